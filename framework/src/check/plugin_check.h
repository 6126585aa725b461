// `collie plugin-check`: the conformance matrix against one scheduler or backend plugin,
// over an in-process backend as threads, or over a process backend as jobs of workers
// (collie itself again, one job per group size) that hand their report back.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace collie::check {

// The schedulers a backend plugin is checked with, beside its own contract.
extern const std::vector<std::string> kReferenceSchedulers;

struct PluginCheckRequest {
  std::string plugin;                    // name or path: a scheduler or a backend
  std::string backend = "loopback";      // the backend a scheduler is checked over
  std::vector<int> worlds;               // group sizes (empty: check::Options' default)
  std::vector<std::string> params;       // key=value params of the plugin under test
  size_t large_count = 100003;           // the largest element count (0: leave it out)
  std::vector<std::string> dtypes, ops;  // names (empty: all)
  // Set only on the workers of a check over processes: what this worker does ("contract"
  // or "scheduler") and the backend's params when the scheduler is the plugin under test.
  std::string worker_task;
  std::vector<std::string> backend_params;
};

// Runs the check and prints the report; returns 0 on PASS, 1 on FAIL. Throws ConfigError
// for bad names, PluginError for a plugin that does not load, Interrupted when a signal
// stopped the workers.
int runPluginCheck(const PluginCheckRequest& request);

}  // namespace collie::check
