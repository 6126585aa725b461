// The learning-rate schedule: warmup, cosine, constant, floor and the linear scaling rule.
#include "train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace collie::train {
namespace {

config::TrainSpec spec(double lr, double min_lr, int warmup, int steps, bool cosine) {
  config::TrainSpec t;
  t.lr = lr;
  t.min_lr = min_lr;
  t.warmup_steps = warmup;
  t.steps = steps;
  t.cosine = cosine;
  t.linear_scaling_batch = 0;
  return t;
}

TEST(LrSchedule, WarmupClimbsLinearlyToThePeak) {
  LrSchedule s = lrSchedule(spec(1.0, 0.0, 4, 100, true), 8);
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);  // the cosine starts at the peak
}

TEST(LrSchedule, CosineFallsToTheFloorAtTheLastStep) {
  LrSchedule s = lrSchedule(spec(1.0, 0.1, 0, 11, true), 8);
  EXPECT_DOUBLE_EQ(s.at(0), 1.0);
  EXPECT_NEAR(s.at(5), 0.1 + 0.5 * 0.9 * (1 + std::cos(M_PI * 5 / 11.0)), 1e-15);
  EXPECT_NEAR(s.at(11), 0.1, 1e-15);
  EXPECT_NEAR(s.at(1000), 0.1, 1e-15);  // never below the floor
  for (int k = 1; k < 11; ++k) EXPECT_LT(s.at(k), s.at(k - 1));
}

TEST(LrSchedule, ConstantStaysAtThePeakAfterWarmup) {
  LrSchedule s = lrSchedule(spec(3e-4, 0.0, 2, 50, false), 8);
  EXPECT_DOUBLE_EQ(s.at(0), 1.5e-4);
  EXPECT_DOUBLE_EQ(s.at(2), 3e-4);
  EXPECT_DOUBLE_EQ(s.at(49), 3e-4);
}

TEST(LrSchedule, LinearScalingScalesPeakAndFloorByTheWorldBatch) {
  config::TrainSpec t = spec(1e-3, 1e-4, 0, 10, true);
  t.linear_scaling_batch = 16;
  LrSchedule s = lrSchedule(t, 64);
  EXPECT_DOUBLE_EQ(s.peak, 4e-3);
  EXPECT_DOUBLE_EQ(s.floor, 4e-4);
  EXPECT_DOUBLE_EQ(s.at(0), 4e-3);
}

TEST(LrSchedule, OneStepRunsAtThePeak) {
  LrSchedule s = lrSchedule(spec(0.5, 0.0, 0, 1, true), 1);
  EXPECT_DOUBLE_EQ(s.at(0), 0.5);
}

}  // namespace
}  // namespace collie::train
