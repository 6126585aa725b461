// Straggler attribution from synthetic timings: scores, waits, who arrived last, the step at
// the fastest rank's speed, and when the watch warns.
#include <gtest/gtest.h>

#include <random>

#include "train/stragglers.h"

namespace collie::train {
namespace {

// `world` ranks whose compute takes base x (rank + 1) with 2 % noise; every rank then waits
// in the step's collectives for the slowest (it enters when its compute is done), and the
// transfer itself takes `transfer` on every rank.
std::vector<StepAttribution> synthetic(int world, int steps, double base, double transfer) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> noise(0.98, 1.02);
  std::vector<StepAttribution> out;
  for (int k = 0; k < steps; ++k) {
    std::vector<StragglerSample> ranks(world);
    double slowest = 0;
    for (int r = 0; r < world; ++r) {
      ranks[r].compute = base * (r + 1) * noise(random);
      slowest = std::max(slowest, ranks[r].compute);
    }
    for (int r = 0; r < world; ++r) {
      // Two collectives: the first holds the wait, the second only the transfer. Long
      // collectives must not count as compute.
      ranks[r].collectives = {slowest - ranks[r].compute + transfer, transfer};
      ranks[r].step = slowest + 2 * transfer;
    }
    out.push_back(attributeStep(ranks));
  }
  return out;
}

TEST(Stragglers, ARankThatComputesKTimesLongerScoresOneKth) {
  const auto report = summarise(synthetic(4, 30, 0.010, 0.050));
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(report.score[r], 1.0 / (r + 1), 0.05 / (r + 1)) << "rank " << r;
    EXPECT_NEAR(report.median_compute[r], 0.010 * (r + 1), 0.0005 * (r + 1)) << "rank " << r;
  }
  EXPECT_EQ(report.slowest(), 3);
  // Every rank waits for rank 3's compute: rank 0 about 30 ms per step, rank 3 none.
  EXPECT_NEAR(report.wait[0], 0.030, 0.002);
  EXPECT_NEAR(report.wait[3], 0.0, 0.002);
  EXPECT_GT(report.last_share[3], 0.45);  // last at the first collective of every step
  // Without rank 3's extra compute a step would be about 40 ms - 30 ms shorter.
  EXPECT_NEAR(report.step_at_fastest, 0.010 + 0.100, 0.003);
  EXPECT_NEAR(report.step_seconds, 0.040 + 0.100, 0.003);
}

// A step where rank 1 computes `factor` times as long as rank 0.
StepAttribution stepAt(double factor) {
  StepAttribution a;
  a.compute = {0.010, 0.010 * factor};
  a.wait = {0.010 * (factor - 1), 0};
  a.last = {0, 1};
  a.collectives = 1;
  a.step = 0.010 * factor + 0.001;
  return a;
}

TEST(Stragglers, TheWatchWarnsOnceAWindowScoresBelowTheThreshold) {
  StragglerWatch watch(2, 0.8, 20);
  const std::vector<StepAttribution> slow(10, stepAt(2.0)), fine(10, stepAt(1.05));
  EXPECT_TRUE(watch.update(slow).empty());  // 10 steps: no window yet
  EXPECT_EQ(watch.update(slow), std::vector<int>{1});
  EXPECT_NEAR(watch.recent().score[1], 0.5, 1e-9);
  EXPECT_TRUE(watch.update(slow).empty());  // once per spell
  // Half a window of good steps moves the median only to the boundary: still below.
  EXPECT_TRUE(watch.update(fine).empty());
  EXPECT_TRUE(watch.update(fine).empty());  // recovered: a whole window at 0.95
  EXPECT_GT(watch.recent().score[1], 0.9);
  // A new spell: half a window of slow steps is the median's boundary, and below it.
  EXPECT_EQ(watch.update(slow), std::vector<int>{1});
}

// One slow step in a window is noise, not a straggler: the median ignores it.
TEST(Stragglers, AFewSlowStepsInAWindowNameNobody) {
  StragglerWatch watch(2, 0.8, 20);
  std::vector<StepAttribution> steps(20, stepAt(1.0));
  for (int k = 0; k < 9; ++k) steps[2 * k].compute[1] = 0.030;
  EXPECT_TRUE(watch.update(steps).empty());
  EXPECT_NEAR(watch.recent().score[1], 1.0, 1e-9);
}

TEST(Stragglers, SamplesSurviveTheirPacking) {
  std::vector<StragglerSample> samples = {{0.5, 0.25, {0.1, 0.2}}, {0.6, 0.3, {}}};
  const auto back = unpackSamples(packSamples(samples));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].collectives, samples[0].collectives);
  EXPECT_EQ(back[1].compute, 0.3);
  EXPECT_EQ(back[0].step, 0.5);
}

}  // namespace
}  // namespace collie::train
