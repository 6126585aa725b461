// The largest model that fits a rank's memory, predicted from one run's measured costs: what
// the rank held at its peak during a step (StepMemory, by use), scaled to a model of the same
// shape with more or fewer units (a GPT's layers, at the run's width, sequence length and
// micro-batch). A large model's peak comes as its backward starts, and its pieces scale as
// what they hold does:
//   - with the parameters: the training state (set-up), the gradient sync's and the
//     optimizer's blocks, and the values gathered after the update (stages 1-2);
//   - with the units: the forward's activations at their most;
//   - fixed: the backward's blocks (one unit's gradients on their way), stage 3's gathered
//     units (one unit's size, whatever their number), the batch and loss ("other"), what the
//     process held outside LibTorch's blocks when the steps began (the runtime, the
//     transports) and what malloc kept free during the steps.
// The set-up's own peak (building the model) scales with the parameters; the higher of the two
// is the prediction. A small model's peak may come in its backward instead, with fewer
// activations live: predicted at its own size, it comes out a little above what it measured.
// Memory is counted as the kernel charges a memory cgroup (launch.memory_limit): the resident
// set less its file-backed pages (the libraries, which the kernel may drop and read again).
// Free of LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "train/trainer.h"

namespace collie::train {

struct MemoryFitShape {
  int64_t parameters = 0;             // the run's model
  int64_t unit_parameters = 0;        // one unit's (the model's units are equal)
  int units = 0;                      // the run's
  bool gathered_is_one_unit = false;  // stage 3: the gathered values are one unit's
  // Stages 2 and 3 without overlap (train.overlap: false): no reduction runs during the
  // backward, so every bucket's full gradient is made in it, and the backward's blocks grow
  // with the parameters.
  bool backward_is_every_gradient = false;
};

struct MemoryFit {
  double bytes_per_parameter = 0;  // the measured per-parameter cost
  double bytes_per_unit = 0;       // activations per unit
  double fixed_bytes = 0;          // what does not scale
  double measured_peak = 0;        // this run's peak, counted as the cgroup counts it
  int largest_units = 0;           // the most units under `limit` (0: not even one)
  int64_t largest_parameters = 0;  // that model's parameters
};

// The peak of `shape` with `units` units, by the scaling above, from `m`.
double predictedPeak(const StepMemory& m, const MemoryFitShape& shape, int units);

// The costs of `m` and the most units whose predicted peak stays under `limit` (bytes), at
// most `most_units`. Throws InternalError for a shape without units or parameters, or whose
// units hold more parameters than the model.
MemoryFit fitMemory(const StepMemory& m, const MemoryFitShape& shape, double limit,
                    int most_units = 100000);

}  // namespace collie::train
