// Training checkpoints (DESIGN §5): named tensors plus a JSON header, written atomically
// (temporary file, fsync, rename, directory fsync) and sealed with an xxh3 hash of every
// byte. Loading parses data only — it never executes anything — and rejects a truncated,
// corrupt or foreign file, or one whose tensors do not match the model, with the reason.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/experiment.h"

namespace collie::train {

struct Checkpoint {
  int64_t step = 0;      // steps completed
  std::string identity;  // what must match to resume: model, params, optimizer, batch
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // float32 or int64, CPU
};

// Writes `checkpoint` to `path` atomically. Throws CheckpointError.
void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint);
// Reads and verifies a whole file. Throws CheckpointError naming the file and the problem.
Checkpoint loadCheckpoint(const std::string& path);

// Copies `from`'s tensors into `into` (same names, order, dtypes and shapes), or throws
// CheckpointError naming the first difference.
void restoreTensors(const Checkpoint& from,
                    const std::vector<std::pair<std::string, at::Tensor>>& into,
                    const std::string& path);

// The content digest a checkpoint file is sealed with (its last 8 bytes), or 0 when the file
// is missing or too short to hold one. Cheap: nothing else is read.
uint64_t checkpointDigest(const std::string& path);

// "DIR/step-00000042.ckpt"
std::string checkpointPath(const std::string& dir, int64_t step);
// The checkpoint of the highest step in `dir`, or "" when there is none.
std::string latestCheckpoint(const std::string& dir);
// Removes all but the `keep` newest checkpoints of `dir`.
void pruneCheckpoints(const std::string& dir, int keep);

// What a checkpoint must agree with to be resumed: the model and its params, the optimizer,
// the micro-batches (`micro_batch`: the sizes per rank) and the data seed — everything that
// decides which samples a step reads and how the optimizer updates.
std::string runIdentity(const config::Experiment& e, const std::vector<int>& micro_batch);

// The checkpoints of one run: train.checkpoint_dir, checkpoint_every, checkpoint_keep and
// resume, and the identity its files carry.
class RunCheckpoints {
 public:
  RunCheckpoints(const config::TrainSpec& spec, std::string identity);

  // Whether a checkpoint is written after `steps_done` of the run's steps.
  bool dueAfter(int64_t steps_done) const;
  // Writes `tensors` as the checkpoint of `steps_done` and prunes the oldest; the path.
  std::string save(int64_t steps_done,
                   const std::vector<std::pair<std::string, at::Tensor>>& tensors) const;
  // With resume on, the step of the newest checkpoint in checkpoint_dir (setting `path`);
  // 0 when there is none or resume is off.
  int64_t newest(std::string* path) const;
  // The path of the checkpoint of `step` in checkpoint_dir.
  std::string pathOf(int64_t step) const;
  // Restores the checkpoint at `path` into `into` and returns its step. Throws
  // CheckpointError for a file of another run (or a broken one).
  int64_t restore(const std::string& path,
                  const std::vector<std::pair<std::string, at::Tensor>>& into) const;

 private:
  const config::TrainSpec& spec_;
  std::string identity_;
};

}  // namespace collie::train
