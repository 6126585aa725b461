// The bench experiment's table for the runtime's roles (runtime/run.h): run, hand over,
// report as nccl-tests does, plots and the rules file for `auto`.
#include <fmt/format.h>

#include <iostream>

#include "bench/bench.h"
#include "bench/policy.h"
#include "collie/config.h"
#include "collie/error.h"
#include "collie/log.h"
#include "config/rules.h"
#include "runtime/launcher.h"

namespace fs = std::filesystem;

namespace collie::bench {
namespace {

constexpr int kExitRunFailed = 1;

// --emit-rules, else bench.emit_rules ("": no rules file).
std::string rulesPath(const RunRequest& request, const config::Experiment& first) {
  return request.emit_rules.empty() ? first.bench.emit_rules : request.emit_rules;
}

class BenchKind : public KindOfResults<Result, &run, &bench::runRank, &saveResult, &loadResult> {
 public:
  void checkRequest(const RunRequest& request, const std::vector<config::Experiment>& runs,
                    const PluginLoader&) const override {
    const config::Experiment& first = runs.front();
    // Refused before the sweep, not after it.
    if (!request.emit_policy.empty()) {
      openMpiPolicyFor(first);  // a collective Open MPI's rules cannot name
      std::error_code ec;
      fs::create_directories(request.emit_policy, ec);
      if (ec || !fs::is_directory(request.emit_policy)) {
        throw ConfigError(fmt::format("--emit-policy {}: cannot make the folder: {}",
                                      request.emit_policy, ec ? ec.message() : "not a folder"));
      }
    }
    const std::string rules = rulesPath(request, first);
    if (rules.empty()) return;
    fs::path folder = fs::absolute(rules).parent_path();
    if (!fs::is_directory(folder)) {
      throw ConfigError(
          fmt::format("--emit-rules {}: folder {} does not exist", rules, folder.string()));
    }
  }

  // A bench runs on a simulator, and a restart measures again from the start.
  void checkSimulated(const config::Experiment&) const override {}
  Restart restartOf(const config::Experiment&) const override { return {}; }

  int report(const RunRequest& request, const std::vector<config::Experiment>& runs,
             const fs::path& out) override {
    std::vector<Row> rows;
    for (const auto& r : results_) rows.insert(rows.end(), r.rows.begin(), r.rows.end());
    printTable(std::cout, results_);
    writeCsv((out / "results.csv").string(), rows);
    writeJson((out / "results.json").string(), rows);
    std::cout << "# Results: " << (out / "results.csv").string() << ", "
              << (out / "results.json").string() << std::endl;
    std::vector<std::string> calibrations;
    for (size_t i = 0; i < results_.size(); ++i) {
      if (!results_[i].calibrated) continue;
      const fs::path path =
          out / (results_.size() == 1 ? "calibration.json" : fmt::format("calibration-{}.json", i));
      writeCalibration(path.string(), results_[i]);
      calibrations.push_back(path.string());
    }
    if (!calibrations.empty()) {
      std::cout << "# Calibration (for auto: params.calibration): " << calibrations.front()
                << (calibrations.size() > 1 ? fmt::format(" and {} more", calibrations.size() - 1)
                                            : "")
                << std::endl;
    }
    writeExtras(request, runs.front(), out, rows);
    uint64_t wrong = 0;
    for (const auto& r : rows) wrong += r.wrong;
    if (wrong > 0) {
      logError(fmt::format(
          "{} result elements differ from the expected values: a scheduler or backend computed "
          "wrong results",
          wrong));
      return kExitRunFailed;
    }
    return 0;
  }

 private:
  // Plots and the rules file for `auto`, when asked for.
  void writeExtras(const RunRequest& request, const config::Experiment& first, const fs::path& out,
                   const std::vector<Row>& rows) const {
    if (first.bench.plots && first.bench.collective == Collective::kBarrier) {
      logInfo("plots skipped: a barrier has no message sizes to plot");
    } else if (first.bench.plots && !rows.empty()) {
      std::string why;
      const auto suffixes = writePlots(out.string(), rows, &why);
      if (!suffixes.empty()) {
        std::cout << "# Plots:";
        for (const auto& suffix : suffixes) {
          std::cout << (&suffix == &suffixes.front() ? " " : "; ")
                    << (out / ("busbw" + suffix + ".png")).string() << ", "
                    << (out / ("time" + suffix + ".png")).string();
        }
        std::cout << " (and .svg)" << std::endl;
      } else {
        logWarn("plots skipped: " + why);
      }
    }
    const std::string rules_path = rulesPath(request, first);
    if (rules_path.empty() && request.emit_policy.empty()) return;
    RulesFile rules = bestRules(results_.front().rows, first.bench.schedulers);
    if (rules.rules.empty()) {
      throw Error(ErrorKind::kInternal,
                  fmt::format("{}: no correct measurement to make rules from",
                              rules_path.empty() ? "--emit-policy" : "--emit-rules"));
    }
    if (!rules_path.empty()) {
      config::writeRulesFile(rules_path, rules,
                             "written by collie " COLLIE_VERSION " from " + request.config +
                                 ": the fastest measured scheduler per size range; use with "
                                 "{plugin: auto, params: {rules_file: THIS_FILE}}");
      std::cout << "# Rules for auto: " << rules_path << std::endl;
    }
    if (!request.emit_policy.empty()) writePolicy(request, rules);
  }

  // The policy files of --emit-policy, and what each size range became in each.
  static void writePolicy(const RunRequest& request, const RulesFile& rules) {
    const std::string measured = fmt::format("written by collie " COLLIE_VERSION
                                             " from {} (its first run): the fastest measured {} "
                                             "per size range on {} ranks over {}",
                                             request.config, rules.collective, rules.world_size,
                                             rules.backend.empty() ? "its backend" : rules.backend);
    const OpenMpiPolicy policy = openMpiPolicy(rules);
    const std::string nccl =
        writeNcclPolicy(request.emit_policy, rules, "NCCL tuner policy, " + measured);
    const std::string open_mpi = writeOpenMpiRules(
        request.emit_policy, policy, "Open MPI coll/tuned dynamic rules, " + measured);
    const std::string tuner = ncclTunerPath();
    std::cout << "# NCCL policy: " << nccl
              << " (NCCL_TUNER_PLUGIN=" << (tuner.empty() ? "libnccl-tuner-collie.so" : tuner)
              << " COLLIE_NCCL_POLICY=" << nccl << ")" << std::endl;
    if (tuner.empty()) {
      std::cout << "#   (libnccl-tuner-collie.so is not built here: cmake --build build --target "
                   "nccl_tuner_collie)"
                << std::endl;
    }
    std::cout << "# Open MPI policy: " << open_mpi
              << " (mpirun --mca coll_tuned_use_dynamic_rules 1 --mca "
                 "coll_tuned_dynamic_rules_filename "
              << open_mpi << ")" << std::endl;
    if (rules.world_size < 2) {
      logWarn(
          "--emit-policy: measured on one rank; Open MPI and NCCL choose no algorithm for "
          "a communicator of one rank, so the policy changes nothing");
    }
    for (size_t i = 0; i < policy.ranges.size(); ++i) {
      const auto& r = policy.ranges[i];
      const std::string algorithm =
          i < rules.rules.size() ? ncclEquivalent(rules.collective, rules.rules[i].choice) : "";
      std::cout << "#   " << rangeText(r.min_bytes) << ": " << r.scheduler << ": NCCL "
                << (algorithm.empty() ? std::string("decides") : algorithm) << ", Open MPI "
                << (r.algorithm.id == 0 ? std::string("decides")
                                        : fmt::format("{} ({})", r.algorithm.name, r.algorithm.id))
                << std::endl;
    }
    std::cout << "#   (decides: no algorithm of that library runs the collie scheduler's schedule)"
              << std::endl;
  }

  // Where NCCL finds collie's tuner: this build's lib folder (beside bin/collie), or the
  // installation's library folder.
  // "" when neither has it.
  static std::string ncclTunerPath() {
    for (const fs::path& lib : {fs::path(selfExecutable()).parent_path().parent_path() / "lib",
                                fs::path(COLLIE_INSTALL_PLUGIN_DIR).parent_path()}) {
      if (fs::exists(lib / "libnccl-tuner-collie.so"))
        return (lib / "libnccl-tuner-collie.so").string();
    }
    return "";
  }

  // Refuses a sweep whose policy Open MPI's rules cannot hold (its collective).
  static void openMpiPolicyFor(const config::Experiment& e) {
    RulesFile probe;
    probe.collective = collectiveName(e.bench.collective);
    probe.world_size = 1;
    probe.rules.push_back({0, RuleChoice{"ring", {}}});
    openMpiPolicy(probe);
  }
};

}  // namespace

std::unique_ptr<ExperimentKind> makeKind() { return std::make_unique<BenchKind>(); }

}  // namespace collie::bench
