// Training runs of one test file over loopback ranks: each run in a folder of its own under
// the file's scratch root with its checkpoints, and what a test reads back from them.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collie/error.h"
#include "config/experiment.h"
#include "loopback_job.h"
#include "run_command.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace collie::testing {

class TrainingRuns {
 public:
  // `scratch`: the folder under the tests' binary folder; `base`: the YAML every run starts
  // from, `--set`s on top.
  TrainingRuns(std::string scratch, std::string base)
      : root_(std::filesystem::path(COLLIE_TEST_BINARY_DIR) / scratch), base_(std::move(base)) {}

  std::filesystem::path dir(const std::string& name) const { return root_ / name; }

  // Trains run `name` (in a fresh folder unless `fresh` is false: a resume) with `sets`,
  // checkpoints in its folder's ckpt/.
  train::Result run(const std::string& name, std::vector<std::string> sets,
                    bool fresh = true) const {
    if (fresh) {
      std::filesystem::remove_all(dir(name));
      std::filesystem::create_directories(dir(name));
    }
    sets.push_back("train.checkpoint_dir=" + (dir(name) / "ckpt").string());
    auto experiments = config::loadExperiments(writeTempFile(name + ".yaml", base_), sets);
    return train::run(buildTreeLoader(), experiments.at(0), dir(name).string());
  }

  // The parameters of run `name`'s newest checkpoint, by name.
  std::map<std::string, at::Tensor> weights(const std::string& name) const {
    train::CheckpointReader reader(train::latestCheckpoint((dir(name) / "ckpt").string()));
    std::map<std::string, at::Tensor> out;
    for (const auto& [key, tensor] : reader.readAll()) {
      if (key.find('/') == std::string::npos) out[key] = tensor;  // not "exp_avg/NAME" ...
    }
    return out;
  }

  // What a run with `sets` is refused with ("" when it is not).
  std::string configError(const std::vector<std::string>& sets) const {
    try {
      run("refused", sets);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }

 private:
  std::filesystem::path root_;
  std::string base_;
};

// The largest element-wise difference between two runs' parameters.
inline double largestDifference(const std::map<std::string, at::Tensor>& a,
                                const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [key, tensor] : a)
    worst = std::max(worst, tensor.sub(b.at(key)).abs().max().item<double>());
  return worst;
}

}  // namespace collie::testing
