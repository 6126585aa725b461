// Bench execution: per rank, sizes × schedulers interleaved, timed between barriers.
#include "bench/bench.h"

#include <fmt/format.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>

#include "bench/calibrate.h"
#include "bench/pattern.h"
#include "collie/error.h"
#include "collie/log.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/in_process.h"

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
            std::shared_ptr<Backend> backend, const Topology& topology)
      : e_(e),
        spec_(e.bench),
        n_(backend->size()),
        rank_(backend->rank()),
        comm_(backend, e.backend.label, topology),
        control_(*backend) {
    for (const auto& ref : spec_.schedulers) {
      Scheduled entry{ref.label, ref.rules.empty() ? ref.plugin : "rules",
                      createRules(loader, ref)};
      schedulers_.push_back(std::move(entry));
    }
  }

  Result run() {
    Result result;
    if (spec_.calibrate) {
      result.model = calibrate(comm_.backend(), control_, comm_.topology(), spec_.dtype);
      result.calibrated = true;
    }
    model_ = result.model;
    std::vector<Row>& rows = result.rows;
    auto sizes = sweepSizes(spec_.min_bytes, spec_.max_bytes, spec_.step_factor);
    Shape largest = shapeFor(spec_.collective, sizes.back(), spec_.dtype, n_);
    Buffer like;
    like.dtype = spec_.dtype;
    ScratchBuffer data(like, largest.data), output(like, largest.output);
    for (uint64_t bytes : sizes) {
      Shape shape = shapeFor(spec_.collective, bytes, spec_.dtype, n_);
      CollectiveArgs args;
      args.coll = spec_.collective;
      args.data = data.view().slice(0, shape.data);
      args.output = output.view().slice(0, shape.output);
      args.op = spec_.op;
      args.root = spec_.root;
      for (auto& s : schedulers_) rows.push_back(measure(s, args, shape));
    }
    return result;
  }

 private:
  Row measure(Scheduled& s, const CollectiveArgs& args, const Shape& shape) {
    Scheduler* chosen = choose(s, args);
    uint64_t wrong = 0;
    if (spec_.check) {
      pattern::fillInput(args, rank_, n_);
      comm_.run(args, s.rules);
      wrong = pattern::countWrong(args, rank_, n_);
    }
    for (int i = 0; i < spec_.warmup_iters; ++i) comm_.run(args, s.rules);
    control_.barrier();
    auto start = std::chrono::steady_clock::now();
    Provenance last;
    for (int i = 0; i < spec_.iters; ++i) last = comm_.run(args, s.rules);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    auto all = control_.allGather({took.count() / spec_.iters, static_cast<double>(wrong)});

    Row row;
    row.run = e_.matrix_point;
    row.scheduler = s.label;
    row.plugin = std::filesystem::path(s.plugin).filename().string();
    row.ran = last.ran;
    row.predicted_us = spec_.calibrate
                           ? chosen->predictSeconds(args, comm_.topology(), model_) * 1e6
                           : kNoPrediction;
    row.backend = e_.backend.label;
    row.collective = collectiveName(spec_.collective);
    row.ranks = n_;
    row.count = shape.total;
    row.bytes = shape.total * dtypeSize(spec_.dtype);
    row.dtype = dtypeName(spec_.dtype);
    row.op = reduceOpName(spec_.op);
    double seconds = 0;
    for (const auto& r : all) {
      seconds = std::max(seconds, r[0]);
      row.wrong += static_cast<uint64_t>(r[1]);
    }
    row.time_us = seconds * 1e6;
    row.algbw = seconds > 0 ? row.bytes / seconds / 1e9 : 0;
    row.busbw = row.algbw * busFactor(spec_.collective, n_);
    logDebug(fmt::format("{} {} B: {:.1f} us", row.scheduler, row.bytes, row.time_us));
    return row;
  }

  // The scheduler the entry's rules pick for `args` (what Communicator::run will run), or a
  // ConfigError naming why none can.
  Scheduler* choose(const Scheduled& s, const CollectiveArgs& args) const {
    std::string refusals;
    if (const auto* rule = comm_.select(args, s.rules, &refusals))
      return rule->choice.scheduler.get();
    throw ConfigError("bench.schedulers: '" + s.label + "' cannot run " +
                      collectiveName(args.coll) + " of " +
                      formatBytes(std::max(args.data.bytes(), args.output.bytes())) + ": " +
                      (refusals.empty() ? "no rule admits this size" : refusals) +
                      ". HINT: remove it from bench.schedulers or change bench.collective");
  }

  const config::Experiment& e_;
  const config::BenchSpec& spec_;
  int n_, rank_;
  Communicator comm_;
  Control control_;
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

Result run(const PluginLoader& loader, const config::Experiment& experiment) {
  at::set_num_threads(experiment.threads_per_rank);
  return runInProcessForRank0<Result>(
      loader, experiment.backend, experiment.nproc_per_node, [&](std::shared_ptr<Backend> backend) {
        return RankBench(loader, experiment, std::move(backend), experiment.topology).run();
      });
}

Result runRank(const PluginLoader& loader, const config::Experiment& experiment,
               std::shared_ptr<Backend> backend, const Topology& topology) {
  at::set_num_threads(experiment.threads_per_rank);
  RankBench bench(loader, experiment, std::move(backend), topology);
  return bench.run();
}

}  // namespace collie::bench
