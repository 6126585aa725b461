// The largest model that fits (train/memory_fit.h): how each measured piece scales with the
// units, and the search under a limit (the summary's line: report_test). benchmarks/zero_fits.sh
// checks the predictions against models that do and do not train under launch.memory_limit.
#include "train/memory_fit.h"

#include <gtest/gtest.h>

#include <string>

#include "collie/error.h"

namespace collie::train {
namespace {

constexpr double kMB = 1e6;

// A 4-unit model of 4 M parameters, 1 M per unit, whose peak came as its backward started:
// 64 MB of state (16 B per parameter, unsharded), 40 MB of activations, 12 MB of backward
// blocks, 1 MB other; 100 MB outside LibTorch's blocks when the steps began, of which 30 MB
// were the libraries' pages; malloc kept 8 MB more during the steps.
StepMemory measured() {
  StepMemory m;
  m.set_up = 64 * kMB;
  m.forward = m.forward_high = 40 * kMB;
  m.backward = 12 * kMB;
  m.other = 1 * kMB;
  m.tracked_at_start = 64 * kMB;
  m.tracked = m.set_up + m.forward + m.backward + m.other;
  m.file_backed_at_start = 30 * kMB;
  m.resident_at_start = 100 * kMB + m.tracked_at_start;
  m.resident = m.resident_at_start + (m.tracked - m.tracked_at_start) + 8 * kMB;
  m.set_up_peak = m.resident_at_start;
  m.process_ranks = 1;
  return m;
}

const MemoryFitShape kShape{4'000'000, 1'000'000, 4, false};

TEST(MemoryFit, AtItsOwnSizeTheModelPredictsWhatWasMeasured) {
  const StepMemory m = measured();
  EXPECT_DOUBLE_EQ(predictedPeak(m, kShape, 4), m.resident - m.file_backed_at_start);
  const MemoryFit fit = fitMemory(m, kShape, 1e9);
  EXPECT_DOUBLE_EQ(fit.measured_peak, m.resident - m.file_backed_at_start);
  EXPECT_DOUBLE_EQ(fit.bytes_per_parameter, 16.0);
  EXPECT_DOUBLE_EQ(fit.bytes_per_unit, 10 * kMB);
  // Outside the blocks less the libraries (70), what malloc kept (8), backward (12), other (1).
  EXPECT_DOUBLE_EQ(fit.fixed_bytes, 91 * kMB);
}

// One more unit adds its parameters' state and its activations; the backward's blocks, the
// fixed memory and what malloc kept stay.
TEST(MemoryFit, EachUnitAddsItsStateAndItsActivations) {
  const StepMemory m = measured();
  const double step = predictedPeak(m, kShape, 5) - predictedPeak(m, kShape, 4);
  EXPECT_DOUBLE_EQ(step, 16 * kMB + 10 * kMB);
  EXPECT_DOUBLE_EQ(predictedPeak(m, kShape, 12) - predictedPeak(m, kShape, 4), 8 * step);
}

// Stage 3's gathered values are one unit's, whatever the number of units; after the update
// of stages 1-2 they are all of this rank's parameters, and grow with them.
TEST(MemoryFit, GatheredUnitsStayGatheredParametersGrow) {
  StepMemory m = measured();
  m.gathered = 8 * kMB;
  m.tracked += m.gathered;
  m.resident += m.gathered;
  MemoryFitShape stage3 = kShape;
  stage3.gathered_is_one_unit = true;
  const double step3 = predictedPeak(m, stage3, 5) - predictedPeak(m, stage3, 4);
  const double step1 = predictedPeak(m, kShape, 5) - predictedPeak(m, kShape, 4);
  EXPECT_DOUBLE_EQ(step3, 26 * kMB);
  EXPECT_DOUBLE_EQ(step1, 26 * kMB + 2 * kMB);  // 8 MB over 4 M parameters, 1 M more
}

// A small model's peak may come in its backward, with some activations freed: the forward's
// most (forward_high) is what a larger model holds at its peak, so the prediction at the
// run's own size comes out above what it measured, never below.
TEST(MemoryFit, TheForwardsMostCountsWhenThePeakCameLater) {
  StepMemory m = measured();
  m.forward = 25 * kMB;  // at the peak; 40 MB at the end of the forward
  m.tracked -= 15 * kMB;
  m.resident -= 15 * kMB;
  EXPECT_DOUBLE_EQ(predictedPeak(m, kShape, 4), m.resident - m.file_backed_at_start + 15 * kMB);
}

// Building the model (stage 3 builds all of it before sharding it) may need more than a step:
// its part above the fixed memory grows with the parameters, and the higher of the two counts.
TEST(MemoryFit, TheSetUpsPeakCountsWhenItIsHigher) {
  StepMemory m = measured();
  m.set_up_peak = m.file_backed_at_start + 70 * kMB + 400 * kMB;  // 100 B per parameter
  EXPECT_DOUBLE_EQ(predictedPeak(m, kShape, 4), 470 * kMB);
  EXPECT_DOUBLE_EQ(predictedPeak(m, kShape, 8), 70 * kMB + 800 * kMB);
}

TEST(MemoryFit, TheLargestIsTheMostUnitsUnderTheLimit) {
  const StepMemory m = measured();
  for (double limit : {150 * kMB, 300 * kMB, 1000 * kMB, 5000 * kMB}) {
    const MemoryFit fit = fitMemory(m, kShape, limit);
    ASSERT_GT(fit.largest_units, 0) << limit;
    EXPECT_LE(predictedPeak(m, kShape, fit.largest_units), limit);
    EXPECT_GT(predictedPeak(m, kShape, fit.largest_units + 1), limit);
    EXPECT_EQ(fit.largest_parameters, 1'000'000LL * fit.largest_units);
  }
  EXPECT_EQ(fitMemory(m, kShape, 50 * kMB).largest_units, 0) << "not even one unit fits";
  EXPECT_EQ(fitMemory(m, kShape, 50 * kMB).largest_parameters, 0);
  EXPECT_THROW(fitMemory(m, MemoryFitShape{4'000'000, 0, 4, false}, 1e9), InternalError);
  EXPECT_THROW(fitMemory(m, MemoryFitShape{3'000'000, 1'000'000, 4, false}, 1e9), InternalError)
      << "units holding more parameters than the model";
}

// Without overlap at stages 2 and 3 every bucket's full gradient is made in the backward: the
// backward's blocks then grow with the parameters, 12 MB more per 4 M parameters here.
TEST(MemoryFit, WithoutOverlapTheBackwardGrowsWithTheParameters) {
  const StepMemory m = measured();
  MemoryFitShape every = kShape;
  every.backward_is_every_gradient = true;
  EXPECT_DOUBLE_EQ(predictedPeak(m, every, 4), predictedPeak(m, kShape, 4));
  EXPECT_DOUBLE_EQ(predictedPeak(m, every, 5) - predictedPeak(m, kShape, 5), 3 * kMB);
  EXPECT_DOUBLE_EQ(fitMemory(m, every, 1e9).bytes_per_parameter, 19.0);
}

}  // namespace
}  // namespace collie::train
