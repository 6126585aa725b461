// Runs the ranks of a job as threads of this process, each with its own backend instance
// (the loopback backend). One failing rank aborts the others, so nobody waits for a timeout.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "collie/backend.h"
#include "config/experiment.h"
#include "plugin/loader.h"

namespace collie {

// The topology a rank of an in-process run works with: the backend's own, when it knows
// where its ranks run (a simulator's platform), else `configured` (the experiment's labels).
Topology topologyOf(const Backend& backend, const Topology& configured);

// Calls body(backend) on `world` threads. Rethrows the first failure (its original type, so
// the exit code stays right) after every thread has finished.
void runInProcess(const PluginLoader& loader, const config::PluginRef& backend, int world,
                  const std::function<void(std::shared_ptr<Backend>)>& body);

// The same, returning what body returned on rank 0 (every rank's body runs to the end).
template <typename Result>
Result runInProcessForRank0(const PluginLoader& loader, const config::PluginRef& backend, int world,
                            const std::function<Result(std::shared_ptr<Backend>)>& body) {
  Result result;
  std::mutex mu;
  runInProcess(loader, backend, world, [&](std::shared_ptr<Backend> rank_backend) {
    const bool root = rank_backend->rank() == 0;
    Result mine = body(std::move(rank_backend));
    if (root) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(mine);
    }
  });
  return result;
}

}  // namespace collie
