// Runs the ranks of a job as threads of this process, each with its own backend instance
// (the loopback backend). One failing rank aborts the others, so nobody waits for a timeout.
#pragma once

#include <functional>
#include <memory>

#include "collie/backend.h"
#include "config/experiment.h"
#include "plugin/loader.h"

namespace collie {

// Calls body(backend) on `world` threads. Rethrows the first failure (its original type, so
// the exit code stays right) after every thread has finished.
void runInProcess(const PluginLoader& loader, const config::PluginRef& backend, int world,
                  const std::function<void(std::shared_ptr<Backend>)>& body);

}  // namespace collie
