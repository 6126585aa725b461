// One rank's training loop: micro-batches, overlapped bucketed all-reduce, optimizer step,
// metrics, weight-sync checks.
#include "train/trainer.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "collie/autocast.h"
#include "collie/error.h"
#include "collie/log.h"
#include "collie/model.h"
#include "core/strings.h"
#include "measure/calibrate.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/device.h"
#include "runtime/environment.h"
#include "runtime/faults.h"
#include "runtime/in_process.h"
#include "runtime/trace.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/reducer.h"
#include "train/report.h"
#include "train/stragglers.h"
#include "train/sync.h"

namespace collie::train {

// train.device: cpu over a backend that moves device memory only.
ConfigError hostTensorsOnDeviceBackend(const config::Experiment& e) {
  return ConfigError(fmt::format(
      "backend '{}' moves device memory only, but train.device is cpu (the model's tensors and "
      "gradient buckets would be host memory). HINT: set train.device: cuda, or choose a "
      "backend that moves host memory (gloo, ucx, or loopback with params memory: host)",
      e.backend.label));
}

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// bf16 autocast of the forward pass on the device's type; off again (and its cast cache
// dropped) after.
class Autocast {
 public:
  Autocast(bool on, at::DeviceType type) : on_(on), type_(type) {
    if (on_) autocast::set(type_, true, at::kBFloat16);
  }
  ~Autocast() {
    if (!on_) return;
    autocast::set(type_, false, at::kBFloat16);
    at::autocast::clear_cache();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_;
  at::DeviceType type_;
};

// Model construction draws the initial weights from LibTorch's global generator; ranks that
// are threads of one process take turns so that each gets the same, repeatable draw.
std::mutex& modelCreationMutex() {
  static std::mutex mu;
  return mu;
}

class RankTrainer {
 public:
  RankTrainer(const PluginLoader& loader, const config::Experiment& e,
              std::shared_ptr<Backend> backend, const Topology& topology,
              const std::string& out_dir)
      : e_(e),
        spec_(e.train),
        rank_(backend->rank()),
        world_(backend->size()),
        faults_(e.faults, rank_),
        device_(rankDevice(spec_.cuda ? "cuda" : "cpu", localRankOf(topology, rank_))),
        comm_(backend, e.backend.label, topology),
        control_(*backend, device_.is_cuda() ? device_.index() : 0),
        out_dir_(out_dir) {
    if (!spec_.cuda && !backend->capabilities().host_memory) throw hostTensorsOnDeviceBackend(e);
    comm_.setFaults(&faults_);
    if (device_.is_cuda()) installDeviceStreamHooks();
    if (spec_.trace) {
      tracer_ = std::make_unique<Tracer>();
      comm_.setTracer(tracer_.get());
    }
    comm_.setDebug(commDebugOf(e, out_dir, rank_));
    control_.setProgress(comm_.progress());
    checkMicroBatches();
    sharding_.grad_accum = spec_.grad_accum;
    addSchedulers(loader);
    createModel(loader);
    shape_ = model_->shape();
    source_ = openSource(e.data, shape_.seq_len + 1, shape_.vocab);
    for (const auto& named : model_->module().named_parameters()) {
      names_.push_back(named.key());
      params_.push_back(named.value());
    }
    checkParameterCount();
    if (spec_.auto_micro_batch) {
      sharding_.micro_batch = measureSplit();
    } else {
      for (int r = 0; r < world_; ++r) sharding_.micro_batch.push_back(spec_.microBatchOf(r));
    }
    mb_ = sharding_.micro_batch[rank_];
    lr_ = lrSchedule(spec_, sharding_.globalBatch());
  }

  Result run() {
    if (rank_ == 0) {
      logInfo(fmt::format(
          "training {} ({} parameters, {:.3g} FLOP/token) on {}, {} ranks, micro-batches {} x {} "
          "accumulation",
          e_.model.label, detail::withCommas(model_->parameterCount()), model_->flopsPerToken(),
          source_->describe(), world_, microBatchText(), spec_.grad_accum));
    }
    const CostModel cost =
        measure::calibrate(comm_.backend(), control_, comm_.topology(), DType::kF32).model;
    for (auto& rule : rules_) rule.choice.scheduler->useCostModel(cost);
    Reducer reducer(params_, spec_.bucket_bytes, comm_, spec_.overlap, spec_.sharding,
                    unitIndices());
    reducer_ = &reducer;
    reducer.broadcastParameters();
    std::unique_ptr<UnitGate> gate;
    GateInstalled installed(*model_);
    if (sharded()) {
      requireShardingCollectives(reducer);
      if (reducer.shardsParameters()) {
        reducer.keepShards();  // rank 0's values, broadcast
        reducer.endStep();     // and only they stay
        gate = makeUnitGate(reducer);
        installed.set(gate.get());
      }
      shards_ = reducer.parameterShards();
      optimizer_ = makeOptimizer(spec_, shards_);
    } else {
      optimizer_ = makeOptimizer(spec_, params_);
    }
    RunCheckpoints checkpoints(spec_);
    const int64_t start = resume(checkpoints);
    StepLog log(out_dir_, rank_, start > 0);
    const double predicted = predictComm(reducer, cost);

    std::vector<StepStats> stats;
    Result result = describeRun(reducer, cost, predicted);
    const auto started = Clock::now();
    for (int64_t s = start; s < spec_.steps; ++s) {
      faults_.beforeStep(s + 1);
      if (ProgressBoard* board = comm_.progress()) board->setStep(s + 1);
      stats.push_back(step(s, reducer));
      const int64_t samples = static_cast<int64_t>(stats.back().micro_batch) * spec_.grad_accum;
      log.write(s, samples, samples * shape_.seq_len, stats.back());
      if ((s + 1) % spec_.log_every == 0 || s + 1 == spec_.steps) {
        progress(s, stats.back(), since(started) / static_cast<double>(s - start + 1));
      }
      watchStragglers(s, start, stats.back());
      rebalance(s, start, stats.back());
      if (spec_.verify_sync_every > 0 && (s + 1) % spec_.verify_sync_every == 0 &&
          s + 1 != spec_.steps) {
        withParameters([&] { enforce(verifyWeights(comm_, control_, params_, names_, s + 1)); });
      }
      if (checkpoints.dueAfter(s + 1)) saveState(checkpoints, s + 1);
    }
    withParameters([&] {
      result.sync = verifyWeights(comm_, control_, params_, names_, spec_.steps);
      result.weight_sample = sampleWeights();
    });
    enforce(result.sync);
    std::vector<RankSummary> ranks;
    for (const auto& packed : control_.allGather(summariseSteps(stats).pack()))
      ranks.push_back(RankSummary::unpack(packed));
    combineRanks(ranks, sharding_.globalBatch() / spec_.grad_accum, &result);
    result.allreduce_bytes = stats.empty() ? 0 : stats.back().sync.bytes;
    result.comm_memory = commMemory(stats);
    result.micro_batch = sharding_.micro_batch;
    result.rebalances = rebalances_;
    if (!attributions_.empty()) {
      const StragglerReport report = summarise(attributions_);
      result.straggler_score = report.score;
      result.straggler_wait_seconds = report.wait;
      result.arrived_last = report.last_share;
      result.step_at_fastest_seconds = report.step_at_fastest;
      result.straggler_steps = report.steps;
    }
    measureHeld(reducer, &result);
    if (tracer_) writeExperimentTrace(*tracer_, comm_, control_, e_, out_dir_);
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB (of the process: ranks as threads share it)
    for (const auto& r : control_.allGather({static_cast<double>(usage.ru_maxrss) * 1024}))
      result.peak_rss_bytes.push_back(r[0]);
    return result;
  }

 private:
  bool sharded() const { return spec_.sharding != config::ShardedState::kNone; }
  bool shardsParameters() const { return spec_.sharding == config::ShardedState::kParameters; }

  // Installs a stage-3 gate in the model for as long as it lives.
  class GateInstalled {
   public:
    explicit GateInstalled(Model& model) : model_(model) {}
    ~GateInstalled() { model_.setUnitGate(nullptr); }
    GateInstalled(const GateInstalled&) = delete;
    GateInstalled& operator=(const GateInstalled&) = delete;
    void set(UnitGate* gate) { model_.setUnitGate(gate); }

   private:
    Model& model_;
  };

  // Runs `fn` with every parameter's values present: stage 3 gathers them all (every rank
  // takes part) and frees them after.
  template <typename F>
  void withParameters(F fn) {
    if (!shardsParameters()) return fn();
    reducer_->gatherAll();
    fn();
    reducer_->endStep();
  }

  // The model's units as parameter indices; a name its module lacks is the plugin's bug.
  // Stage 3 needs units.
  std::vector<std::vector<size_t>> unitIndices() const {
    std::map<std::string, size_t> index;
    for (size_t k = 0; k < names_.size(); ++k) index[names_[k]] = k;
    std::vector<std::vector<size_t>> units;
    for (const auto& unit : model_->units()) {
      units.emplace_back();
      for (const auto& name : unit) {
        const auto it = index.find(name);
        if (it == index.end()) {
          throw InternalError(fmt::format(
              "model '{}' names parameter '{}' in units(), which its module does not have",
              e_.model.label, name));
        }
        units.back().push_back(it->second);
      }
    }
    if (shardsParameters() && units.empty()) {
      throw ConfigError(fmt::format(
          "{}: train.sharding: parameters needs the model's units, and model '{}' declares "
          "none. HINT: use train.sharding: gradients, or give the model units() "
          "(docs/writing-a-model.md)",
          e_.file, e_.model.label));
    }
    return units;
  }

  // The optimizer's state tensors by name ("exp_avg/3": of parameter 3 unsharded, of bucket
  // 3's block sharded), and the kinds of state they hold ("exp_avg", "exp_avg_sq").
  std::map<std::string, at::Tensor> optimizerState() const {
    std::map<std::string, at::Tensor> out;
    for (auto& [name, tensor] : optimizer_->state()) out.emplace(name, tensor);
    return out;
  }
  std::vector<std::string> stateKinds() const {
    std::vector<std::string> kinds;
    for (const auto& [name, tensor] : optimizer_->state()) {
      const std::string kind = name.substr(0, name.rfind('/'));
      if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    }
    return kinds;
  }
  // A state tensor's name in checkpoints: the parameter's, or "exp_avg/NAME".
  std::string stateKey(const std::string& kind, size_t k) const {
    return kind.empty() ? names_[k] : kind + "/" + names_[k];
  }

  // Sharded: a piece of rank r's block of a state kind ("" for the parameters' values) and
  // where it lies in its bucket's block: of every parameter, the elements inside the block.
  struct BlockPiece {
    Piece piece;
    std::string kind;
    size_t bucket;
    int64_t at;  // elements into the block
  };
  std::vector<BlockPiece> blockPieces(int r) const {
    std::vector<std::string> kinds = {""};
    for (const auto& kind : stateKinds()) kinds.push_back(kind);
    std::vector<BlockPiece> out;
    for (const auto& kind : kinds) {
      for (size_t k = 0; k < params_.size(); ++k) {
        const size_t b = reducer_->bucketOf(k);
        const int64_t block = reducer_->shardNumel(b), begin = reducer_->offsetOf(k);
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
  // Where each of rank r's block pieces lives in this rank's tensors (r == rank_).
  std::vector<std::pair<Piece, at::Tensor>> blockTargets() const {
    const auto state = optimizerState();
    std::vector<std::pair<Piece, at::Tensor>> out;
    for (const BlockPiece& p : blockPieces(rank_)) {
      const at::Tensor& block =
          p.kind.empty() ? shards_[p.bucket] : state.at(fmt::format("{}/{}", p.kind, p.bucket));
      out.emplace_back(p.piece, block.narrow(0, p.at, p.piece.numel));
    }
    return out;
  }
  // Unsharded: every state tensor whole, parameters first.
  std::vector<std::pair<Piece, at::Tensor>> wholeTargets() const {
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
    return out;
  }

  // Writes the checkpoint of `step`. Unsharded, rank 0 writes every tensor whole into one
  // file (every rank holds the same, as verified); sharded, every rank writes its blocks
  // and, once every rank has, the same manifest.
  void saveState(const RunCheckpoints& checkpoints, int64_t step) {
    const CheckpointInfo info{step, runIdentity(e_), sharding_.micro_batch, spec_.grad_accum,
                              config::shardedStateName(spec_.sharding)};
    if (!sharded()) {
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
      mine = writeShard(dir, rank_, world_, info, blockTargets());
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
      for (const BlockPiece& p : blockPieces(r)) file.pieces.push_back(p.piece);
      files.push_back(std::move(file));
    }
    writeManifest(dir, info, files, rank_);
    checkpoints.prune();
    if (rank_ == 0) logInfo(fmt::format("checkpoint: {} ({} shards)", dir, world_));
  }

  // Whether `reader`'s checkpoint can continue this run: the same model, optimizer and data
  // seed, and the same samples per step (their split over ranks, so the world size, may
  // differ: the sums are then added in another order).
  void checkResumable(const CheckpointReader& reader) const {
    const CheckpointInfo& info = reader.info();
    const std::string mine =
        reader.formatOne() ? formatOneIdentity(e_, sharding_.micro_batch) : runIdentity(e_);
    if (info.identity != mine) {
      throw CheckpointError("checkpoint " + reader.path() +
                            " was written by another run: it holds " + info.identity +
                            ", this run is " + mine +
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

  // Loads `reader`'s tensors into the parameters and the optimizer state: unsharded, every
  // tensor whole; sharded, this rank's blocks (from whichever files hold them: any world
  // size, sharding or bucket size wrote them), the parameters' then all-gathered.
  void restoreState(CheckpointReader& reader) {
    at::NoGradGuard no_grad;
    const size_t expected = params_.size() * (1 + stateKinds().size());
    if (reader.tensors().size() != expected) {
      throw CheckpointError(fmt::format("checkpoint {}: holds {} tensors, this run has {}",
                                        reader.path(), reader.tensors().size(), expected));
    }
    if (!sharded()) return reader.read(wholeTargets());
    for (auto& shard : shards_) shard.zero_();  // the padding
    for (auto& [name, tensor] : optimizer_->state()) tensor.zero_();
    reader.read(blockTargets());
    if (!shardsParameters()) reducer_->gatherParameters();  // stage 3 gathers when it computes
  }

  // The collectives bucket b takes every step, sizes only: an all-reduce, or sharded a
  // reduce-scatter of the bucket and an all-gather of its blocks.
  std::vector<CollectiveArgs> stepCollectives(const Reducer& reducer, size_t b) const {
    const size_t whole = static_cast<size_t>(reducer.bucketNumel(b));
    // In the buckets' memory: a scheduler may decline a kind (native over nccl takes only
    // device memory).
    const MemoryKind memory = spec_.cuda ? MemoryKind::kCuda : MemoryKind::kHost;
    auto collective = [&](Collective coll, size_t data, size_t output) {
      CollectiveArgs args;
      args.coll = coll;
      args.data.count = data;
      args.output.count = output;
      args.data.memory = args.output.memory = memory;
      args.data.device = args.output.device = device_.is_cuda() ? device_.index() : 0;
      return args;
    };
    if (!sharded()) return {collective(Collective::kAllReduce, whole, 0)};
    const size_t block = whole / static_cast<size_t>(world_);
    std::vector<CollectiveArgs> out = {collective(Collective::kReduceScatter, whole, block),
                                       collective(Collective::kAllGather, block, whole)};
    // Stage 3 gathers a unit's bucket for forward and again for backward, every micro-batch
    // (a root bucket once a step).
    if (shardsParameters() && !reducer.isRoot(b)) {
      for (int k = 1; k < 2 * spec_.grad_accum; ++k) out.push_back(out.back());
    }
    return out;
  }

  // Sharding needs the rules to run reduce-scatter and all-gather of every bucket: said
  // before the first step rather than at its first collective.
  void requireShardingCollectives(const Reducer& reducer) const {
    for (size_t b = 0; b < reducer.bucketCount(); ++b) {
      for (const CollectiveArgs& args : stepCollectives(reducer, b)) {
        std::string why;
        if (comm_.select(args, rules_, &why) != nullptr) continue;
        throw ConfigError(fmt::format(
            "{}: train.sharding: {} needs {} of {} on {} ranks, which no rule of "
            "train.scheduler runs: {}. HINT: use a scheduler that has both reduce_scatter "
            "and allgather (ring does on any group size), or train.sharding: none",
            e_.file, config::shardedStateName(spec_.sharding), collectiveName(args.coll),
            formatBytes(std::max(args.data.count, args.output.count) * 4), world_, why));
      }
    }
  }

  // Continues from a checkpoint: the step to start from, 0 without one. Rank 0 decides which
  // (its newest) and every rank loads that file, after every rank has said it holds the same
  // bytes: on several nodes without a shared file system, each rank's newest file may differ.
  int64_t resume(const RunCheckpoints& checkpoints) {
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
    restoreState(reader);
    optimizer_->setSteps(step);
    if (rank_ == 0) logInfo(fmt::format("resumed from {} at step {}", path, step));
    return step;
  }

  // `count` samples from sample `first` on, as (count, T + 1) tokens on the rank's device.
  at::Tensor deviceBatch(uint64_t first, int64_t count) const {
    at::Tensor tokens = batch(*source_, first, count, shape_.seq_len + 1);  // (count, T + 1)
    return device_.is_cuda() ? tokens.to(device_) : tokens;
  }

  // The model's loss of `tokens` (B, T + 1), under bf16 autocast when configured.
  at::Tensor lossOf(const at::Tensor& tokens) {
    Autocast autocast(spec_.bf16, device_.type());
    return model_->loss(tokens);
  }

  // micro_batch: auto. Every rank times forward + backward of an equal probe batch; the
  // global batch is then split in proportion to the measured speeds, the same on every rank.
  std::vector<int> measureSplit() {
    if (spec_.global_batch < world_) {
      throw ConfigError(fmt::format(
          "{}: train.global_batch: expected at least one sample per rank ({}), found {}", e_.file,
          world_, spec_.global_batch));
    }
    const int probe = std::max(1, spec_.global_batch / world_);
    at::Tensor tokens = deviceBatch(0, probe);  // (probe, T + 1)
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < 3; ++i) {  // the first pays for allocation; keep the best
      const auto start = Clock::now();
      lossOf(tokens).backward();
      best = std::min(best, since(start));
    }
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
    std::vector<double> speeds;
    for (const auto& r : control_.allGather({probe / best})) speeds.push_back(r[0]);
    std::vector<int> split = proportionalSplit(spec_.global_batch, speeds);
    if (rank_ == 0) {
      std::vector<std::string> parts;
      for (int r = 0; r < world_; ++r) {
        parts.push_back(fmt::format("rank {} {:.1f} samples/s -> {}", r, speeds[r], split[r]));
      }
      logInfo("micro_batch auto: " + detail::join(parts, ", "));
    }
    return split;
  }

  void checkMicroBatches() const {
    if (spec_.auto_micro_batch) return;
    const auto n = spec_.micro_batch.size();
    if (n != 1 && static_cast<int>(n) != world_) {
      throw ConfigError(fmt::format(
          "{}: train.micro_batch: expected one size for every rank or {} sizes (one per rank), "
          "found {}. HINT: the job has {} ranks",
          e_.file, world_, n, world_));
    }
  }

  void addSchedulers(const PluginLoader& loader) {
    rules_ = createRules(loader, spec_.scheduler);
    for (const auto& rule : rules_)
      comm_.addRule(rule.choice.label, rule.choice.scheduler, rule.max_bytes);
  }

  void createModel(const PluginLoader& loader) {
    std::lock_guard<std::mutex> lock(modelCreationMutex());
    torch::manual_seed(spec_.seed);
    Params params = e_.model.params;
    model_ = loader.createModel(e_.model.plugin, params);
    model_->module().to(device_);  // drawn on the CPU (the same draw on every device), moved
    {  // the rank's own generator, of the training device's kind, for the model's draws
      at::Generator global = at::globalContext().defaultGenerator(device_);
      std::lock_guard<std::mutex> lock(global.mutex());
      generator_ = global.clone();
    }
    model_->setGenerator(generator_);
    if (spec_.grad_checkpointing && !model_->setGradCheckpointing(true)) {
      throw ConfigError("train.grad_checkpointing: model '" + e_.model.label +
                        "' cannot recompute activations. HINT: set it to false");
    }
  }

  void checkParameterCount() const {
    int64_t actual = 0;
    for (const auto& p : params_) actual += p.numel();
    if (actual != model_->parameterCount()) {
      throw InternalError(fmt::format(
          "model '{}' reports {} parameters by its formula, but its module has {}: the plugin's "
          "parameterCount() is wrong",
          e_.model.label, model_->parameterCount(), actual));
    }
  }

  StepStats step(int64_t s, Reducer& reducer) {
    StepStats st;
    if (tracer_) tracer_->setStep(s + 1);
    const TraceSpan traced(tracer_.get(), "step");
    const auto start = Clock::now();
    reseed(s);
    const std::vector<at::Tensor> global_generators = globalGeneratorStates();
    const int mb = mb_;
    st.micro_batch = mb;
    const double global = static_cast<double>(sharding_.globalBatch());
    // tokens: this micro-batch's share of the step's predictions; uniform: DDP's mean.
    const double scale = spec_.tokens_weighting
                             ? static_cast<double>(mb) / global
                             : 1.0 / (static_cast<double>(spec_.grad_accum) * world_);
    double loss_sum = 0;
    for (int k = 0; k < spec_.grad_accum; ++k) {
      at::Tensor tokens = deviceBatch(sharding_.firstSample(s, k, rank_), mb);  // (mb, T + 1)
      if (k + 1 == spec_.grad_accum) reducer.arm();
      auto t = Clock::now();
      at::Tensor loss;
      {
        const TraceSpan forward(tracer_.get(), "forward", k);
        if (shardsParameters()) reducer.gatherRoot();
        loss = lossOf(tokens);
      }
      st.forward += since(t);
      const double value = loss.item<double>();
      if (!std::isfinite(value)) {  // stop before its gradients can reach the weights
        throw TrainingError(fmt::format(
            "rank {}: the loss is {} at step {} (micro-batch {} of {}); stopped before the "
            "update, the weights are those after step {}. HINT: lower train.lr, set "
            "train.grad_clip, or check the data",
            rank_, value, s + 1, k + 1, spec_.grad_accum, s));
      }
      t = Clock::now();
      {
        const TraceSpan backward(tracer_.get(), "backward", k);
        (loss * scale).backward();
        if (shardsParameters()) reducer.afterBackward();
      }
      st.backward += since(t);
      loss_sum += value;
    }
    st.loss = loss_sum / spec_.grad_accum;
    {
      const TraceSpan waited(tracer_.get(), "gradient sync");
      st.sync = reducer.finish();
    }
    auto t = Clock::now();
    {
      const TraceSpan optimizer(tracer_.get(), "optimizer");
      if (sharded()) {
        for (size_t b = 0; b < shards_.size(); ++b)
          shards_[b].mutable_grad() = reducer.gradShard(b);
      }
      st.grad_norm = clipGradients(reducer);
      st.lr = lr_.at(s);
      optimizer_->step(st.lr);
      reducer.endStep();  // the next step starts afresh
    }
    st.optimizer = since(t);
    if (sharded() && !shardsParameters()) {  // stage 3 gathers in the next forward
      // Timed as communication, all of it exposed; sync.bytes stays the gradient's bytes.
      const SyncTiming gathered = reducer.gatherParameters();
      st.sync.comm_seconds += gathered.comm_seconds;
      st.sync.exposed_seconds += gathered.exposed_seconds;
      st.sync.gather_seconds += gathered.gather_seconds;
      st.sync.gather_exposed_seconds += gathered.gather_exposed_seconds;
      st.sync.collectives.insert(st.sync.collectives.end(), gathered.collectives.begin(),
                                 gathered.collectives.end());
    }
    checkNoGlobalDraws(global_generators, s);
    st.step = since(start);
    return st;
  }

  // Dropout's randomness is a function of (seed, rank, step), so a resumed run draws what
  // the uninterrupted one would have. It is the rank's generator, not LibTorch's global one:
  // ranks that are threads of one process would share that, in whatever order they run.
  void reseed(int64_t s) {
    const uint64_t seed =
        spec_.seed + 1 + static_cast<uint64_t>(rank_) + static_cast<uint64_t>(s) * 0x9E3779B9ull;
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_current_seed(seed);
  }

  // The states of LibTorch's global generators the model could draw from (the CPU's, and the
  // training device's), to tell whether a step drew from them.
  std::vector<at::Tensor> globalGeneratorStates() const {
    std::vector<at::Tensor> states;
    auto stateOf = [&](const at::Device& device) {
      at::Generator generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      states.push_back(generator.get_state());
    };
    stateOf(at::Device(at::kCPU));
    if (!device_.is_cpu()) stateOf(device_);
    return states;
  }

  // Refuses a model whose step drew from a global generator (Model::setGenerator says why).
  void checkNoGlobalDraws(const std::vector<at::Tensor>& before, int64_t s) const {
    const std::vector<at::Tensor> after = globalGeneratorStates();
    for (size_t i = 0; i < before.size(); ++i) {
      if (at::equal(before[i], after[i])) continue;
      throw PluginError(fmt::format(
          "model '{}' drew from LibTorch's global random generator ({}) during step {}: ranks "
          "that are threads of one process share it, so the draws would follow the threads' "
          "timing and a resumed run would draw others. HINT: draw from the generator the "
          "trainer passes to Model::setGenerator (collie::dropout takes it; "
          "docs/writing-a-model.md)",
          e_.model.label, i == 0 ? "cpu" : device_.str(), s + 1));
    }
  }

  // The global L2 norm of the (already all-reduced, identical) gradients; scaled down to
  // train.grad_clip when it is larger. Sharded, each rank holds the reduced gradient of its
  // blocks only: the squares of every rank's blocks are gathered and added in rank order,
  // the same sum on every rank. Unsharded, the rank adds the same blocks' squares in the same
  // order itself, so that the norm, and so the clipped weights, are the sharded run's bit
  // for bit.
  double clipGradients(const Reducer& reducer) {
    double squares = 0;
    std::vector<at::Tensor> grads;
    if (sharded()) {
      for (const auto& shard : shards_) grads.push_back(shard.grad());
      for (const auto& r : control_.allGather({localSquares(grads)})) squares += r[0];
    } else {
      for (int64_t r = 0; r < world_; ++r) {
        grads.clear();
        for (size_t b = 0; b < reducer.bucketCount(); ++b) grads.push_back(reducer.gradBlock(b, r));
        squares += localSquares(grads);
      }
    }
    const double norm = std::sqrt(squares);
    if (spec_.grad_clip > 0 && norm > spec_.grad_clip) {
      const double factor = spec_.grad_clip / (norm + 1e-6);
      for (auto& p : sharded() ? shards_ : params_) p.mutable_grad().mul_(factor);
    }
    return norm;
  }

  static double localSquares(const std::vector<at::Tensor>& grads) {
    double squares = 0;
    for (const auto& g : grads) {
      const double n = g.norm().item().toDouble();
      squares += n * n;
    }
    return squares;
  }

  // Every rank takes part (the loss is averaged over the job); rank 0 prints the line of
  // step `s` (0-based).
  void progress(int64_t s, const StepStats& last, double seconds_per_step) {
    double loss = 0;
    for (const auto& r : control_.allGather({last.loss * last.micro_batch})) loss += r[0];
    loss /= static_cast<double>(sharding_.globalBatch() / spec_.grad_accum);
    if (rank_ != 0) return;
    const double tokens = static_cast<double>(sharding_.globalBatch() * shape_.seq_len);
    logInfo(progressLine(s + 1, spec_.steps, loss, last, tokens, seconds_per_step));
  }

  void enforce(const SyncCheck& check) {
    if (check.identical) {
      logDebug(check.describe(world_));
      return;
    }
    if (spec_.fail_on_divergence) {
      throw CommError(check.describe(world_) +
                      ". HINT: a scheduler or backend returned different sums on different "
                      "ranks; `collie plugin-check` finds which");
    }
    if (rank_ == 0) logWarn(check.describe(world_) + " (train.on_divergence: warn)");
  }

  // The all-reduce time per step the calibrated model predicts for these buckets.
  double predictComm(const Reducer& reducer, const CostModel& cost) const {
    double total = 0;
    for (size_t b = 0; b < reducer.bucketCount(); ++b) {
      for (const CollectiveArgs& args : stepCollectives(reducer, b)) {
        std::string why;
        const auto* rule = comm_.select(args, rules_, &why);
        if (rule == nullptr) return kNoPrediction;
        total += rule->choice.scheduler->predictSeconds(args, comm_.topology(), cost);
      }
    }
    return total;
  }

  // Straggler attribution: this rank's timings of the steps since the last gathering are
  // all-gathered every straggler_every steps (and after the last step), every rank
  // attributes them alike, and rank 0 warns about a rank that stays below the threshold.
  // The run's first step (warm-up) is left out.
  void watchStragglers(int64_t s, int64_t start, const StepStats& st) {
    if (spec_.straggler_every == 0 || world_ == 1) return;
    if (s > start) {
      StragglerSample sample{st.step, st.forward + st.backward, {}};
      for (const auto& c : st.sync.collectives) sample.collectives.push_back(c.seconds);
      pending_.push_back(std::move(sample));
    }
    if (static_cast<int>(pending_.size()) < spec_.straggler_every && s + 1 != spec_.steps) return;
    const auto gathered = control_.allGather(packSamples(pending_));
    pending_.clear();
    std::vector<std::vector<StragglerSample>> per_rank;
    for (const auto& packed : gathered) per_rank.push_back(unpackSamples(packed));
    std::vector<StepAttribution> window;
    for (size_t k = 0; k < per_rank.front().size(); ++k) {
      std::vector<StragglerSample> ranks;
      for (const auto& samples : per_rank) ranks.push_back(samples.at(k));
      window.push_back(attributeStep(ranks));
    }
    if (window.empty()) return;
    attributions_.insert(attributions_.end(), window.begin(), window.end());
    for (const int r : watch_.update(window)) {
      const StragglerReport& report = watch_.recent();
      if (rank_ != 0) continue;
      const Topology& t = comm_.topology();
      const std::string host =
          r < static_cast<int>(t.node_of_rank.size()) ? t.node_names[t.node_of_rank[r]] : "?";
      logWarn(fmt::format(
          "straggler: rank {} (host {}) scored below {} over the last {} steps (step {}): score "
          "{:.2f}, "
          "its compute takes {:.4f} s against the fastest rank's {:.4f} s; the others waited "
          "{:.4f} s per step for it",
          r, host, watch_.threshold(), watch_.window(), s + 1, report.score[r],
          report.median_compute[r],
          *std::min_element(report.median_compute.begin(), report.median_compute.end()),
          report.wait.empty() ? 0.0 : *std::max_element(report.wait.begin(), report.wait.end())));
    }
  }

  // micro_batch: auto, during the run: every rebalance_every steps every rank's median
  // compute time per sample over those steps is all-gathered, and the global batch split
  // again, halfway towards the proportion of the speeds (data.cc resplit; the same split on
  // every rank). The new split is taken only when it predicts the slowest rank's compute (its
  // samples times its time per sample) at least rebalance_hysteresis shorter than the current one,
  // so measurement noise does not move samples back and forth. The step reads the same samples
  // whatever the split and tokens weighting weighs each by 1/global, so the update is the same.
  void rebalance(int64_t s, int64_t start, const StepStats& st) {
    if (!spec_.auto_micro_batch || spec_.rebalance_every == 0 || world_ == 1) return;
    if (s > start) {  // the first step allocates
      per_sample_.push_back((st.forward + st.backward) /
                            (static_cast<double>(st.micro_batch) * spec_.grad_accum));
    }
    if (static_cast<int>(per_sample_.size()) < spec_.rebalance_every || s + 1 == spec_.steps)
      return;
    const double mine = measure::median(per_sample_);
    per_sample_.clear();
    std::vector<double> per_sample;
    for (const auto& r : control_.allGather({mine})) per_sample.push_back(r[0]);
    const std::vector<int> now = sharding_.micro_batch;
    const Resplit change = resplit(spec_.global_batch, now, per_sample, spec_.rebalance_hysteresis);
    if (rank_ == 0) {
      std::vector<std::string> parts;
      for (int r = 0; r < world_; ++r) {
        parts.push_back(fmt::format("rank {} {:.1f} samples/s {}", r, 1 / per_sample[r],
                                    change.take ? fmt::format("{} -> {}", now[r], change.split[r])
                                                : std::to_string(now[r])));
      }
      const double accum = spec_.grad_accum;
      const std::string line = fmt::format(
          "micro_batch auto after step {}: {}; the slowest rank's compute {:.4f} s, {:.4f} s "
          "with [{}]",
          s + 1, detail::join(parts, ", "), change.slowest_now * accum, change.slowest_next * accum,
          fmt::join(change.split, ", "));
      if (change.take) {
        logInfo(line);
      } else {
        logDebug(line +
                 fmt::format(" (kept: not {:.0f}% shorter)", 100 * spec_.rebalance_hysteresis));
      }
    }
    if (!change.take) return;
    sharding_.micro_batch = change.split;
    mb_ = change.split[rank_];
    rebalances_.push_back({s + 1, change.split});
  }

  Result describeRun(const Reducer& reducer, const CostModel& cost, double predicted) const {
    Result r;
    r.run = e_.matrix_point;
    r.name = e_.name;
    r.model = e_.model.label;
    r.scheduler = spec_.scheduler.label;
    r.backend = e_.backend.label;
    r.ranks = world_;
    r.parameters = model_->parameterCount();
    r.flops_per_token = model_->flopsPerToken();
    r.steps = spec_.steps;
    r.world_batch_samples = sharding_.globalBatch();
    r.world_batch_tokens = sharding_.globalBatch() * shape_.seq_len;
    r.micro_batch = sharding_.micro_batch;
    r.tokens_weighting = spec_.tokens_weighting;
    r.buckets = static_cast<int>(reducer.bucketCount());
    r.predicted_comm_seconds = predicted;
    r.between_nodes = comm_.topology().nodeCount() > 1;
    const LinkCost& link = r.between_nodes ? cost.inter : cost.intra;
    r.link_alpha = link.alpha;
    r.link_beta = link.beta;

    r.token_budgets = spec_.token_budgets;
    r.peak_flops = spec_.peak_flops;
    r.sharding = config::shardedStateName(spec_.sharding);
    if (device_.is_cuda()) r.device = fmt::format("{} ({})", device_.str(), torchDescription());
    if (spec_.cuda && emulatedDevice()) r.device = "emulated device (COLLIE_EMULATED_DEVICE=1)";
    return r;
  }

  // Which memory the last step's collectives ran on (Result::comm_memory).
  std::string commMemory(const std::vector<StepStats>& stats) const {
    if (!spec_.cuda) return "host memory";  // train.device: cuda is a GPU or the emulated device
    if (stats.empty()) return "device memory";
    for (const Provenance& p : stats.back().sync.collectives) {
      if (p.staged) return "host-staged";
    }
    return "device memory";
  }

  // What rank 0 holds between steps, by kind: the buffers themselves, not a formula.
  void measureHeld(const Reducer& reducer, Result* r) {
    const HeldBytes held = reducer.held();
    r->parameter_bytes = held.parameters;
    r->gradient_bytes = held.gradients;
    r->gathered_peak_bytes = held.gathered_peak;
    r->optimizer_bytes = 0;
    for (auto& [name, tensor] : optimizer_->state())
      r->optimizer_bytes += static_cast<uint64_t>(tensor.numel()) * 4;
  }

  // kWeightSamples of the weights, evenly spaced over all parameters in named order.
  std::vector<double> sampleWeights() const {
    int64_t total = 0;
    for (const auto& p : params_) total += p.numel();
    std::vector<double> out;
    if (total == 0) return out;
    const int64_t n = std::min<int64_t>(kWeightSamples, total);
    int64_t begin = 0, i = 0;
    for (const auto& p : params_) {
      const int64_t end = begin + p.numel();
      if (i < n && i * total / n < end) {
        const at::Tensor flat = p.detach().reshape({-1}).to(at::kCPU, at::kDouble).contiguous();
        const double* values = flat.data_ptr<double>();
        for (; i < n && i * total / n < end; ++i) out.push_back(values[i * total / n - begin]);
      }
      begin = end;
    }
    return out;
  }

  std::string microBatchText() const {
    return fmt::format("[{}]", fmt::join(sharding_.micro_batch, ", "));
  }

  const config::Experiment& e_;
  const config::TrainSpec& spec_;
  int rank_, world_;
  Faults faults_;                   // outlives comm_, which takes them
  at::Device device_;               // train.device: where the model and its state live
  std::unique_ptr<Tracer> tracer_;  // train.trace; outlives comm_, which records into it
  Communicator comm_;
  Control control_;
  std::string out_dir_;
  std::vector<Communicator::Rule> rules_;
  std::shared_ptr<Model> model_;
  at::Generator generator_;  // the rank's: every random draw of the model's (dropout)
  ModelShape shape_;
  std::unique_ptr<TokenSource> source_;
  Sharding sharding_;
  std::vector<double> per_sample_;     // auto: compute seconds per sample since the last split
  std::vector<Rebalance> rebalances_;  // auto: the splits taken during the run
  int mb_ = 0;                         // this rank's samples per micro-batch
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<Optimizer> optimizer_;
  Reducer* reducer_ = nullptr;            // while run() runs
  std::vector<at::Tensor> shards_;        // sharded: this rank's block of every bucket's parameters
  std::vector<StragglerSample> pending_;  // this rank's steps not gathered yet
  std::vector<StepAttribution> attributions_;  // every gathered step, for the summary
  StragglerWatch watch_{world_, spec_.straggler_threshold, spec_.straggler_window};
  LrSchedule lr_;
};

}  // namespace

Result run(const PluginLoader& loader, const config::Experiment& e, const std::string& out_dir) {
  at::set_num_threads(e.threads_per_rank);
  return runInProcessForRank0<Result>(
      loader, e.backend, e.nproc_per_node, [&](std::shared_ptr<Backend> backend) {
        return RankTrainer(loader, e, std::move(backend), e.topology, out_dir).run();
      });
}

Result runRank(const PluginLoader& loader, const config::Experiment& e,
               std::shared_ptr<Backend> backend, const Topology& topology,
               const std::string& out_dir) {
  at::set_num_threads(e.threads_per_rank);
  RankTrainer trainer(loader, e, std::move(backend), topology, out_dir);
  return trainer.run();
}

}  // namespace collie::train
