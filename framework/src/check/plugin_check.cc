// plugin-check in threads or as jobs of worker processes (check/plugin_check.h).
#include "check/plugin_check.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "check/conformance.h"
#include "collie/error.h"
#include "collie/log.h"
#include "runtime/environment.h"
#include "runtime/job.h"
#include "runtime/launcher.h"

namespace fs = std::filesystem;

namespace collie::check {

const std::vector<std::string> kReferenceSchedulers = {"ring", "tree", "halving_doubling"};

namespace {

constexpr int kExitRunFailed = 1;

// The kind of the plugin NAME names: its descriptor says, for a path; the file that exists,
// for a bare name (found without loading any: a scan would load every plugin, models and
// their LibTorch included, in every worker).
PluginKind kindOf(const PluginLoader& loader, const std::string& name) {
  if (name.find('/') != std::string::npos) return pluginInfo(*openPluginFile(name, nullptr)).kind;
  if (!loader.find(PluginKind::kBackend, name).empty()) return PluginKind::kBackend;
  return PluginKind::kScheduler;  // open() then explains what was not found
}

config::PluginRef pluginRef(const std::string& plugin, const std::vector<std::string>& params,
                            const std::string& kind) {
  config::PluginRef ref;
  ref.plugin = plugin;
  ref.label = fs::path(plugin).filename().string();
  ref.params = Params(kind + " '" + plugin + "'");
  for (const auto& p : params) {
    auto eq = p.find('=');
    // A scheduler's params come from --param; a backend's from --param when it is the
    // plugin under test, else from --backend-param.
    const std::string flag = kind == "scheduler" ? "--param" : "--param/--backend-param";
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError(flag + " " + p + ": expected key=value, e.g. " + flag + " timeout=10s");
    }
    ref.params.set(p.substr(0, eq), p.substr(eq + 1), flag);
  }
  return ref;
}

// `names` parsed by `parse` into `*values` (left as they are when `names` is empty).
template <typename T>
void parseNames(const std::vector<std::string>& names, bool (*parse)(const std::string&, T*),
                const char* flag, std::vector<T>* values) {
  if (names.empty()) return;
  values->clear();
  for (const auto& name : names) {
    T value;
    if (!parse(name, &value)) throw ConfigError(fmt::format("{}: unknown value '{}'", flag, name));
    values->push_back(value);
  }
}

Options optionsOf(const PluginCheckRequest& request) {
  Options options;
  if (!request.worlds.empty()) options.worlds = request.worlds;
  options.large_count = request.large_count;
  parseNames(request.dtypes, parseDType, "--dtypes", &options.dtypes);
  parseNames(request.ops, parseReduceOp, "--ops", &options.ops);
  return options;
}

// A private folder for one job's report, removed with the object.
class ScratchDir {
 public:
  ScratchDir() {
    char path[] = "/tmp/collie-check-XXXXXX";
    if (::mkdtemp(path) == nullptr) {
      throw Error(ErrorKind::kInternal, std::string("mkdtemp: ") + std::strerror(errno));
    }
    path_ = path;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// One group size of a check over a process backend: a job of workers (this executable
// again, with --worker-task), whose reporting rank leaves the report at COLLIE_RESULT.
Report checkAsProcesses(const PluginCheckRequest& request, const std::string& task,
                        const std::string& scheduler, int world) {
  const std::string label = task == "contract" ? request.plugin : scheduler;
  ScratchDir scratch;
  // The params belong to the plugin under test: the backend's when it is the backend.
  const bool backend_under_test = task == "contract" || scheduler != request.plugin;
  LaunchSpec spec;
  spec.argv = {selfExecutable(),
               "plugin-check",
               task == "contract" ? request.plugin : scheduler,
               "--backend",
               backend_under_test ? request.plugin : request.backend,
               "--worlds",
               fmt::format("{}", world),
               "--large-count",
               fmt::format("{}", request.large_count),
               "--worker-task",
               task};
  for (const auto& d : request.dtypes) spec.argv.insert(spec.argv.end(), {"--dtypes", d});
  for (const auto& o : request.ops) spec.argv.insert(spec.argv.end(), {"--ops", o});
  for (const auto& p : request.params) {
    spec.argv.insert(
        spec.argv.end(),
        {task == "scheduler" && backend_under_test ? "--backend-param" : "--param", p});
  }
  if (!backend_under_test) {  // a scheduler under test: the backend's own params, as given
    for (const auto& p : request.backend_params) {
      spec.argv.insert(spec.argv.end(), {"--backend-param", p});
    }
  }
  spec.nproc = world;
  spec.master_port = pickFreePort(spec.master_addr);
  spec.result_path = (scratch.path() / "report.json").string();
  LaunchOutcome outcome = launchWorkers(spec);
  if (outcome.interrupted) throw Interrupted{outcome.exit_code};
  if (!outcome.failure.empty()) {
    Report report;
    report.failures.push_back(fmt::format("{}: {} ranks: stopped: {} (its error is above)", label,
                                          world, outcome.failure));
    return report;
  }
  return loadReport(spec.result_path);
}

// One worker of checkAsProcesses.
int runWorker(const PluginCheckRequest& request, const PluginLoader& loader, const WorkerEnv& env,
              const Options& options) {
  if (env.result_path.empty()) {
    throw ConfigError("plugin-check worker: COLLIE_RESULT is not set (collie's launcher sets it)");
  }
  setProcessLogRank(env.rank);
  ProcessJob job(env, "127.0.0.1", 0, std::chrono::seconds(60));
  const auto timeout = std::chrono::seconds(60);
  if (request.worker_task == "contract") {
    std::vector<WorkerRank> groups;
    int barriers = 0;
    auto make = [&](const std::string& limit) {
      config::PluginRef ref = pluginRef(request.plugin, request.params, "backend");
      ref.params.set("timeout", limit, "plugin-check");
      groups.push_back(
          createBackend(job, loader, ref, fmt::format("contract{}/", groups.size()), timeout));
      return groups.back().backend;
    };
    auto barrier = [&] { job.allGather(fmt::format("barrier{}", barriers++), ""); };
    Report report = checkBackendContractOnRank(request.plugin, make, barrier);
    if (job.rank() == 1) saveReport(env.result_path, report);
    return 0;
  }
  config::PluginRef backend = pluginRef(request.backend, request.backend_params, "backend");
  backend.params.set("timeout", options.timeout, "plugin-check");
  WorkerRank rank = createBackend(job, loader, backend, "check/", timeout);
  Report report =
      checkSchedulerOnRank(loader, pluginRef(request.plugin, request.params, "scheduler"),
                           rank.backend, backend.label, options);
  if (job.rank() == 0) saveReport(env.result_path, report);
  return 0;
}

// Prints each report and the verdict; the exit code.
class Verdict {
 public:
  void add(const std::string& title, const Report& report) {
    std::cout << describe(title, report) << std::flush;
    ok_ = ok_ && report.ok();
  }
  int finish() const {
    std::cout << (ok_ ? "plugin-check: PASS" : "plugin-check: FAIL") << std::endl;
    return ok_ ? 0 : kExitRunFailed;
  }

 private:
  bool ok_ = true;
};

int checkOverProcesses(const PluginCheckRequest& request, bool is_scheduler,
                       const Options& options) {
  Verdict verdict;
  auto run = [&](const std::string& title, const std::string& task, const std::string& scheduler,
                 const std::vector<int>& worlds) {
    Report report;
    for (int world : worlds) merge(report, checkAsProcesses(request, task, scheduler, world));
    verdict.add(title, report);
  };
  if (is_scheduler) {
    run(fmt::format("scheduler {} over {} (processes)", request.plugin, request.backend),
        "scheduler", request.plugin, options.worlds);
  } else {
    run(fmt::format("backend {} contract (processes)", request.plugin), "contract", "", {2});
    for (const auto& scheduler : kReferenceSchedulers) {
      run(fmt::format("scheduler {} over {} (processes)", scheduler, request.plugin), "scheduler",
          scheduler, options.worlds);
    }
  }
  return verdict.finish();
}

int checkInThreads(const PluginCheckRequest& request, const PluginLoader& loader, bool is_scheduler,
                   const Options& options) {
  Verdict verdict;
  if (is_scheduler) {
    loader.open(PluginKind::kBackend, request.backend);
    verdict.add(
        fmt::format("scheduler {} over {}", request.plugin, request.backend),
        checkScheduler(loader, pluginRef(request.plugin, request.params, "scheduler"),
                       pluginRef(request.backend, request.backend_params, "backend"), options));
    return verdict.finish();
  }
  loader.open(PluginKind::kBackend, request.plugin);
  auto backend = pluginRef(request.plugin, request.params, "backend");
  verdict.add(fmt::format("backend {} contract", request.plugin),
              checkBackendContract(loader, backend));
  for (const auto& scheduler : kReferenceSchedulers) {
    verdict.add(fmt::format("scheduler {} over {}", scheduler, request.plugin),
                checkScheduler(loader, pluginRef(scheduler, {}, "scheduler"), backend, options));
  }
  return verdict.finish();
}

}  // namespace

int runPluginCheck(const PluginCheckRequest& request) {
  PluginLoader loader;
  const Options options = optionsOf(request);
  const bool is_scheduler = kindOf(loader, request.plugin) == PluginKind::kScheduler;
  if (!is_scheduler && !request.backend_params.empty() && request.worker_task.empty()) {
    throw ConfigError(
        "plugin-check: --backend-param sets the params of the backend a "
        "scheduler is checked over; " +
        request.plugin + " is the backend under test: give its params with --param");
  }
  if (is_scheduler) loader.open(PluginKind::kScheduler, request.plugin);
  const std::string backend = is_scheduler ? request.backend : request.plugin;
  if (runsInProcess(loader, backend)) return checkInThreads(request, loader, is_scheduler, options);
  const WorkerEnv env = detectWorkerEnv();
  if (env.present && !request.worker_task.empty()) return runWorker(request, loader, env, options);
  return checkOverProcesses(request, is_scheduler, options);
}

}  // namespace collie::check
