// The train experiment's table for the runtime's roles (runtime/run.h): train, hand over,
// print the summary and write summary.json; and the entry of libcollie_torch.so, which hands
// the table and host staging to the application (runtime/torch_runtime.h).
#include <fmt/format.h>

#include <iostream>

#include "collie/error.h"
#include "plugin/loader.h"
#include "runtime/device.h"
#include "runtime/torch_runtime.h"
#include "train/report.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace collie::train {
namespace {

class TrainKind : public KindOfResults<Result, &run, &train::runRank, &saveResult, &loadResult> {
 public:
  void checkRequest(const RunRequest& request, const std::vector<config::Experiment>& runs,
                    const PluginLoader& loader) const override {
    const config::Experiment& first = runs.front();
    for (const auto& [flag, value] : {std::pair{"--emit-rules", &request.emit_rules},
                                      std::pair{"--emit-policy", &request.emit_policy}}) {
      if (value->empty()) continue;
      throw ConfigError(
          fmt::format("{}: {} is a train experiment; rules come from a bench: experiment", flag,
                      request.config));
    }
    // Said once here, before any rank starts, rather than by every rank (they check too).
    for (const auto& e : runs) {
      const bool device_only =
          pluginInfo(*loader.open(PluginKind::kBackend, e.backend.plugin)).device_memory_only;
      if (device_only && !e.train.cuda) throw hostTensorsOnDeviceBackend(e);
    }
    if (first.train.cuda) rankDevice("cuda", 0);
  }

  void checkSimulated(const config::Experiment& e) const override {
    throw ConfigError(fmt::format(
        "backend '{}' simulates its ranks (SimGrid actors in simulated time), which the bench "
        "and plugin-check use; training runs on a real backend. HINT: use gloo, ucx, nccl or "
        "loopback for train experiments",
        e.backend.label));
  }

  Restart restartOf(const config::Experiment& e) const override {
    if (e.train.checkpoint_dir.empty()) {
      return {"", fmt::format("launch.max_restarts is {} but train.checkpoint_dir is not set: a "
                              "restart trains from step 0",
                              e.max_restarts)};
    }
    return {" from the newest checkpoint in " + e.train.checkpoint_dir, ""};
  }

  int report(const RunRequest&, const std::vector<config::Experiment>& runs,
             const fs::path& out) override {
    printSummary(std::cout, results_);
    writeSummaryJson((out / "summary.json").string(), results_);
    const bool matrix = !runs.empty() && !runs.front().matrix_point.empty();
    std::cout << "# Results: " << (out / "summary.json").string() << ", per step and rank: "
              << (out / (matrix ? "run-*-rank-*.jsonl" : "rank-*.jsonl")).string() << std::endl;
    return 0;
  }
};

}  // namespace

std::unique_ptr<ExperimentKind> makeKind() { return std::make_unique<TrainKind>(); }

}  // namespace collie::train

extern "C" __attribute__((visibility("default"))) const collie::TorchRuntime*
collie_torch_runtime() {
  static const collie::TorchRuntime runtime{collie::kTorchRuntimeBuild, &collie::train::makeKind,
                                            &collie::makeHostStaging, &collie::torchDescription};
  return &runtime;
}
