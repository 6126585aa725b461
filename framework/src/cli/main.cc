// The collie command line: run, validate, plugins, --version. Exit codes: 0 success,
// 1 the run failed, 2 bad input (config, CLI, plugin).
#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
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
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

constexpr int kExitRunFailed = 1;
constexpr int kExitBadInput = 2;

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
  for (const auto& e : experiments) {
    loader.open(PluginKind::kBackend, e.backend.plugin);
    for (const auto& s : e.bench.schedulers) {
      if (s.rules.empty()) loader.open(PluginKind::kScheduler, s.plugin);
      for (const auto& rule : s.rules) loader.open(PluginKind::kScheduler, rule.scheduler.plugin);
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

int runCommand(const Options& opt) {
  auto experiments = config::loadExperiments(opt.config, opt.sets);
  applyLogLevel(opt.log_level, experiments.front().log_level);
  const auto& first = experiments.front();
  fs::path out = opt.out.empty() ? fs::path(first.output_dir) / (first.name + "-" + timestamp())
                                 : fs::path(opt.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw ConfigError("--out " + out.string() + ": cannot create: " + ec.message());

  PluginLoader loader;
  openPlugins(loader, experiments);
  const std::string rules_path = opt.emit_rules.empty() ? first.bench.emit_rules : opt.emit_rules;
  if (!rules_path.empty()) {  // fail before the sweep, not after it
    fs::path folder = fs::absolute(rules_path).parent_path();
    if (!fs::is_directory(folder)) {
      throw ConfigError("--emit-rules " + rules_path + ": folder " + folder.string() +
                        " does not exist");
    }
  }
  std::vector<bench::Result> results;
  std::vector<bench::Row> rows;
  for (size_t i = 0; i < experiments.size(); ++i) {
    const auto& e = experiments[i];
    saveConfig(
        (out / (experiments.size() == 1 ? "config.yaml" : "config-" + std::to_string(i) + ".yaml"))
            .string(),
        e.resolved);
    logInfo("run " + std::to_string(i + 1) + "/" + std::to_string(experiments.size()) + ": " +
            e.name + (e.matrix_point.empty() ? "" : " [" + e.matrix_point + "]") + ", " +
            std::to_string(e.nproc_per_node) + " ranks on " + e.backend.label);
    results.push_back(bench::run(loader, e));
    rows.insert(rows.end(), results.back().rows.begin(), results.back().rows.end());
  }
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

int pluginCheckCommand(const Options& opt) {
  PluginLoader loader;
  check::Options options;
  if (!opt.worlds.empty()) options.worlds = opt.worlds;
  options.large_count = opt.large_count;
  bool ok = true;
  if (kindOf(loader, opt.plugin) == PluginKind::kScheduler) {
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }
  if (!opt.log_level.empty()) applyLogLevel(opt.log_level, LogLevel::kInfo);
  if (version) return printVersion(), 0;
  if (*run) return runCommand(opt);
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
  } catch (const collie::Error& e) {
    std::cerr << "collie: error: " << e.what() << std::endl;
    return e.exitCode();
  } catch (const std::exception& e) {
    std::cerr << "collie: internal error: " << e.what() << std::endl;
    return 1;
  }
}
