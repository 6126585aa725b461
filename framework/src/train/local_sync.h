// Fewer synchronisations (train.sync): between meetings every rank steps its own optimizer
// on its own gradients, and every H steps the ranks' models meet. local_sgd averages their
// parameters (PyTorch's post-local SGD with its periodic model averager); diloco averages
// how far each moved since the last meeting and takes an outer SGD step with Nesterov
// momentum from there (DiLoCo, Douillard et al. 2023). A synchronous warm-up (every_step)
// may come first. Both send the parameters' bytes once per meeting instead of the
// gradients' every step.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "config/experiment.h"
#include "runtime/communicator.h"
#include "train/reducer.h"
#include "train/step.h"

namespace collie::train {

class PeriodicSync {
 public:
  // `reducer` holds the parameters in its buckets (unsharded), identical on every rank now;
  // `comm` all-reduces them. `steps`: the run's (the last step always meets).
  PeriodicSync(const config::SyncSpec& spec, int64_t steps, Reducer& reducer, Communicator& comm);

  bool local() const { return spec_.local(); }
  // Whether step s (0-based) all-reduces its gradients: every step of every_step, and the
  // warm-up's of the local modes.
  bool gradientsSynchronised(int64_t s) const { return !local() || s < spec_.warmup_steps; }
  // Whether the ranks' models meet after step s: every `every`-th step after the warm-up,
  // and the run's last step, so that it ends with one model.
  bool meetsAfter(int64_t s) const;
  // How many times the models meet in the run, and its synchronous steps.
  int64_t meetings() const;
  int64_t synchronousSteps() const {
    return local() ? std::min<int64_t>(spec_.warmup_steps, steps_) : steps_;
  }
  // After every step's update, on every rank. A synchronous step (the warm-up's) only moves
  // DiLoCo's starting point along. After a step that meets, each rank's parameters (local_sgd)
  // or their change since the last meeting (diloco) are weighted by `share`, this rank's
  // fraction of the step's predictions, and summed over the ranks; diloco then steps the
  // outer optimizer. Every rank ends with the same parameters. Returns the communication.
  SyncTiming afterStep(int64_t s, double share);

  // DiLoCo's outer state, the same on every rank, per bucket in the buckets' layout: the
  // parameters at the last meeting, and the outer momentum. Empty for the other modes.
  const std::vector<at::Tensor>& outerParameters() const { return outer_; }
  const std::vector<at::Tensor>& outerMomentum() const { return momentum_; }

 private:
  SyncTiming average(double share);
  SyncTiming outerStep(double share);
  Provenance sum(const at::Tensor& t);  // all-reduce in place

  config::SyncSpec spec_;
  int64_t steps_;
  Reducer& reducer_;
  Communicator& comm_;
  std::vector<at::Tensor> outer_, momentum_;  // diloco: per bucket (bucket numel)
};

}  // namespace collie::train
