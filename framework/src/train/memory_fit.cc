// The scaling of train/memory_fit.h, and the search for the most units under a limit.
#include "train/memory_fit.h"

#include <fmt/format.h>

#include <algorithm>

#include "collie/error.h"

namespace collie::train {
namespace {

// What the process held outside LibTorch's blocks when the steps began, less the libraries'
// pages: the runtime, the transports, the data.
double fixedOutside(const StepMemory& m) {
  return std::max(0.0, m.resident_at_start - m.file_backed_at_start - m.tracked_at_start);
}

// What malloc kept free while the steps ran (the resident set's growth beyond the blocks the
// steps added): the allocator's caches and the transports' buffers, about the same whatever
// the model's size (the runs behind benchmarks/zero_fits.sh: 21 MB at 2 layers, 32 MB at 14).
double keptFree(const StepMemory& m) {
  return std::max(0.0, (m.resident - m.resident_at_start) - (m.tracked - m.tracked_at_start));
}

// The forward's activations at their most, or at the peak when that was higher.
double activations(const StepMemory& m) { return std::max(m.forward_high, m.forward); }

}  // namespace

double predictedPeak(const StepMemory& m, const MemoryFitShape& shape, int units) {
  const double grown = static_cast<double>(units - shape.units);
  const double params =
      static_cast<double>(shape.parameters) + grown * static_cast<double>(shape.unit_parameters);
  const double r = std::max(0.0, params / static_cast<double>(shape.parameters));
  const double u = static_cast<double>(units) / shape.units;  // units' scale
  const double gathered = shape.gathered_is_one_unit ? m.gathered : m.gathered * r;
  // Without overlap at stages 2 and 3, every bucket's full gradient is made in the backward:
  // the backward's blocks then grow with the parameters too.
  const double backward = shape.backward_is_every_gradient ? m.backward * r : m.backward;
  // The peak of a large model comes as the backward starts: every unit's activations live,
  // and the backward's blocks of one unit on their way into the buckets.
  const double tracked = (m.set_up + m.gradient_sync + m.optimizer) * r + gathered +
                         activations(m) * u + backward + m.other;
  const double steps = fixedOutside(m) + tracked + keptFree(m);
  // The set-up's own peak (building the model, stage 3's whole model before it is sharded),
  // its part above the fixed memory in proportion to the parameters.
  const double set_up_peak = m.set_up_peak - m.file_backed_at_start;
  const double set_up = fixedOutside(m) + std::max(0.0, set_up_peak - fixedOutside(m)) * r;
  return std::max(steps, set_up);
}

MemoryFit fitMemory(const StepMemory& m, const MemoryFitShape& shape, double limit,
                    int most_units) {
  if (shape.units <= 0 || shape.parameters <= 0 || shape.unit_parameters <= 0 ||
      shape.parameters < shape.units * shape.unit_parameters) {
    throw InternalError(
        fmt::format("fitMemory: a shape of {} units of {} parameters ({} in all) cannot be scaled",
                    shape.units, shape.unit_parameters, shape.parameters));
  }
  MemoryFit fit;
  const double per_parameter = m.set_up + m.gradient_sync + m.optimizer +
                               (shape.gathered_is_one_unit ? 0.0 : m.gathered) +
                               (shape.backward_is_every_gradient ? m.backward : 0.0);
  fit.bytes_per_parameter = per_parameter / static_cast<double>(shape.parameters);
  fit.bytes_per_unit = activations(m) / shape.units;
  fit.fixed_bytes = fixedOutside(m) + keptFree(m) +
                    (shape.backward_is_every_gradient ? 0.0 : m.backward) + m.other +
                    (shape.gathered_is_one_unit ? m.gathered : 0.0);
  fit.measured_peak = std::max(m.resident, m.set_up_peak) - m.file_backed_at_start;
  // The peak grows with the units (every piece does or stays): the first that does not fit
  // ends the search.
  for (int units = 1; units <= most_units && predictedPeak(m, shape, units) <= limit; ++units)
    fit.largest_units = units;
  fit.largest_parameters =
      fit.largest_units == 0
          ? 0
          : shape.parameters +
                static_cast<int64_t>(fit.largest_units - shape.units) * shape.unit_parameters;
  return fit;
}

}  // namespace collie::train
