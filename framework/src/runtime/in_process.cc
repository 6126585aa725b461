// Thread-per-rank jobs.
#include "runtime/in_process.h"

#include <fmt/format.h>

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "collie/error.h"
#include "collie/log.h"
#include "collie/simulation.h"

namespace collie {

Topology topologyOf(const Backend& backend, const Topology& configured) {
  auto labels = nodeLabels(backend);
  if (labels.empty()) return configured;
  if (static_cast<int>(labels.size()) != backend.size()) {
    throw InternalError(
        fmt::format("backend gave {} node labels for {} ranks", labels.size(), backend.size()));
  }
  return Topology::fromLabels(labels);
}

void runInProcess(const PluginLoader& loader, const config::PluginRef& backend_ref, int world,
                  const std::function<void(std::shared_ptr<Backend>)>& body) {
  const PluginInfo& info = pluginInfo(*loader.open(PluginKind::kBackend, backend_ref.plugin));
  if (!info.in_process) {
    throw PluginError("backend '" + backend_ref.plugin +
                      "' runs one process per rank and cannot run as threads of one process "
                      "(internal: the caller should have launched workers)");
  }
  static std::atomic<int> jobs{0};
  BackendContext context;
  context.size = world;
  context.job_id = fmt::format("job-{}-{}", ::getpid(), jobs++);

  std::mutex mu;
  std::exception_ptr first_error;
  std::vector<std::shared_ptr<Backend>> backends(world);
  // The aborts run outside the lock: a simulator's abort may switch to another rank.
  auto fail = [&](int rank, std::exception_ptr error) {
    std::vector<std::shared_ptr<Backend>> others;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error) return;
      first_error = error;
      for (int r = 0; r < world; ++r) {
        if (backends[r] && r != rank) others.push_back(backends[r]);
      }
    }
    for (auto& other : others) other->abort(fmt::format("rank {} failed", rank));
  };

  // One rank, start to end; never throws. A backend that runs its ranks itself (a
  // simulator) may run these one after the other on one thread, switching between them only
  // inside its own calls: nothing here holds the lock across a backend call.
  auto rank_body = [&](int rank) {
    setLogRank(rank);
    try {
      Params params = backend_ref.params;
      BackendContext mine = context;
      mine.rank = rank;
      mine.local_rank = rank;  // every rank is a thread of this host
      auto backend = loader.createBackend(backend_ref.plugin, params, mine);
      bool abort_now = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        backends[rank] = backend;
        abort_now = first_error != nullptr;
      }
      if (abort_now) backend->abort("another rank failed");
      body(backend);
    } catch (...) {
      fail(rank, std::current_exception());
    }
    if (info.runs_ranks) {  // a simulator's ranks end inside it, before it returns
      std::shared_ptr<Backend> mine;
      {
        std::lock_guard<std::mutex> lock(mu);
        mine.swap(backends[rank]);
      }
    }
    setLogRank(-1);
  };
  if (info.runs_ranks) {
    loader.runRanks(backend_ref.plugin, backend_ref.params, context, world, rank_body);
  } else {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) threads.emplace_back(rank_body, rank);
    for (auto& t : threads) t.join();
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace collie
