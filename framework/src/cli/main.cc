// The collie command line: run, validate, plugins, --version. Exit codes: 0 success,
// 1 the run failed, 2 bad input (config, CLI, plugin).
#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "bench/bench.h"
#include "check/conformance.h"
#include "collie/error.h"
#include "collie/log.h"
#include "collie/plugin.h"
#include "collie/rules.h"
#include "config/experiment.h"
#include "plugin/loader.h"
#include "runtime/environment.h"
#include "runtime/job.h"
#include "runtime/launcher.h"
#include "train/trainer.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

constexpr int kExitRunFailed = 1;
constexpr int kExitBadInput = 2;

// The launcher was interrupted (SIGINT, SIGTERM, SIGHUP): collie exits 128 + signal, as a
// shell reports a process killed by it.
struct Interrupted {
  int exit_code;
};

struct Options {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  std::string log_level;
  std::string emit_rules;
  std::string plugin;
  std::string backend = "loopback";
  std::vector<int> worlds;
  std::vector<std::string> params;
  size_t large_count = 100003;
  std::vector<std::string> dtypes, ops;
  std::vector<std::string> backend_params;  // plugin-check's workers: the backend's own
  std::string worker_task;                  // plugin-check's workers: "contract" or "scheduler"
  // collie launch: this node's place among several.
  int nnodes = 1, node_rank = 0;
  std::string master_addr;
  int master_port = 0;
};

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream out;
  out << std::put_time(&tm, "%Y%m%d-%H%M%S");
  return out.str();
}

void applyLogLevel(const std::string& cli_level, LogLevel config_level) {
  LogLevel level = config_level;
  if (const char* env = std::getenv("COLLIE_LOG_LEVEL")) parseLogLevel(env, &level);
  if (!cli_level.empty()) parseLogLevel(cli_level, &level);
  setLogLevel(level);
}

void saveConfig(const std::string& path, const YAML::Node& resolved) {
  std::ofstream out(path);
  YAML::Emitter emitter;
  emitter << resolved;
  out << "# resolved by collie " << COLLIE_VERSION << ": defaults filled in, --set applied\n"
      << emitter.c_str() << "\n";
  if (!out) throw Error(ErrorKind::kInternal, "cannot write " + path);
}

// Every plugin the experiments name must load before anything runs (no silent fallback).
void openPlugins(const PluginLoader& loader, const std::vector<config::Experiment>& experiments) {
  auto openScheduler = [&](const config::PluginRef& s) {
    if (s.rules.empty()) loader.open(PluginKind::kScheduler, s.plugin);
    for (const auto& rule : s.rules) loader.open(PluginKind::kScheduler, rule.scheduler.plugin);
  };
  for (const auto& e : experiments) {
    loader.open(PluginKind::kBackend, e.backend.plugin);
    for (const auto& s : e.bench.schedulers) openScheduler(s);
    if (e.kind == config::Experiment::Kind::kTrain) {
      loader.open(PluginKind::kModel, e.model.plugin);
      openScheduler(e.train.scheduler);
    }
  }
}

// Plots and the rules file for `auto`, when asked for.
void writeExtras(const Options& opt, const config::Experiment& first, const fs::path& out,
                 const std::vector<bench::Result>& results, const std::vector<bench::Row>& rows) {
  if (first.bench.plots && !rows.empty()) {
    std::string why;
    if (bench::writePlots(out.string(), rows, &why)) {
      std::cout << "# Plots: " << (out / "busbw.png").string() << ", "
                << (out / "time.png").string() << " (and .svg)" << std::endl;
    } else {
      logWarn("plots skipped: " + why);
    }
  }
  std::string rules_path = opt.emit_rules.empty() ? first.bench.emit_rules : opt.emit_rules;
  if (!rules_path.empty()) {
    RulesFile rules = bench::bestRules(results.front().rows);
    if (rules.rules.empty()) {
      throw Error(ErrorKind::kInternal, "--emit-rules: no correct measurement to make rules from");
    }
    writeRulesFile(rules_path, rules,
                   "written by collie " COLLIE_VERSION " from " + opt.config +
                       ": the fastest measured scheduler per size range; use with "
                       "{plugin: auto, params: {rules_file: THIS_FILE}}");
    std::cout << "# Rules for auto: " << rules_path << std::endl;
  }
}

std::string selfExecutable() {
  std::error_code ec;
  auto path = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error(ErrorKind::kInternal, "cannot find the collie executable: " + ec.message());
  return path.string();
}

fs::path resultPath(const fs::path& out, size_t index) {
  return out / (".rank0-results-" + std::to_string(index) + ".json");
}

// A worker started by collie's launcher: one run of the file, rank 0 hands its rows over.
int workerCommand(const Options& opt, const std::vector<config::Experiment>& experiments,
                  const WorkerEnv& env) {
  if (env.experiment >= static_cast<int>(experiments.size())) {
    throw ConfigError("COLLIE_EXPERIMENT=" + std::to_string(env.experiment) + " but " + opt.config +
                      " has " + std::to_string(experiments.size()) + " run(s)");
  }
  const auto& e = experiments[env.experiment];
  PluginLoader loader;
  openPlugins(loader, {e});
  ProcessJob job(env, e.master_addr, static_cast<uint16_t>(e.master_port), e.rendezvous_timeout);
  const std::string path = resultPath(opt.out, env.experiment).string();
  if (e.kind == config::Experiment::Kind::kTrain) {
    train::Result result = job.diagnose([&] {
      WorkerRank rank = joinRun(job, loader, e, env.experiment);
      return train::runRank(loader, e, rank.backend, rank.topology, opt.out);
    });
    if (job.rank() == 0) train::saveResult(path, result);
    return 0;
  }
  bench::Result result = job.diagnose([&] {
    WorkerRank rank = joinRun(job, loader, e, env.experiment);
    return bench::runRank(loader, e, rank.backend, rank.topology);
  });
  if (job.rank() == 0) bench::saveResult(path, result);
  return 0;
}

// Runs experiment `index` as processes of this node (collie run; collie launch on each node);
// on the node that has rank 0, its results are then at resultPath(out, index).
void launchRun(const Options& opt, const config::Experiment& e, size_t index, const fs::path& out) {
  LaunchSpec spec;
  spec.argv = {selfExecutable(), "run", opt.config, "--out", out.string()};
  for (const auto& s : opt.sets) spec.argv.insert(spec.argv.end(), {"--set", s});
  if (!opt.log_level.empty())
    spec.argv.insert(spec.argv.begin() + 1, {"--log-level", opt.log_level});
  spec.nproc = e.nproc_per_node;
  spec.nnodes = opt.nnodes;
  spec.node_rank = opt.node_rank;
  spec.master_addr = opt.master_addr.empty() ? e.master_addr : opt.master_addr;
  const int port = opt.master_port != 0 ? opt.master_port : e.master_port;
  spec.experiment = static_cast<int>(index);
  spec.threads_per_rank = e.threads_per_rank;
  spec.cpu_affinity = e.cpu_affinity;
  fs::remove(resultPath(out, index));
  const bool training = e.kind == config::Experiment::Kind::kTrain;
  if (e.max_restarts > 0 && training && e.train.checkpoint_dir.empty()) {
    logWarn("launch.max_restarts is " + std::to_string(e.max_restarts) +
            " but train.checkpoint_dir is not set: a restart trains from step 0");
  }
  for (int attempt = 0;; ++attempt) {
    // Consecutive runs of one file use consecutive ports, so that a late rank never reaches
    // the previous run's store; a restart reuses its run's port (the old store is gone).
    spec.master_port =
        port != 0 ? static_cast<uint16_t>(port + index) : pickFreePort(spec.master_addr);
    LaunchOutcome outcome = launchWorkers(spec);
    if (outcome.interrupted) {
      logError("interrupted: every worker was stopped");
      throw Interrupted{outcome.exit_code};
    }
    if (outcome.failure.empty()) return;
    // Bad input fails the same way every time: never restarted.
    if (attempt < e.max_restarts && outcome.exit_code != kExitBadInput && opt.nnodes == 1) {
      logWarn("run " + std::to_string(index + 1) + " (" + e.name + ") failed: " + outcome.failure +
              "; restarting all " + std::to_string(e.nproc_per_node) + " workers (restart " +
              std::to_string(attempt + 1) + " of " + std::to_string(e.max_restarts) + ")" +
              (training && !e.train.checkpoint_dir.empty()
                   ? " from the newest checkpoint in " + e.train.checkpoint_dir
                   : std::string()));
      continue;
    }
    std::string message =
        "run " + std::to_string(index + 1) + " (" + e.name +
        ") failed; every other rank was stopped. First failure: " + outcome.failure;
    if (attempt > 0) message += " (after " + std::to_string(attempt) + " restart(s))";
    if (outcome.exit_code == kExitBadInput) throw ConfigError(message);
    throw CommError(message);
  }
}

int reportTraining(const fs::path& out, const std::vector<train::Result>& results) {
  train::printSummary(std::cout, results);
  train::writeSummaryJson((out / "summary.json").string(), results);
  std::cout << "# Results: " << (out / "summary.json").string()
            << ", per step and rank: " << (out / "rank-*.jsonl").string() << std::endl;
  return 0;
}

int runCommand(const Options& opt) {
  auto experiments = config::loadExperiments(opt.config, opt.sets);
  applyLogLevel(opt.log_level, experiments.front().log_level);
  const WorkerEnv env = detectWorkerEnv();
  if (env.present && env.source == "collie" && opt.nnodes == 1) {
    if (opt.out.empty()) throw ConfigError("collie worker: --out is required");
    return workerCommand(opt, experiments, env);
  }
  if (env.present) {
    setProcessLogRank(env.rank);
    if (env.rank != 0) setLogLevel(LogLevel::kWarn);  // one progress log, from rank 0
  }
  const auto& first = experiments.front();
  for (const auto& e : experiments) {
    if (e.kind != first.kind) {
      throw ConfigError(opt.config + ": the matrix turns a " +
                        (first.kind == config::Experiment::Kind::kTrain ? "train" : "bench") +
                        " experiment into the other kind; one file runs one kind");
    }
  }
  const bool training = first.kind == config::Experiment::Kind::kTrain;
  fs::path out = opt.out.empty() ? fs::path(first.output_dir) / (first.name + "-" + timestamp())
                                 : fs::path(opt.out);
  const bool writer = !env.present || env.rank == 0;

  PluginLoader loader;
  openPlugins(loader, experiments);
  std::unique_ptr<ProcessJob> job;  // under torchrun, mpirun, srun: this process is a rank
  if (env.present) {
    for (const auto& e : experiments) {
      if (e.nproc_per_node != first.nproc_per_node) {
        throw ConfigError(opt.config + ": the matrix changes launch.nproc_per_node, but " +
                          env.source + " started a fixed " + std::to_string(env.world) +
                          " ranks. HINT: run it with `collie run` alone, which starts the "
                          "workers itself");
      }
    }
    if (first.nproc_per_node != env.world && first.nproc_per_node != 1) {
      logWarn("launch.nproc_per_node is " + std::to_string(first.nproc_per_node) + " but " +
              env.source + " started " + std::to_string(env.world) + " ranks; using " +
              std::to_string(env.world));
    }
    job = std::make_unique<ProcessJob>(
        env, first.master_addr,
        static_cast<uint16_t>(first.master_port ? first.master_port : 29500),
        first.rendezvous_timeout);
    out = job->allGather("output-dir", out.string()).front();  // rank 0's clock names it
  }
  std::error_code ec;
  fs::create_directories(out, ec);  // every rank writes its per-step metrics here
  if (ec) throw ConfigError("--out " + out.string() + ": cannot create: " + ec.message());
  const std::string rules_path = opt.emit_rules.empty() ? first.bench.emit_rules : opt.emit_rules;
  if (training && !opt.emit_rules.empty()) {
    throw ConfigError("--emit-rules: " + opt.config +
                      " is a train experiment; rules come from a bench: experiment");
  }
  if (!rules_path.empty()) {  // fail before the sweep, not after it
    fs::path folder = fs::absolute(rules_path).parent_path();
    if (!fs::is_directory(folder)) {
      throw ConfigError("--emit-rules " + rules_path + ": folder " + folder.string() +
                        " does not exist");
    }
  }
  std::vector<bench::Result> results;
  std::vector<train::Result> trained;
  for (size_t i = 0; i < experiments.size(); ++i) {
    const auto& e = experiments[i];
    if (writer) {  // under torchrun/mpirun only rank 0 writes
      saveConfig((out / (experiments.size() == 1 ? "config.yaml"
                                                 : "config-" + std::to_string(i) + ".yaml"))
                     .string(),
                 e.resolved);
    }
    const bool threads = runsInProcess(loader, e.backend.plugin);
    const int ranks = job ? job->world() : e.nproc_per_node * opt.nnodes;
    logInfo("run " + std::to_string(i + 1) + "/" + std::to_string(experiments.size()) + ": " +
            e.name + (e.matrix_point.empty() ? "" : " [" + e.matrix_point + "]") + ", " +
            std::to_string(ranks) + " ranks on " + e.backend.label +
            (threads ? " (threads)" : " (processes)"));
    if (threads && (job ? job->world() > 1 : opt.nnodes > 1)) {
      throw ConfigError("backend '" + e.backend.label +
                        "' runs its ranks as threads of one process, but this job has " +
                        std::to_string(ranks) +
                        " processes. HINT: use backend gloo or ucx "
                        "across processes, or run `collie run` alone");
    }
    if (job) {
      job->diagnose([&] {
        WorkerRank rank = joinRun(*job, loader, e, static_cast<int>(i));
        if (training) {
          trained.push_back(train::runRank(loader, e, rank.backend, rank.topology, out.string()));
        } else {
          results.push_back(bench::runRank(loader, e, rank.backend, rank.topology));
        }
      });
    } else if (threads) {
      if (training) {
        trained.push_back(train::run(loader, e, out.string()));
      } else {
        results.push_back(bench::run(loader, e));
      }
    } else {
      launchRun(opt, e, i, out);
      if (opt.node_rank != 0) continue;
      const std::string path = resultPath(out, i).string();
      if (training) {
        trained.push_back(train::loadResult(path));
      } else {
        results.push_back(bench::loadResult(path));
      }
      fs::remove(path);
    }
  }
  if (!writer || opt.node_rank != 0) return 0;  // rank 0's launcher prints and writes
  if (training) return reportTraining(out, trained);
  std::vector<bench::Row> rows;
  for (const auto& r : results) rows.insert(rows.end(), r.rows.begin(), r.rows.end());
  bench::printTable(std::cout, results);
  bench::writeCsv((out / "results.csv").string(), rows);
  bench::writeJson((out / "results.json").string(), rows);
  std::cout << "# Results: " << (out / "results.csv").string() << ", "
            << (out / "results.json").string() << std::endl;
  writeExtras(opt, first, out, results, rows);
  uint64_t wrong = 0;
  for (const auto& r : rows) wrong += r.wrong;
  if (wrong > 0) {
    logError(std::to_string(wrong) +
             " result elements differ from the expected values: a "
             "scheduler or backend computed wrong results");
    return kExitRunFailed;
  }
  return 0;
}

int validateCommand(const Options& opt) {
  auto experiments = config::loadExperiments(opt.config, opt.sets);
  openPlugins(PluginLoader(), experiments);
  std::cout << opt.config << ": OK, " << experiments.size() << " run(s)\n";
  for (const auto& e : experiments) {
    if (!e.matrix_point.empty()) std::cout << "  " << e.matrix_point << "\n";
  }
  return 0;
}

int pluginsCommand() {
  PluginLoader loader;
  auto scan = loader.scan();
  std::cout << "Search path (first match wins):\n";
  for (const auto& dir : loader.searchPath()) std::cout << "  " << dir << "\n";
  std::cout << "\nPlugins (" << scan.found.size() << "):\n";
  std::cout << std::left << "  " << std::setw(10) << "KIND" << std::setw(12) << "NAME"
            << std::setw(9) << "VERSION" << std::setw(6) << "ABI"
            << "PATH\n";
  for (const auto& p : scan.found) {
    std::cout << "  " << std::setw(10) << pluginKindName(p.kind) << std::setw(12) << p.name
              << std::setw(9) << p.version << std::setw(6)
              << (std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor)) << p.path << "\n"
              << "  " << std::setw(37) << "" << p.description << "\n";
  }
  if (!scan.rejected.empty()) {
    std::cout << "\nRejected (" << scan.rejected.size() << "):\n";
    for (const auto& r : scan.rejected) std::cout << "  " << r.reason << "\n";
  }
  return 0;
}

// The kind of the plugin NAME names: its descriptor says, for a path; the file that exists,
// for a bare name.
PluginKind kindOf(const PluginLoader& loader, const std::string& name) {
  if (name.find('/') != std::string::npos) return pluginInfo(*openPluginFile(name, nullptr)).kind;
  for (const auto& info : loader.scan().found) {
    if (info.kind == PluginKind::kBackend && info.name == name) return PluginKind::kBackend;
  }
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
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("--param " + p + ": expected key=value, e.g. --param chunk_bytes=4KiB");
    }
    ref.params.set(p.substr(0, eq), p.substr(eq + 1), "--param");
  }
  return ref;
}

// plugin-check over a backend whose ranks are processes: each group size is a job of
// workers (this executable again, with --worker-task), whose report rank 0 or 1 leaves.
check::Report checkAsProcesses(const Options& opt, const std::string& task,
                               const std::string& scheduler, int world) {
  const std::string label = task == "contract" ? opt.plugin : scheduler;
  char dir_template[] = "/tmp/collie-check-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    throw Error(ErrorKind::kInternal, std::string("mkdtemp: ") + std::strerror(errno));
  }
  const fs::path report_path = fs::path(dir_template) / "report.json";
  // The params belong to the plugin under test: the backend's when it is the backend.
  const bool backend_under_test = task == "contract" || scheduler != opt.plugin;
  LaunchSpec spec;
  spec.argv = {selfExecutable(),
               "plugin-check",
               task == "contract" ? opt.plugin : scheduler,
               "--backend",
               backend_under_test ? opt.plugin : opt.backend,
               "--worlds",
               std::to_string(world),
               "--large-count",
               std::to_string(opt.large_count),
               "--worker-task",
               task};
  for (const auto& d : opt.dtypes) spec.argv.insert(spec.argv.end(), {"--dtypes", d});
  for (const auto& o : opt.ops) spec.argv.insert(spec.argv.end(), {"--ops", o});
  for (const auto& p : opt.params) {
    spec.argv.insert(
        spec.argv.end(),
        {task == "scheduler" && backend_under_test ? "--backend-param" : "--param", p});
  }
  spec.nproc = world;
  spec.master_port = pickFreePort(spec.master_addr);
  spec.extra_env = {"COLLIE_REPORT=" + report_path.string()};
  LaunchOutcome outcome = launchWorkers(spec);
  check::Report report;
  if (!outcome.failure.empty() || outcome.interrupted) {
    report.failures.push_back(label + ": " + std::to_string(world) + " ranks: stopped: " +
                              (outcome.interrupted ? std::string("interrupted") : outcome.failure) +
                              " (its error is above)");
  } else {
    report = check::loadReport(report_path.string());
  }
  fs::remove_all(dir_template);
  if (outcome.interrupted) throw Interrupted{outcome.exit_code};
  return report;
}

// One worker of checkAsProcesses.
int pluginCheckWorker(const Options& opt, const PluginLoader& loader, const WorkerEnv& env,
                      const check::Options& options) {
  const char* report_path = std::getenv("COLLIE_REPORT");
  if (report_path == nullptr) throw ConfigError("plugin-check worker: COLLIE_REPORT is not set");
  ProcessJob job(env, "127.0.0.1", 0, std::chrono::seconds(60));
  check::Report report;
  const auto timeout = std::chrono::seconds(60);
  if (opt.worker_task == "contract") {
    std::vector<WorkerRank> groups;
    int barriers = 0;
    auto make = [&](const std::string& limit) {
      config::PluginRef ref = pluginRef(opt.plugin, opt.params, "backend");
      ref.params.set("timeout", limit, "plugin-check");
      groups.push_back(createBackend(job, loader, ref,
                                     "contract" + std::to_string(groups.size()) + "/", timeout));
      return groups.back().backend;
    };
    auto barrier = [&] { job.allGather("barrier" + std::to_string(barriers++), ""); };
    report = check::checkBackendContractOnRank(opt.plugin, make, barrier);
    if (job.rank() == 1) check::saveReport(report_path, report);
  } else {
    config::PluginRef backend = pluginRef(opt.backend, opt.backend_params, "backend");
    backend.params.set("timeout", options.timeout, "plugin-check");
    WorkerRank rank = createBackend(job, loader, backend, "check/", timeout);
    report = check::checkSchedulerOnRank(loader, pluginRef(opt.plugin, opt.params, "scheduler"),
                                         rank.backend, backend.label, options);
    if (job.rank() == 0) check::saveReport(report_path, report);
  }
  return 0;
}

int pluginCheckCommand(const Options& opt) {
  PluginLoader loader;
  check::Options options;
  if (!opt.worlds.empty()) options.worlds = opt.worlds;
  options.large_count = opt.large_count;
  if (!opt.dtypes.empty()) {
    options.dtypes.clear();
    for (const auto& name : opt.dtypes) {
      DType d;
      if (!parseDType(name, &d)) throw ConfigError("--dtypes: unknown dtype '" + name + "'");
      options.dtypes.push_back(d);
    }
  }
  if (!opt.ops.empty()) {
    options.ops.clear();
    for (const auto& name : opt.ops) {
      ReduceOp op;
      if (!parseReduceOp(name, &op)) throw ConfigError("--ops: unknown op '" + name + "'");
      options.ops.push_back(op);
    }
  }
  const bool is_scheduler = kindOf(loader, opt.plugin) == PluginKind::kScheduler;
  const std::string backend_name = is_scheduler ? opt.backend : opt.plugin;
  if (is_scheduler) loader.open(PluginKind::kScheduler, opt.plugin);
  if (!runsInProcess(loader, backend_name)) {
    const WorkerEnv env = detectWorkerEnv();
    if (env.present && !opt.worker_task.empty()) {
      setProcessLogRank(env.rank);
      return pluginCheckWorker(opt, loader, env, options);
    }
    bool ok = true;
    auto run = [&](const std::string& title, const std::string& task, const std::string& scheduler,
                   const std::vector<int>& worlds) {
      check::Report report;
      for (int world : worlds) check::merge(report, checkAsProcesses(opt, task, scheduler, world));
      std::cout << check::describe(title, report) << std::flush;
      ok = ok && report.ok();
    };
    if (is_scheduler) {
      run("scheduler " + opt.plugin + " over " + opt.backend + " (processes)", "scheduler",
          opt.plugin, options.worlds);
    } else {
      run("backend " + opt.plugin + " contract (processes)", "contract", "", {2});
      for (const char* scheduler : {"ring", "tree", "halving_doubling"}) {
        run(std::string("scheduler ") + scheduler + " over " + opt.plugin + " (processes)",
            "scheduler", scheduler, options.worlds);
      }
    }
    std::cout << (ok ? "plugin-check: PASS" : "plugin-check: FAIL") << std::endl;
    return ok ? 0 : kExitRunFailed;
  }
  bool ok = true;
  if (is_scheduler) {
    loader.open(PluginKind::kScheduler, opt.plugin);
    loader.open(PluginKind::kBackend, opt.backend);
    auto report = check::checkScheduler(loader, pluginRef(opt.plugin, opt.params, "scheduler"),
                                        pluginRef(opt.backend, {}, "backend"), options);
    std::cout << check::describe("scheduler " + opt.plugin + " over " + opt.backend, report);
    ok = report.ok();
  } else {
    loader.open(PluginKind::kBackend, opt.plugin);
    auto backend = pluginRef(opt.plugin, opt.params, "backend");
    auto contract = check::checkBackendContract(loader, backend);
    std::cout << check::describe("backend " + opt.plugin + " contract", contract);
    ok = contract.ok();
    for (const char* scheduler : {"ring", "tree", "halving_doubling"}) {
      auto report =
          check::checkScheduler(loader, pluginRef(scheduler, {}, "scheduler"), backend, options);
      std::cout << check::describe(std::string("scheduler ") + scheduler + " over " + opt.plugin,
                                   report);
      ok = ok && report.ok();
    }
  }
  std::cout << (ok ? "plugin-check: PASS" : "plugin-check: FAIL") << std::endl;
  return ok ? 0 : kExitRunFailed;
}

void printVersion() {
  std::cout << "collie " << COLLIE_VERSION << " (plugin ABI " << COLLIE_ABI_MAJOR << "."
            << COLLIE_ABI_MINOR << ")\n"
            << "build fingerprint: " << COLLIE_BUILD_FINGERPRINT << "\n"
            << "BLAS: " << detail::blasInUse() << "\n";
}

void addConfigOptions(CLI::App* cmd, Options& opt) {
  cmd->add_option("config", opt.config, "experiment file (YAML)")->required();
  cmd->add_option("--set", opt.sets, "override a key: --set bench.iters=5 (repeatable)")
      ->type_name("KEY=VALUE");
}

int dispatch(int argc, char** argv) {
  CLI::App app{"collie: synchronous data-parallel training and collective-algorithm comparison"};
  app.require_subcommand(0, 1);
  Options opt;
  bool version = false;
  app.add_flag("--version", version, "print version, build fingerprint and BLAS in use");
  app.add_option("--log-level", opt.log_level,
                 "trace|debug|info|warn|error|off (or COLLIE_LOG_LEVEL)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  auto* run = app.add_subcommand("run", "run an experiment file and print its table");
  run->alias("bench");
  addConfigOptions(run, opt);
  run->add_option("--out", opt.out, "output folder (default: output.dir/NAME-TIMESTAMP)");
  run->add_option("--emit-rules", opt.emit_rules,
                  "write the fastest measured scheduler per size range, as rules for auto");
  auto* launch = app.add_subcommand(
      "launch", "run an experiment across nodes: start this node's workers (one per rank)");
  addConfigOptions(launch, opt);
  launch->add_option("--nnodes", opt.nnodes, "how many nodes run the job")
      ->required()
      ->check(CLI::Range(1, 65536));
  launch->add_option("--node-rank", opt.node_rank, "this node's index, 0 hosts rank 0")
      ->required()
      ->check(CLI::Range(0, 65535));
  launch->add_option("--master-addr", opt.master_addr, "address of node 0 (rank 0's store)")
      ->required();
  launch->add_option("--master-port", opt.master_port, "port of rank 0's store")
      ->required()
      ->check(CLI::Range(1, 65535));
  launch->add_option("--out", opt.out, "output folder on node 0");
  auto* validate = app.add_subcommand("validate", "check an experiment file without running it");
  addConfigOptions(validate, opt);
  auto* plugins = app.add_subcommand("plugins", "list the plugins found and the files rejected");
  auto* plugin_check = app.add_subcommand(
      "plugin-check", "run the conformance matrix against a scheduler or backend plugin");
  plugin_check->add_option("plugin", opt.plugin, "plugin name or path")->required();
  plugin_check->add_option("--backend", opt.backend, "backend to test a scheduler over")
      ->capture_default_str();
  plugin_check->add_option("--worlds", opt.worlds, "group sizes (default 1,2,3,4,5,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  plugin_check
      ->add_option("--large-count", opt.large_count,
                   "the largest element count tried (0: leave it out)")
      ->capture_default_str();
  plugin_check->add_option("--param", opt.params, "a param of the plugin under test: key=value");
  plugin_check->add_option("--dtypes", opt.dtypes, "dtypes to try (default: all six)")
      ->delimiter(',');
  plugin_check->add_option("--ops", opt.ops, "reduce ops to try (default: all five)")
      ->delimiter(',');
  plugin_check->add_option("--worker-task", opt.worker_task)
      ->group("")  // internal: what a worker process of plugin-check does
      ->check(CLI::IsMember({"contract", "scheduler"}));
  plugin_check->add_option("--backend-param", opt.backend_params)->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }
  if (!opt.log_level.empty()) applyLogLevel(opt.log_level, LogLevel::kInfo);
  if (version) return printVersion(), 0;
  if (*run) return runCommand(opt);
  if (*launch) {
    if (opt.node_rank >= opt.nnodes) {
      throw ConfigError("--node-rank " + std::to_string(opt.node_rank) +
                        " must be below --nnodes " + std::to_string(opt.nnodes));
    }
    if (detectWorkerEnv().present) {
      throw ConfigError(
          "collie launch starts workers itself; it was started as a worker of "
          "another launcher (RANK/OMPI/SLURM variables are set)");
    }
    return runCommand(opt);
  }
  if (*validate) return validateCommand(opt);
  if (*plugins) return pluginsCommand();
  if (*plugin_check) return pluginCheckCommand(opt);
  std::cout << app.help();
  return kExitBadInput;
}

}  // namespace
}  // namespace collie

int main(int argc, char** argv) {
  try {
    return collie::dispatch(argc, argv);
  } catch (const collie::Interrupted& i) {
    return i.exit_code;
  } catch (const collie::Error& e) {
    std::cerr << "collie: error: " << e.what() << std::endl;
    return e.exitCode();
  } catch (const std::exception& e) {
    std::cerr << "collie: internal error: " << e.what() << std::endl;
    return 1;
  }
}
