// What the trainer does between steps, on three loopback ranks with made-up step timings:
// the rebalancer's split and the straggler monitor's attribution must be the same on every
// rank and follow the timings they were given.
#include "train/step_watchers.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>

#include "loopback_job.h"
#include "runtime/control.h"
#include "train/data.h"

namespace collie::train {
namespace {

using collie::testing::runLoopback;

constexpr int kWorld = 3;

// A step of `samples` samples at `per_sample` seconds of compute each.
StepStats stepOf(int samples, double per_sample) {
  StepStats st;
  st.micro_batch = samples;
  st.forward = samples * per_sample / 3;
  st.backward = samples * per_sample * 2 / 3;
  st.step = st.forward + st.backward + 0.01;
  return st;
}

config::TrainSpec rebalancingSpec() {
  config::TrainSpec spec;
  spec.steps = 10;
  spec.auto_micro_batch = true;
  spec.global_batch = 12;
  spec.grad_accum = 1;
  spec.rebalance_every = 2;
  spec.rebalance_hysteresis = 0.05;
  return spec;
}

TEST(Rebalancer, MovesSamplesFromASlowRankTheSameWayOnEveryRank) {
  const config::TrainSpec spec = rebalancingSpec();
  const std::vector<double> per_sample = {0.01, 0.01, 0.03};  // rank 2 is three times slower
  std::mutex mu;
  std::vector<std::vector<int>> splits(kWorld);
  std::vector<std::vector<Rebalance>> taken(kWorld);
  runLoopback(kWorld, [&](std::shared_ptr<Backend> b) {
    const int rank = b->rank();
    Control control(*b);
    Rebalancer rebalancer(spec, rank, kWorld, control);
    Sharding sharding{{4, 4, 4}, 1};
    bool changed_early = false;
    for (int64_t s = 0; s < 3; ++s) {
      const bool changed = rebalancer.afterStep(
          s, 0, stepOf(sharding.micro_batch[rank], per_sample[rank]), &sharding);
      if (s < 2) changed_early = changed_early || changed;
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(changed_early) << "rank " << rank << " split before rebalance_every steps";
    splits[rank] = sharding.micro_batch;
    taken[rank] = rebalancer.taken();
  });
  // Steps 1 and 2 are measured (step 0 allocates): the split after step 3 is data.h's resplit
  // of those speeds, on every rank.
  const Resplit expected = resplit(12, {4, 4, 4}, per_sample, spec.rebalance_hysteresis);
  ASSERT_TRUE(expected.take);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(splits[r], expected.split) << "rank " << r;
    ASSERT_EQ(taken[r].size(), 1u) << "rank " << r;
    EXPECT_EQ(taken[r][0].after_step, 3);
    EXPECT_EQ(taken[r][0].micro_batch, expected.split);
  }
  EXPECT_LT(expected.split[2], 4);
  EXPECT_EQ(std::accumulate(expected.split.begin(), expected.split.end(), 0), 12);
}

TEST(Rebalancer, KeepsTheSplitWhenTheRanksAreEquallyFast) {
  const config::TrainSpec spec = rebalancingSpec();
  runLoopback(kWorld, [&](std::shared_ptr<Backend> b) {
    Control control(*b);
    Rebalancer rebalancer(spec, b->rank(), kWorld, control);
    Sharding sharding{{4, 4, 4}, 1};
    for (int64_t s = 0; s < 7; ++s)
      EXPECT_FALSE(rebalancer.afterStep(s, 0, stepOf(4, 0.01), &sharding));
    EXPECT_EQ(sharding.micro_batch, (std::vector<int>{4, 4, 4}));
    EXPECT_TRUE(rebalancer.taken().empty());
  });
}

TEST(StragglerMonitor, ScoresTheRankThatComputesTwiceAsLong) {
  config::TrainSpec spec;
  spec.steps = 9;
  spec.straggler_every = 4;
  spec.straggler_window = 4;
  spec.straggler_threshold = 0.7;
  std::mutex mu;
  std::vector<Result> results(kWorld);
  runLoopback(kWorld, [&](std::shared_ptr<Backend> b) {
    const int rank = b->rank();
    Control control(*b);
    const Topology topology = Topology::singleNode(kWorld);
    StragglerMonitor monitor(spec, rank, kWorld, control, topology);
    for (int64_t s = 0; s < spec.steps; ++s) {
      StepStats st = stepOf(4, rank == 1 ? 0.02 : 0.01);
      Provenance collective;
      collective.seconds = rank == 1 ? 0.001 : 0.001 + 0.04;  // the others wait for rank 1
      st.sync.collectives.push_back(collective);
      monitor.afterStep(s, 0, st);
      if (s == 4) {  // steps 1-4 are gathered after step 4, not only at the end
        Result so_far;
        monitor.report(&so_far);
        EXPECT_EQ(so_far.straggler_steps, 4) << "rank " << rank;
      }
    }
    Result r;
    monitor.report(&r);
    std::lock_guard<std::mutex> lock(mu);
    results[rank] = r;
  });
  for (int r = 0; r < kWorld; ++r) {
    const Result& got = results[r];
    EXPECT_EQ(got.straggler_steps, 8) << "rank " << r << ": every step but the first";
    ASSERT_EQ(got.straggler_score.size(), 3u) << "rank " << r;
    EXPECT_NEAR(got.straggler_score[0], 1.0, 1e-9);
    EXPECT_NEAR(got.straggler_score[1], 0.5, 1e-9);
    EXPECT_NEAR(got.straggler_score[2], 1.0, 1e-9);
    EXPECT_EQ(got.straggler_score, results[0].straggler_score) << "rank " << r;
    ASSERT_EQ(got.arrived_last.size(), 3u);
    EXPECT_NEAR(got.arrived_last[1], 1.0, 1e-9) << "rank 1 arrives last at every collective";
  }
}

TEST(StragglerMonitor, GathersNothingWhenOff) {
  config::TrainSpec spec;
  spec.steps = 5;
  spec.straggler_every = 0;
  runLoopback(kWorld, [&](std::shared_ptr<Backend> b) {
    Control control(*b);
    const Topology topology = Topology::singleNode(kWorld);
    StragglerMonitor monitor(spec, b->rank(), kWorld, control, topology);
    for (int64_t s = 0; s < spec.steps; ++s) monitor.afterStep(s, 0, stepOf(4, 0.01));
    Result r;
    monitor.report(&r);
    EXPECT_TRUE(r.straggler_score.empty());
    EXPECT_EQ(r.straggler_steps, 0);
  });
}

}  // namespace
}  // namespace collie::train
