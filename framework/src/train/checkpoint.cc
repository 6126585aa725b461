// Checkpoint files: safetensors shards and their manifest (format 2), and format 1's reader.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "collie/error.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace collie::train {
namespace {

constexpr int kFormat = 2;
constexpr uint64_t kMaxHeader = 64 << 20;
constexpr int64_t kMaxStep = 100000000;  // train.steps' largest value
constexpr int kMaxFiles = 99999;         // five digits in a shard's name
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr char kManifest[] = "manifest.json";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError("checkpoint " + path + ": " + what);
}

void writeAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, std::string("cannot write: ") + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void syncDirectory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes the byte ranges `parts` to `path` through `partial`: fsync, rename, directory fsync.
// Returns the xxh3 of everything written.
uint64_t writeAtomically(const std::string& path, const std::string& partial,
                         const std::vector<std::pair<const void*, size_t>>& parts) {
  int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(partial, std::string("cannot create: ") + std::strerror(errno));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  try {
    for (const auto& [data, size] : parts) {
      XXH3_64bits_update(state, data, size);
      writeAll(fd, data, size, partial);
    }
    if (::fsync(fd) != 0) fail(partial, std::string("fsync failed: ") + std::strerror(errno));
  } catch (...) {
    XXH3_freeState(state);
    ::close(fd);
    ::unlink(partial.c_str());
    throw;
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  ::close(fd);
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(partial.c_str());
    fail(path, "cannot rename the temporary file into place: " + why);
  }
  syncDirectory(fs::absolute(path).parent_path());
  return digest;
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

uint64_t parseHex(const std::string& text, const std::string& path, const std::string& what) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    fail(path, what + " '" + text + "' is not 16 hexadecimal digits");
  }
  return std::stoull(text, nullptr, 16);
}

// The elements of `shape`, or -1 when a dimension is negative or the product exceeds
// kMaxElements (checked before anything is allocated).
int64_t elementsOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > kMaxElements / d)) return -1;
    n *= d;
  }
  return n;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

nlohmann::json pieceJson(const Piece& p) {
  return nlohmann::json::array({p.key, p.start, p.numel});
}

}  // namespace

bool Piece::whole() const { return start == 0 && numel == elementsOf(shape); }

int64_t CheckpointInfo::samplesPerMicroBatch() const {
  int64_t n = 0;
  for (int m : micro_batch) n += m;
  return n;
}

std::string shardFileName(int index, int count) {
  return fmt::format("shard-{:05d}-of-{:05d}.safetensors", index, count);
}

ShardFile writeShard(const std::string& step_dir, int index, int count, const CheckpointInfo& info,
                     const std::vector<std::pair<Piece, at::Tensor>>& pieces) {
  ShardFile file;
  file.name = shardFileName(index, count);
  const std::string path = (fs::path(step_dir) / file.name).string();
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json where = nlohmann::json::object();
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& [piece, values] : pieces) {
    COLLIE_CHECK(values.scalar_type() == at::kFloat && values.numel() == piece.numel &&
                     !header.contains(piece.key),
                 "checkpoint piece ", piece.key, " has ", values.numel(), " elements of ",
                 values.scalar_type(), " for ", piece.numel, ", or twice");
    contiguous.push_back(values.detach().to(at::kCPU).contiguous());  // a GPU's: copied once
    const uint64_t bytes = contiguous.back().nbytes();
    // A whole tensor keeps its shape, so that any safetensors reader loads it as it is.
    header[piece.key] = {{"dtype", "F32"},
                         {"shape", piece.whole() ? piece.shape : std::vector<int64_t>{piece.numel}},
                         {"data_offsets", {offset, offset + bytes}}};
    where[piece.key] = {{"shape", piece.shape}, {"start", piece.start}};
    XXH3_64bits_update(state, contiguous.back().data_ptr(), bytes);
    offset += bytes;
    file.pieces.push_back(piece);
  }
  const uint64_t data_digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  // safetensors' __metadata__ maps strings to strings.
  header["__metadata__"] = {
      {"format", "collie-checkpoint"},     {"version", std::to_string(kFormat)},
      {"step", std::to_string(info.step)}, {"shard", std::to_string(index)},
      {"shards", std::to_string(count)},   {"identity", info.identity},
      {"sharding", info.sharding},         {"pieces", where.dump()},
      {"data_xxh3", hex(data_digest)}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // safetensors pads the header to 8 bytes
  const uint64_t header_size = text.size();
  std::vector<std::pair<const void*, size_t>> parts = {{&header_size, sizeof(header_size)},
                                                       {text.data(), text.size()}};
  for (const auto& t : contiguous) parts.emplace_back(t.data_ptr(), t.nbytes());
  file.digest = writeAtomically(path, path + ".partial", parts);
  file.bytes = sizeof(header_size) + header_size + offset;
  return file;
}

void writeManifest(const std::string& step_dir, const CheckpointInfo& info,
                   const std::vector<ShardFile>& files, int writer) {
  nlohmann::json tensors = nlohmann::json::array();
  std::set<std::string> listed;
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& file : files) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const auto& p : file.pieces) {
      pieces.push_back(pieceJson(p));
      if (listed.insert(p.key).second) {
        tensors.push_back({{"key", p.key}, {"dtype", "F32"}, {"shape", p.shape}});
      }
    }
    entries.push_back({{"name", file.name},
                       {"bytes", file.bytes},
                       {"xxh3", hex(file.digest)},
                       {"pieces", pieces}});
  }
  const nlohmann::ordered_json manifest = {{"format", "collie-checkpoint"},
                                           {"version", kFormat},
                                           {"step", info.step},
                                           {"identity", info.identity},
                                           {"micro_batch", info.micro_batch},
                                           {"grad_accum", info.grad_accum},
                                           {"sharding", info.sharding},
                                           {"tensors", tensors},
                                           {"files", entries}};
  // One field per line, and one line per tensor and per file: readable, and diffable.
  std::string text = "{\n";
  for (auto it = manifest.begin(); it != manifest.end(); ++it) {
    text += (it == manifest.begin() ? " " : ",\n ") + nlohmann::json(it.key()).dump() + ": ";
    if (!it->is_array() || it->empty() || !it->front().is_object()) {
      text += it->dump();
      continue;
    }
    text += "[";
    for (size_t k = 0; k < it->size(); ++k) text += (k ? ",\n  " : "\n  ") + (*it)[k].dump();
    text += "\n ]";
  }
  text += "\n}\n";
  const std::string path = (fs::path(step_dir) / kManifest).string();
  writeAtomically(path, fmt::format("{}.partial-{}", path, writer), {{text.data(), text.size()}});
}

// A shard file, mapped, verified and indexed.
struct CheckpointReader::Opened {
  std::unique_ptr<detail::MappedFile> mapping;
  const uint8_t* data = nullptr;                            // the tensor bytes
  std::map<std::string, std::pair<uint64_t, uint64_t>> at;  // key: [begin, end) into data
};

namespace {

// The manifest's fields, checked; `dir` names it in errors.
void parseManifest(const std::string& dir, const std::string& text, CheckpointInfo* info,
                   std::vector<std::pair<std::string, std::vector<int64_t>>>* tensors,
                   std::vector<ShardFile>* files) {
  const std::string where = dir + "/" + kManifest;
  static const std::regex name_pattern("shard-[0-9]{5}-of-[0-9]{5}\\.safetensors");
  try {
    const auto m = nlohmann::json::parse(text);
    if (m.at("format") != "collie-checkpoint") fail(where, "not a collie checkpoint manifest");
    const int version = m.at("version");
    if (version != kFormat) {
      fail(where,
           fmt::format("format version {}, this collie reads versions 1 and {}", version, kFormat));
    }
    info->step = m.at("step");
    if (info->step < 0 || info->step > kMaxStep) {
      fail(where, fmt::format("step {} is out of range (0 to {})", info->step, kMaxStep));
    }
    info->identity = m.at("identity");
    info->micro_batch = m.at("micro_batch").get<std::vector<int>>();
    info->grad_accum = m.at("grad_accum");
    info->sharding = m.at("sharding");
    const auto& names = config::shardedStateNames();
    if (info->micro_batch.empty() || info->micro_batch.size() > 1000000 || info->grad_accum < 1 ||
        std::find(names.begin(), names.end(), info->sharding) == names.end() ||
        std::any_of(info->micro_batch.begin(), info->micro_batch.end(),
                    [](int b) { return b < 1; })) {
      fail(where, "its batch (micro_batch, grad_accum) or sharding is out of range");
    }
    std::map<std::string, int64_t> elements;
    for (const auto& t : m.at("tensors")) {
      const std::string key = t.at("key");
      const auto shape = t.at("shape").get<std::vector<int64_t>>();
      const int64_t n = elementsOf(shape);
      if (t.at("dtype") != "F32" || n < 0 || !elements.emplace(key, n).second) {
        fail(where, "tensor '" + key + "' has an inconsistent entry");
      }
      tensors->emplace_back(key, shape);
    }
    std::set<std::string> seen;
    for (const auto& f : m.at("files")) {
      ShardFile file;
      file.name = f.at("name");
      if (!std::regex_match(file.name, name_pattern) || !seen.insert(file.name).second) {
        fail(where, "lists a file named '" + file.name + "'");
      }
      file.bytes = f.at("bytes");
      file.digest = parseHex(f.at("xxh3"), where, "the digest of " + file.name);
      for (const auto& p : f.at("pieces")) {
        Piece piece;
        piece.key = p.at(0);
        piece.start = p.at(1);
        piece.numel = p.at(2);
        const auto it = elements.find(piece.key);
        if (it == elements.end() || piece.start < 0 || piece.numel < 0 ||
            piece.start > it->second - piece.numel) {
          fail(where,
               "file " + file.name + " holds a piece of '" + piece.key + "' outside the tensor");
        }
        for (const auto& [key, shape] : *tensors) {
          if (key == piece.key) piece.shape = shape;
        }
        file.pieces.push_back(piece);
      }
      files->push_back(std::move(file));
    }
    if (files->empty() || files->size() > kMaxFiles) fail(where, "lists no files, or too many");
  } catch (const nlohmann::json::exception& e) {
    fail(where, std::string("unreadable: ") + e.what());
  }
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {  // format 1
    FormatOneCheckpoint one = loadFormatOne(path);
    info_.step = one.step;
    info_.identity = one.identity;
    format_one_ = std::make_unique<std::map<std::string, at::Tensor>>();
    // Its names: "param/NAME" for the parameters, in order; "KIND/K" for parameter K's state.
    std::vector<std::string> names;
    for (const auto& [key, tensor] : one.tensors) {
      if (key.rfind("param/", 0) == 0) names.push_back(key.substr(6));
    }
    for (auto& [key, tensor] : one.tensors) {
      std::string mine;
      const size_t slash = key.find('/');
      if (key.rfind("param/", 0) == 0) {
        mine = key.substr(6);
      } else if (slash != std::string::npos && slash + 1 < key.size() &&
                 key.find_first_not_of("0123456789", slash + 1) == std::string::npos &&
                 key.size() - slash <= 9 && std::stoul(key.substr(slash + 1)) < names.size()) {
        mine = key.substr(0, slash + 1) + names[std::stoul(key.substr(slash + 1))];
      }
      if (mine.empty() || tensor.scalar_type() != at::kFloat || format_one_->count(mine)) {
        fail(path, "holds tensor '" + key + "', which this collie cannot place");
      }
      tensors_.emplace_back(mine, tensor.sizes().vec());
      format_one_->emplace(mine, tensor);
    }
    return;
  }
  const std::string manifest = (fs::path(path) / kManifest).string();
  std::ifstream in(manifest, std::ios::binary);
  if (!in) {
    fail(path, std::string(kManifest) +
                   " is missing: the checkpoint was not finished (a crash while writing it)");
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  parseManifest(path, text, &info_, &tensors_, &files_);
  opened_.resize(files_.size());
  for (size_t f = 0; f < files_.size(); ++f) {
    for (const Piece& p : files_[f].pieces) where_[p.key].push_back({f, p.start, p.numel});
  }
  // Every tensor must be held exactly once: its pieces tile it.
  for (const auto& [key, shape] : tensors_) {
    auto& pieces = where_[key];
    std::sort(pieces.begin(), pieces.end(),
              [](const Located& a, const Located& b) { return a.start < b.start; });
    int64_t next = 0;
    for (const Located& l : pieces) {
      if (l.numel == 0) continue;
      if (l.start != next) fail(manifest, "the pieces of '" + key + "' overlap or leave a gap");
      next += l.numel;
    }
    if (next != elementsOf(shape)) fail(manifest, "the pieces of '" + key + "' leave a gap");
  }
}

CheckpointReader::~CheckpointReader() = default;

const CheckpointReader::Opened& CheckpointReader::open(size_t f) {
  if (opened_[f]) return *opened_[f];
  const ShardFile& file = files_[f];
  const std::string path = (fs::path(path_) / file.name).string();
  auto opened = std::make_unique<Opened>();
  try {
    opened->mapping = std::make_unique<detail::MappedFile>(path);
  } catch (const std::runtime_error& e) {
    fail(path, std::string(e.what()) + " (the manifest lists it: file " + std::to_string(f) +
                   " of " + std::to_string(files_.size()) + ")");
  }
  const uint8_t* bytes = opened->mapping->bytes();
  const size_t size = opened->mapping->size();
  if (size != file.bytes) {
    fail(path, fmt::format("{} bytes, the manifest says {}: the file was cut short or replaced",
                           size, file.bytes));
  }
  if (XXH3_64bits(bytes, size) != file.digest) {
    fail(path,
         "content hash mismatch: the file is corrupt. HINT: delete its step directory to resume "
         "from the previous checkpoint");
  }
  uint64_t header_size = 0;
  if (size < sizeof(header_size)) fail(path, "truncated");
  std::memcpy(&header_size, bytes, sizeof(header_size));
  if (header_size > kMaxHeader || header_size > size - sizeof(header_size)) {
    fail(path, fmt::format("header length {} is out of range", header_size));
  }
  const char* text = reinterpret_cast<const char*>(bytes) + sizeof(header_size);
  opened->data = bytes + sizeof(header_size) + header_size;
  const uint64_t data_size = size - sizeof(header_size) - header_size;
  try {
    const auto header = nlohmann::json::parse(text, text + header_size);
    for (const auto& [key, entry] : header.items()) {
      if (key == "__metadata__") continue;
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const uint64_t begin = entry.at("data_offsets").at(0), end = entry.at("data_offsets").at(1);
      const int64_t n = elementsOf(shape);
      if (entry.at("dtype") != "F32" || n < 0 || begin > end || end > data_size ||
          end - begin != static_cast<uint64_t>(n) * 4) {
        fail(path, "tensor '" + key + "' has an inconsistent entry");
      }
      opened->at[key] = {begin, end};
    }
    const auto& meta = header.at("__metadata__");
    if (XXH3_64bits(opened->data, data_size) != parseHex(meta.at("data_xxh3"), path, "data_xxh3")) {
      fail(path, "its tensor bytes do not match its own data_xxh3");
    }
    if (std::stoll(meta.at("step").get<std::string>()) != info_.step) {
      fail(path, "holds step " + meta.at("step").get<std::string>() + ", its manifest step " +
                     std::to_string(info_.step));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("unreadable header: ") + e.what());
  } catch (const std::logic_error& e) {  // stoll
    fail(path, "its step is not a number");
  }
  for (const Piece& p : file.pieces) {
    const auto it = opened->at.find(p.key);
    if (it == opened->at.end() ||
        it->second.second - it->second.first != static_cast<uint64_t>(p.numel) * 4) {
      fail(path, "does not hold the piece of '" + p.key + "' its manifest lists");
    }
  }
  opened_[f] = std::move(opened);
  return *opened_[f];
}

void CheckpointReader::read(const std::vector<std::pair<Piece, at::Tensor>>& into) {
  for (const auto& [want, destination] : into) {
    // A target in device memory is read into host memory and copied there once.
    const at::Tensor target = destination.is_cpu() ? destination : destination.to(at::kCPU);
    COLLIE_CHECK(destination.scalar_type() == at::kFloat && destination.is_contiguous() &&
                     destination.numel() == want.numel,
                 "checkpoint target for ", want.key, " is not ", want.numel,
                 " contiguous float32 elements");
    const auto known = std::find_if(tensors_.begin(), tensors_.end(),
                                    [&](const auto& t) { return t.first == want.key; });
    if (known == tensors_.end()) fail(path_, "holds no tensor '" + want.key + "'");
    if (known->second != want.shape) {
      fail(path_, fmt::format("holds '{}' of shape {}, this run's is {}", want.key,
                              shapeText(known->second), shapeText(want.shape)));
    }
    float* out = target.data_ptr<float>();
    if (format_one_) {
      std::memcpy(out, format_one_->at(want.key).contiguous().data_ptr<float>() + want.start,
                  static_cast<size_t>(want.numel) * 4);
    } else {
      for (const Located& l : where_.at(want.key)) {
        const int64_t lo = std::max(l.start, want.start);
        const int64_t hi = std::min(l.start + l.numel, want.start + want.numel);
        if (lo >= hi) continue;
        const Opened& file = open(l.file);
        const uint8_t* base = file.data + file.at.at(want.key).first;
        std::memcpy(out + (lo - want.start), base + (lo - l.start) * 4,
                    static_cast<size_t>(hi - lo) * 4);
      }
    }
    if (!destination.is_cpu()) destination.copy_(target);
  }
}

std::vector<std::pair<std::string, at::Tensor>> CheckpointReader::readAll() {
  std::vector<std::pair<std::string, at::Tensor>> all;
  std::vector<std::pair<Piece, at::Tensor>> into;
  for (const auto& [key, shape] : tensors_) {
    at::Tensor t = at::empty(shape, at::kFloat);
    into.emplace_back(Piece{key, shape, 0, t.numel()}, t);
    all.emplace_back(key, t);
  }
  read(into);
  return all;
}

// ---- format 1 -------------------------------------------------------------------------

FormatOneCheckpoint loadFormatOne(const std::string& path) {
  constexpr char kMagic[8] = {'C', 'O', 'L', 'L', 'I', 'E', 'C', 'K'};
  std::unique_ptr<detail::MappedFile> file;
  try {
    file = std::make_unique<detail::MappedFile>(path);
  } catch (const std::runtime_error& e) {
    fail(path, e.what());
  }
  const char* bytes = reinterpret_cast<const char*>(file->bytes());
  const size_t size = file->size();
  const size_t fixed = sizeof(kMagic) + sizeof(uint32_t) + sizeof(uint64_t);
  if (size < fixed + sizeof(uint64_t)) fail(path, fmt::format("truncated ({} bytes)", size));
  if (std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0) {
    fail(path, "not a collie checkpoint (it does not start with COLLIECK)");
  }
  uint32_t version = 0;
  uint64_t header_size = 0, digest = 0;
  std::memcpy(&version, bytes + 8, sizeof(version));
  std::memcpy(&header_size, bytes + 12, sizeof(header_size));
  std::memcpy(&digest, bytes + size - 8, sizeof(digest));
  if (version != 1)
    fail(path, fmt::format("format version {}, this collie reads 1 and 2", version));
  if (XXH3_64bits(bytes, size - 8) != digest) {
    fail(path,
         "content hash mismatch: the file is corrupt or was cut short. HINT: delete it "
         "to resume from the previous checkpoint");
  }
  if (header_size > kMaxHeader || fixed + header_size > size - 8) {
    fail(path, fmt::format("header length {} is out of range", header_size));
  }
  FormatOneCheckpoint checkpoint;
  const char* payload = bytes + fixed + header_size;
  const uint64_t payload_size = size - 8 - fixed - header_size;
  try {
    auto header = nlohmann::json::parse(bytes + fixed, bytes + fixed + header_size);
    checkpoint.step = header.at("step");
    if (checkpoint.step < 0 || checkpoint.step > kMaxStep) {
      fail(path, fmt::format("step {} is out of range (0 to {})", checkpoint.step, kMaxStep));
    }
    checkpoint.identity = header.at("identity");
    for (const auto& entry : header.at("tensors")) {
      const std::string dtype = entry.at("dtype");
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const uint64_t offset = entry.at("offset"), length = entry.at("bytes");
      // Checked before anything is allocated: a crafted header cannot ask for terabytes.
      uint64_t expected = dtype == "i64" ? 8 : 4;
      bool valid = dtype == "f32" || dtype == "i64";
      for (int64_t d : shape) {
        valid = valid && d >= 0 && (d == 0 || expected <= payload_size / static_cast<uint64_t>(d));
        if (valid) expected *= static_cast<uint64_t>(d);
      }
      if (!valid || expected != length || offset > payload_size || length > payload_size - offset) {
        fail(path,
             "tensor '" + entry.at("name").get<std::string>() + "' has an inconsistent entry");
      }
      at::Tensor t = at::empty(shape, dtype == "i64" ? at::kLong : at::kFloat);
      std::memcpy(t.data_ptr(), payload + offset, length);
      checkpoint.tensors.emplace_back(entry.at("name"), t);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("unreadable header: ") + e.what());
  }
  return checkpoint;
}

// ---- the checkpoints of a run -----------------------------------------------------------

uint64_t checkpointDigest(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::ifstream in(fs::path(path) / kManifest, std::ios::binary);
    if (!in) return 0;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return XXH3_64bits(text.data(), text.size()) | 1;  // never 0
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.is_open() || in.tellg() < static_cast<std::streamoff>(sizeof(uint64_t))) return 0;
  in.seekg(-static_cast<std::streamoff>(sizeof(uint64_t)), std::ios::end);
  uint64_t digest = 0;
  in.read(reinterpret_cast<char*>(&digest), sizeof(digest));
  return in ? digest : 0;
}

std::string checkpointPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step-{:08d}", step)).string();
}

namespace {

struct Found {
  int64_t step;
  std::string path;
  bool complete;  // a directory with its manifest, or a format-1 file
};

// Every checkpoint in `dir`, ascending by step; where a step has a directory and a format-1
// file, the directory.
std::vector<Found> listCheckpoints(const std::string& dir) {
  static const std::regex pattern("step-([0-9]{8,})(\\.ckpt)?");
  std::map<int64_t, Found> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern) || m[1].length() > 12) continue;
    const int64_t step = std::stoll(m[1]);
    const bool file = m[2].matched;
    std::error_code e2;
    if (file != entry.is_regular_file(e2)) continue;
    const bool complete = file || fs::exists(entry.path() / kManifest, e2);
    auto it = found.find(step);
    if (it == found.end() || (!file && complete)) {
      found[step] = Found{step, entry.path().string(), complete};
    }
  }
  std::vector<Found> out;
  for (auto& [step, f] : found) out.push_back(f);
  return out;
}

}  // namespace

std::string latestCheckpoint(const std::string& dir) {
  const auto found = listCheckpoints(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    if (it->complete) return it->path;
  }
  return "";
}

std::string runIdentity(const config::Experiment& e) {
  std::string id = "model " + e.model.plugin + " {";
  for (const auto& [key, value] : e.model.params.values()) id += key + ": " + value + ", ";
  id += fmt::format("}}; optimizer {}; data seed {}", e.train.sgd ? "sgd" : "adamw", e.data.seed);
  return id;
}

std::string formatOneIdentity(const config::Experiment& e, const std::vector<int>& micro_batch) {
  const config::TrainSpec& t = e.train;
  std::string id = "model " + e.model.plugin + " {";
  for (const auto& [key, value] : e.model.params.values()) id += key + ": " + value + ", ";
  id += fmt::format("}}; optimizer {}; micro_batch {} x {}; data seed {}", t.sgd ? "sgd" : "adamw",
                    t.auto_micro_batch ? fmt::format("auto (global {})", t.global_batch)
                                       : fmt::format("[{}]", fmt::join(micro_batch, ", ")),
                    t.grad_accum, e.data.seed);
  return id;
}

RunCheckpoints::RunCheckpoints(const config::TrainSpec& spec) : spec_(spec) {}

bool RunCheckpoints::dueAfter(int64_t steps_done) const {
  if (spec_.checkpoint_dir.empty()) return false;
  return (spec_.checkpoint_every > 0 && steps_done % spec_.checkpoint_every == 0) ||
         steps_done == spec_.steps;
}

std::string RunCheckpoints::createStepDir(int64_t step) const {
  const std::string dir = checkpointPath(spec_.checkpoint_dir, step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw CheckpointError("train.checkpoint_dir " + spec_.checkpoint_dir + ": cannot create " +
                          dir + ": " + ec.message());
  }
  return dir;
}

void RunCheckpoints::prune() const {
  const auto found = listCheckpoints(spec_.checkpoint_dir);
  int complete = 0;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    // Unfinished ones older than a finished one were left by a crash; a newer one may be
    // being written by another rank.
    const bool remove = it->complete ? ++complete > spec_.checkpoint_keep : complete > 0;
    std::error_code ec;
    if (remove) fs::remove_all(it->path, ec);  // other ranks may remove it too
  }
}

int64_t RunCheckpoints::newest(std::string* path) const {
  if (spec_.checkpoint_dir.empty() || !spec_.resume) return 0;
  *path = latestCheckpoint(spec_.checkpoint_dir);
  if (path->empty()) return 0;
  // The step is the name's; the trainer checks that the content agrees.
  const std::string name = fs::path(*path).filename().string();
  return std::stoll(
      name.substr(5, name.find('.') == std::string::npos ? std::string::npos : name.find('.') - 5));
}

std::string RunCheckpoints::pathOf(int64_t step) const {
  const std::string dir = checkpointPath(spec_.checkpoint_dir, step);
  std::error_code ec;
  if (!fs::exists(dir, ec) && fs::is_regular_file(dir + ".ckpt", ec)) return dir + ".ckpt";
  return dir;
}

}  // namespace collie::train
