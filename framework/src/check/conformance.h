// The conformance matrix for scheduler and backend plugins: every collective a scheduler
// accepts × group sizes × element counts × ops × dtypes, against closed-form values, with
// bit-identical results on every rank and from run to run. Used by the test suite and by
// `collie plugin-check`, so that a plugin author sees what users would hit.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collie/buffer.h"
#include "collie/collective.h"
#include "config/experiment.h"
#include "plugin/loader.h"

namespace collie::check {

struct Options {
  std::vector<int> worlds = {1, 2, 3, 4, 5, 8};
  std::vector<DType> dtypes = {DType::kF32,  DType::kF64, DType::kF16,
                               DType::kBF16, DType::kI32, DType::kI64};
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                               ReduceOp::kProd};
  std::vector<Collective> collectives = {Collective::kAllReduce, Collective::kReduceScatter,
                                         Collective::kAllGather, Collective::kBroadcast,
                                         Collective::kBarrier};
  // Element counts are {0, 1, 7, world - 1, 1000, large_count}; 0 leaves the large one out.
  size_t large_count = 100003;
  // Emulate nodes (the smallest divisor > 1 of the group size ranks per node), so that
  // hierarchical schedulers meet more than one node.
  bool emulate_nodes = true;
  std::string timeout = "30s";
};

struct Report {
  size_t passed = 0;
  size_t declined = 0;
  std::vector<std::string> failures;  // one line each: the case, and what was wrong
  // Distinct refusals ("reduce_scatter: ring: why") and the group sizes they came on.
  std::vector<std::pair<std::string, std::vector<int>>> declines;
  // The collectives the scheduler accepted for at least one case ("allreduce", ...), sorted:
  // what its README must say it supports.
  std::vector<std::string> accepted;
  bool ok() const { return failures.empty(); }
};

// Runs the matrix for one scheduler over one (in-process) backend.
Report checkScheduler(const PluginLoader& loader, const config::PluginRef& scheduler,
                      const config::PluginRef& backend, const Options& options);

// This process's part of the matrix on `backend` (a worker of a job of processes), for the
// group size backend->size(). Rank 0's report holds the results.
Report checkSchedulerOnRank(const PluginLoader& loader, const config::PluginRef& scheduler,
                            std::shared_ptr<Backend> backend, const std::string& backend_name,
                            const Options& options);

// Checks the backend contract itself (collie/backend.h): tag order, zero-byte messages, a
// receive from a silent peer that must fail with a CommError naming the peer, after the
// timeout and not long after it, and the abort and request-lifetime rules: an abort from
// another thread (another actor on a simulator) ends a pending wait at once with its reason,
// a second abort changes nothing, posts after it fail, and a receive whose group was
// destroyed before its message came still ends (with the bytes or a CommError).
Report checkBackendContract(const PluginLoader& loader, const config::PluginRef& backend);

// The same on one rank of a 2-process job: `make(timeout)` creates a fresh group of the
// backend with that params.timeout, `barrier()` waits for the other rank. Rank 1's report
// holds the results.
Report checkBackendContractOnRank(
    const std::string& label,
    const std::function<std::shared_ptr<Backend>(const std::string& timeout)>& make,
    const std::function<void()>& barrier);

// Adds `from` to `into` (counts, failures, refusals and their group sizes).
void merge(Report& into, const Report& from);
// A report as JSON, for a worker to hand it to the launcher (written atomically).
void saveReport(const std::string& path, const Report& report);
Report loadReport(const std::string& path);

// The report as a user reads it: PASS/FAIL, counts, the first failures.
std::string describe(const std::string& what, const Report& report, size_t max_lines = 20);

}  // namespace collie::check
