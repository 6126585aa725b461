// One rank's training loop: micro-batches, overlapped bucketed all-reduce, optimizer step,
// metrics, weight-sync checks.
#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include "collie/autocast.h"
#include "collie/codec.h"
#include "collie/error.h"
#include "collie/log.h"
#include "collie/model.h"
#include "core/strings.h"
#include "measure/calibrate.h"
#include "measure/interface_bytes.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/device.h"
#include "runtime/environment.h"
#include "runtime/faults.h"
#include "runtime/in_process.h"
#include "runtime/trace.h"
#include "train/checkpoint.h"
#include "train/codec_group.h"
#include "train/data.h"
#include "train/local_sync.h"
#include "train/lr_schedule.h"
#include "train/memory_ledger.h"
#include "train/optimizer.h"
#include "train/reducer.h"
#include "train/report.h"
#include "train/step_watchers.h"
#include "train/sync.h"
#include "train/training_state.h"
#include "util/system.h"

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

// This process among a job's: its host's name and its pid, as one number ranks compare.
double processId() {
  const uint64_t host = std::hash<std::string>{}(detail::hostName()) % (uint64_t{1} << 30);
  return static_cast<double>(host * (uint64_t{1} << 22) + static_cast<uint64_t>(::getpid()));
}

// On the lab, what the hosts' interfaces counted sent at a few marks of the run: every rank
// meets at a barrier (so that the host's other ranks have sent what comes before the mark)
// and the first rank of each host reads its host's counters (measure/interface_bytes.h).
// Elsewhere nothing is read and no barrier is taken.
class InterfaceMarks {
 public:
  InterfaceMarks(bool on_lab, bool host_reader, Control& control)
      : on_lab_(on_lab), reader_(host_reader), control_(control) {}

  void mark(bool barrier = true) {
    if (!on_lab_) return;
    if (barrier) control_.barrier();
    marks_.push_back(reader_ ? measure::readInterfaceBytes() : std::nullopt);
  }
  // The bytes sent between marks `from` and `to`, or -1 where this rank read none.
  double sent(size_t from, size_t to) const {
    if (to >= marks_.size() || !marks_[from] || !marks_[to]) return -1;
    return static_cast<double>(marks_[to]->sent - marks_[from]->sent);
  }

 private:
  bool on_lab_, reader_;
  Control& control_;
  std::vector<std::optional<measure::InterfaceBytes>> marks_;
};

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
    loader_ = &loader;  // run() makes fresh codecs to time (and, auto, the chosen one)
    if (spec_.choosesCompression()) {
      for (const config::PluginRef& c : spec_.compression_candidates) {
        Params params = c.params;
        candidates_.push_back(c.plugin == "none" ? nullptr : loader.createCodec(c.plugin, params));
      }
    } else if (spec_.compresses()) {
      Params params = spec_.compression.params;
      codec_ = loader.createCodec(spec_.compression.plugin, params);
      codec_label_ = spec_.compression.label;
    }
    shape_ = model_->shape();
    source_ = openSource(e.data, shape_.seq_len + 1, shape_.vocab);
    for (const auto& named : model_->module().named_parameters()) {
      names_.push_back(named.key());
      params_.push_back(named.value());
    }
    checkParameterCount();
    unit_parameters_ = unitParameters();
    if (spec_.auto_micro_batch) {
      sharding_.micro_batch = measureSplit();
    } else {
      for (int r = 0; r < world_; ++r) sharding_.micro_batch.push_back(spec_.microBatchOf(r));
    }
    mb_ = sharding_.micro_batch[rank_];
    lr_ = lrSchedule(spec_, sharding_.globalBatch());
  }

  // The run, top to bottom: set up what the steps share, continue from a checkpoint, step,
  // then check the weights and gather every rank's numbers.
  Result run() {
    // Barriers by the config, which every rank shares; counters only inside a lab host.
    InterfaceMarks interfaces(
        e_.lab.hosts > 0, comm_.topology().localRank(rank_) == 0 && !measure::labHostName().empty(),
        control_);
    interfaces.mark();  // 0: before calibration
    announce();
    const CostModel cost =
        measure::calibrate(comm_.backend(), control_, comm_.topology(), DType::kF32).model;
    for (auto& rule : rules_) rule.choice.scheduler->useCostModel(cost);
    const std::optional<CostModel> busy = busyModel(cost);
    Reducer reducer(params_, spec_.bucket_bytes, comm_, spec_.overlap, spec_.sharding,
                    unitIndices());
    reducer_ = &reducer;
    const std::unique_ptr<UnitGate> gate = shardAndMakeOptimizer(reducer);
    const std::string choice = setUpCodec(reducer, cost);
    PeriodicSync periodic(spec_.sync, spec_.steps, reducer, comm_);
    periodic_ = &periodic;
    GateInstalled installed(*model_, gate.get());  // taken out of the model before `gate` goes
    TrainingState state(e_, rank_, world_, control_, names_, params_, shards_, *optimizer_, reducer,
                        periodic, sharding_);
    RunCheckpoints checkpoints(spec_);
    const int64_t start = state.resume(checkpoints);
    StepLog log(out_dir_, rank_, e_.matrix_point.empty() ? -1 : e_.matrix_index, start > 0);
    StragglerMonitor stragglers(spec_, rank_, world_, control_, comm_.topology());
    Rebalancer rebalancer(spec_, rank_, world_, control_);
    Result result = planRun(reducer, cost, periodic, choice);

    std::vector<StepStats> stats;
    // Memory: what the steps allocate outside the parts that say otherwise is "other"; the
    // resident peak is the steps' (and what runs between them), where the kernel restarts it.
    const MemoryLedger::Use steps(MemoryUse::kOther);
    StepsMemory memory = startStepsMemory();
    interfaces.mark();          // 1: the first step
    std::vector<double> ended;  // seconds from the first step's start to each step's end
    const auto started = Clock::now();
    bool checkpoint_due = false;
    for (int64_t s = start; s < spec_.steps; ++s) {
      faults_.beforeStep(s + 1);
      if (ProgressBoard* board = comm_.progress()) board->setStep(s + 1);
      stats.push_back(step(s, reducer));
      ended.push_back(since(started));
      logStep(s, stats.back(), log, since(started) / static_cast<double>(s - start + 1));
      stragglers.afterStep(s, start, stats.back());
      if (rebalancer.afterStep(s, start, stats.back(), &sharding_))
        mb_ = sharding_.micro_batch[rank_];
      if (weightsCheckedAfter(s, periodic)) enforce(checkWeights(s + 1, nullptr));
      // A checkpoint holds one model: in the local modes one due between meetings waits for
      // the next.
      checkpoint_due = checkpoint_due || checkpoints.dueAfter(s + 1);
      if (checkpoint_due && (periodic.gradientsSynchronised(s) || periodic.meetsAfter(s))) {
        state.save(checkpoints, s + 1);
        checkpoint_due = false;
      }
    }

    control_.barrier();  // ranks that are threads read their process's peak once all have stepped
    interfaces.mark(/*barrier=*/false);  // 2: the last step's end
    if (memory.restarted) memory.resident_peak = static_cast<double>(residentPeakBytes());
    result.sync = checkWeights(spec_.steps, &result.weight_sample);
    enforce(result.sync);
    gatherTimings(stats, interfaces, &result);
    if (!codec_ && !sharded() && !periodic.local())
      result.comm_explained = explainSteps(stats, reducer, cost, busy);
    lossCurve(stats, ended, &result);
    result.rebalances = rebalancer.taken();
    stragglers.report(&result);
    if (tracer_) writeExperimentTrace(*tracer_, comm_, control_, e_, out_dir_);
    measureMemory(reducer, memory, &result);  // last: the run's peak includes the checks
    return result;
  }

 private:
  bool sharded() const { return spec_.sharding != config::ShardedState::kNone; }
  bool shardsParameters() const { return spec_.sharding == config::ShardedState::kParameters; }

  // train.compression before the first step: auto's choice among its candidates (returned,
  // for the summary) or the named codec rehearsed, then the run's instance prepared in the
  // reducer. A named codec is rehearsed before that instance is prepared, as auto's are: a
  // codec that cannot prepare on one rank fails every rank there, naming it, and the
  // rehearsal's buffers are gone before the run's state comes.
  std::string setUpCodec(Reducer& reducer, const CostModel& cost) {
    const std::string choice = spec_.choosesCompression() ? chooseCodec(reducer, cost) : "";
    if (codec_ && !spec_.choosesCompression()) codec_arithmetic_ = timeArithmetic(reducer, cost);
    if (codec_) {
      reducer.useCodec(codec_, codec_label_, {spec_.seed, rank_, world_});
      requireStepCollectives(reducer);
    }
    return choice;
  }

  // The result as it stands before the first step: what the run is (describeRun) and its
  // predicted synchronisation per step. The local modes all-reduce the gradients in their
  // synchronous steps only (a codec's collectives there), and the parameters, in float32,
  // at each meeting: per step, over the run. A codec's step: its collectives from the
  // calibrated link, and its arithmetic.
  Result planRun(const Reducer& reducer, const CostModel& cost, const PeriodicSync& periodic,
                 const std::string& choice) const {
    double predicted = predictComm(reducer, cost);
    if (codec_ && !std::isnan(predicted)) predicted += codec_arithmetic_;
    if (periodic.local()) {
      predicted = (static_cast<double>(periodic.synchronousSteps()) * predicted +
                   static_cast<double>(periodic.meetings()) *
                       predictComm(reducer, cost, /*float32=*/true)) /
                  static_cast<double>(spec_.steps);
    }
    Result result = describeRun(reducer, cost, predicted);
    result.compression_choice = choice;
    result.predicted_codec_arithmetic_seconds = codec_ ? codec_arithmetic_ : 0;
    if (codec_ || periodic.local()) {  // what the float32 all-reduce every step would take
      const double float32 = predictComm(reducer, cost, /*float32=*/true);
      result.predicted_float32_comm_seconds = std::isnan(float32) ? 0 : float32;
    }
    return result;
  }

  // Step `s` (0-based) in this rank's step log and, every train.log_every steps and at the
  // last, in the job's progress line (`seconds_per_step`: the mean since the first step),
  // which is a collective then (progress() averages the loss over the ranks).
  void logStep(int64_t s, const StepStats& stats, StepLog& log, double seconds_per_step) {
    const int64_t samples = static_cast<int64_t>(stats.micro_batch) * spec_.grad_accum;
    log.write(s, samples, samples * shape_.seq_len, stats);
    if ((s + 1) % spec_.log_every == 0 || s + 1 == spec_.steps)
      progress(s, stats, seconds_per_step);
  }

  // Whether the weights are compared after step `s` (0-based), before the last (which the
  // run's end checks): every train.verify_sync_every steps, or in the local modes at every
  // meeting, when the ranks hold one model.
  bool weightsCheckedAfter(int64_t s, const PeriodicSync& periodic) const {
    if (s + 1 == spec_.steps) return false;
    return periodic.local() ? periodic.meetsAfter(s)
                            : spec_.verify_sync_every > 0 && (s + 1) % spec_.verify_sync_every == 0;
  }

  // Installs a stage-3 gate (or none) in the model for as long as it lives.
  class GateInstalled {
   public:
    GateInstalled(Model& model, UnitGate* gate) : model_(model) { model_.setUnitGate(gate); }
    ~GateInstalled() { model_.setUnitGate(nullptr); }
    GateInstalled(const GateInstalled&) = delete;
    GateInstalled& operator=(const GateInstalled&) = delete;

   private:
    Model& model_;
  };

  // Every rank's weights compared (train/sync.h) after `step`, and with `sample`, rank 0's
  // weights sampled (sampleWeights). Stage 3 gathers one bucket at a time for it, so that
  // the check needs no more memory than a step: a model whose steps fit its ranks' memory is
  // never stopped by its proof.
  SyncCheck checkWeights(int64_t step, std::vector<double>* sample) {
    if (sample != nullptr) sample->assign(weightSamples(), 0.0);
    std::vector<size_t> all(params_.size());
    std::iota(all.begin(), all.end(), size_t{0});
    if (!shardsParameters()) {
      if (sample != nullptr) sampleWeights(all, sample);
      return verifyWeights(comm_, control_, params_, names_, step);
    }
    SyncCheck check;
    check.step = step;
    // Buckets hold runs of parameters in reverse order: checked from the one with the first
    // parameters, each in the model's order, the first that differs is the model's first.
    std::vector<std::vector<size_t>> layout = reducer_->bucketLayout();
    for (auto& bucket : layout) std::sort(bucket.begin(), bucket.end());
    std::vector<size_t> order(layout.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return !layout[b].empty() && (layout[a].empty() || layout[a].front() < layout[b].front());
    });
    reducer_->forEachBucketGathered(order, [&](size_t b) {
      std::vector<at::Tensor> params;
      std::vector<std::string> names;
      for (size_t k : layout[b]) {
        params.push_back(params_[k]);
        names.push_back(names_[k]);
      }
      if (sample != nullptr) sampleWeights(layout[b], sample);
      check.add(verifyWeights(comm_, control_, params, names, step));
    });
    return check;
  }

  // The parameters of each of the model's units, counted before any sharding.
  std::vector<int64_t> unitParameters() const {
    std::map<std::string, int64_t> numel;
    for (size_t k = 0; k < names_.size(); ++k) numel[names_[k]] = params_[k].numel();
    std::vector<int64_t> sizes;
    for (const auto& unit : model_->units()) {
      sizes.push_back(0);
      for (const auto& name : unit) {
        const auto it = numel.find(name);
        if (it != numel.end()) sizes.back() += it->second;
      }
    }
    return sizes;
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

  // What `codec` plans for `bucket` in `step`, as the collectives the rules choose for.
  std::vector<CollectiveArgs> codecCollectives(const Codec& codec, const CodecBucket& bucket,
                                               int64_t step) const {
    std::vector<CollectiveArgs> out;
    for (const CodecCall& call : codec.plan(bucket, world_, step)) {
      const size_t count = static_cast<size_t>(call.count);
      out.push_back(sizedCollective(call.coll, count,
                                    call.coll == Collective::kAllGather ? count * world_ : 0));
      out.back().data.dtype = out.back().output.dtype = call.dtype;
    }
    return out;
  }

  // A collective of a step, sizes only, in the buckets' memory (a scheduler may decline a
  // kind: native over nccl takes only device memory).
  CollectiveArgs sizedCollective(Collective coll, size_t data, size_t output) const {
    CollectiveArgs args;
    args.coll = coll;
    args.data.count = data;
    args.output.count = output;
    args.data.memory = args.output.memory = spec_.cuda ? MemoryKind::kCuda : MemoryKind::kHost;
    args.data.device = args.output.device = device_.is_cuda() ? device_.index() : 0;
    return args;
  }

  // The collectives bucket b takes every step, sizes only: an all-reduce, or sharded a
  // reduce-scatter of the bucket and an all-gather of its blocks, or what its codec plans
  // (for step `step`: a codec may change its plan after a warm-up).
  // `float32`: the float32 all-reduce whatever the codec (what it saves is measured against).
  std::vector<CollectiveArgs> stepCollectives(const Reducer& reducer, size_t b, int64_t step = 0,
                                              bool float32 = false) const {
    const size_t whole = static_cast<size_t>(reducer.bucketNumel(b));
    if (const Codec* codec = reducer.codec(); codec != nullptr && !float32)
      return codecCollectives(*codec, reducer.codecBucket(b), step);
    if (!sharded()) return {sizedCollective(Collective::kAllReduce, whole, 0)};
    const size_t block = whole / static_cast<size_t>(world_);
    std::vector<CollectiveArgs> out = {sizedCollective(Collective::kReduceScatter, whole, block),
                                       sizedCollective(Collective::kAllGather, block, whole)};
    // Stage 3 gathers a unit's bucket for forward and again for backward, every micro-batch
    // (a root bucket once a step).
    if (shardsParameters() && !reducer.isRoot(b)) {
      for (int k = 1; k < 2 * spec_.grad_accum; ++k) out.push_back(out.back());
    }
    return out;
  }

  // The rules must run every collective of a step: sharding's reduce-scatter and all-gather
  // of every bucket, a codec's all-reduces and all-gathers (its plan at the first step and
  // the last: a codec may change its plan after a warm-up). Said before the first step
  // rather than at its first collective.
  void requireStepCollectives(const Reducer& reducer) const {
    for (const int64_t step : {int64_t{0}, int64_t{spec_.steps} - 1}) {
      for (size_t b = 0; b < reducer.bucketCount(); ++b) {
        for (const CollectiveArgs& args : stepCollectives(reducer, b, step)) {
          std::string why;
          if (comm_.select(args, rules_, &why) != nullptr) continue;
          const std::string needs =
              fmt::format("{} of {} on {} ranks, which no rule of train.scheduler runs: {}",
                          collectiveName(args.coll),
                          formatBytes(std::max(args.data.count, args.output.count) *
                                      dtypeSize(args.data.dtype)),
                          world_, why);
          if (reducer.codec() != nullptr) {
            throw ConfigError(fmt::format(
                "{}: train.compression: codec '{}' needs {}. HINT: use a scheduler that runs "
                "it (ring runs allreduce and allgather on any group size), or another codec",
                e_.file, codec_label_, needs));
          }
          throw ConfigError(fmt::format(
              "{}: train.sharding: {} needs {}. HINT: use a scheduler that has both "
              "reduce_scatter and allgather (ring does on any group size), or train.sharding: "
              "none",
              e_.file, config::shardedStateName(spec_.sharding), needs));
        }
      }
    }
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
    lossOf(tokens).backward();                  // the first pays for allocation
    // The sustained speed, over at least 0.3 s (three periods of the CPU controller's quota):
    // the best of a few short probes timed a rank held to a share of a CPU inside a period
    // it still had quota in, as fast as an unthrottled one.
    int probes = 0;
    const auto start = Clock::now();
    do {
      lossOf(tokens).backward();
      ++probes;
    } while (since(start) < 0.3);
    const double seconds = since(start) / probes;
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
    std::vector<double> speeds;
    for (const auto& r : control_.allGather({probe / seconds})) speeds.push_back(r[0]);
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
    const MemoryLedger::PeakWindow counted(ledger_);
    StepStats st;
    if (tracer_) tracer_->setStep(s + 1);
    const TraceSpan traced(tracer_.get(), "step");
    const auto start = Clock::now();
    reseed(s);
    const std::vector<at::Tensor> global_generators = globalGeneratorStates();
    const int mb = mb_;
    st.micro_batch = mb;
    const double global = static_cast<double>(sharding_.globalBatch());
    // This rank's weight in the sum over ranks: its share of the step's predictions (tokens)
    // or 1/N (uniform: DDP's mean).
    const double share =
        spec_.tokens_weighting ? static_cast<double>(mb) * spec_.grad_accum / global : 1.0 / world_;
    // Each micro-batch's loss scaled to its part of the sum; a local step (train.sync) takes
    // the mean of this rank's own micro-batches.
    const bool together = periodic_->gradientsSynchronised(s);
    const double scale = (together ? share : 1.0) / spec_.grad_accum;
    double loss_sum = 0;
    for (int k = 0; k < spec_.grad_accum; ++k) {
      at::Tensor tokens = deviceBatch(sharding_.firstSample(s, k, rank_), mb);  // (mb, T + 1)
      if (k + 1 == spec_.grad_accum && together) reducer.arm(s, share);
      auto t = Clock::now();
      at::Tensor loss;
      {
        const TraceSpan forward(tracer_.get(), "forward", k);
        const MemoryLedger::Use counted(MemoryUse::kForward);
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
        const MemoryLedger::Use counted(MemoryUse::kBackward);
        (loss * scale).backward();
        if (shardsParameters()) reducer.afterBackward();
      }
      st.backward += since(t);
      loss_sum += value;
    }
    st.loss = loss_sum / spec_.grad_accum;
    if (together) {
      const TraceSpan waited(tracer_.get(), "gradient sync");
      const MemoryLedger::Use counted(MemoryUse::kGradientSync);
      st.sync = reducer.finish();
    }
    auto t = Clock::now();
    {
      const TraceSpan optimizer(tracer_.get(), "optimizer");
      const MemoryLedger::Use counted(MemoryUse::kOptimizer);
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
      const MemoryLedger::Use counted(MemoryUse::kGathered);
      add(reducer.gatherParameters(), &st.sync);  // no bytes: sync.bytes stays the gradient's
    }
    if (periodic_->local()) {  // the models meet after some steps (train.sync)
      const TraceSpan met(tracer_.get(), "models meet");
      const MemoryLedger::Use counted(MemoryUse::kGradientSync);
      add(periodic_->afterStep(s, share), &st.sync);
    }
    for (const Provenance& p : st.sync.collectives) st.sync.sent_bytes += sentBytes(p, world_);
    checkNoGlobalDraws(global_generators, s);
    st.step = since(start);
    return st;
  }

  // Adds communication after the gradients' to a step's: times, bytes, collectives.
  static void add(const SyncTiming& more, SyncTiming* sync) {
    sync->comm_seconds += more.comm_seconds;
    sync->exposed_seconds += more.exposed_seconds;
    sync->gather_seconds += more.gather_seconds;
    sync->gather_exposed_seconds += more.gather_exposed_seconds;
    sync->bytes += more.bytes;
    sync->buckets = std::max(sync->buckets, more.buckets);
    sync->collectives.insert(sync->collectives.end(), more.collectives.begin(),
                             more.collectives.end());
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

  // The seconds the calibrated model predicts for `collectives` on the schedulers the rules
  // choose; kNoPrediction when no rule runs one of them.
  double predictSeconds(const std::vector<CollectiveArgs>& collectives,
                        const CostModel& cost) const {
    double total = 0;
    for (const CollectiveArgs& args : collectives) {
      std::string why;
      const auto* rule = comm_.select(args, rules_, &why);
      if (rule == nullptr) return kNoPrediction;
      total += predictCollective(*rule->choice.scheduler, args, comm_.topology(), cost);
    }
    return total;
  }

  // The all-reduce time per step the calibrated model predicts for these buckets (a codec's
  // plan after any warm-up: the last step's).
  double predictComm(const Reducer& reducer, const CostModel& cost, bool float32 = false) const {
    double total = 0;
    for (size_t b = 0; b < reducer.bucketCount(); ++b)
      total += predictSeconds(stepCollectives(reducer, b, spec_.steps - 1, float32), cost);
    return total;
  }

  // train.compression: auto. Each candidate's synchronisation of a step, predicted: its
  // collectives (its plan after any warm-up) from the calibrated link, plus the arithmetic
  // between them, timed on a rehearsal of every bucket (codec_group.h's RehearsalGroup)
  // and taken from the slowest rank. The shortest wins, the first listed on a tie; codec_
  // becomes a fresh instance of it (the rehearsal's state never reaches the run). Returns
  // the summary's account of the choice.
  std::string chooseCodec(const Reducer& reducer, const CostModel& cost) {
    const auto& listed = spec_.compression_candidates;
    std::vector<Rehearsed> rehearsed;
    for (size_t i = 0; i < listed.size(); ++i) {
      if (candidates_[i] == nullptr) {  // none: the float32 all-reduce
        rehearsed.push_back({predictComm(reducer, cost, /*float32=*/true), 0, ""});
        continue;
      }
      // Its state and buffers go with the rehearsal, before the next one's come.
      rehearsed.push_back(
          rehearseFresh([&] { return std::move(candidates_[i]); }, reducer, cost, listed[i].label));
    }
    candidates_.clear();
    agreeOnRehearsals(&rehearsed, [&](size_t i) { return listed[i].label; });
    std::vector<double> comm, arithmetic;
    for (const Rehearsed& r : rehearsed) {
      comm.push_back(r.comm);
      arithmetic.push_back(r.arithmetic);
    }
    size_t best = listed.size();
    std::vector<std::string> others;
    for (size_t i = 0; i < listed.size(); ++i) {
      if (std::isnan(comm[i])) {
        others.push_back(
            fmt::format("{} (train.scheduler runs none of its collectives)", listed[i].label));
        continue;
      }
      if (best == listed.size() || comm[i] + arithmetic[i] < comm[best] + arithmetic[best])
        best = i;
    }
    if (best == listed.size()) {
      throw ConfigError(fmt::format(
          "{}: train.compression: auto: train.scheduler runs the collectives of none of the "
          "candidates. HINT: use a scheduler that runs allreduce and allgather (ring does)",
          e_.file));
    }
    auto account = [&](size_t i) {
      return fmt::format("{} {:.4f} s ({:.4f} s on the link + {:.4f} s arithmetic)",
                         listed[i].label, comm[i] + arithmetic[i], comm[i], arithmetic[i]);
    };
    for (size_t i = 0; i < listed.size(); ++i)
      if (i != best && !std::isnan(comm[i])) others.push_back(account(i));
    const config::PluginRef& chosen = listed[best];
    codec_label_ = chosen.label;
    codec_arithmetic_ = arithmetic[best];
    if (chosen.plugin != "none") {
      Params params = chosen.params;
      codec_ = loader_->createCodec(chosen.plugin, params);
    }
    return fmt::format(
        "chose {}: its synchronisation of a step is predicted shortest, {}{}. Each candidate "
        "after any warm-up: its collectives from the calibrated link, its arithmetic timed on "
        "the slowest rank (what hides behind the backward is not counted)",
        chosen.label, account(best),
        others.empty() ? std::string(" (the only candidate)") : "; " + detail::join(others, "; "));
  }

  // train.compression's codec (named, not chosen): the slowest rank's arithmetic of a step,
  // timed on a fresh instance (rehearse) so that the run's codec keeps prepare()'s state.
  double timeArithmetic(const Reducer& reducer, const CostModel& cost) {
    std::vector<Rehearsed> rehearsed{rehearseFresh(
        [&] {
          Params params = spec_.compression.params;
          return loader_->createCodec(spec_.compression.plugin, params);
        },
        reducer, cost, codec_label_)};
    agreeOnRehearsals(&rehearsed, [&](size_t) { return codec_label_; });
    return rehearsed.front().arithmetic;
  }

  // One codec's rehearsal on this rank, on an instance `make` hands over and on fresh
  // buffers: its planned collectives priced on the calibrated link (kNoPrediction where
  // train.scheduler runs none of them, and then no rehearsal), and its arithmetic timed; or
  // why it failed, caught, so that every rank still reaches agreeOnRehearsals.
  struct Rehearsed {
    double comm = 0, arithmetic = 0;
    std::string failure;
  };
  Rehearsed rehearseFresh(const std::function<std::shared_ptr<Codec>()>& make,
                          const Reducer& reducer, const CostModel& cost, const std::string& label) {
    Rehearsed out;
    try {
      const std::shared_ptr<Codec> codec = make();
      std::vector<CodecBucket> buckets = reducer.codecBuckets(/*fresh=*/true);
      codec->prepare(buckets, {spec_.seed, rank_, world_});
      std::vector<CollectiveArgs> collectives;
      for (const CodecBucket& bucket : buckets) {
        for (auto& args : codecCollectives(*codec, bucket, spec_.steps - 1))
          collectives.push_back(args);
      }
      out.comm = predictSeconds(collectives, cost);
      if (!std::isnan(out.comm)) out.arithmetic = rehearse(*codec, buckets, label);
    } catch (const std::exception& e) {
      out.failure = e.what();
    }
    return out;
  }

  // Every rank's rehearsals made one verdict, in one exchange: the slowest rank's arithmetic
  // and one link prediction for all. A rehearsal that failed on any rank fails the run on
  // every rank, naming the codec and the rank (whose own error says why).
  void agreeOnRehearsals(std::vector<Rehearsed>* rehearsed,
                         const std::function<std::string(size_t)>& label) {
    const size_t n = rehearsed->size();
    std::vector<double> values(3 * n);
    for (size_t i = 0; i < n; ++i) {
      const Rehearsed& r = (*rehearsed)[i];
      values[i] = r.arithmetic;
      values[n + i] = r.failure.empty() ? 0 : rank_ + 1;
      values[2 * n + i] = std::isnan(r.comm) ? -1 : r.comm;
    }
    values = control_.max(values);
    for (size_t i = 0; i < n; ++i) {
      if (values[n + i] == 0) continue;
      const int failed = static_cast<int>(values[n + i]) - 1;
      throw PluginError(fmt::format(
          "train.compression: codec '{}' failed its rehearsal before the first step on rank "
          "{}{}",
          label(i), failed,
          failed == rank_ ? ": " + (*rehearsed)[i].failure : std::string(" (its error says why)")));
    }
    for (size_t i = 0; i < n; ++i) {
      (*rehearsed)[i].arithmetic = values[i];
      (*rehearsed)[i].comm = values[2 * n + i] < 0 ? kNoPrediction : values[2 * n + i];
    }
  }

  // The seconds `codec` computes to synchronise `buckets` once, its collectives left out
  // (RehearsalGroup): the median of 3 passes after one that allocates, on gradient-like
  // values drawn from the run's seed.
  double rehearse(Codec& codec, std::vector<CodecBucket>& buckets, const std::string& label) {
    RehearsalGroup group(rank_, world_, label, device_);
    at::Generator draws = at::make_generator<at::CPUGeneratorImpl>(spec_.seed + 7919 * rank_);
    std::vector<at::Tensor> values;  // each bucket's gradient-like values, drawn once
    for (CodecBucket& b : buckets) {
      for (at::Tensor& p : b.parameters)
        p.copy_(at::randn(p.sizes(), draws, at::TensorOptions().dtype(at::kFloat)) * 1e-3);
      values.push_back(b.gradient.clone());
      b.share = 1.0 / world_;
      b.step = spec_.steps - 1;
    }
    auto settled = [&] {  // the device's queue drained (a scalar read waits for it)
      if (device_.is_cuda() && !buckets.empty()) (void)buckets.back().gradient.sum().item<double>();
    };
    std::vector<double> seconds;
    for (int pass = 0; pass < 4; ++pass) {
      for (size_t b = 0; b < buckets.size(); ++b) buckets[b].gradient.copy_(values[b]);
      settled();
      const auto start = Clock::now();
      for (CodecBucket& b : buckets) codec.synchronize(b, group);
      settled();
      if (pass > 0) seconds.push_back(since(start));
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  }

  void announce() const {
    if (rank_ != 0) return;
    logInfo(fmt::format(
        "training {} ({} parameters, {:.3g} FLOP/token) on {}, {} ranks, micro-batches {} x {} "
        "accumulation",
        e_.model.label, detail::withCommas(model_->parameterCount()), model_->flopsPerToken(),
        source_->describe(), world_, microBatchText(), spec_.grad_accum));
  }

  // Gives every rank rank 0's parameters, shards what train.sharding shards (stage 3 keeps
  // only this rank's blocks and returns the gate that gathers a unit's values when the model
  // computes), and makes the optimizer over what this rank updates.
  std::unique_ptr<UnitGate> shardAndMakeOptimizer(Reducer& reducer) {
    reducer.broadcastParameters();
    std::unique_ptr<UnitGate> gate;
    if (!sharded()) {
      optimizer_ = makeOptimizer(spec_, params_);
      return gate;
    }
    requireStepCollectives(reducer);
    if (reducer.shardsParameters()) {
      reducer.keepShards();  // rank 0's values, broadcast
      reducer.endStep();     // and only they stay
      gate = makeUnitGate(reducer);
    }
    shards_ = reducer.parameterShards();
    optimizer_ = makeOptimizer(spec_, shards_);
    return gate;
  }

  // Every rank's means over the timed steps, combined into the job's (train/report.h).
  void gatherTimings(const std::vector<StepStats>& stats, const InterfaceMarks& interfaces,
                     Result* result) {
    RankSummary mine = summariseSteps(stats);
    mine.interface_startup_sent = interfaces.sent(0, 1);
    mine.interface_steps_sent = interfaces.sent(1, 2);
    std::vector<RankSummary> ranks;
    for (const auto& packed : control_.allGather(mine.pack()))
      ranks.push_back(RankSummary::unpack(packed));
    combineRanks(ranks, sharding_.globalBatch() / spec_.grad_accum, result);
    result->allreduce_bytes = stats.empty() ? 0 : stats.back().sync.bytes;
    double sent = 0;
    for (const StepStats& st : stats) sent += st.sync.sent_bytes;
    result->sent_bytes_per_step = stats.empty() ? 0 : sent / static_cast<double>(stats.size());
    result->comm_memory = commMemory(stats);
    result->schedulers_ran = schedulersRan(stats);
    result->micro_batch = sharding_.micro_batch;
  }

  // Where buckets are all-reduced during backward (every step, no codec, no sharding, more
  // than one rank): the model with its slowest level probed again while every rank keeps a
  // core busy (measure::calibrateUnderLoad), for the all-reduces that run while backward
  // computes; nothing elsewhere. The probe's sizes go up to the buckets' (at least 1 MiB,
  // at most the calibration's largest probe between nodes: its repeats cost start-up time
  // on a slow link), its line is fitted from a bucket's share of one rank on (the chunk a
  // ring moves).
  // Every rank decides alike, from the config.
  std::optional<CostModel> busyModel(const CostModel& cost) {
    if (world_ < 2 || spec_.compresses() || sharded() || spec_.sync.local() || !spec_.overlap)
      return std::nullopt;
    const uint64_t largest =
        std::clamp<uint64_t>(spec_.bucket_bytes, 1 << 20, measure::kLargestInterProbe);
    const uint64_t chunk = spec_.bucket_bytes / static_cast<uint64_t>(world_);
    measure::LinkFit fit;
    const LinkCost loaded = measure::calibrateUnderLoad(comm_.backend(), control_, comm_.topology(),
                                                        chunk, largest, &fit);
    if (rank_ == 0) {
      std::string points;
      for (const auto& [bytes, seconds] : fit.points)
        points += fmt::format(" {:.0f} B {:.1f} us,", bytes, seconds * 1e6);
      logDebug(fmt::format("the link probed busy: alpha {:.1f} us, {:.3f} GB/s (exchanges:{})",
                           loaded.alpha * 1e6, loaded.beta > 0 ? 1e-9 / loaded.beta : 0.0,
                           points.substr(0, points.size() - 1)));
    }
    // Only the level's α and β change: what the calibration found of a pair alone and of
    // the one-way β stays, the one-way β scaled as the exchange's was, the gap as a chunk's
    // exchange was (the busy line's α is where a line through the chunks' sizes meets zero,
    // not a small message's time as the idle α is).
    CostModel busy = cost;
    const bool across = comm_.topology().nodeCount() > 1;
    LinkCost& level = across ? busy.inter : busy.intra;
    const double idle_chunk = level.message(static_cast<double>(chunk));
    level.beta_one_way = level.beta > 0 ? level.beta_one_way * loaded.beta / level.beta : 0;
    level.gap =
        idle_chunk > 0 ? level.gap * loaded.message(static_cast<double>(chunk)) / idle_chunk : 0;
    level.alpha = loaded.alpha;
    level.beta = loaded.beta;
    level.by_buffer.clear();  // the busy line is fitted over the chunks' sizes already
    if (!across) busy.inter = measure::interOnOneNode(busy.intra);
    return busy;
  }

  // A run whose every step all-reduces every bucket once (the caller checks): over the last
  // kExplainedSteps timed steps, each bucket's seconds in each step as the mean and the
  // least over the ranks (a sum and a max: the exchange grows with the ranks, not with
  // their square), its prediction on the idle calibrated link (and the α terms of it) and
  // on the busy one, backward's and the exposed part's means, and how much later than the
  // mean the last rank arrived at the end of its backward, into the split of
  // comm_explained.h. Every rank takes part; not explained where a rank's steps ran
  // another number of collectives, or without a model.
  CommExplained explainSteps(const std::vector<StepStats>& stats, const Reducer& reducer,
                             const CostModel& cost, const std::optional<CostModel>& busy) {
    constexpr size_t kExplainedSteps = 256;
    const size_t buckets = reducer.bucketCount();
    const size_t first =
        std::max<size_t>(stats.size() > 1 ? 1 : 0,  // the first step is not timed
                         stats.size() > kExplainedSteps ? stats.size() - kExplainedSteps : 0);
    if (stats.size() <= first) return {};  // alike on every rank: no step ran
    const size_t steps = stats.size() - first;
    std::vector<std::vector<CollectiveArgs>> planned(buckets);
    bool regular = true;
    for (size_t b = 0; b < buckets; ++b) {
      planned[b] = stepCollectives(reducer, b, spec_.steps - 1, /*float32=*/false);
      regular = regular && planned[b].size() == 1;
    }
    // A rank's arrival in a step: when it ends its backward and waits for what is left of
    // the all-reduces. Summed over ranks: each step's bucket seconds, then backward's
    // and the exposed part's means, then each step's arrival. Maximised: each step's negated
    // bucket seconds, then 1 where a rank's steps were not one all-reduce per bucket in
    // bucket order, then each step's arrival.
    const size_t arrivals = steps * buckets + 2, flag = steps * buckets;
    std::vector<double> sums(arrivals + steps, 0), most(flag + 1 + steps, 0);
    for (size_t i = 0; i < steps && regular; ++i) {
      const StepStats& st = stats[first + i];
      regular = st.sync.collectives.size() == buckets;
      for (size_t b = 0; b < buckets && regular; ++b) {
        const Provenance& p = st.sync.collectives[b];
        regular = p.bytes == planned[b].front().data.bytes();
        sums[i * buckets + b] = p.seconds;
        most[i * buckets + b] = -p.seconds;
      }
      sums[steps * buckets] += st.backward / spec_.grad_accum / steps;  // the last micro-batch's
      sums[steps * buckets + 1] += st.sync.exposed_seconds / steps;
      // From the end of the step before's all-reduces, which every rank leaves together:
      // that step's optimizer, then this one up to its wait (0 before the first step).
      const double before = first + i > 0 ? stats[first + i - 1].optimizer : 0;
      const double arrival = before + st.step - st.optimizer - st.sync.exposed_seconds;
      sums[arrivals + i] = most[flag + 1 + i] = arrival;
    }
    most[flag] = regular ? 0 : 1;
    most = control_.max(most);
    if (most[flag] != 0) return {};
    const std::vector<double> total = control_.sum(sums);
    const double ranks = static_cast<double>(world_);
    double late = 0;  // the last rank's arrival after the mean's, mean over the steps
    for (size_t i = 0; i < steps; ++i) {
      late += std::max(0.0, most[flag + 1 + i] - total[arrivals + i] / ranks) /
              static_cast<double>(steps);
    }
    // The per-message part of a bucket's price: the line's with and without α and the gap,
    // both without a bank (what a bank saves is not linear in the line's time).
    CostModel unbanked = cost;
    unbanked.intra.bank = unbanked.inter.bank = 0;
    CostModel latency_free = unbanked;
    for (LinkCost* link : {&latency_free.intra, &latency_free.inter})
      link->alpha = link->alpha_alone = link->gap = 0;
    std::vector<BucketTimes> times(buckets);
    for (size_t b = 0; b < buckets; ++b) {
      for (size_t i = 0; i < steps; ++i) {
        times[b].mean.push_back(total[i * buckets + b] / ranks);
        times[b].fastest.push_back(-most[i * buckets + b]);
      }
      const auto& collectives = planned[b];
      times[b].predicted = predictSeconds(collectives, cost);
      times[b].latency =
          predictSeconds(collectives, unbanked) - predictSeconds(collectives, latency_free);
      times[b].predicted_busy = busy ? predictSeconds(collectives, *busy) : 0;
      times[b].elements = static_cast<double>(reducer.bucketNumel(b));
      if (std::isnan(times[b].predicted)) return {};
    }
    return explainComm(times, total[steps * buckets + 1] / ranks, total[steps * buckets] / ranks,
                       late, spec_.overlap);
  }

  // The job's mean loss after each step of this run against rank 0's wall time, and when
  // its mean over the last kTargetWindow steps first reached train.target_loss.
  void lossCurve(const std::vector<StepStats>& stats, const std::vector<double>& ended,
                 Result* result) {
    std::vector<double> sums;
    for (const StepStats& st : stats) sums.push_back(st.loss * st.micro_batch);
    sums = control_.sum(sums);
    const double samples = static_cast<double>(sharding_.globalBatch() / spec_.grad_accum);
    for (double& loss : sums) loss /= samples;
    result->loss_curve = sums;
    result->loss_curve_seconds = ended;
    result->loss_curve_first_step = spec_.steps - static_cast<int64_t>(sums.size()) + 1;
    result->target_loss = spec_.target_loss;
    if (spec_.target_loss <= 0) return;
    const size_t window = std::min<size_t>(kTargetWindow, sums.size());
    double in_window = 0;
    for (size_t i = 0; i < sums.size(); ++i) {
      in_window += sums[i];
      if (i >= window) in_window -= sums[i - window];
      if (i + 1 < window || in_window / static_cast<double>(window) > spec_.target_loss) continue;
      result->steps_to_target = static_cast<int64_t>(spec_.steps - sums.size() + i + 1);
      result->seconds_to_target = ended[i];
      return;
    }
  }

  Result describeRun(const Reducer& reducer, const CostModel& cost, double predicted) const {
    Result r;
    r.run = e_.matrix_point;
    r.name = e_.name;
    r.model = e_.model.label;
    r.scheduler = spec_.scheduler.label;
    r.compression = codec_label_;
    r.sync_mode = config::syncModeName(spec_.sync.mode);
    r.sync_every = spec_.sync.every;
    r.sync_warmup_steps = spec_.sync.warmup_steps;
    r.backend = e_.backend.label;
    r.ranks = world_;
    r.parameters = model_->parameterCount();
    r.units = static_cast<int>(unit_parameters_.size());
    const bool equal_units = !unit_parameters_.empty() &&
                             std::all_of(unit_parameters_.begin(), unit_parameters_.end(),
                                         [&](int64_t n) { return n == unit_parameters_.front(); });
    r.unit_parameters = equal_units ? unit_parameters_.front() : 0;
    r.flops_per_token = model_->flopsPerToken();
    r.steps = spec_.steps;
    r.world_batch_samples = sharding_.globalBatch();
    r.world_batch_tokens = sharding_.globalBatch() * shape_.seq_len;
    r.micro_batch = sharding_.micro_batch;
    r.tokens_weighting = spec_.tokens_weighting;
    r.buckets = static_cast<int>(reducer.bucketCount());
    r.predicted_comm_seconds = predicted;
    r.between_nodes = comm_.topology().nodeCount() > 1;
    // The β a bucket's all-reduce is priced at (CostModel::forBuffer), which the summary
    // prints beside the prediction and its bandwidth bound.
    const CostModel bucket = cost.forBuffer(static_cast<double>(spec_.bucket_bytes));
    const LinkCost& link = r.between_nodes ? bucket.inter : bucket.intra;
    r.link_alpha = link.alpha;
    r.link_beta = link.beta;
    r.link_gap = link.gap;
    r.link_bank = r.between_nodes ? link.bank : 0;

    r.token_budgets = spec_.token_budgets;
    r.peak_flops = spec_.peak_flops;
    r.sharding = config::shardedStateName(spec_.sharding);
    r.overlap = spec_.overlap;
    if (device_.is_cuda()) r.device = fmt::format("{} ({})", device_.str(), torchDescription());
    if (spec_.cuda && emulatedDevice()) r.device = "emulated device (COLLIE_EMULATED_DEVICE=1)";
    return r;
  }

  // What delegating schedulers (auto) chose over the steps (Result::schedulers_ran): per
  // label, each choice with the message sizes it ran, largest first, by collective where a
  // step ran more than one kind (ZeRO's reduce-scatters and all-gathers, a codec's).
  static std::string schedulersRan(const std::vector<StepStats>& stats) {
    constexpr size_t kSizesShown = 6;
    using Sizes = std::set<uint64_t, std::greater<>>;
    std::map<std::string_view, std::map<Collective, std::map<std::string_view, Sizes>>> chosen;
    for (const StepStats& st : stats) {
      for (const Provenance& p : st.sync.collectives) {
        if (!p.ran.empty() && p.ran != p.scheduler)
          chosen[p.scheduler][p.coll][p.ran].insert(p.bytes);
      }
    }
    std::vector<std::string> labels;
    for (const auto& [label, kinds] : chosen) {
      std::vector<std::string> parts;
      for (const auto& [coll, choices] : kinds) {
        const std::string kind = kinds.size() > 1 ? std::string(collectiveName(coll)) + ": " : "";
        for (const auto& [ran, sizes] : choices) {
          std::vector<std::string> shown;
          for (uint64_t bytes : sizes) {
            if (shown.size() == kSizesShown) break;
            shown.push_back(detail::withCommas(static_cast<int64_t>(bytes)));
          }
          const std::string more =
              sizes.size() > kSizesShown
                  ? fmt::format(" (+{} more sizes)", sizes.size() - kSizesShown)
                  : "";
          parts.push_back(fmt::format("{}{} for {} B{}", kind, ran, fmt::join(shown, " / "), more));
        }
      }
      labels.push_back(fmt::format("{} ran {}", label, fmt::join(parts, "; ")));
    }
    return fmt::format("{}", fmt::join(labels, "; "));
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

  // The resident set and LibTorch's blocks when the steps began, the resident peak before
  // them, and over them (-1: the kernel would not restart it, the run's peak stands in).
  struct StepsMemory {
    double resident_at_start = 0, tracked_at_start = 0, set_up_peak = 0, resident_peak = -1;
    double file_backed_at_start = 0;
    bool restarted = false;
  };

  // Before the first step: what the set-up freed (stage 3: the whole model it built) goes
  // back to the system, and the resident peak starts again from there. Each part between
  // barriers, since ranks that are threads share one resident set, and no rank's first
  // step may allocate before every rank has restarted the peak. The resident set at the
  // start is read after the restart, so that the steps' peak is never below it (read
  // before, a rank that is a thread freeing memory in the barrier between could leave the
  // restarted peak 160 KB under it).
  StepsMemory startStepsMemory() {
    StepsMemory m;
    control_.barrier();
    releaseFreeMemory();
    control_.barrier();
    m.set_up_peak = static_cast<double>(residentPeakBytes());
    control_.barrier();
    m.restarted = restartResidentPeak();
    control_.barrier();
    m.resident_at_start = static_cast<double>(residentBytes());
    m.file_backed_at_start = static_cast<double>(residentFileBytes());
    m.tracked_at_start = static_cast<double>(ledger_.live());
    control_.barrier();
    return m;
  }

  // Memory: what rank 0 holds between steps, by kind (the buffers themselves, not a
  // formula), every rank's peak resident memory over the run (of its process: ranks as
  // threads share one; restarting the steps' peak resets getrusage's too, so the set-up's
  // peak is kept beside it), and every rank's memory at its peak during a step, by use
  // (measured).
  void measureMemory(const Reducer& reducer, const StepsMemory& steps, Result* r) {
    const HeldBytes held = reducer.held();
    r->parameter_bytes = held.parameters;
    r->gradient_bytes = held.gradients;
    r->gathered_peak_bytes = held.gathered_peak;
    r->pooled_bytes = held.pooled;
    r->optimizer_bytes = 0;
    for (auto& [name, tensor] : optimizer_->state())
      r->optimizer_bytes += static_cast<uint64_t>(tensor.numel()) * 4;
    for (const auto* outer : {&periodic_->outerParameters(), &periodic_->outerMomentum()}) {
      for (const at::Tensor& t : *outer) r->optimizer_bytes += static_cast<uint64_t>(t.numel()) * 4;
    }
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB
    const double run_peak =
        std::max(static_cast<double>(usage.ru_maxrss) * 1024, steps.set_up_peak);
    const MemoryPeak peak = ledger_.peak();
    const bool limit_given = !e_.memory_limit.empty();
    const double limit =
        limit_given ? static_cast<double>(e_.memory_limit.size() == 1 ? e_.memory_limit[0]
                                                                      : e_.memory_limit[rank_])
                    : static_cast<double>(hostMemoryBytes()) / e_.nproc_per_node;
    std::vector<double> mine = {
        run_peak,
        steps.resident_peak >= 0 ? steps.resident_peak : run_peak,
        processId(),
        steps.resident_at_start,
        steps.tracked_at_start,
        steps.file_backed_at_start,
        steps.set_up_peak,
        limit,
        limit_given ? 1.0 : 0.0,
        static_cast<double>(peak.highs[static_cast<int>(MemoryUse::kForward)]),
        static_cast<double>(peak.bytes)};
    for (uint64_t bytes : peak.by_use) mine.push_back(static_cast<double>(bytes));
    const std::vector<std::vector<double>> ranks = control_.allGather(mine);
    for (const auto& rank : ranks) {
      r->peak_rss_bytes.push_back(rank[0]);
      StepMemory m;
      m.resident = rank[1];
      m.process_ranks = static_cast<int>(std::count_if(
          ranks.begin(), ranks.end(), [&](const auto& other) { return other[2] == rank[2]; }));
      m.resident_at_start = rank[3];
      m.tracked_at_start = rank[4];
      m.file_backed_at_start = rank[5];
      m.set_up_peak = rank[6];
      m.limit = rank[7];
      m.limit_given = rank[8] != 0;
      m.forward_high = rank[9];
      m.tracked = rank[10];
      const auto use = [&](MemoryUse u) { return rank[11 + static_cast<size_t>(u)]; };
      m.set_up = use(MemoryUse::kSetUp);
      m.forward = use(MemoryUse::kForward);
      m.backward = use(MemoryUse::kBackward);
      m.gathered = use(MemoryUse::kGathered);
      m.gradient_sync = use(MemoryUse::kGradientSync);
      m.optimizer = use(MemoryUse::kOptimizer);
      m.other = use(MemoryUse::kOther);
      r->step_memory.push_back(m);
    }
  }

  // How many weights sampleWeights takes: kWeightSamples, or every one of a smaller model.
  size_t weightSamples() const {
    int64_t total = 0;
    for (const auto& p : params_) total += p.numel();
    return static_cast<size_t>(std::min<int64_t>(kWeightSamples, total));
  }

  // Weights at weightSamples() positions evenly spaced over all parameters in named order
  // (sample i is element floor(i * total / n)), those that fall in the parameters `which`
  // (whose values are present now) written into `out` (of weightSamples() elements).
  void sampleWeights(const std::vector<size_t>& which, std::vector<double>* out) const {
    std::vector<int64_t> begins(params_.size() + 1, 0);
    for (size_t k = 0; k < params_.size(); ++k) begins[k + 1] = begins[k] + params_[k].numel();
    const int64_t total = begins.back();
    const auto n = static_cast<int64_t>(out->size());
    if (n == 0) return;
    // The first sample at or after element e: the least i with i * total >= e * n.
    const auto firstAt = [&](int64_t e) { return (e * n + total - 1) / total; };
    for (size_t k : which) {
      const int64_t from = firstAt(begins[k]), to = firstAt(begins[k + 1]);
      if (from >= to) continue;
      // Only the sampled elements are copied (a whole parameter in double would be twice its
      // size on top of its gathered bucket).
      std::vector<int64_t> positions;
      for (int64_t i = from; i < to; ++i) positions.push_back(i * total / n - begins[k]);
      const at::Tensor index =
          at::tensor(positions, at::TensorOptions().dtype(at::kLong)).to(params_[k].device());
      const at::Tensor picked =
          params_[k].detach().reshape({-1}).index_select(0, index).to(at::kCPU, at::kDouble);
      const double* values = picked.data_ptr<double>();
      for (int64_t i = from; i < to; ++i) (*out)[i] = values[i - from];
    }
  }

  std::string microBatchText() const {
    return fmt::format("[{}]", fmt::join(sharding_.micro_batch, ", "));
  }

  // First, so that everything the rank allocates from here on is counted (train/memory_ledger.h).
  MemoryLedger& ledger_ = MemoryLedger::create();
  MemoryLedger::Bind counted_{&ledger_, MemoryUse::kSetUp};
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
  std::shared_ptr<Codec> codec_;  // train.compression, or none
  std::string codec_label_ = "none";
  double codec_arithmetic_ = 0;  // its arithmetic per step, timed before the first step
  // train.compression: auto: each candidate (nullptr: none) until run() chooses, and the
  // loader that makes a fresh instance of the chosen one.
  std::vector<std::shared_ptr<Codec>> candidates_;
  const PluginLoader* loader_ = nullptr;
  at::Generator generator_;  // the rank's: every random draw of the model's (dropout)
  ModelShape shape_;
  std::unique_ptr<TokenSource> source_;
  Sharding sharding_;
  int mb_ = 0;  // this rank's samples per micro-batch
  std::vector<std::string> names_;
  std::vector<int64_t> unit_parameters_;  // per unit of the model, unsharded
  std::vector<at::Tensor> params_;
  std::unique_ptr<Optimizer> optimizer_;
  Reducer* reducer_ = nullptr;        // while run() runs
  PeriodicSync* periodic_ = nullptr;  // while run() runs
  std::vector<at::Tensor> shards_;    // sharded: this rank's block of every bucket's parameters
  LrSchedule lr_;
};

}  // namespace

Result run(const PluginLoader& loader, const config::Experiment& e, const std::string& out_dir) {
  at::set_num_threads(e.threads_per_rank);
  if (!e.train.cuda) MemoryLedger::install();
  return runInProcessForRank0<Result>(
      loader, e.backend, e.nproc_per_node, [&](std::shared_ptr<Backend> backend) {
        return RankTrainer(loader, e, std::move(backend), e.topology, out_dir).run();
      });
}

Result runRank(const PluginLoader& loader, const config::Experiment& e,
               std::shared_ptr<Backend> backend, const Topology& topology,
               const std::string& out_dir) {
  at::set_num_threads(e.threads_per_rank);
  if (!e.train.cuda) MemoryLedger::install();
  RankTrainer trainer(loader, e, std::move(backend), topology, out_dir);
  return trainer.run();
}

}  // namespace collie::train
