// The checkpoint file format:
//   "COLLIECK" | u32 version | u64 header length | header JSON | tensor bytes | u64 xxh3
// where the hash covers every byte before it, and the header lists each tensor's name,
// dtype, shape and offset into the tensor bytes.
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
#include <memory>
#include <regex>

#include "collie/error.h"
#include "core/strings.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace collie::train {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'L', 'L', 'I', 'E', 'C', 'K'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kMaxHeader = 64 << 20;
constexpr int64_t kMaxStep = 100000000;  // train.steps' largest value

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

const char* dtypeName(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return "f32";
    case at::kLong:
      return "i64";
    default:
      return nullptr;
  }
}

}  // namespace

void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  nlohmann::json header = {{"step", checkpoint.step}, {"identity", checkpoint.identity}};
  nlohmann::json entries = nlohmann::json::array();
  uint64_t offset = 0;
  std::vector<at::Tensor> contiguous;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    const char* dtype = dtypeName(tensor);
    COLLIE_CHECK(dtype != nullptr, "checkpoint tensor ", name, " has dtype ", tensor.scalar_type());
    contiguous.push_back(tensor.detach().contiguous());
    entries.push_back({{"name", name},
                       {"dtype", dtype},
                       {"shape", tensor.sizes().vec()},
                       {"offset", offset},
                       {"bytes", contiguous.back().nbytes()}});
    offset += contiguous.back().nbytes();
  }
  header["tensors"] = entries;
  const std::string text = header.dump();
  const uint64_t header_size = text.size();

  const std::string partial = path + ".partial";
  int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(partial, std::string("cannot create: ") + std::strerror(errno));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  auto emit = [&](const void* data, size_t size) {
    XXH3_64bits_update(state, data, size);
    writeAll(fd, data, size, partial);
  };
  try {
    emit(kMagic, sizeof(kMagic));
    emit(&kVersion, sizeof(kVersion));
    emit(&header_size, sizeof(header_size));
    emit(text.data(), text.size());
    for (const auto& t : contiguous) emit(t.data_ptr(), t.nbytes());
    const uint64_t digest = XXH3_64bits_digest(state);
    writeAll(fd, &digest, sizeof(digest), partial);
    if (::fsync(fd) != 0) fail(partial, std::string("fsync failed: ") + std::strerror(errno));
  } catch (...) {
    XXH3_freeState(state);
    ::close(fd);
    ::unlink(partial.c_str());
    throw;
  }
  XXH3_freeState(state);
  ::close(fd);
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    fail(path, std::string("cannot rename the temporary file into place: ") + std::strerror(errno));
  }
  syncDirectory(fs::absolute(path).parent_path());
}

Checkpoint loadCheckpoint(const std::string& path) {
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
  if (version != kVersion) {
    fail(path, fmt::format("format version {}, this collie reads version {}", version, kVersion));
  }
  if (XXH3_64bits(bytes, size - 8) != digest) {
    fail(path,
         "content hash mismatch: the file is corrupt or was cut short. HINT: delete it "
         "to resume from the previous checkpoint");
  }
  if (header_size > kMaxHeader || fixed + header_size > size - 8) {
    fail(path, fmt::format("header length {} is out of range", header_size));
  }
  Checkpoint checkpoint;
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

void restoreTensors(const Checkpoint& from,
                    const std::vector<std::pair<std::string, at::Tensor>>& into,
                    const std::string& path) {
  if (from.tensors.size() != into.size()) {
    fail(path, fmt::format("holds {} tensors, this run has {}", from.tensors.size(), into.size()));
  }
  for (size_t i = 0; i < into.size(); ++i) {
    const auto& [name, saved] = from.tensors[i];
    const auto& [want, target] = into[i];
    if (name != want || saved.sizes() != target.sizes() ||
        saved.scalar_type() != target.scalar_type()) {
      fail(path, fmt::format("tensor {} is '{}' {}, this run expects '{}' {}", i, name,
                             c10::str(saved.sizes()), want, c10::str(target.sizes())));
    }
  }
  for (size_t i = 0; i < into.size(); ++i) {
    at::Tensor target = into[i].second;
    target.detach().copy_(from.tensors[i].second);
  }
}

std::string checkpointPath(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08lld.ckpt", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

namespace {
std::vector<std::pair<int64_t, std::string>> listCheckpoints(const std::string& dir) {
  static const std::regex pattern("step-([0-9]{8,})\\.ckpt");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern))
      found.emplace_back(std::stoll(m[1]), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}
}  // namespace

std::string latestCheckpoint(const std::string& dir) {
  auto found = listCheckpoints(dir);
  return found.empty() ? "" : found.back().second;
}

void pruneCheckpoints(const std::string& dir, int keep) {
  auto found = listCheckpoints(dir);
  for (size_t i = 0; i + keep < found.size(); ++i) {
    std::error_code ec;
    fs::remove(found[i].second, ec);
  }
}

std::string runIdentity(const config::Experiment& e, const std::vector<int>& micro_batch) {
  const config::TrainSpec& t = e.train;
  std::string id = "model " + e.model.plugin + " {";
  for (const auto& [key, value] : e.model.params.values()) id += key + ": " + value + ", ";
  id += fmt::format("}}; optimizer {}; micro_batch {} x {}; data seed {}", t.sgd ? "sgd" : "adamw",
                    t.auto_micro_batch ? fmt::format("auto (global {})", t.global_batch)
                                       : fmt::format("[{}]", fmt::join(micro_batch, ", ")),
                    t.grad_accum, e.data.seed);
  return id;
}

RunCheckpoints::RunCheckpoints(const config::TrainSpec& spec, std::string identity)
    : spec_(spec), identity_(std::move(identity)) {}

bool RunCheckpoints::dueAfter(int64_t steps_done) const {
  if (spec_.checkpoint_dir.empty()) return false;
  return (spec_.checkpoint_every > 0 && steps_done % spec_.checkpoint_every == 0) ||
         steps_done == spec_.steps;
}

std::string RunCheckpoints::save(
    int64_t steps_done, const std::vector<std::pair<std::string, at::Tensor>>& tensors) const {
  std::error_code ec;
  fs::create_directories(spec_.checkpoint_dir, ec);
  if (ec) {
    throw CheckpointError("train.checkpoint_dir " + spec_.checkpoint_dir +
                          ": cannot create: " + ec.message());
  }
  const std::string path = checkpointPath(spec_.checkpoint_dir, steps_done);
  saveCheckpoint(path, Checkpoint{steps_done, identity_, tensors});
  pruneCheckpoints(spec_.checkpoint_dir, spec_.checkpoint_keep);
  return path;
}

int64_t RunCheckpoints::newest(std::string* path) const {
  if (spec_.checkpoint_dir.empty() || !spec_.resume) return 0;
  // The step is the file name's; the trainer checks that the header agrees.
  const auto found = listCheckpoints(spec_.checkpoint_dir);
  if (found.empty()) return 0;
  *path = found.back().second;
  return found.back().first;
}

std::string RunCheckpoints::pathOf(int64_t step) const {
  return checkpointPath(spec_.checkpoint_dir, step);
}

int64_t RunCheckpoints::restore(const std::string& path,
                                const std::vector<std::pair<std::string, at::Tensor>>& into) const {
  Checkpoint c = loadCheckpoint(path);
  if (c.identity != identity_) {
    throw CheckpointError("checkpoint " + path + " was written by another run: it holds " +
                          c.identity + ", this run is " + identity_ +
                          ". HINT: point train.checkpoint_dir elsewhere or set "
                          "train.resume: false");
  }
  restoreTensors(c, into, path);
  return c.step;
}

uint64_t checkpointDigest(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.is_open() || in.tellg() < static_cast<std::streamoff>(sizeof(uint64_t))) return 0;
  in.seekg(-static_cast<std::streamoff>(sizeof(uint64_t)), std::ios::end);
  uint64_t digest = 0;
  in.read(reinterpret_cast<char*>(&digest), sizeof(digest));
  return in ? digest : 0;
}

}  // namespace collie::train
