// Scheduler selection and provenance.
#include "runtime/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <set>

#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/params.h"
#include "collie/simulation.h"
#include "config/experiment.h"
#include "plugin/loader.h"
#include "runtime/control.h"
#include "runtime/environment.h"
#include "runtime/faults.h"
#include "runtime/flight_recorder.h"
#include "runtime/staging.h"
#include "runtime/torch_runtime.h"
#include "runtime/trace.h"

namespace collie {

std::string_view internName(std::string_view name) {
  static std::mutex mu;
  static auto* names = new std::set<std::string, std::less<>>();  // never freed: views outlive
  std::lock_guard<std::mutex> lock(mu);
  auto it = names->find(name);
  if (it == names->end()) it = names->emplace(name).first;
  return *it;
}

Communicator::Communicator(std::shared_ptr<Backend> backend, std::string backend_name,
                           Topology topology)
    : backend_(std::move(backend)),
      backend_name_(std::move(backend_name)),
      backend_interned_(internName(backend_name_)),
      topology_(std::move(topology)) {
  topology_.capabilities = backend_->capabilities();  // what native and accepts() consult
  topology_.concurrent_groups = concurrentGroups(*backend_);
  topology_.backend = backend_name_;  // what auto's rules files are matched to
  who_ = "rank " + std::to_string(backend_->rank());
  uncaught_at_start_ = std::uncaught_exceptions();
}

Communicator::~Communicator() {
  const bool failing = std::uncaught_exceptions() > uncaught_at_start_;
  if (failing)
    dumpFlightRecord("the rank failed outside a collective (its error follows in its log)");
  if (progress_) unpublishProgress(progress_.get(), failing || dumped_);
}

void Communicator::setDebug(CommDebug debug) {
  debug_ = std::move(debug);
  recorder_.reset();
  if (debug_.flight_entries > 0 && !debug_.flight_path.empty())
    recorder_ = std::make_unique<FlightRecorder>(debug_.flight_entries);
  if (progress_) unpublishProgress(progress_.get());
  progress_.reset();
  // A simulator's ranks wait in simulated time: a wall-clock watch would say nothing true.
  if (!debug_.progress.dir.empty() && !simulatedTime(*backend_)) {
    progress_ = std::make_unique<ProgressBoard>(backend_->rank(), backend_->size(), debug_.run);
    publishProgress(progress_.get(), progressPath(debug_.progress.dir, backend_->rank()),
                    debug_.progress);
  }
}

void Communicator::dumpFlightRecord(const std::string& reason) {
  if (!recorder_ || dumped_.exchange(true)) return;  // the first failure's view
  recorder_->dump(debug_.flight_path, backend_->rank(), backend_->size(), reason);
}

void Communicator::addRule(std::string label, std::shared_ptr<Scheduler> scheduler,
                           uint64_t max_bytes) {
  rules_.push_back({max_bytes, {std::move(label), std::move(scheduler)}});
}

Provenance Communicator::runRule(const Rule& rule, CollectiveArgs args, std::string_view ran) {
  const std::string& label = rule.choice.label;
  args.seq = next_seq_++;
  if (faults_ != nullptr) faults_->beforeCollective(args.seq);
  const uint64_t bytes = args.bufferBytes();
  uint64_t entry = 0;
  if (recorder_) {
    entry = recorder_->begin({args.seq, args.coll, bytes, args.data.count, args.data.dtype, args.op,
                              args.root, std::string(ran)});
  }
  const int64_t traced_from = tracer_ != nullptr ? tracer_->now() : 0;
  const ProgressScope marked(progress_.get(), {false, args.coll, args.seq, bytes});
  bool staged = false;
  const double start = clockSeconds(*backend_);  // simulated time on a simulator
  try {
    if (debug_.consistency) checkConsistent(args);
    staged = runScheduler(*rule.choice.scheduler, args);
  } catch (const CommError& e) {
    CommError wrapped(fmt::format("{} seq {} ({}, scheduler {}, backend {}) failed on rank {}: {}",
                                  collectiveName(args.coll), args.seq, formatBytes(bytes), label,
                                  backend_name_, backend_->rank(), e.what()));
    if (recorder_) recorder_->end(entry, FlightEntry::State::kFailed);
    dumpFlightRecord(wrapped.what());
    throw wrapped;
  } catch (const std::exception& e) {
    if (recorder_) recorder_->end(entry, FlightEntry::State::kFailed);
    dumpFlightRecord(e.what());
    throw;
  }
  if (recorder_) recorder_->end(entry, FlightEntry::State::kCompleted);
  const double took = clockSeconds(*backend_) - start;
  const Provenance done{
      internName(label), backend_interned_, args.coll, bytes, args.seq, took, ran, staged};
  if (tracer_ != nullptr) tracer_->collective(done, args.op, traced_from, tracer_->now());
  return done;
}

bool Communicator::runScheduler(Scheduler& scheduler, const CollectiveArgs& args) {
  if (!HostStaging::needed(args, topology_.capabilities, stage_always_)) {
    scheduler.run(args, *backend_, topology_);
    return false;
  }
  if (!staging_) staging_ = torchRuntime().host_staging();
  const CollectiveArgs staged = staging_->stageIn(args);
  scheduler.run(staged, *backend_, topology_);
  staging_->stageOut(args, staged);
  return true;
}

namespace {

constexpr uint32_t kConsistencyPhase = 0xE;  // tags no scheduler uses (the control plane: 0xF)

// What every rank must agree on, with the fields a collective ignores zeroed.
std::vector<int64_t> fingerprintOf(const CollectiveArgs& args) {
  const bool reduces =
      args.coll == Collective::kAllReduce || args.coll == Collective::kReduceScatter;
  return {static_cast<int64_t>(args.coll),
          static_cast<int64_t>(args.data.dtype),
          static_cast<int64_t>(args.data.count),
          static_cast<int64_t>(args.output.count),
          reduces ? static_cast<int64_t>(args.op) : 0,
          args.coll == Collective::kBroadcast ? args.root : 0};
}

std::string describeCall(const std::vector<int64_t>& f) {
  const auto coll = static_cast<Collective>(f[0]);
  if (coll == Collective::kBarrier) return "barrier";
  std::string text =
      fmt::format("{} of {} x {}", collectiveName(coll), f[2], dtypeName(static_cast<DType>(f[1])));
  if (coll == Collective::kReduceScatter || coll == Collective::kAllGather)
    text += fmt::format(" into {}", f[3]);
  if (coll == Collective::kAllReduce || coll == Collective::kReduceScatter)
    text += fmt::format(" ({})", reduceOpName(static_cast<ReduceOp>(f[4])));
  if (coll == Collective::kBroadcast) text += fmt::format(" (root {})", f[5]);
  return text;
}

}  // namespace

void Communicator::checkConsistent(const CollectiveArgs& args) {
  const int n = backend_->size(), rank = backend_->rank();
  const std::vector<int64_t> mine = fingerprintOf(args);
  const size_t k = mine.size();
  std::vector<int64_t> table(k * n);
  std::copy(mine.begin(), mine.end(), table.begin() + rank * k);
  const Tag gather = makeTag(args.seq, kConsistencyPhase, 0);
  const Tag scatter = makeTag(args.seq, kConsistencyPhase, 1);
  if (!wire_) {
    wire_ =
        std::make_unique<MessageWire>(*backend_, deviceOfLocalRank(localRankOf(topology_, rank)));
  }
  const size_t row = k * sizeof(int64_t);
  if (rank == 0) {
    std::vector<int> others;
    for (int r = 1; r < n; ++r) {
      wire_->recv(r, table.data() + r * k, row, gather);
      others.push_back(r);
    }
    wire_->sendToEach(others, table.data(), table.size() * sizeof(int64_t), scatter);
  } else {
    wire_->send(0, mine.data(), row, gather);
    wire_->recv(0, table.data(), table.size() * sizeof(int64_t), scatter);
  }
  // The calls, each with the ranks that made it, in the order of their first rank.
  std::vector<std::pair<std::vector<int64_t>, std::vector<int>>> calls;
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> row(table.begin() + r * k, table.begin() + (r + 1) * k);
    auto it =
        std::find_if(calls.begin(), calls.end(), [&](const auto& c) { return c.first == row; });
    if (it == calls.end()) {
      calls.push_back({row, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (calls.size() == 1) return;
  static const char* kFields[] = {"the collective",   "the dtype",     "the count",
                                  "the output count", "the reduce op", "the root"};
  std::vector<std::string> differs;
  for (size_t i = 0; i < k; ++i) {
    for (const auto& c : calls) {
      if (c.first[i] != calls.front().first[i]) {
        differs.push_back(kFields[i]);
        break;
      }
    }
  }
  std::vector<std::string> parts;
  for (const auto& [call, ranks] : calls) {
    parts.push_back(fmt::format("rank{} {} call{} {}", ranks.size() == 1 ? "" : "s",
                                fmt::join(ranks, ", "), ranks.size() == 1 ? "s" : "",
                                describeCall(call)));
  }
  throw CommError(fmt::format(
      "debug.consistency: the ranks call different collectives as seq {}: {} ({} differ{}). "
      "HINT: every rank must call the same collectives in the same order",
      args.seq, fmt::join(parts, "; "), fmt::join(differs, ", "), differs.size() == 1 ? "s" : ""));
}

Provenance Communicator::run(CollectiveArgs args) { return run(args, rules_); }

const Communicator::Rule* Communicator::select(const CollectiveArgs& args,
                                               const std::vector<Rule>& rules,
                                               std::string* refusals, std::string_view* ran) const {
  // A collective that will be staged is judged as it will run: on host memory.
  const bool staged = HostStaging::needed(args, topology_.capabilities, stage_always_);
  const CollectiveArgs judged = staged ? HostStaging::asStaged(args) : args;
  return firstAdmitting(rules, args.bufferBytes(), [&](const Rule& rule) {
    Decision decision = rule.choice.scheduler->accepts(judged, topology_);
    if (!decision.accepted) {
      // A refusal names its plugin ("tree: ..."); the label is added only when it differs.
      const std::string prefix = rule.choice.label + ": ";
      const bool named = decision.reason.compare(0, prefix.size(), prefix) == 0;
      *refusals += (refusals->empty() ? "" : "; ") + (named ? "" : prefix) + decision.reason;
    } else if (ran != nullptr) {
      *ran = internName(decision.reason.empty() ? rule.choice.label : decision.reason);
    }
    return decision.accepted;
  });
}

Provenance Communicator::run(CollectiveArgs args, const std::vector<Rule>& rules) {
  checkCollectiveShape(who_, args, backend_->size());
  std::string refusals;
  std::string_view ran;
  if (const Rule* rule = select(args, rules, &refusals, &ran)) return runRule(*rule, args, ran);
  throw ConfigError(std::string("no scheduler can run ") + collectiveName(args.coll) + " of " +
                    formatBytes(args.bufferBytes()) + ": " +
                    (refusals.empty() ? "no rule admits this size" : refusals) +
                    ". HINT: add a scheduler that implements it to the rules");
}

std::vector<Communicator::Rule> createRules(const PluginLoader& loader,
                                            const config::PluginRef& ref) {
  auto create = [&](const config::PluginRef& one) {
    Params params = one.params;
    return loader.createScheduler(one.plugin, params);
  };
  std::vector<Communicator::Rule> rules;
  if (ref.rules.empty()) rules.push_back({0, {ref.label, create(ref)}});
  for (const auto& rule : ref.rules) {
    rules.push_back({rule.max_bytes, {rule.choice.label, create(rule.choice)}});
  }
  return rules;
}

CommDebug commDebugOf(const config::Experiment& e, const std::string& out_dir, int rank) {
  CommDebug d;
  d.consistency = e.debug.consistency;
  d.flight_entries = static_cast<size_t>(e.debug.flight_recorder);
  if (!out_dir.empty()) d.flight_path = flightRecordPath(out_dir, rank);
  if (!out_dir.empty()) {
    d.progress.dir = progressFolder(out_dir);
    d.progress.stall_warning = e.debug.stall_warning;
    // Under collie's launcher the launcher watches; otherwise the ranks speak for the job.
    const WorkerEnv env = detectWorkerEnv();
    d.progress.watch = !(env.present && env.source == "collie");
  }
  d.run = e.matrix_index;
  return d;
}

}  // namespace collie
