// The collie command line: run, launch, validate, analyze, plugins, plugin-check, lab,
// --version. What the commands do lives in runtime/run.h and check/plugin_check.h. Exit codes: 0
// success, 1 the run failed, 2 bad input (config, CLI, plugin).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "check/plugin_check.h"
#include "collie/error.h"
#include "collie/log.h"
#include "collie/plugin.h"
#include "config/experiment.h"
#include "lab/lab.h"
#include "lab/lab_job.h"
#include "plugin/loader.h"
#include "runtime/environment.h"
#include "runtime/flight_recorder.h"
#include "runtime/job.h"
#include "runtime/launcher.h"
#include "runtime/progress.h"
#include "runtime/run.h"
#include "runtime/torch_runtime.h"
#include "util/system.h"

namespace collie {
namespace {

constexpr int kExitBadInput = 2;

// What the subcommands were given; each takes its part.
struct Options {
  RunRequest run;
  check::PluginCheckRequest check;
  lab::UpRequest lab;
  std::string lab_host;
  std::vector<std::string> lab_command;
};

void applyLogLevel(const std::string& cli_level, LogLevel config_level) {
  LogLevel level = config_level;
  if (const char* env = std::getenv("COLLIE_LOG_LEVEL")) parseLogLevel(env, &level);
  if (!cli_level.empty()) parseLogLevel(cli_level, &level);
  setLogLevel(level);
}

std::unique_ptr<ExperimentKind> kindFor(config::Experiment::Kind kind) {
  if (kind == config::Experiment::Kind::kTrain) return torchRuntime().train_kind();
  return bench::makeKind();
}

int runCommand(const RunRequest& request) {
  auto experiments = config::loadExperiments(request.config, request.sets);
  applyLogLevel(request.log_level, experiments.front().log_level);
  return runExperiments(request, experiments, {kindFor, lab::wantsLab, lab::runOnLab});
}

// `list_plugins`: prints "KIND NAME" (or KIND PATH) for every plugin the file's runs name,
// each once, without opening them: what a build must make before the file can run
// (scripts/quickstart.sh builds those). A scheduler that runs others (auto, hierarchical)
// opens those itself; they are not listed.
int validateCommand(const RunRequest& request, bool list_plugins) {
  auto experiments = config::loadExperiments(request.config, request.sets);
  if (list_plugins) {
    std::vector<std::string> lines;
    for (const auto& e : experiments) {
      for (const auto& use : pluginsOf(e)) {
        std::string line = std::string(pluginKindName(use.kind)) + " " + use.plugin;
        if (std::find(lines.begin(), lines.end(), line) == lines.end()) lines.push_back(line);
      }
    }
    for (const auto& line : lines) std::cout << line << "\n";
    return 0;
  }
  PluginLoader loader;
  for (const auto& e : experiments) {
    for (const auto& use : pluginsOf(e)) loader.open(use.kind, use.plugin);
  }
  std::cout << request.config << ": OK, " << experiments.size() << " run(s)\n";
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
  // Columns as wide as their longest entry, two spaces apart (names such as
  // halving_doubling must not run into their version).
  size_t kind = 4, name = 4, version = 7;
  for (const auto& p : scan.found) {
    kind = std::max(kind, std::strlen(pluginKindName(p.kind)));
    name = std::max(name, p.name.size());
    version = std::max(version, p.version.size());
  }
  const size_t indent = 2 + kind + 2 + name + 2 + version + 2 + 3 + 2;
  std::cout << fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:<3}  PATH\n", "KIND", kind, "NAME", name,
                           "VERSION", version, "ABI");
  for (const auto& p : scan.found) {
    std::cout << fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:<3}  {}\n", pluginKindName(p.kind), kind,
                             p.name, name, p.version, version,
                             fmt::format("{}.{}", p.abi_major, p.abi_minor), p.path)
              << std::string(indent, ' ') << p.description << "\n";
  }
  if (!scan.rejected.empty()) {
    std::cout << "\nRejected (" << scan.rejected.size() << "):\n";
    for (const auto& r : scan.rejected) std::cout << "  " << r.reason << "\n";
  }
  return 0;
}

// collie lab up|down|status|exec (exec when none of the others).
int labCommand(CLI::App* up, CLI::App* down, CLI::App* status, const Options& opt) {
  if (*status) return std::cout << lab::describe(), 0;
  lab::requirePrivileges();
  if (*up) {
    lab::up(opt.lab);
    std::cout << lab::describe();
    return 0;
  }
  if (*down) {
    auto removed = lab::down();
    if (removed.empty()) std::cout << "no lab was up; nothing to remove\n";
    for (const auto& r : removed) std::cout << "removed " << r << "\n";
    return 0;
  }
  auto lab = lab::current();
  if (!lab) throw ConfigError("no lab is up. HINT: collie lab up --hosts N");
  return lab::exec(lab::hostNamed(*lab, opt.lab_host), opt.lab_command);
}

void printVersion() {
  std::cout << "collie " << COLLIE_VERSION << " (plugin ABI " << COLLIE_ABI_MAJOR << "."
            << COLLIE_ABI_MINOR << ")\n"
            << "build fingerprint: " << COLLIE_BUILD_FINGERPRINT
            << " (model and codec plugins: " << COLLIE_TORCH_FINGERPRINT << ")\n";
  // What training runs with: LibTorch is loaded only by the processes that train, so load it
  // here, and then say which BLAS its calls bind to.
  std::string torch;
  try {
    torch = torchRuntime().describe();
  } catch (const Error& e) {
    torch = std::string("not loadable: ") + e.what();
  }
  std::cout << "LibTorch (for training): " << torch << "\n"
            << "BLAS: " << detail::blasInUse() << "\n"
            << "malloc: " << detail::mallocInUse() << "\n";
}

void addConfigOptions(CLI::App* cmd, RunRequest& opt) {
  cmd->add_option("config", opt.config, "experiment file (YAML)")->required();
  // One value after each --set: a second word is an argument of its own (a config file
  // after `--set k=v` is not taken for another override).
  cmd->add_option("--set", opt.sets, "override a key: --set bench.iters=5 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

int dispatch(int argc, char** argv) {
  CLI::App app{"collie: synchronous data-parallel training and collective-algorithm comparison"};
  app.require_subcommand(0, 1);
  Options opt;
  bool version = false;
  app.add_flag("--version", version, "print version, build fingerprint and BLAS in use");
  app.add_option("--log-level", opt.run.log_level,
                 "trace|debug|info|warn|error|off (or COLLIE_LOG_LEVEL)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  auto* run = app.add_subcommand("run", "run an experiment file and print its table");
  run->alias("bench");
  addConfigOptions(run, opt.run);
  run->add_option("--out", opt.run.out, "output folder (default: output.dir/NAME-TIMESTAMP)");
  run->add_option("--emit-rules", opt.run.emit_rules,
                  "write the fastest measured scheduler per size range, as rules for auto");
  run->add_option("--emit-policy", opt.run.emit_policy,
                  "write the same choices into DIR for other libraries: NCCL's (nccl-tuner.policy, "
                  "for libnccl-tuner-collie.so) and Open MPI's coll/tuned dynamic rules "
                  "(openmpi-coll-tuned.rules)")
      ->type_name("DIR");
  auto* launch = app.add_subcommand(
      "launch", "run an experiment across nodes: start this node's workers (one per rank)");
  addConfigOptions(launch, opt.run);
  launch->add_option("--nnodes", opt.run.nnodes, "how many nodes run the job")
      ->required()
      ->check(CLI::Range(1, 65536));
  launch->add_option("--node-rank", opt.run.node_rank, "this node's index, 0 hosts rank 0")
      ->required()
      ->check(CLI::Range(0, 65535));
  launch->add_option("--master-addr", opt.run.master_addr, "address of node 0 (rank 0's store)")
      ->required();
  launch->add_option("--master-port", opt.run.master_port, "port of rank 0's store")
      ->required()
      ->check(CLI::Range(1, 65535));
  launch->add_option("--out", opt.run.out, "output folder on node 0");
  launch->add_option("--only-run", opt.run.only_run)
      ->group("")  // internal: what the lab's launcher starts on each emulated host
      ->check(CLI::Range(0, 1 << 20));
  auto* validate = app.add_subcommand("validate", "check an experiment file without running it");
  addConfigOptions(validate, opt.run);
  bool list_plugins = false;
  validate->add_flag("--list-plugins", list_plugins,
                     "print the plugins the file names (KIND NAME a line) without opening them");
  // The commands that read a run's output folder (--out), named by their one argument.
  auto runFolderCommand = [&app](const char* name, const char* what, std::string* dir) {
    auto* command = app.add_subcommand(name, what);
    command->add_option("rundir", *dir, "the run's output folder (--out)")
        ->required()
        ->check(CLI::ExistingDirectory);
    return command;
  };
  std::string analyze_dir, status_dir;
  auto* analyze = runFolderCommand(
      "analyze", "read a failed run's flight records: the rank the others were waiting for",
      &analyze_dir);
  auto* status = runFolderCommand(
      "status", "where each rank of a run is: its step, the collective it is in and for how long",
      &status_dir);
  auto* plugins = app.add_subcommand("plugins", "list the plugins found and the files rejected");
  auto* plugin_check = app.add_subcommand(
      "plugin-check", "run the conformance matrix against a scheduler or backend plugin");
  plugin_check->add_option("plugin", opt.check.plugin, "plugin name or path")->required();
  plugin_check->add_option("--backend", opt.check.backend, "backend to test a scheduler over")
      ->capture_default_str();
  plugin_check->add_option("--worlds", opt.check.worlds, "group sizes (default 1,2,3,4,5,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  plugin_check
      ->add_option("--large-count", opt.check.large_count,
                   "the largest element count tried (0: leave it out)")
      ->capture_default_str();
  plugin_check->add_option("--param", opt.check.params,
                           "a param of the plugin under test: key=value");
  plugin_check->add_option("--dtypes", opt.check.dtypes, "dtypes to try (default: all six)")
      ->delimiter(',');
  plugin_check->add_option("--ops", opt.check.ops, "reduce ops to try (default: all five)")
      ->delimiter(',');
  plugin_check->add_option("--worker-task", opt.check.worker_task)
      ->group("")  // internal: what a worker process of plugin-check does
      ->check(CLI::IsMember({"contract", "scheduler"}));
  plugin_check->add_option("--backend-param", opt.check.backend_params,
                           "a param of the backend a scheduler is checked over: key=value");
  auto* lab_cmd = app.add_subcommand(
      "lab", "an emulated cluster on this machine: hosts in network namespaces, capped links");
  lab_cmd->require_subcommand(1);
  auto* lab_up = lab_cmd->add_subcommand("up", "make the lab (or keep it, when it is as asked)");
  lab_up->add_option("--hosts", opt.lab.hosts, "emulated hosts")
      ->capture_default_str()
      ->check(CLI::Range(1, config::LabSpec::kMaxHosts));
  lab_up->add_option("--rate", opt.lab.rate, "every link's rate, both directions (tbf)")
      ->capture_default_str();
  lab_up->add_option("--cpus", opt.lab.cpus, "CPUs per host, ';' between hosts: 0;1 or 0-1;2-3");
  auto* lab_down = lab_cmd->add_subcommand("down", "remove everything the lab made");
  auto* lab_status = lab_cmd->add_subcommand("status", "the lab's hosts, addresses and links");
  auto* lab_exec = lab_cmd->add_subcommand("exec", "run a command on one lab host");
  lab_exec->add_option("host", opt.lab_host, "collie-h0, collie-h1, ...")->required();
  lab_exec->add_option("command", opt.lab_command, "the command and its arguments (after --)")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }
  if (!opt.run.log_level.empty()) applyLogLevel(opt.run.log_level, LogLevel::kInfo);
  if (version) return printVersion(), 0;
  if (*run) return runCommand(opt.run);
  if (*launch) {
    if (opt.run.node_rank >= opt.run.nnodes) {
      throw ConfigError(fmt::format("--node-rank {} must be below --nnodes {}", opt.run.node_rank,
                                    opt.run.nnodes));
    }
    if (detectWorkerEnv().present) {
      throw ConfigError(
          "collie launch starts workers itself; it was started as a worker of "
          "another launcher (RANK/OMPI/SLURM variables are set)");
    }
    return runCommand(opt.run);
  }
  if (*validate) return validateCommand(opt.run, list_plugins);
  if (*analyze) return analyzeRun(analyze_dir, std::cout);
  if (*status) return printStatus(status_dir, std::cout);
  if (*plugins) return pluginsCommand();
  if (*plugin_check) return check::runPluginCheck(opt.check);
  if (*lab_cmd) return labCommand(lab_up, lab_down, lab_status, opt);
  std::cout << app.help();
  return kExitBadInput;
}

}  // namespace
}  // namespace collie

int main(int argc, char** argv) {
  try {
    collie::installDeviceMemory(std::getenv("COLLIE_EMULATED_DEVICE"));
    return collie::dispatch(argc, argv);
  } catch (const collie::Interrupted& i) {
    return i.exit_code;
  } catch (const collie::Error& e) {
    std::cerr << "collie: error: " << e.what() << std::endl;
    collie::leaveErrorForLauncher(e.what());
    return e.exitCode();
  } catch (const std::exception& e) {
    std::cerr << "collie: internal error: " << e.what() << std::endl;
    collie::leaveErrorForLauncher(std::string("internal error: ") + e.what());
    return 1;
  }
}
