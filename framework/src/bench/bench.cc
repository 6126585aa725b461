// Bench execution: per rank, sizes × schedulers interleaved, timed between barriers.
#include "bench/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/log.h"
#include "collie/simulation.h"
#include "measure/calibrate.h"
#include "measure/pattern.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/environment.h"
#include "runtime/faults.h"
#include "runtime/in_process.h"
#include "runtime/trace.h"
#include "util/system.h"

namespace collie::bench {
namespace {

// Element counts of the input (data) and output buffers for a message of `bytes`.
struct Shape {
  size_t data = 0, output = 0, total = 0;
};

Shape shapeFor(Collective coll, uint64_t bytes, DType dtype, int n) {
  size_t count = bytes / dtypeSize(dtype);
  switch (coll) {
    case Collective::kReduceScatter: {
      size_t k = count / n;
      return {k * n, k, k * n};
    }
    case Collective::kAllGather: {
      size_t k = count / n;
      return {k, k * n, k * n};
    }
    default:
      return {count, 0, count};
  }
}

// One entry of bench.schedulers: a scheduler, or a list of size rules.
struct Scheduled {
  std::string label;
  std::string plugin;  // "rules" for a rule list
  std::vector<Communicator::Rule> rules;
};

class RankBench {
 public:
  RankBench(const PluginLoader& loader, const config::Experiment& e,
            std::shared_ptr<Backend> backend, const Topology& topology, const std::string& out_dir)
      : e_(e),
        spec_(e.bench),
        n_(backend->size()),
        rank_(backend->rank()),
        faults_(e.faults, rank_),
        comm_(backend, e.backend.label, topology),
        control_(*backend, deviceOfLocalRank(localRankOf(topology, rank_))),
        out_dir_(out_dir) {
    comm_.setFaults(&faults_);
    if (spec_.trace) {
      tracer_ = std::make_unique<Tracer>();
      comm_.setTracer(tracer_.get());
    }
    comm_.setDebug(commDebugOf(e, out_dir, rank_));
    control_.setProgress(comm_.progress());
    if (e.debug.consistency && rank_ == 0) {
      logWarn(
          "debug.consistency: every collective starts with a gather of what each rank "
          "calls; the times below include it");
    }
    for (const auto& ref : spec_.schedulers) {
      Scheduled entry{ref.label, ref.rules.empty() ? ref.plugin : "rules",
                      createRules(loader, ref)};
      schedulers_.push_back(std::move(entry));
    }
  }

  Result run() {
    Result result;
    result.facts = facts();
    if (spec_.calibrate) {
      const Calibration c = calibrate(comm_.backend(), control_, comm_.topology(), spec_.dtype);
      result.model = c.model;
      result.fit_intra = c.intra;
      result.fit_inter = c.inter;
      result.fit_inter_one_way = c.inter_one_way;
      result.fit_inter_bank = c.inter_bank;
      result.fit_intra_alone = c.intra_alone;
      result.calibrated = true;
      for (auto& s : schedulers_) {
        for (auto& rule : s.rules) rule.choice.scheduler->useCostModel(c.model);
      }
    }
    model_ = result.model;
    // A barrier moves no data: one "size", 0 bytes (as osu_barrier).
    auto sizes = spec_.collective == Collective::kBarrier
                     ? std::vector<uint64_t>{0}
                     : sweepSizes(spec_.min_bytes, spec_.max_bytes, spec_.step_factor);
    Shape largest = shapeFor(spec_.collective, sizes.back(), spec_.dtype, n_);
    // Without payload (a simulator at scale) the buffers are sizes only: nothing allocated.
    const Buffer like = measurementLike(comm_.backend(), spec_.dtype, control_.device());
    ScratchBuffer data(like, largest.data), output(like, largest.output);
    for (uint64_t bytes : sizes) {
      Shape shape = shapeFor(spec_.collective, bytes, spec_.dtype, n_);
      CollectiveArgs args;
      args.coll = spec_.collective;
      args.data = data.view().slice(0, shape.data);
      args.output = output.view().slice(0, shape.output);
      args.op = spec_.op;
      args.root = spec_.root;
      std::vector<Row> size_rows;
      for (auto& s : schedulers_) size_rows.push_back(check(s, args, shape));
      // Every repeat measures every scheduler once, each repeat starting one scheduler
      // later, so that drift in the machine's load falls on all of them alike.
      const size_t k = schedulers_.size();
      std::vector<std::vector<double>> seconds(k);
      for (int repeat = 0; repeat < spec_.repeats; ++repeat) {
        for (size_t j = 0; j < k; ++j) {
          const size_t i = (j + repeat) % k;
          seconds[i].push_back(timeOnce(schedulers_[i], args, &size_rows[i]));
        }
      }
      for (size_t i = 0; i < k; ++i) result.rows.push_back(summarise(size_rows[i], seconds[i]));
    }
    if (tracer_) writeExperimentTrace(*tracer_, comm_, control_, e_, out_dir_);
    return result;
  }

 private:
  // Every rank's host facts, gathered before anything is measured (collective). The link is
  // the lab's cap (COLLIE_LAB_LINK_MBIT, set on its hosts) or the speed the kernel reports
  // for backend.params.interface.
  Facts facts() {
    Facts f;
    f.backend = e_.backend.label;
    std::string params;
    for (const auto& [key, value] : e_.backend.params.values())
      params += fmt::format("{}{}: {}", params.empty() ? "" : ", ", key, value);
    if (!params.empty()) f.backend += " {" + params + "}";
    const Topology& t = comm_.topology();
    if (simulatedTime(comm_.backend())) {
      // The machine that ran the simulation says nothing about the numbers: the platform does.
      f.simulated = fmt::format(
          "{} ranks on {} simulated host(s) in {} node(s); every time below is simulated time", n_,
          n_, t.nodeCount());
      return f;
    }
    f.cpu_model = detail::cpuModel();
    const auto interface = e_.backend.params.values().find("interface");
    const std::string nic = interface == e_.backend.params.values().end() ? "" : interface->second;
    const char* lab = std::getenv("COLLIE_LAB_LINK_MBIT");
    const double mbit = lab != nullptr ? std::atof(lab) : detail::linkSpeedMbps(nic);
    auto all = control_.allGather({static_cast<double>(detail::onlineCpus()), detail::loadAverage(),
                                   mbit, lab != nullptr ? 1.0 : 0.0, nic.empty() ? 0.0 : 1.0});
    for (int node = 0; node < t.nodeCount(); ++node) {
      const auto ranks = t.ranksOnNode(node);
      if (ranks.empty()) continue;
      const auto& first = all[ranks.front()];
      HostFacts host;
      host.name = t.nodeCount() == 1 ? detail::hostName() : t.node_names[node];
      host.ranks = static_cast<int>(ranks.size());
      host.cpus = static_cast<int>(first[0]);
      host.load = first[1];
      if (first[2] > 0) {
        host.link =
            fmt::format("{:g} Mbit/s{}", first[2], first[3] > 0 ? " (the lab's tbf cap)" : "");
      } else if (first[4] > 0) {
        host.link = "speed not reported";
      }
      f.hosts.push_back(host);
    }
    return f;
  }

  // The row of (size, scheduler) before timing: what it is, its prediction and, with
  // bench.check, the elements one call got wrong (summed over ranks).
  Row check(Scheduled& s, const CollectiveArgs& args, const Shape& shape) {
    Scheduler* chosen = choose(s, args);
    uint64_t wrong = 0;
    const bool checked = spec_.check && payload();
    if (checked) {
      pattern::fillInput(args, rank_, n_);
      comm_.run(args, s.rules);
      wrong = pattern::countWrong(args, rank_, n_);
    }
    Row row;
    row.run = e_.matrix_point;
    row.scheduler = s.label;
    row.plugin = std::filesystem::path(s.plugin).filename().string();
    // Rank 0's rows are the result; a prediction walks the whole schedule, which thousands of
    // simulated ranks would each walk again for nothing.
    row.predicted_us = spec_.calibrate && rank_ == 0
                           ? predictCollective(*chosen, args, comm_.topology(), model_) * 1e6
                           : kNoPrediction;
    row.backend = e_.backend.label;
    row.collective = collectiveName(spec_.collective);
    row.ranks = n_;
    row.count = shape.total;
    row.bytes = shape.total * dtypeSize(spec_.dtype);
    row.dtype = dtypeName(spec_.dtype);
    row.op = reduceOpName(spec_.op);
    row.checked = checked;
    row.wrong = static_cast<uint64_t>(control_.sum({static_cast<double>(wrong)})[0]);
    return row;
  }

  // One measurement as nccl-tests takes it: warm-up calls, a barrier, `iters` back-to-back
  // calls; the mean per call of the slowest rank, in seconds (the same on every rank). With
  // bench.min_time the warm-up calls (at least one) are timed and the loop gets as many
  // calls as that time needs at the slowest rank's pace, the same number on every rank.
  double timeOnce(Scheduled& s, const CollectiveArgs& args, Row* row) {
    const bool sized = spec_.min_time.count() > 0;
    const int warmups = sized ? std::max(1, spec_.warmup_iters) : spec_.warmup_iters;
    Backend& clock = comm_.backend();  // simulated time on a simulator
    const double warm = clockSeconds(clock);
    for (int i = 0; i < warmups; ++i) comm_.run(args, s.rules);
    int iters = spec_.iters;
    if (sized) {
      const double per_call = (clockSeconds(clock) - warm) / warmups;
      const double slowest = control_.max({per_call})[0];
      const double needed =
          std::chrono::duration<double>(spec_.min_time).count() / std::max(slowest, 1e-9);
      iters = static_cast<int>(std::clamp(std::ceil(needed), static_cast<double>(iters), 1e6));
    }
    control_.barrier();
    const double start = clockSeconds(clock);
    Provenance last;
    {
      const TraceSpan loop(tracer_.get(), tracer_ ? internName(fmt::format("{} {}", s.label,
                                                                           formatBytes(row->bytes)))
                                                  : std::string_view());
      for (int i = 0; i < iters; ++i) last = comm_.run(args, s.rules);
    }
    const double took = clockSeconds(clock) - start;
    row->ran = last.ran;
    row->iters = std::max(row->iters, iters);
    return control_.max({took / iters})[0];
  }

  // The row with its times: the median of the repeats, and their min and max.
  Row summarise(Row row, const std::vector<double>& seconds) const {
    row.repeats = static_cast<int>(seconds.size());
    row.time_us = median(seconds) * 1e6;
    row.time_min_us = *std::min_element(seconds.begin(), seconds.end()) * 1e6;
    row.time_max_us = *std::max_element(seconds.begin(), seconds.end()) * 1e6;
    const double s = row.time_us / 1e6;
    row.algbw = s > 0 ? row.bytes / s / 1e9 : 0;
    row.busbw = row.algbw * busFactor(spec_.collective, n_);
    logDebug(fmt::format("{} {} B: {:.1f} us ({:.1f}-{:.1f})", row.scheduler, row.bytes,
                         row.time_us, row.time_min_us, row.time_max_us));
    return row;
  }

  bool payload() const { return movesPayload(comm_.backend()); }

  // The scheduler the entry's rules pick for `args` (what Communicator::run will run), or a
  // ConfigError naming why none can.
  Scheduler* choose(const Scheduled& s, const CollectiveArgs& args) const {
    std::string refusals;
    if (const auto* rule = comm_.select(args, s.rules, &refusals))
      return rule->choice.scheduler.get();
    const std::string what =
        args.coll == Collective::kBarrier
            ? std::string("a barrier")
            : std::string(collectiveName(args.coll)) + " of " + formatBytes(args.bufferBytes());
    throw ConfigError("bench.schedulers: '" + s.label + "' cannot run " + what + ": " +
                      (refusals.empty() ? "no rule admits this size" : refusals) +
                      ". HINT: remove it from bench.schedulers or change bench.collective");
  }

  const config::Experiment& e_;
  const config::BenchSpec& spec_;
  int n_, rank_;
  Faults faults_;                   // outlives comm_, which takes them
  std::unique_ptr<Tracer> tracer_;  // bench.trace; outlives comm_, which records into it
  Communicator comm_;
  Control control_;
  std::string out_dir_;
  CostModel model_;
  std::vector<Scheduled> schedulers_;
};

}  // namespace

std::vector<uint64_t> sweepSizes(uint64_t min_bytes, uint64_t max_bytes, int factor) {
  std::vector<uint64_t> sizes;
  for (uint64_t b = min_bytes; b <= max_bytes; b = b == 0 ? 1 : b * factor) {
    sizes.push_back(b);
    if (b > max_bytes / factor && b != 0) break;
  }
  return sizes;
}

double busFactor(Collective coll, int n) {
  switch (coll) {
    case Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      return static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}

Result run(const PluginLoader& loader, const config::Experiment& experiment,
           const std::string& out_dir) {
  return runInProcessForRank0<Result>(
      loader, experiment.backend, experiment.nproc_per_node, [&](std::shared_ptr<Backend> backend) {
        const Topology topology = topologyOf(*backend, experiment.topology);
        return RankBench(loader, experiment, std::move(backend), topology, out_dir).run();
      });
}

Result runRank(const PluginLoader& loader, const config::Experiment& experiment,
               std::shared_ptr<Backend> backend, const Topology& topology,
               const std::string& out_dir) {
  RankBench bench(loader, experiment, std::move(backend), topology, out_dir);
  return bench.run();
}

}  // namespace collie::bench
