// Test helper: a job of N processes, forks of the test, joined through the job's store, for
// the backends that run one process per rank (gloo, ucx).
#pragma once

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "loopback_job.h"
#include "runtime/job.h"
#include "runtime/launcher.h"

namespace collie::testing {

// Runs body(job, ref) as rank r of a `ranks`-process job, for every r, each in a fork of this
// test; `ref` is the `plugin` backend with a 10 s timeout. Returns the children's exit codes
// (0 when body returned true); a child prints what went wrong.
inline std::vector<int> runJobWith(
    const std::string& plugin,
    const std::function<bool(ProcessJob&, const config::PluginRef&)>& body, int ranks = 2) {
  using namespace std::chrono_literals;
  const uint16_t port = pickFreePort("127.0.0.1");
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int code = 1;
      try {
        WorkerEnv env;
        env.present = true;
        env.source = "test";
        env.rank = env.local_rank = rank;
        env.world = env.local_world = ranks;
        env.master_addr = "127.0.0.1";
        env.master_port = port;
        ProcessJob job(env, "127.0.0.1", port, 20s);
        config::PluginRef ref;
        ref.plugin = ref.label = plugin;
        ref.params = Params("backend '" + plugin + "'");
        ref.params.set("timeout", "10s", "test");
        code = body(job, ref) ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// The same with the backend made: body(backend).
inline std::vector<int> runJob(const std::string& plugin, const std::function<bool(Backend&)>& body,
                               int ranks = 2) {
  using namespace std::chrono_literals;
  return runJobWith(
      plugin,
      [&](ProcessJob& job, const config::PluginRef& ref) {
        WorkerRank w = createBackend(job, buildTreeLoader(), ref, "test/", 20s);
        return body(*w.backend);
      },
      ranks);
}

}  // namespace collie::testing
