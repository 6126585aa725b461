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

// Three loopback ranks of unequal micro-batches, two per step, training a small mlp: what
// the training tests of codecs and train.sync start from.
inline const char* kUnequalRanksMlp = R"(
name: unequal-ranks-mlp
launch: {nproc_per_node: 3}
backend: {plugin: loopback, params: {timeout: 30s}}
model: {plugin: mlp, params: {seq_len: 6, vocab: 48, d_embed: 8, hidden: 32, layers: 2}}
train:
  steps: 6
  micro_batch: [3, 2, 2]
  grad_accum: 2
  warmup_steps: 1
  bucket_bytes: 4KiB
  log_every: 100
)";

class TrainingRuns {
 public:
  // `scratch`: the folder under the tests' binary folder; `base`: the YAML every run starts
  // from, `sets` (--set) on top of it in every run, each run's own after those.
  TrainingRuns(std::string scratch, std::string base, std::vector<std::string> sets = {})
      : root_(std::filesystem::path(COLLIE_TEST_BINARY_DIR) / scratch),
        base_(std::move(base)),
        sets_(std::move(sets)) {}

  std::filesystem::path dir(const std::string& name) const { return root_ / name; }

  // Trains run `name` (in a fresh folder unless `fresh` is false: a resume) with `sets`,
  // checkpoints in its folder's ckpt/.
  train::Result run(const std::string& name, std::vector<std::string> sets,
                    bool fresh = true) const {
    if (fresh) {
      std::filesystem::remove_all(dir(name));
      std::filesystem::create_directories(dir(name));
    }
    sets.insert(sets.begin(), sets_.begin(), sets_.end());
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
  std::vector<std::string> sets_;
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
