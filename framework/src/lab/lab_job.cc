// The lab's launcher: a `collie launch` per host, started inside the host's namespaces,
// watched as collie's launcher watches its workers (runtime/teardown.h decides when the
// others are stopped after one fails).
#include "lab/lab_job.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "collie/error.h"
#include "collie/log.h"
#include "lab/lab.h"
#include "runtime/launcher.h"
#include "runtime/teardown.h"
#include "runtime/worker_set.h"

namespace fs = std::filesystem;

namespace collie::lab {
namespace {

constexpr const char* kHostVariable = "COLLIE_LAB_HOST";  // set in every host's launcher
constexpr int kDefaultPort = 29500;

struct HostLauncher {
  const Host* host = nullptr;
  int node = 0;
  pid_t pid = -1;
  bool running = false;
};

// The command host `node`'s launcher runs: collie launch, node `node` of the lab's hosts.
std::vector<std::string> launchArgv(const RunRequest& request, const Lab& lab, size_t index,
                                    int node, int port, const fs::path& out) {
  std::vector<std::string> argv = {selfExecutable()};
  if (!request.log_level.empty()) argv.insert(argv.end(), {"--log-level", request.log_level});
  argv.insert(argv.end(), {"launch", request.config, "--only-run", std::to_string(index),
                           "--nnodes", std::to_string(lab.hosts.size()), "--node-rank",
                           std::to_string(node), "--master-addr", lab.hosts.front().address,
                           "--master-port", std::to_string(port), "--out", out.string()});
  for (const auto& s : request.sets) argv.insert(argv.end(), {"--set", s});
  // Each host's own NIC (their names differ, as on real machines): a per-host setting.
  argv.insert(argv.end(), {"--set", "backend.params.interface=" + lab.hosts[node].interface});
  return argv;
}

}  // namespace

bool wantsLab(const config::Experiment& e) {
  return e.lab.hosts > 0 && std::getenv(kHostVariable) == nullptr;
}

void runOnLab(const RunRequest& request, const config::Experiment& e, size_t index,
              const fs::path& out) {
  if (request.nnodes > 1) {
    throw ConfigError(
        "launch.lab starts a launcher on every emulated host itself. HINT: use `collie run`, "
        "not `collie launch`");
  }
  Lab lab = up({e.lab.hosts, e.lab.rate, e.lab.cpus});
  // Consecutive runs use consecutive ports, as collie launch does (a late rank never meets
  // the previous run's store).
  const int port = (e.master_port != 0 ? e.master_port : kDefaultPort) + static_cast<int>(index);
  logInfo(fmt::format("lab: {} host(s) at {}, {} rank(s) each; rank 0's store on {}:{}",
                      lab.hosts.size(), lab.rate, e.nproc_per_node, lab.hosts.front().address,
                      port));

  using Clock = Teardown::Clock;
  BlockedSignals signals;
  Teardown teardown(std::chrono::seconds(10), std::chrono::seconds(5));
  std::vector<HostLauncher> launchers;
  int running = 0;
  auto signalAll = [&](int sig) {
    for (const auto& l : launchers) {
      if (l.running) ::kill(l.pid, sig);
    }
  };
  std::string failure;
  int exit_code = 0;
  bool interrupted = false;
  for (size_t i = 0; i < lab.hosts.size(); ++i) {
    HostLauncher l{&lab.hosts[i], static_cast<int>(i)};
    // The host's launcher knows it is one (and runs its run, not the lab), and its ranks'
    // bench headers name the link's cap.
    l.pid = spawn(lab.hosts[i], launchArgv(request, lab, index, static_cast<int>(i), port, out),
                  {std::string(kHostVariable) + "=" + lab.hosts[i].name,
                   fmt::format("COLLIE_LAB_LINK_MBIT={:g}", lab.rate_bits / 1e6)},
                  &signals.previousMask());
    l.running = true;
    ++running;
    launchers.push_back(l);
  }
  while (running > 0) {
    while (int sig = teardown.due(Clock::now())) signalAll(sig);
    pollfd fd{signals.fd(), POLLIN, 0};
    ::poll(&fd, 1, 100);
    for (int sig : signals.read()) {
      if (interrupted) {
        teardown.killNow(Clock::now());
        continue;
      }
      interrupted = true;
      exit_code = 128 + sig;
      logWarn(
          fmt::format("lab: {} received; forwarding it to the hosts' launchers", signalName(sig)));
      signalAll(sig);
      teardown.forwarded(Clock::now());
    }
    for (auto& l : launchers) {
      int status = 0;
      if (!l.running || ::waitpid(l.pid, &status, WNOHANG) != l.pid) continue;
      l.running = false;
      --running;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || !failure.empty() || interrupted || teardown.stopping()) continue;
      failure = fmt::format("host {} (node {}) {}", l.host->name, l.node, describeExit(status));
      exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      if (running > 0) {
        logError(fmt::format("lab: {}; the other host(s) get 10 s to stop on their own", failure));
      }
      teardown.failed(Clock::now());
    }
  }
  if (interrupted) throw Interrupted{exit_code};
  if (failure.empty()) return;
  const std::string message =
      fmt::format("run {} ({}) failed on the lab; first failure: {}", index + 1, e.name, failure);
  if (exit_code == 2) throw ConfigError(message);
  throw CommError(message);
}

}  // namespace collie::lab
