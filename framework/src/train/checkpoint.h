// Training checkpoints. The checkpoint of step S is a directory
// CHECKPOINT_DIR/step-0000000S holding one file per writer in the safetensors layout
// ("shard-00001-of-00004.safetensors": 8-byte header length, a JSON header with every
// tensor's dtype, shape and data_offsets and collie's fields under __metadata__, the tensor
// bytes) and manifest.json, committed last: the step, the run it belongs to, every file's
// size and xxh3 digest, and which part of which tensor each file holds. Every file is
// written atomically (temporary file, fsync, rename, directory fsync), so a crash leaves a
// directory without a manifest, which is never resumed from.
//
// A tensor is stored whole or in pieces: a sharded run's rank r writes, of every tensor,
// the elements inside its block of the tensor's bucket (flattened, a range), so the files of
// N ranks together hold every tensor once; an unsharded run's rank 0 writes one file of whole
// tensors. Readers assemble whatever they need from the pieces, so a checkpoint loads into
// any world size, sharding and bucket size. Loading parses data only, never executes
// anything, and refuses a missing, corrupt or foreign file naming it.
//
// Format 1 (collie before ZeRO's shards: one step-S.ckpt file, "COLLIECK" | u32 version |
// u64 header length | header JSON | tensor bytes | u64 xxh3) still loads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/experiment.h"

namespace collie::detail {
class MappedFile;
}

namespace collie::train {

// A part of one state tensor: elements [start, start + numel) of it flattened; the whole
// tensor when start is 0 and numel its size.
struct Piece {
  std::string key;             // a parameter's name, or "exp_avg/NAME" for optimizer state
  std::vector<int64_t> shape;  // the whole tensor's
  int64_t start = 0, numel = 0;

  bool whole() const;
};

// What a checkpoint records of the run that wrote it.
struct CheckpointInfo {
  int64_t step = 0;
  // The model and its params, the optimizer and the data seed: what must match to resume.
  std::string identity;
  std::vector<int> micro_batch;  // per rank of the run that wrote it
  int grad_accum = 1;
  std::string sharding = "none";

  int worldSize() const { return static_cast<int>(micro_batch.size()); }
  int64_t samplesPerMicroBatch() const;  // all ranks together
};

// One written file, as the manifest lists it.
struct ShardFile {
  std::string name;  // "shard-00001-of-00004.safetensors"
  uint64_t bytes = 0;
  uint64_t digest = 0;        // xxh3 of the whole file
  std::vector<Piece> pieces;  // what it holds
};

// "shard-00001-of-00004.safetensors"
std::string shardFileName(int index, int count);

// Writes file `index` of `count` of the checkpoint in `step_dir`: `pieces` with their values
// (float32 CPU tensors of piece.numel elements). Atomic; throws CheckpointError.
ShardFile writeShard(const std::string& step_dir, int index, int count, const CheckpointInfo& info,
                     const std::vector<std::pair<Piece, at::Tensor>>& pieces);
// Writes step_dir/manifest.json atomically, listing `files` (every writer's, in order).
// `writer` names the temporary file, so that ranks on a shared file system writing the same
// manifest do not write into one temporary file.
void writeManifest(const std::string& step_dir, const CheckpointInfo& info,
                   const std::vector<ShardFile>& files, int writer);

// An open checkpoint: a step directory (its manifest read and checked) or a format-1 file.
// Shard files are opened and verified when a read first needs them.
class CheckpointReader {
 public:
  // Throws CheckpointError naming the file and what is wrong with it.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const CheckpointInfo& info() const { return info_; }
  // Format 1: info().identity is that format's (it included the micro-batches) and
  // info().micro_batch is empty.
  bool formatOne() const { return format_one_ != nullptr; }
  // Every tensor's key and whole shape, in the writer's order.
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors() const {
    return tensors_;
  }
  // Fills each target (a contiguous float32 CPU tensor of piece.numel elements) with that
  // part of its tensor, from the files that hold it. Throws CheckpointError for a tensor the
  // checkpoint lacks or has in another shape, and for a missing or corrupt file, naming it.
  void read(const std::vector<std::pair<Piece, at::Tensor>>& into);
  // Every tensor, whole, in the writer's order.
  std::vector<std::pair<std::string, at::Tensor>> readAll();

 private:
  struct Located {
    size_t file;
    int64_t start, numel;
  };
  struct Opened;
  const Opened& open(size_t file);

  std::string path_;
  CheckpointInfo info_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors_;
  std::map<std::string, std::vector<Located>> where_;  // by key, ascending start
  std::vector<ShardFile> files_;
  std::vector<std::unique_ptr<Opened>> opened_;  // per file, once opened
  std::unique_ptr<std::map<std::string, at::Tensor>> format_one_;
};

// Format 1's content, for reading old checkpoints.
struct FormatOneCheckpoint {
  int64_t step = 0;
  std::string identity;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // float32 or int64, CPU
};
// Reads and verifies a whole format-1 file. Throws CheckpointError naming the file.
FormatOneCheckpoint loadFormatOne(const std::string& path);

// What every rank compares before resuming: the xxh3 of a step directory's manifest, or a
// format-1 file's seal; 0 when there is none. Cheap: no tensor is read.
uint64_t checkpointDigest(const std::string& path);

// "DIR/step-00000042"
std::string checkpointPath(const std::string& dir, int64_t step);
// The newest complete checkpoint in `dir` (a step directory with its manifest, or a format-1
// file), or "" when there is none.
std::string latestCheckpoint(const std::string& dir);

// What a checkpoint must agree with to be resumed: the model and its params, the optimizer
// and the data seed. The batch is checked apart (the samples per micro-batch step must
// match; their split over ranks may differ, so the world size may).
std::string runIdentity(const config::Experiment& e);
// Format 1's identity, which also held the micro-batches per rank.
std::string formatOneIdentity(const config::Experiment& e, const std::vector<int>& micro_batch);

// The checkpoints of one run: train.checkpoint_dir, checkpoint_every, checkpoint_keep and
// resume.
class RunCheckpoints {
 public:
  explicit RunCheckpoints(const config::TrainSpec& spec);

  // Whether a checkpoint is written after `steps_done` of the run's steps.
  bool dueAfter(int64_t steps_done) const;
  // The directory of `step`'s checkpoint, created. Throws CheckpointError.
  std::string createStepDir(int64_t step) const;
  // Removes all but the newest `checkpoint_keep` checkpoints, and unfinished ones older than
  // the newest.
  void prune() const;
  // With resume on, the step of the newest checkpoint in checkpoint_dir (setting `path`);
  // 0 when there is none or resume is off.
  int64_t newest(std::string* path) const;
  // The checkpoint of `step` in checkpoint_dir: its directory, or a format-1 file of that
  // step where only that exists.
  std::string pathOf(int64_t step) const;

 private:
  const config::TrainSpec& spec_;
};

}  // namespace collie::train
