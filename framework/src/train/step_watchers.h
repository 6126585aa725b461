// What the trainer does between steps, besides the step: each piece is told about every
// step once it ended and decides for itself when the ranks exchange what they measured.
// Every rank calls each piece after every step, so that their gatherings meet. Free of
// LibTorch headers.
//
// - StragglerMonitor: straggler attribution (train/stragglers.h) over the control plane.
// - Rebalancer: micro_batch: auto during the run.
#pragma once

#include <cstdint>
#include <vector>

#include "collie/topology.h"
#include "config/experiment.h"
#include "runtime/control.h"
#include "train/step.h"
#include "train/stragglers.h"
#include "train/trainer.h"

namespace collie::train {

struct Sharding;  // train/data.h, which includes LibTorch

// This rank's timings of the steps since the last gathering are all-gathered every
// train.straggler_every steps (and after the last step), every rank attributes them alike,
// and rank 0 warns about a rank that stays below train.straggler_threshold. The run's first
// step (warm-up) is left out. Off with one rank or straggler_every 0.
class StragglerMonitor {
 public:
  StragglerMonitor(const config::TrainSpec& spec, int rank, int world, Control& control,
                   const Topology& topology);
  // After step `s` (0-based) of a run that started at step `start`.
  void afterStep(int64_t s, int64_t start, const StepStats& st);
  // The summary of every gathered step into `result` (nothing when none was gathered).
  void report(Result* result) const;

 private:
  const config::TrainSpec& spec_;
  int rank_, world_;
  Control& control_;
  const Topology& topology_;
  std::vector<StragglerSample> pending_;       // this rank's steps not gathered yet
  std::vector<StepAttribution> attributions_;  // every gathered step, for the summary
  StragglerWatch watch_;
};

// micro_batch: auto, during the run: every train.rebalance_every steps every rank's median
// compute time per sample over those steps is all-gathered, and the global batch split
// again, halfway towards the proportion of the speeds (train/data.h resplit; the same split
// on every rank). The new split is taken only when it predicts the slowest rank's compute
// (its samples times its time per sample) at least train.rebalance_hysteresis shorter than
// the current one, so measurement noise does not move samples back and forth. The step
// reads the same samples whatever the split, and tokens weighting weighs each by 1/global,
// so the update is the same.
class Rebalancer {
 public:
  Rebalancer(const config::TrainSpec& spec, int rank, int world, Control& control);
  // After step `s` (0-based) of a run that started at step `start`; true when it changed
  // `sharding`'s micro-batches.
  bool afterStep(int64_t s, int64_t start, const StepStats& st, Sharding* sharding);
  // The splits taken during the run.
  const std::vector<Rebalance>& taken() const { return taken_; }

 private:
  const config::TrainSpec& spec_;
  int rank_, world_;
  Control& control_;
  std::vector<double> per_sample_;  // compute seconds per sample since the last split
  std::vector<Rebalance> taken_;
};

}  // namespace collie::train
