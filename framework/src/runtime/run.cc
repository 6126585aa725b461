// The roles of `collie run`: launcher, collie worker, a simulation's child, rank of an outside
// launcher.
#include "runtime/run.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>

#include "collie/config.h"
#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/log.h"
#include "core/strings.h"
#include "runtime/environment.h"
#include "runtime/faults.h"
#include "runtime/launcher.h"
#include "runtime/progress.h"
#include "runtime/tcp_store.h"
#include "util/files.h"
#include "util/spawn.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

constexpr int kExitBadInput = 2;

// Who this process is in the job; detected once, from the environment a launcher set.
enum class Role {
  kLauncher,      // started by a user: runs each run as threads or starts its workers
  kCollieWorker,  // started by collie's launcher: one run, one rank
  kOutsideRank,   // started by torchrun, mpirun or srun: one rank of every run
};

Role roleOf(const WorkerEnv& env) {
  if (!env.present) return Role::kLauncher;
  return env.source == "collie" ? Role::kCollieWorker : Role::kOutsideRank;
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%d-%H%M%S", &tm);
  return text;
}

void saveConfig(const fs::path& path, const YAML::Node& resolved) {
  std::ofstream out(path);
  YAML::Emitter emitter;
  emitter << resolved;
  out << "# resolved by collie " << COLLIE_VERSION << ": defaults filled in, --set applied\n"
      << emitter.c_str() << "\n";
  if (!out) throw Error(ErrorKind::kInternal, "cannot write " + path.string());
}

// Every plugin the runs name loads before anything runs (no silent fallback).
void openPlugins(const PluginLoader& loader, const std::vector<config::Experiment>& runs) {
  for (const auto& e : runs) {
    for (const auto& use : pluginsOf(e)) loader.open(use.kind, use.plugin);
  }
}

// Where rank 0 of run `index` leaves its result for the launcher on its node.
fs::path resultPath(const fs::path& out, size_t index) {
  return out / fmt::format(".rank0-results-{}.json", index);
}

// launch.cpu_share: this rank's process limited for the run (nullptr without a share). Every
// rank then spins at once for a moment, and rank 0 logs the share each one achieved. A rank
// that cannot take its share tells the others, and every rank stops with its reason.
std::unique_ptr<CpuLimit> limitCpu(ProcessJob& job, const config::Experiment& e, size_t index) {
  const double share = cpuShareOf(e, job.rank(), job.world(), false, e.backend.label);
  if (share == 0) return nullptr;
  const std::string run = fmt::format("run{}/cpu-share-", index);
  std::unique_ptr<CpuLimit> limit;
  std::string failure;
  try {
    limit = std::make_unique<CpuLimit>(share, "launch.cpu_share", "share");
  } catch (const ConfigError& x) {
    failure = x.what();
  }
  const auto taken = job.allGather(run + "taken", failure);
  for (size_t r = 0; r < taken.size(); ++r) {
    if (!taken[r].empty()) throw ConfigError(fmt::format("rank {}: {}", r, taken[r]));
  }
  const double achieved = measureCpuShare(std::chrono::milliseconds(500));
  const auto all = job.allGather(run + "achieved", fmt::format("{:.3f}", achieved));
  if (job.rank() == 0) {
    std::vector<std::string> parts;
    std::vector<std::string> short_of;
    for (size_t r = 0; r < all.size(); ++r) {
      const double want = e.cpu_share.size() == 1 ? e.cpu_share[0] : e.cpu_share[r];
      parts.push_back(fmt::format("rank {} {:.2f} (achieved {})", r, want, all[r]));
      if (std::stod(all[r]) < 0.85 * std::min(want, 1.0)) short_of.push_back(std::to_string(r));
    }
    logInfo("launch.cpu_share of one CPU, measured over 0.5 s with every rank spinning: " +
            detail::join(parts, ", "));
    if (!short_of.empty()) {
      logWarn("launch.cpu_share: rank(s) " + detail::join(short_of, ", ") +
              " achieved less than 85% of their share: the ranks share fewer free CPUs than "
              "their shares add up to, so the shares are not what sets their speeds");
    }
  }
  return limit;
}

// This process's rank of run `index`: join it, run it, and explain a failure.
void runRank(ProcessJob& job, const PluginLoader& loader, const config::Experiment& e, size_t index,
             ExperimentKind& kind, const fs::path& out) {
  job.diagnose([&] {
    const auto limit = limitCpu(job, e, index);
    WorkerRank rank = joinRun(job, loader, e, static_cast<int>(index));
    kind.runAsRank(loader, e, rank, out);
  });
}

// The command that runs this file again as the user asked (its --set, --log-level), with
// its output into `out`: a run's workers, and a simulation's child.
std::vector<std::string> collieAgain(const RunRequest& request, const fs::path& out) {
  std::vector<std::string> argv = {selfExecutable()};
  if (!request.log_level.empty()) argv.insert(argv.end(), {"--log-level", request.log_level});
  argv.insert(argv.end(), {"run", request.config, "--out", out.string()});
  for (const auto& s : request.sets) argv.insert(argv.end(), {"--set", s});
  return argv;
}

// A simulation's child is told its run, what that run must read as (a digest of its resolved
// config: the file is read again) and where to leave its result by these; a failure leaves
// its message in RESULT.error, and its kind in the exit code.
constexpr const char* kSimulationRun = "COLLIE_SIMULATION_RUN";
constexpr const char* kSimulationDigest = "COLLIE_SIMULATION_DIGEST";
constexpr const char* kSimulationResult = "COLLIE_SIMULATION_RESULT";
constexpr int kExitPluginError = 3;
constexpr int kExitInternalError = 4;

fs::path errorPathOf(const std::string& result_path) { return result_path + ".error"; }

// The resolved config of `e` (defaults filled in, --set applied) as a short digest.
std::string digestOf(const config::Experiment& e) {
  YAML::Emitter emitter;
  emitter << e.resolved;
  return fmt::format("{:016x}", std::hash<std::string>{}(emitter.c_str()));
}

// A simulated run (a backend that runs its ranks itself: SimGrid) in a child process of its
// own: SimGrid runs one simulation per process (its engine and models cannot be set up
// again), so every run of a file, and every matrix point, gets a fresh one: this very
// executable again (/proc/self/exe, even if the file was replaced since), started as the
// launcher starts its workers. The child hands its result over in `result_path` as a worker
// does; a failure comes back with its kind and message and is thrown here again.
void runSimulationInChild(ExperimentKind& kind, const RunRequest& request,
                          const config::Experiment& e, size_t index, const fs::path& out) {
  const std::string result_path = resultPath(out, index).string();
  std::error_code ec;
  fs::remove(result_path, ec);
  fs::remove(errorPathOf(result_path), ec);
  detail::SpawnOptions child;
  child.argv = collieAgain(request, out);
  child.argv.front() = "/proc/self/exe";
  child.environment =
      detail::environmentWith({fmt::format("{}={}", kSimulationRun, index),
                               fmt::format("{}={}", kSimulationDigest, digestOf(e)),
                               fmt::format("{}={}", kSimulationResult, result_path)});
  std::cout.flush();
  std::cerr.flush();
  const int status = detail::waitFor(detail::spawn(child));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    kind.load(result_path);
    fs::remove(result_path, ec);
    return;
  }
  std::string message;
  {
    std::ifstream in(errorPathOf(result_path));
    message.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  fs::remove(errorPathOf(result_path), ec);
  if (WIFSIGNALED(status)) {
    throw CommError(fmt::format("the simulation of {} stopped with signal {} ({})", e.name,
                                WTERMSIG(status), ::strsignal(WTERMSIG(status))));
  }
  if (message.empty()) {  // it failed before it could leave a message: it printed its own
    message = fmt::format("the simulation of {} exited with code {} (its error is above)", e.name,
                          WEXITSTATUS(status));
  }
  switch (WEXITSTATUS(status)) {
    case kExitBadInput:
      throw ConfigError(message);
    case kExitPluginError:
      throw PluginError(message);
    case kExitInternalError:
      throw Error(ErrorKind::kInternal, message);
    default:
      throw CommError(message);
  }
}

// The run a simulation's child was started for: the one whose index and digest its parent
// gave. ConfigError when the file no longer has it (it was edited since the parent read it).
const config::Experiment& simulatedRun(const RunRequest& request,
                                       const std::vector<config::Experiment>& runs) {
  const char* run = std::getenv(kSimulationRun);
  const char* digest = std::getenv(kSimulationDigest);
  char* end = nullptr;
  const long index = run != nullptr ? std::strtol(run, &end, 10) : -1;
  if (run == nullptr || *end != '\0' || index < 0 || index >= static_cast<long>(runs.size()) ||
      digest == nullptr || digestOf(runs[static_cast<size_t>(index)]) != digest) {
    throw ConfigError(fmt::format(
        "{} changed while collie ran it: run {} of it is no longer what the first reading "
        "found. HINT: run it again; edit an experiment file only when no run of it is under way",
        request.config, run != nullptr ? run : "(unset)"));
  }
  return runs[static_cast<size_t>(index)];
}

// The child runSimulationInChild started: the one run its parent names, in threads of this
// process; its result, or its failure's message, where the parent reads it. Ends the process
// with the exit code that tells the parent the failure's kind, as the forked child SimGrid
// needs did: nothing of the simulation's state is torn down (_Exit, no static destructor).
[[noreturn]] void runAsSimulationChild(const RunRequest& request,
                                       const std::vector<config::Experiment>& runs,
                                       ExperimentKind& kind, const std::string& result_path) {
  int code = 0;
  std::string message;
  try {
    const config::Experiment& e = simulatedRun(request, runs);
    PluginLoader loader;
    openPlugins(loader, {e});
    kind.runInThreads(loader, e, request.out);
    kind.saveLast(result_path);
  } catch (const Error& x) {
    code = x.kind() == ErrorKind::kConfig   ? kExitBadInput
           : x.kind() == ErrorKind::kPlugin ? kExitPluginError
                                            : 1;
    message = x.what();
  } catch (const std::exception& x) {
    code = kExitInternalError;
    message = x.what();
  }
  if (code != 0) {
    try {
      detail::writeFileAtomically(errorPathOf(result_path).string(), message);
    } catch (const std::exception&) {
      std::cerr << "collie: error: " << message << "\n";  // the parent's message is then bare
    }
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

// A worker collie's launcher started: one run of the file; rank 0 hands its result over.
int runAsCollieWorker(const RunRequest& request, const std::vector<config::Experiment>& runs,
                      const WorkerEnv& env, ExperimentKind& kind) {
  if (env.experiment >= static_cast<int>(runs.size())) {
    throw ConfigError(fmt::format("COLLIE_EXPERIMENT={} but {} has {} run(s)", env.experiment,
                                  request.config, runs.size()));
  }
  if (request.out.empty() || env.result_path.empty()) {
    throw ConfigError(
        "collie worker: --out and COLLIE_RESULT are required (collie's launcher sets both)");
  }
  const auto& e = runs[env.experiment];
  PluginLoader loader;
  openPlugins(loader, {e});
  ProcessJob job(env, e.master_addr, static_cast<uint16_t>(e.master_port), e.rendezvous_timeout,
                 e.token_file);
  runRank(job, loader, e, env.experiment, kind, request.out);
  if (job.rank() == 0) kind.saveLast(env.result_path);
  return 0;
}

// OUT/error.json: why run `index` failed for good, for a scheduler or a person to read
// (torchrun writes one too): the run, the first failed rank, its exit code or signal, the
// time, and how many restarts had been used.
void writeErrorFile(const fs::path& out, const config::Experiment& e, size_t index,
                    const LaunchOutcome& outcome, int restarts) {
  char when[32];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  nlohmann::json error = {
      {"run", index + 1},
      {"name", e.name},
      {"matrix_point", e.matrix_point},
      {"failed_rank", outcome.failed_rank},
      {"exit_code", outcome.exit_code},
      {"signal", outcome.failed_signal},
      {"out_of_memory", outcome.out_of_memory},
      {"message", outcome.failure},
      {"restarts", restarts},
      {"max_restarts", e.max_restarts},
      {"time", when},
  };
  try {
    detail::writeFileAtomically((out / "error.json").string(), error.dump(2) + "\n");
  } catch (const std::exception& x) {
    logWarn(std::string("cannot write the error file: ") + x.what());
  }
}

// The launcher's part of run `index`: this node's workers, restarted after a failure as
// launch.max_restarts allows. On node 0 the result is then at resultPath(out, index); a
// failure that ends the run is also in OUT/error.json.
void launchRun(const RunRequest& request, const ExperimentKind& kind, const config::Experiment& e,
               size_t index, const fs::path& out) {
  LaunchSpec spec;
  spec.argv = collieAgain(request, out);
  spec.nproc = e.nproc_per_node;
  spec.nnodes = request.nnodes;
  spec.node_rank = request.node_rank;
  spec.master_addr = request.master_addr.empty() ? e.master_addr : request.master_addr;
  const int port = request.master_port != 0 ? request.master_port : e.master_port;
  spec.experiment = static_cast<int>(index);
  spec.result_path = resultPath(out, index).string();
  spec.threads_per_rank = e.threads_per_rank;
  spec.cpu_affinity = e.cpu_affinity;
  spec.memory_limits = e.memory_limit;
  fs::remove(spec.result_path);
  fs::remove(out / "error.json");  // from an earlier run into the same folder
  // Node 0's launcher watches for stalls (the others would repeat its line).
  if (request.node_rank == 0) {
    spec.watch.progress_dir = progressFolder(out.string());
    spec.watch.stall_warning = e.debug.stall_warning;
    spec.watch.progress_run = e.matrix_index;
  }
  const ExperimentKind::Restart restart = kind.restartOf(e);
  if (e.max_restarts > 0 && !restart.warning.empty()) logWarn(restart.warning);
  for (int attempt = 0;; ++attempt) {
    // Consecutive runs of one file use consecutive ports, so that a late rank never reaches
    // the previous run's store; a restart reuses its run's port (the old store is gone).
    spec.master_port =
        port != 0 ? static_cast<uint16_t>(port + index) : pickFreePort(spec.master_addr);
    std::error_code ec;
    if (request.node_rank == 0)
      fs::remove_all(spec.watch.progress_dir, ec);  // an earlier attempt's
    LaunchOutcome outcome = launchWorkers(spec);
    if (outcome.interrupted) {
      logError("interrupted: every worker was stopped");
      throw Interrupted{outcome.exit_code};
    }
    if (outcome.failure.empty()) return;
    // Bad input fails the same way every time, and so does a rank over its memory limit:
    // never restarted.
    if (attempt < e.max_restarts && outcome.exit_code != kExitBadInput && !outcome.not_started &&
        !outcome.out_of_memory && request.nnodes == 1) {
      logWarn(fmt::format("run {} ({}) failed: {}; restarting all {} workers (restart {} of {}){}",
                          index + 1, e.name, outcome.failure, e.nproc_per_node, attempt + 1,
                          e.max_restarts, restart.from));
      continue;
    }
    std::string message =
        fmt::format("run {} ({}) failed; every other rank was stopped. First failure: {}",
                    index + 1, e.name, outcome.failure);
    if (attempt > 0) message += fmt::format(" (after {} restart(s))", attempt);
    if (outcome.out_of_memory) {
      message +=
          ". HINT: raise launch.memory_limit, or need less per rank (a smaller model or "
          "micro-batch, a higher train.sharding stage)";
    }
    writeErrorFile(out, e, index, outcome, attempt);
    if (outcome.exit_code == kExitBadInput) throw ConfigError(message);
    throw CommError(message);
  }
}

// The job of an outside launcher (torchrun, mpirun, srun): this process is one of its ranks
// for every run of the file, and the output folder is the one rank 0 names.
std::unique_ptr<ProcessJob> joinOutsideJob(const std::vector<config::Experiment>& runs,
                                           const WorkerEnv& env, fs::path* out) {
  setProcessLogRank(env.rank);
  if (env.rank != 0) setLogLevel(LogLevel::kWarn);  // one progress log, from rank 0
  const auto& first = runs.front();
  config::checkFixedWorld(runs, env.source, env.world);
  auto job = std::make_unique<ProcessJob>(
      env, first.master_addr, static_cast<uint16_t>(first.master_port ? first.master_port : 29500),
      first.rendezvous_timeout, first.token_file);
  *out = job->allGather("output-dir", out->string()).front();  // rank 0's clock names it
  return job;
}

// Run i of a file listens on master_port + i (launchRun): refuses, before any run starts, a
// port that would pass 65535 (it wrapped to a low port, or to 0, "not set").
void checkRunPorts(const RunRequest& request, const std::vector<config::Experiment>& runs,
                   const PluginLoader& loader) {
  for (size_t i = 0; i < runs.size(); ++i) {
    const int port = request.master_port != 0 ? request.master_port : runs[i].master_port;
    if (port == 0 || port + static_cast<long>(i) <= 65535) continue;
    if (runsInProcess(loader, runs[i].backend.plugin)) continue;  // threads use no port
    throw ConfigError(fmt::format(
        "{}: run {} of {} would listen on port {} + {} = {}, past 65535 (each run of a file "
        "takes the next port). HINT: set launch.master_port to {} or lower, or 0 to pick a "
        "free port",
        request.config, i + 1, runs.size(), port, i, port + static_cast<long>(i),
        65535 - static_cast<long>(runs.size()) + 1));
  }
}

// A backend that moves device memory only (nccl) needs a GPU's: the emulated device
// (COLLIE_EMULATED_DEVICE=1) is host memory it cannot read. Said once, before any rank starts.
void refuseEmulatedDeviceFor(const PluginLoader& loader, const config::Experiment& e) {
  if (deviceMemoryOps().owns == nullptr) return;
  if (!pluginInfo(*loader.open(PluginKind::kBackend, e.backend.plugin)).device_memory_only) return;
  throw ConfigError(fmt::format(
      "backend '{}' moves a GPU's memory only, but COLLIE_EMULATED_DEVICE=1 made this process's "
      "device memory the emulated device's (host memory). HINT: unset COLLIE_EMULATED_DEVICE, "
      "or check device-only paths over loopback with params memory: device",
      e.backend.label));
}

}  // namespace

int runExperiments(const RunRequest& request, const std::vector<config::Experiment>& runs,
                   const RunParts& parts) {
  const auto& first = runs.front();
  std::unique_ptr<ExperimentKind> kind = parts.kind(first.kind);
  const char* simulation_result = std::getenv(kSimulationResult);
  if (simulation_result != nullptr && std::getenv(kSimulationRun) != nullptr)
    runAsSimulationChild(request, runs, *kind, simulation_result);
  const WorkerEnv env = detectWorkerEnv();
  const Role role = roleOf(env);
  if (role == Role::kCollieWorker) return runAsCollieWorker(request, runs, env, *kind);

  fs::path out = request.out.empty() ? fs::path(first.output_dir) / (first.name + "-" + timestamp())
                                     : fs::path(request.out);
  PluginLoader loader;
  openPlugins(loader, runs);
  std::unique_ptr<ProcessJob> job;  // kOutsideRank: the job every run shares
  if (role == Role::kOutsideRank) job = joinOutsideJob(runs, env, &out);
  std::error_code ec;
  fs::create_directories(out, ec);  // every rank writes its per-step metrics here
  if (ec) throw ConfigError("--out " + out.string() + ": cannot create: " + ec.message());
  kind->checkRequest(request, runs, loader);
  for (const auto& e : runs) refuseEmulatedDeviceFor(loader, e);
  checkRunPorts(request, runs, loader);
  const bool writer = !job || job->rank() == 0;  // under an outside launcher, rank 0 writes

  if (request.only_run >= static_cast<int>(runs.size())) {
    throw ConfigError(fmt::format("--only-run {}: {} has {} run(s)", request.only_run,
                                  request.config, runs.size()));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& e = runs[i];
    const bool on_lab = role == Role::kLauncher && parts.wants_lab && parts.wants_lab(e);
    if (request.only_run >= 0 && static_cast<int>(i) != request.only_run) continue;
    if (writer) {
      saveConfig(out / (runs.size() == 1 ? "config.yaml" : fmt::format("config-{}.yaml", i)),
                 e.resolved);
    }
    const bool threads = runsInProcess(loader, e.backend.plugin);
    const bool simulated =
        threads && pluginInfo(*loader.open(PluginKind::kBackend, e.backend.plugin)).runs_ranks;
    if (simulated) kind->checkSimulated(e);
    if (!simulated && e.nproc_per_node > config::kMostLocalRanks) {
      throw ConfigError(fmt::format(
          "launch.nproc_per_node {} is more ranks than one machine runs ({} at most); only a "
          "simulated backend takes up to {}. HINT: use backend simgrid to simulate a larger job",
          e.nproc_per_node, config::kMostLocalRanks, config::kMostSimulatedRanks));
    }
    const int ranks =
        job ? job->world() : e.nproc_per_node * (on_lab ? e.lab.hosts : request.nnodes);
    logInfo(fmt::format("run {}/{}: {}{}, {} ranks on {} ({})", i + 1, runs.size(), e.name,
                        e.matrix_point.empty() ? "" : " [" + e.matrix_point + "]", ranks,
                        e.backend.label,
                        simulated ? "simulated"
                        : threads ? "threads"
                                  : "processes"));
    if (threads && on_lab) {
      throw ConfigError(fmt::format(
          "launch.lab runs ranks on emulated hosts, but backend '{}' runs its ranks as threads of "
          "one process. HINT: use backend gloo or ucx",
          e.backend.label));
    }
    if (threads && (job ? job->world() > 1 : request.nnodes > 1)) {
      throw ConfigError(fmt::format(
          "backend '{}' runs its ranks as threads of one process, but this job has {} "
          "processes. HINT: use backend gloo or ucx across processes, or run `collie run` alone",
          e.backend.label, ranks));
    }
    checkFaultsFit(e, ranks, threads, e.backend.label);
    cpuShareOf(e, 0, ranks, threads, e.backend.label);  // its length, and threads refused
    checkMemoryLimit(e, ranks, threads, job != nullptr, on_lab, e.backend.label);
    // The workers this launcher starts (here, or on the lab's hosts) share a job token: a
    // fresh one when it starts them all, else launch.token_file's (node 0 writes it).
    if (!job && !threads && (request.nnodes == 1 || !e.token_file.empty()))
      provideJobToken(e.token_file, request.node_rank == 0, e.rendezvous_timeout);
    const std::string master = request.master_addr.empty() ? e.master_addr : request.master_addr;
    if (!job && !threads && request.nnodes > 1 && !isLoopbackHost(master) &&
        jobToken(e.token_file).empty()) {
      throw ConfigError(fmt::format(
          "collie launch: a job across {} nodes meets at {}, which other hosts reach, and has no "
          "job token. HINT: set launch.token_file to a file every node can read (node 0 writes "
          "it when it is missing), or export the same COLLIE_JOB_TOKEN on every node",
          request.nnodes, master));
    }
    if (job) {
      runRank(*job, loader, e, i, *kind, out);
    } else if (simulated) {
      runSimulationInChild(*kind, request, e, i, out);
    } else if (threads) {
      kind->runInThreads(loader, e, out);
    } else {
      if (on_lab) {
        parts.run_on_lab(request, e, i, out);  // node 0 of the lab leaves the result here
      } else {
        launchRun(request, *kind, e, i, out);
        // Node 0's launcher reports; on a lab host, the launcher that started the hosts does.
        if (request.node_rank != 0 || request.only_run >= 0) continue;
      }
      kind->load(resultPath(out, i).string());
      fs::remove(resultPath(out, i));
    }
  }
  if (!writer || request.node_rank != 0 || request.only_run >= 0) return 0;
  return kind->report(request, runs, out);
}

}  // namespace collie
