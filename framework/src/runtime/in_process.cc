// Thread-per-rank jobs.
#include "runtime/in_process.h"

#include <fmt/format.h>

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "collie/error.h"
#include "collie/log.h"

namespace collie {

void runInProcess(const PluginLoader& loader, const config::PluginRef& backend_ref, int world,
                  const std::function<void(std::shared_ptr<Backend>)>& body) {
  if (!pluginInfo(*loader.open(PluginKind::kBackend, backend_ref.plugin)).in_process) {
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
  auto fail = [&](int rank, std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first_error) {
      first_error = error;
      for (int r = 0; r < world; ++r) {
        if (backends[r] && r != rank) backends[r]->abort(fmt::format("rank {} failed", rank));
      }
    }
  };

  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      setLogRank(rank);
      try {
        Params params = backend_ref.params;
        BackendContext mine = context;
        mine.rank = rank;
        auto backend = loader.createBackend(backend_ref.plugin, params, mine);
        {
          std::lock_guard<std::mutex> lock(mu);
          backends[rank] = backend;
          if (first_error) backend->abort("another rank failed");
        }
        body(backend);
      } catch (...) {
        fail(rank, std::current_exception());
      }
      setLogRank(-1);
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace collie
