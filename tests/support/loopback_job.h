// Helpers for multi-rank tests: N loopback ranks as threads, plugins from the build tree.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "collie/error.h"
#include "collie/scheduler.h"
#include "config/experiment.h"
#include "expect.h"
#include "plugin/loader.h"
#include "runtime/in_process.h"

namespace collie::testing {

inline const PluginLoader& buildTreeLoader() {
  static const PluginLoader loader({COLLIE_TEST_PLUGIN_DIR});
  return loader;
}

// Runs body(backend) on `world` loopback ranks; rethrows the first rank's failure.
inline void runLoopback(int world, const std::function<void(std::shared_ptr<Backend>)>& body,
                        const std::string& timeout = "10s") {
  config::PluginRef ref;
  ref.plugin = "loopback";
  ref.params.set("timeout", timeout);
  runInProcess(buildTreeLoader(), ref, world, body);
}

// Success when runLoopback(world, body, timeout) fails with a CommError saying every one of
// `parts`, within `bound` (a failure that is a hang shows as a bound missed).
inline ::testing::AssertionResult failsWithin(
    std::chrono::seconds bound, int world,
    const std::function<void(std::shared_ptr<Backend>)>& body, const std::string& timeout,
    const std::vector<std::string>& parts) {
  const auto start = std::chrono::steady_clock::now();
  auto result = throwsWith<CommError>([&] { runLoopback(world, body, timeout); }, parts);
  const auto took = std::chrono::steady_clock::now() - start;
  if (result && took >= bound) {
    return ::testing::AssertionFailure()
           << "failed after " << std::chrono::duration<double>(took).count() << " s, not within "
           << bound.count() << " s";
  }
  return result;
}

inline std::shared_ptr<Scheduler> loadScheduler(const std::string& name, Params params = Params()) {
  return buildTreeLoader().createScheduler(name, params);
}

}  // namespace collie::testing
