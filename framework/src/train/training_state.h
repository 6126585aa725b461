// What a checkpoint holds of a run, and how the run saves it and gets it back: the
// parameters and the optimizer state, whole (one file from rank 0) or, sharded, every rank's
// blocks (a file per rank and one manifest). The file format is train/checkpoint.h's; this
// is the trainer's side of it, so that the step loop only says when.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/experiment.h"
#include "runtime/control.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/local_sync.h"
#include "train/optimizer.h"
#include "train/reducer.h"

namespace collie::train {

class TrainingState {
 public:
  // The run's state as the trainer holds it. Everything is referenced, not copied, and must
  // outlive this: `shards` (sharded: this rank's block of every bucket's parameters) and
  // `sharding` (its micro-batches change when micro_batch: auto rebalances) are read when
  // a checkpoint is written or read.
  TrainingState(const config::Experiment& e, int rank, int world, Control& control,
                const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                const std::vector<at::Tensor>& shards, Optimizer& optimizer, Reducer& reducer,
                const PeriodicSync& periodic, const Sharding& sharding);

  // Writes the checkpoint of `step`. Unsharded, rank 0 writes every tensor whole into one
  // file (every rank holds the same, as verified); sharded, every rank writes its blocks
  // and, once every rank has, the same manifest. What differs from rank to rank (a codec's
  // error feedback, the optimizer's state between train.sync's meetings) every rank writes
  // too, in a file of its own. Every rank calls it, where every rank holds the same model.
  void save(const RunCheckpoints& checkpoints, int64_t step);

  // Continues from a checkpoint: the step to start from, 0 without one. Rank 0 decides which
  // (its newest) and every rank loads that file, after every rank has said it holds the same
  // bytes: on several nodes without a shared file system, each rank's newest file may differ.
  // Throws CheckpointError for a checkpoint of another run or one that cannot continue this.
  int64_t resume(const RunCheckpoints& checkpoints);

 private:
  // Sharded: a piece of rank r's block of a state kind ("" for the parameters' values) and
  // where it lies in its bucket's block: of every parameter, the elements inside the block.
  struct BlockPiece {
    Piece piece;
    std::string kind;
    size_t bucket;
    int64_t at;  // elements into the block
  };

  bool sharded() const { return spec_.sharding != config::ShardedState::kNone; }
  bool shardsParameters() const { return spec_.sharding == config::ShardedState::kParameters; }
  // The optimizer's state tensors by name ("exp_avg/3": of parameter 3 unsharded, of bucket
  // 3's block sharded), and the kinds of state they hold ("exp_avg", "exp_avg_sq").
  std::map<std::string, at::Tensor> optimizerState() const;
  std::vector<std::string> stateKinds() const;
  // A state tensor's name in checkpoints: the parameter's, or "exp_avg/NAME".
  std::string stateKey(const std::string& kind, size_t k) const;
  std::vector<BlockPiece> blockPieces(int r) const;
  // Where each of this rank's block pieces lives in its tensors.
  std::vector<std::pair<Piece, at::Tensor>> blockTargets() const;
  // Unsharded: every state tensor whole, parameters first.
  std::vector<std::pair<Piece, at::Tensor>> wholeTargets() const;
  // What differs from rank to rank and every rank writes: the codec's state
  // ("codec/LABEL/R/NAME", train.compression's label: another codec's is not loaded) and, in the
  // local modes of train.sync, the optimizer's
  // ("rank/R/exp_avg/NAME"). Every rank's tensors have the same names and shapes, so any
  // rank can list another's.
  std::vector<std::pair<std::string, at::Tensor>> rankState(int r) const;
  std::vector<Piece> rankPieces(int r) const;
  // This rank's, those whose key starts with `prefix`, as read targets.
  std::vector<std::pair<Piece, at::Tensor>> rankTargets(const char* prefix) const;
  // DiLoCo's outer state ("outer/NAME", "outer_momentum/NAME"), the same on every rank:
  // rank 0's whole file holds it. Empty in the other modes.
  std::vector<std::pair<Piece, at::Tensor>> outerTargets() const;
  // Whether every rank writes a file: sharded, or some state differs from rank to rank.
  bool everyRankWrites() const { return sharded() || !rankState(rank_).empty(); }
  // This rank's tensors in the checkpoint: its blocks (sharded), or every tensor whole
  // (rank 0 of an unsharded run), and what is its own.
  std::vector<std::pair<Piece, at::Tensor>> targetsOf() const;
  // Warns (rank 0) of codec state in the checkpoint under another codec's label.
  void warnOfOtherCodecsState(CheckpointReader& reader) const;
  // Reads `targets` when the checkpoint holds every one in its shape (and, `per_rank`,
  // was written by as many ranks); else calls `fallback` and logs that it holds no `what`:
  // `otherwise`.
  void restoreIfHeld(CheckpointReader& reader,
                     const std::vector<std::pair<Piece, at::Tensor>>& targets, bool per_rank,
                     const std::string& what, const std::string& otherwise,
                     const std::function<void()>& fallback);
  // Whether `reader`'s checkpoint can continue this run: the same model, optimizer and data
  // seed, and the same samples per step (their split over ranks, so the world size, may
  // differ: the sums are then added in another order).
  void checkResumable(const CheckpointReader& reader) const;
  // Loads `reader`'s tensors into the parameters and the optimizer state: unsharded, every
  // tensor whole; sharded, this rank's blocks (from whichever files hold them: any world
  // size, sharding or bucket size wrote them), the parameters' then all-gathered.
  void restore(CheckpointReader& reader);

  const config::Experiment& e_;
  const config::TrainSpec& spec_;
  int rank_, world_;
  Control& control_;
  const std::vector<std::string>& names_;
  const std::vector<at::Tensor>& params_;
  const std::vector<at::Tensor>& shards_;
  Optimizer& optimizer_;
  Reducer& reducer_;
  const PeriodicSync& periodic_;
  const Sharding& sharding_;
};

}  // namespace collie::train
