// Warmup, cosine decay and the linear scaling rule (train/lr_schedule.h).
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace collie::train {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / warmup_steps;
  if (!cosine) return peak;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

LrSchedule lrSchedule(const config::TrainSpec& spec, int64_t world_batch) {
  const double scale = spec.linear_scaling_batch == 0
                           ? 1.0
                           : static_cast<double>(world_batch) / spec.linear_scaling_batch;
  LrSchedule s;
  s.peak = spec.lr * scale;
  s.floor = spec.min_lr * scale;
  s.warmup_steps = spec.warmup_steps;
  s.total_steps = spec.steps;
  s.cosine = spec.cosine;
  return s;
}

}  // namespace collie::train
