// What a checkpoint holds of a run and how the run gets it back (train/training_state.h).
#include "train/training_state.h"

#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/utils.h>

#include <algorithm>
#include <set>

#include "collie/codec.h"
#include "collie/error.h"
#include "collie/log.h"

namespace collie::train {

TrainingState::TrainingState(const config::Experiment& e, int rank, int world, Control& control,
                             const std::vector<std::string>& names,
                             const std::vector<at::Tensor>& params,
                             const std::vector<at::Tensor>& shards, Optimizer& optimizer,
                             Reducer& reducer, const PeriodicSync& periodic,
                             const Sharding& sharding)
    : e_(e),
      spec_(e.train),
      rank_(rank),
      world_(world),
      control_(control),
      names_(names),
      params_(params),
      shards_(shards),
      optimizer_(optimizer),
      reducer_(reducer),
      periodic_(periodic),
      sharding_(sharding) {}

std::map<std::string, at::Tensor> TrainingState::optimizerState() const {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : optimizer_.state()) out.emplace(name, tensor);
  return out;
}

std::vector<std::string> TrainingState::stateKinds() const {
  std::vector<std::string> kinds;
  for (const auto& [name, tensor] : optimizer_.state()) {
    const std::string kind = name.substr(0, name.rfind('/'));
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  return kinds;
}

std::string TrainingState::stateKey(const std::string& kind, size_t k) const {
  return kind.empty() ? names_[k] : kind + "/" + names_[k];
}

std::vector<TrainingState::BlockPiece> TrainingState::blockPieces(int r) const {
  std::vector<std::string> kinds = {""};
  for (const auto& kind : stateKinds()) kinds.push_back(kind);
  std::vector<BlockPiece> out;
  for (const auto& kind : kinds) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const size_t b = reducer_.bucketOf(k);
      const int64_t block = reducer_.shardNumel(b), begin = reducer_.offsetOf(k);
      const int64_t end = begin + params_[k].numel();
      const int64_t lo = std::max(begin, r * block), hi = std::min(end, (r + 1) * block);
      // An empty tensor is rank 0's, so that the files still list it.
      if (lo < hi || (begin == end && r == 0)) {
        out.push_back({Piece{stateKey(kind, k), params_[k].sizes().vec(), lo - begin,
                             std::max<int64_t>(hi - lo, 0)},
                       kind, b, lo - r * block});
      }
    }
  }
  return out;
}

std::vector<std::pair<Piece, at::Tensor>> TrainingState::blockTargets() const {
  const auto state = optimizerState();
  std::vector<std::pair<Piece, at::Tensor>> out;
  for (const BlockPiece& p : blockPieces(rank_)) {
    const at::Tensor& block =
        p.kind.empty() ? shards_[p.bucket] : state.at(fmt::format("{}/{}", p.kind, p.bucket));
    out.emplace_back(p.piece, block.narrow(0, p.at, p.piece.numel));
  }
  return out;
}

std::vector<std::pair<Piece, at::Tensor>> TrainingState::wholeTargets() const {
  const auto state = optimizerState();
  std::vector<std::pair<Piece, at::Tensor>> out;
  auto add = [&](const std::string& kind, size_t k, const at::Tensor& t) {
    out.emplace_back(Piece{stateKey(kind, k), t.sizes().vec(), 0, t.numel()}, t.view({-1}));
  };
  for (size_t k = 0; k < params_.size(); ++k) add("", k, params_[k].detach());
  for (const auto& kind : stateKinds()) {
    for (size_t k = 0; k < params_.size(); ++k)
      add(kind, k, state.at(fmt::format("{}/{}", kind, k)));
  }
  for (auto& target : outerTargets()) out.push_back(std::move(target));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> TrainingState::rankState(int r) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (Codec* codec = reducer_.codec()) {
    for (const auto& [name, tensor] : codec->state())
      out.emplace_back(fmt::format("codec/{}/{}/{}", reducer_.codecName(), r, name), tensor);
  }
  if (periodic_.local()) {  // between meetings each rank's optimizer steps on its own
    const auto state = optimizerState();
    for (const auto& kind : stateKinds()) {
      for (size_t k = 0; k < params_.size(); ++k) {
        out.emplace_back(fmt::format("rank/{}/{}", r, stateKey(kind, k)),
                         state.at(fmt::format("{}/{}", kind, k)));
      }
    }
  }
  return out;
}

std::vector<Piece> TrainingState::rankPieces(int r) const {
  std::vector<Piece> out;
  for (const auto& [key, tensor] : rankState(r))
    out.push_back(Piece{key, tensor.sizes().vec(), 0, tensor.numel()});
  return out;
}

std::vector<std::pair<Piece, at::Tensor>> TrainingState::rankTargets(const char* prefix) const {
  std::vector<std::pair<Piece, at::Tensor>> out;
  for (const auto& [key, tensor] : rankState(rank_)) {
    if (key.rfind(prefix, 0) != 0) continue;
    out.emplace_back(Piece{key, tensor.sizes().vec(), 0, tensor.numel()}, tensor.view({-1}));
  }
  return out;
}

std::vector<std::pair<Piece, at::Tensor>> TrainingState::outerTargets() const {
  std::vector<std::pair<Piece, at::Tensor>> out;
  const auto& outer = periodic_.outerParameters();
  const auto& momentum = periodic_.outerMomentum();
  if (outer.empty()) return out;
  for (const auto& [kind, buckets] :
       {std::make_pair("outer", &outer), std::make_pair("outer_momentum", &momentum)}) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const at::Tensor view =
          (*buckets)[reducer_.bucketOf(k)].narrow(0, reducer_.offsetOf(k), params_[k].numel());
      out.emplace_back(Piece{stateKey(kind, k), params_[k].sizes().vec(), 0, view.numel()}, view);
    }
  }
  return out;
}

std::vector<std::pair<Piece, at::Tensor>> TrainingState::targetsOf() const {
  std::vector<std::pair<Piece, at::Tensor>> out;
  if (sharded()) {
    out = blockTargets();
  } else if (rank_ == 0) {
    out = wholeTargets();
  }
  for (const auto& [key, tensor] : rankState(rank_))
    out.emplace_back(Piece{key, tensor.sizes().vec(), 0, tensor.numel()}, tensor.view({-1}));
  return out;
}

void TrainingState::save(const RunCheckpoints& checkpoints, int64_t step) {
  const CheckpointInfo info{step, runIdentity(e_), sharding_.micro_batch, spec_.grad_accum,
                            config::shardedStateName(spec_.sharding)};
  if (!everyRankWrites()) {
    if (rank_ != 0) return;
    const std::string dir = checkpoints.createStepDir(step);
    writeManifest(dir, info, {writeShard(dir, 0, 1, info, wholeTargets())}, 0);
    checkpoints.prune();
    logInfo("checkpoint: " + dir);
    return;
  }
  // A rank that cannot write says so to the others, which stop too rather than wait.
  std::string dir, failure;
  ShardFile mine;
  try {
    dir = checkpoints.createStepDir(step);
    mine = writeShard(dir, rank_, world_, info, targetsOf());
  } catch (const CheckpointError& e) {
    failure = e.what();
  }
  const auto written = control_.allGather(
      {failure.empty() ? 1.0 : 0.0, static_cast<double>(mine.bytes),
       static_cast<double>(mine.digest >> 32), static_cast<double>(mine.digest & 0xFFFFFFFFu)});
  std::vector<ShardFile> files;
  for (int r = 0; r < world_; ++r) {
    if (written[r][0] == 0) {
      throw CheckpointError(r == rank_ ? failure
                                       : fmt::format("checkpoint of step {}: rank {} could not "
                                                     "write its shard (its log says why)",
                                                     step, r));
    }
    ShardFile file{
        shardFileName(r, world_),
        static_cast<uint64_t>(written[r][1]),
        (static_cast<uint64_t>(written[r][2]) << 32) | static_cast<uint64_t>(written[r][3]),
        {}};
    if (sharded()) {
      for (const BlockPiece& p : blockPieces(r)) file.pieces.push_back(p.piece);
    } else if (r == 0) {
      for (const auto& [piece, tensor] : wholeTargets()) file.pieces.push_back(piece);
    }
    for (Piece& piece : rankPieces(r)) file.pieces.push_back(std::move(piece));
    files.push_back(std::move(file));
  }
  writeManifest(dir, info, files, rank_);
  checkpoints.prune();
  if (rank_ == 0) logInfo(fmt::format("checkpoint: {} ({} files)", dir, world_));
}

void TrainingState::checkResumable(const CheckpointReader& reader) const {
  const CheckpointInfo& info = reader.info();
  const std::string mine =
      reader.formatOne() ? formatOneIdentity(e_, sharding_.micro_batch) : runIdentity(e_);
  if (info.identity != mine) {
    throw CheckpointError("checkpoint " + reader.path() + " was written by another run: it holds " +
                          info.identity + ", this run is " + mine +
                          ". HINT: point train.checkpoint_dir elsewhere or set "
                          "train.resume: false");
  }
  if (reader.formatOne()) {
    if (rank_ == 0) {
      logInfo("checkpoint " + reader.path() +
              " is in format 1 (one .ckpt file): it loads, and this run writes its "
              "checkpoints in format 2 (a directory of safetensors shards)");
    }
    return;
  }
  const int64_t samples = sharding_.globalBatch() / spec_.grad_accum;
  if (info.samplesPerMicroBatch() != samples || info.grad_accum != spec_.grad_accum) {
    throw CheckpointError(fmt::format(
        "checkpoint {} was written by a run of {} samples per micro-batch step (micro_batch "
        "[{}]) x grad_accum {}, this run takes {} x {}: its steps would read other samples. "
        "HINT: keep the sum of the micro-batches and grad_accum when resuming (their split "
        "over ranks may change), or set train.resume: false",
        reader.path(), info.samplesPerMicroBatch(), fmt::join(info.micro_batch, ", "),
        info.grad_accum, samples, spec_.grad_accum));
  }
  if (info.micro_batch != sharding_.micro_batch && rank_ == 0) {
    logInfo(fmt::format(
        "checkpoint {} was written by {} ranks (micro_batch [{}], sharding: {}); this run "
        "has {} (micro_batch [{}]): the same samples per step, re-sharded on load, their "
        "gradients added in another order",
        reader.path(), info.worldSize(), fmt::join(info.micro_batch, ", "), info.sharding, world_,
        fmt::join(sharding_.micro_batch, ", ")));
  }
}

void TrainingState::restore(CheckpointReader& reader) {
  at::NoGradGuard no_grad;
  // Every run's tensors: the parameters and the optimizer state. A checkpoint may hold more
  // (every rank's codec or optimizer state, DiLoCo's outer state), which this run takes
  // where it can use it.
  const size_t expected = params_.size() * (1 + stateKinds().size());
  const size_t held = static_cast<size_t>(
      std::count_if(reader.tensors().begin(), reader.tensors().end(), [](const auto& t) {
        for (const char* extra : {"codec/", "rank/", "outer/", "outer_momentum/"}) {
          if (t.first.rfind(extra, 0) == 0) return false;
        }
        return true;
      }));
  if (held != expected) {
    throw CheckpointError(fmt::format("checkpoint {}: holds {} tensors, this run has {}",
                                      reader.path(), held, expected));
  }
  if (sharded()) {
    for (auto& shard : shards_) shard.zero_();  // the padding
    for (auto& [name, tensor] : optimizer_.state()) tensor.zero_();
    reader.read(blockTargets());
    if (!shardsParameters()) reducer_.gatherParameters();  // stage 3 gathers when it computes
  } else {
    std::vector<std::pair<Piece, at::Tensor>> whole = wholeTargets();
    whole.resize(params_.size() * (1 + stateKinds().size()));  // the outer state apart
    reader.read(whole);
  }
  restoreIfHeld(reader, outerTargets(), /*per_rank=*/false,
                "DiLoCo's outer state (the last meeting's parameters "
                "and the outer momentum)",
                "it starts from these parameters with no momentum", [&] {
                  for (size_t b = 0; b < periodic_.outerParameters().size(); ++b) {
                    periodic_.outerParameters()[b].copy_(reducer_.values(b));
                    periodic_.outerMomentum()[b].zero_();
                  }
                });
  restoreIfHeld(reader, rankTargets("codec/"), /*per_rank=*/true,
                "every rank's state of train.compression " + reducer_.codecName(),
                "the codec starts afresh (no error feedback carried over)", [] {});
  warnOfOtherCodecsState(reader);
  restoreIfHeld(reader, rankTargets("rank/"), /*per_rank=*/true, "every rank's own optimizer state",
                "every rank continues from rank 0's", [] {});
}

// A checkpoint written with another codec (a resumed train.compression: auto may choose
// another, or the file now names another) holds state this run cannot use: said once, so
// that a resume that leaves error feedback behind never does so silently.
void TrainingState::warnOfOtherCodecsState(CheckpointReader& reader) const {
  if (rank_ != 0) return;
  std::set<std::string> others;
  for (const auto& [key, shape] : reader.tensors()) {
    // "codec/LABEL/R/NAME": the label is what lies between "codec/" and the last two parts
    // (a label may hold slashes; a state name holds none).
    const size_t name = key.rfind('/'), rank = name == std::string::npos || name == 0
                                                   ? std::string::npos
                                                   : key.rfind('/', name - 1);
    if (key.rfind("codec/", 0) != 0 || rank == std::string::npos || rank <= 6) continue;
    const std::string label = key.substr(6, rank - 6);
    if (reducer_.codec() == nullptr || label != reducer_.codecName()) others.insert(label);
  }
  for (const std::string& label : others) {
    logWarn(
        fmt::format("checkpoint {} holds the state of train.compression {}, which this run "
                    "does not use ({}): it is not carried over",
                    reader.path(), label,
                    reducer_.codec() != nullptr ? "it synchronises with " + reducer_.codecName()
                                                : "it synchronises in float32"));
  }
}

void TrainingState::restoreIfHeld(CheckpointReader& reader,
                                  const std::vector<std::pair<Piece, at::Tensor>>& targets,
                                  bool per_rank, const std::string& what,
                                  const std::string& otherwise,
                                  const std::function<void()>& fallback) {
  if (targets.empty()) return;
  std::map<std::string, std::vector<int64_t>> held;
  for (const auto& [key, shape] : reader.tensors()) held.emplace(key, shape);
  // Every rank decides alike: every rank's tensors have the same names and shapes.
  const bool fits = (!per_rank || reader.info().worldSize() == world_) &&
                    std::all_of(targets.begin(), targets.end(), [&](const auto& target) {
                      const auto it = held.find(target.first.key);
                      return it != held.end() && it->second == target.first.shape;
                    });
  if (fits) return reader.read(targets);
  fallback();
  if (rank_ == 0) {
    logInfo(fmt::format(
        "checkpoint {} holds no {}{} in the shapes this run keeps: {}", reader.path(), what,
        per_rank ? fmt::format(" for {} ranks", world_) : std::string(), otherwise));
  }
}

int64_t TrainingState::resume(const RunCheckpoints& checkpoints) {
  std::string path;
  int64_t step = rank_ == 0 ? checkpoints.newest(&path) : 0;
  uint64_t digest = step > 0 ? checkpointDigest(path) : 0;
  const auto chosen =
      control_.allGather({static_cast<double>(step), static_cast<double>(digest >> 32),
                          static_cast<double>(digest & 0xFFFFFFFFu)})[0];
  step = static_cast<int64_t>(chosen[0]);
  digest = (static_cast<uint64_t>(chosen[1]) << 32) | static_cast<uint64_t>(chosen[2]);
  if (step == 0) return 0;
  path = checkpoints.pathOf(step);
  const uint64_t mine = checkpointDigest(path);
  const double verdict = mine == digest ? 0 : mine == 0 ? 1 : 2;  // same, missing, other
  const auto verdicts = control_.allGather({verdict});
  for (int r = 0; r < world_; ++r) {
    if (verdicts[r][0] == 0) continue;
    throw CheckpointError(fmt::format(
        "rank {} {} {}, the checkpoint of step {} that rank 0 resumes from. HINT: every rank "
        "resumes from the same file; train.checkpoint_dir must hold it on every node (a "
        "shared file system, or copy it there)",
        r, verdicts[r][0] == 1 ? "has no" : "holds other bytes in", path, step));
  }
  CheckpointReader reader(path);
  if (reader.info().step != step) {
    throw CheckpointError(
        fmt::format("checkpoint {}: its content holds another step ({}) than its name ({})", path,
                    reader.info().step, step));
  }
  checkResumable(reader);
  restore(reader);
  optimizer_.setSteps(step);
  if (rank_ == 0) logInfo(fmt::format("resumed from {} at step {}", path, step));
  return step;
}

}  // namespace collie::train
