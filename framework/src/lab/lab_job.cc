// The lab's launcher: a `collie launch` per host, started inside the host's namespaces and
// watched by collie's launcher loop (runtime/launcher.h), as it watches a run's workers.
#include "lab/lab_job.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "collie/error.h"
#include "collie/log.h"
#include "lab/lab.h"
#include "measure/interface_bytes.h"
#include "runtime/launcher.h"

namespace fs = std::filesystem;

namespace collie::lab {
namespace {

constexpr int kDefaultPort = 29500;

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
  return e.lab.hosts > 0 && measure::labHostName().empty();
}

void runOnLab(const RunRequest& request, const config::Experiment& e, size_t index,
              const fs::path& out) {
  if (request.nnodes > 1) {
    throw ConfigError(
        "launch.lab starts a launcher on every emulated host itself. HINT: use `collie run`, "
        "not `collie launch`");
  }
  bool made = false;
  Lab lab = up({e.lab.hosts, e.lab.rate, e.lab.cpus}, &made);
  // A run that made the lab takes it down when it ends, however it ends, and leaves the
  // machine as it found it; a lab that was up as asked (`collie lab up` before the run, to
  // keep it between runs) stays up.
  struct TakeDown {
    bool armed;
    ~TakeDown() {
      if (!armed) return;
      try {
        down();
      } catch (...) {
        std::fputs("lab: cannot take the lab down. HINT: collie lab down\n", stderr);
      }
    }
  } take_down{made};
  // Consecutive runs use consecutive ports, as collie launch does (a late rank never meets
  // the previous run's store).
  const int port = (e.master_port != 0 ? e.master_port : kDefaultPort) + static_cast<int>(index);
  logInfo(fmt::format("lab: {} host(s) at {}, {} rank(s) each; rank 0's store on {}:{}",
                      lab.hosts.size(), lab.rate, e.nproc_per_node, lab.hosts.front().address,
                      port));

  std::vector<ChildProcess> launchers;
  for (size_t i = 0; i < lab.hosts.size(); ++i) {
    // The host's launcher knows it is one (and runs its run, not the lab), and its ranks'
    // bench headers name the link's cap.
    ChildProcess l;
    l.name = fmt::format("host {}, node {}", lab.hosts[i].name, i);
    l.start = inside(lab.hosts[i], launchArgv(request, lab, index, static_cast<int>(i), port, out),
                     {std::string(measure::kLabHostVariable) + "=" + lab.hosts[i].name,
                      fmt::format("COLLIE_LAB_LINK_MBIT={:g}", lab.rate_bits / 1e6)});
    launchers.push_back(std::move(l));
  }
  // Their ranks' lines reach us already prefixed by their own launcher; a host that fails
  // leaves the others 10 s to stop on their own (their ranks report the failure first).
  Supervision how;
  how.who = "lab";
  how.noun = "host launcher(s)";
  how.relay_output = false;
  how.early_exit_is_suspect = false;
  how.failure_grace = std::chrono::seconds(10);
  how.kill_grace = std::chrono::seconds(5);
  const LaunchOutcome outcome = supervise(std::move(launchers), how);
  if (outcome.interrupted) throw Interrupted{outcome.exit_code};
  if (outcome.failure.empty()) return;
  const std::string message = fmt::format("run {} ({}) failed on the lab; first failure: {}",
                                          index + 1, e.name, outcome.failure);
  // A host whose launcher cannot be started (its namespace is gone) is the lab's setup.
  if (outcome.exit_code == 2 || outcome.not_started) throw ConfigError(message);
  throw CommError(message);
}

}  // namespace collie::lab
