// The learning rate of every step: linear warmup to the peak, then cosine decay
// to the floor, or constant; the linear scaling rule scales peak and floor by the world
// batch. A pure function of the config, tested alone.
#pragma once

#include <cstdint>

#include "config/experiment.h"

namespace collie::train {

struct LrSchedule {
  double peak = 0, floor = 0;  // after the linear scaling rule
  int64_t warmup_steps = 0;    // steps 0 .. warmup-1 climb linearly to the peak
  int64_t total_steps = 1;     // the cosine reaches the floor at this step index
  bool cosine = true;          // false: constant after warmup

  // The rate of 0-based step `step`.
  double at(int64_t step) const;
};

// train.lr, min_lr, lr_schedule, warmup_steps and steps, with linear_scaling_batch applied
// for a world batch of `world_batch` samples per micro-batch round.
LrSchedule lrSchedule(const config::TrainSpec& spec, int64_t world_batch);

}  // namespace collie::train
