// Helpers for multi-rank tests: N loopback ranks as threads, plugins from the build tree.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "collie/backend.h"
#include "collie/scheduler.h"
#include "config/experiment.h"
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

inline std::shared_ptr<Scheduler> loadScheduler(const std::string& name, Params params = Params()) {
  return buildTreeLoader().createScheduler(name, params);
}

}  // namespace collie::testing
