// Fewer synchronisations (train.sync) on loopback ranks: local SGD equal to DDP where the
// algebra says so, DiLoCo's outer step against a closed form, the bytes of the meetings,
// checkpoints that wait for a meeting and resume bit for bit, and the refusals.
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "collie/error.h"
#include "expect.h"
#include "loopback_job.h"
#include "run_command.h"
#include "runtime/communicator.h"
#include "train/checkpoint.h"
#include "train/local_sync.h"
#include "train/reducer.h"
#include "train/trainer.h"
#include "training_runs.h"

namespace collie {
namespace {

namespace fs = std::filesystem;

const testing::TrainingRuns kRuns("local-sync-scratch", testing::kUnequalRanksMlp,
                                  {"train.lr=0.05"});

// Meetings after steps 2, 4 and the last, 5: three times the parameters' bytes over five
// steps, and one model at the end.
TEST(LocalSgd, TheModelsMeetEveryHStepsAndAtTheEnd) {
  const train::Result r =
      kRuns.run("meetings", {"train.steps=5", "train.sync.mode=local_sgd", "train.sync.every=2"});
  EXPECT_TRUE(r.sync.identical);
  EXPECT_EQ(r.sync_mode, "local_sgd");
  EXPECT_EQ(r.sync_every, 2);
  // A rank sends 2(N-1)/N of what an all-reduce carries.
  const double ring = 2.0 * 2 / 3;
  EXPECT_DOUBLE_EQ(r.sent_bytes_per_step, ring * 3 * static_cast<double>(r.parameter_bytes) / 5);
  const train::Result ddp = kRuns.run("meetings-ddp", {"train.steps=5"});
  EXPECT_DOUBLE_EQ(ddp.sent_bytes_per_step, ring * static_cast<double>(ddp.allreduce_bytes));
}

// SGD with momentum is linear in the gradients: averaging every rank's parameters after
// every step, each rank weighted by its share of the step's samples, is DDP's update of
// the token-weighted mean gradient, each rank's momentum averaging to DDP's. Unequal
// micro-batches, two per step; no clipping (the norm is not linear).
TEST(LocalSgd, MeetingEveryStepIsDdpForSgdWithMomentum) {
  const std::vector<std::string> sgd = {"train.optimizer=sgd", "train.grad_clip=0",
                                        "train.weight_decay=0.01", "train.lr=2"};
  kRuns.run("sgd-ddp", sgd);
  auto local = sgd;
  local.insert(local.end(), {"train.sync.mode=local_sgd", "train.sync.every=1"});
  kRuns.run("sgd-local-1", local);
  // Meeting every 3 steps is another algorithm: the same start, other weights.
  auto rarer = sgd;
  rarer.insert(rarer.end(), {"train.sync.mode=local_sgd", "train.sync.every=3"});
  kRuns.run("sgd-local-3", rarer);
  const double every =
      testing::largestDifference(kRuns.weights("sgd-ddp"), kRuns.weights("sgd-local-1"));
  const double third =
      testing::largestDifference(kRuns.weights("sgd-ddp"), kRuns.weights("sgd-local-3"));
  std::printf("largest difference from DDP: meeting every step %g, every 3 steps %g\n", every,
              third);
  EXPECT_LT(every, 1e-5);
  EXPECT_GT(third, 100 * every);
}

// DiLoCo meeting every step with an outer SGD of lr 1 and no momentum takes the averaged
// parameters: local SGD.
TEST(Diloco, PlainOuterSgdOfRateOneIsLocalSgd) {
  kRuns.run("local-2", {"train.sync.mode=local_sgd", "train.sync.every=2"});
  kRuns.run("diloco-2", {"train.sync.mode=diloco", "train.sync.every=2", "train.sync.outer_lr=1",
                         "train.sync.outer_momentum=0", "train.sync.nesterov=false"});
  EXPECT_LT(testing::largestDifference(kRuns.weights("local-2"), kRuns.weights("diloco-2")), 1e-6);
}

// The outer step on made-up parameters, against the closed form: with θ the last meeting's
// parameters and θ_r rank r's, g = Σ share_r (θ - θ_r), m = μ m + g, and Nesterov's
// θ ← θ - lr (g + μ m); every rank then holds θ.
TEST(Diloco, OuterStepIsNesterovSgdOnTheAveragedChange) {
  const std::vector<double> shares = {0.5, 0.3, 0.2};
  config::SyncSpec spec;
  spec.mode = config::SyncSpec::Mode::kDiloco;
  spec.every = 1;
  spec.outer_lr = 0.7;
  spec.outer_momentum = 0.9;
  spec.nesterov = true;
  std::mutex mu;
  std::vector<at::Tensor> after(3);
  testing::runLoopback(3, [&](std::shared_ptr<Backend> backend) {
    const int r = backend->rank();
    Communicator comm(backend, "loopback", Topology::fromLabels({"a", "a", "a"}));
    comm.addRule("ring", testing::loadScheduler("ring"));
    at::Tensor p = at::full({5}, 1.0f).requires_grad_();
    train::Reducer reducer({p}, 1 << 20, comm, false);
    train::PeriodicSync periodic(spec, 10, reducer, comm);
    std::vector<at::Tensor> seen;
    for (int s = 0; s < 2; ++s) {  // each rank moves its own way, then they meet
      reducer.values(0).narrow(0, 0, 5).sub_(0.1 * (r + 1) * (s + 1));
      periodic.afterStep(s, shares[r]);
      seen.push_back(reducer.values(0).narrow(0, 0, 5).clone());
    }
    std::lock_guard<std::mutex> lock(mu);
    after[r] = at::stack(seen);
  });
  double theta = 1, m = 0;
  std::vector<double> expected;
  for (int s = 0; s < 2; ++s) {
    double g = 0;
    for (int r = 0; r < 3; ++r) g += shares[r] * 0.1 * (r + 1) * (s + 1);
    m = 0.9 * m + g;
    theta -= 0.7 * (g + 0.9 * m);
    expected.push_back(theta);
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(at::equal(after[r], after[0])) << "rank " << r;
    for (int s = 0; s < 2; ++s) {
      EXPECT_NEAR(after[r][s][0].item<double>(), expected[s], 1e-6) << "step " << s;
    }
  }
}

// A checkpoint holds one model: one due between meetings waits for the next, and a run
// resumed from it (DiLoCo's outer state, every rank's AdamW state) ends where the
// uninterrupted run does, bit for bit.
TEST(LocalSync, CheckpointsWaitForAMeetingAndResumeBitIdentically) {
  const std::vector<std::string> sets = {"train.sync.mode=diloco", "train.sync.every=3",
                                         "train.sync.warmup_steps=1", "train.checkpoint_every=2",
                                         "train.checkpoint_keep=5"};
  kRuns.run("whole", sets);
  // One synchronous step, then meetings after steps 4 and 6: the checkpoint due after step
  // 2 is written after step 4, none after step 2.
  const fs::path ckpt = kRuns.dir("whole") / "ckpt";
  EXPECT_TRUE(fs::exists(train::checkpointPath(ckpt.string(), 4)));
  EXPECT_FALSE(fs::exists(train::checkpointPath(ckpt.string(), 2)));
  EXPECT_TRUE(fs::exists(train::checkpointPath(ckpt.string(), 6)));
  kRuns.run("interrupted", sets);
  fs::remove_all(train::checkpointPath((kRuns.dir("interrupted") / "ckpt").string(), 6));
  train::CheckpointReader reader(
      train::latestCheckpoint((kRuns.dir("interrupted") / "ckpt").string()));
  size_t outer = 0, own = 0;
  for (const auto& [key, shape] : reader.tensors()) {
    outer += key.rfind("outer/", 0) == 0;
    own += key.rfind("rank/2/exp_avg/", 0) == 0;
  }
  EXPECT_GT(outer, 0u);
  EXPECT_GT(own, 0u);
  const train::Result resumed = kRuns.run("interrupted", sets, /*fresh=*/false);
  EXPECT_EQ(resumed.timed_steps, 1);  // steps 5 and 6, the first untimed: it resumed at 4
  EXPECT_TRUE(resumed.sync.identical);
  const auto whole = kRuns.weights("whole"), again = kRuns.weights("interrupted");
  for (const auto& [key, tensor] : whole) EXPECT_TRUE(at::equal(tensor, again.at(key))) << key;
}

TEST(LocalSync, ConfigsThatCannotWorkAreRefused) {
  EXPECT_TRUE(testing::contains(kRuns.configError({"train.sync.outer_lr=0.5"}),
                                {"only mode diloco takes it"}));
  EXPECT_TRUE(testing::contains(
      kRuns.configError({"train.sync.mode=diloco", "train.sync.every=2", "train.sync.outer_lr=0"}),
      {"expected a rate above 0"}));
  EXPECT_TRUE(
      testing::contains(kRuns.configError({"train.sync.mode=local_sgd", "train.sync.every=2",
                                           "train.sync.warmup_steps=6"}),
                        {"leave none of the run's 6 to take alone"}));
  EXPECT_TRUE(testing::contains(kRuns.configError({"train.sync.mode=local_sgd",
                                                   "train.sync.every=2", "train.compression=bf16"}),
                                {"makes none without a warm-up"}));
  EXPECT_TRUE(testing::contains(kRuns.configError({"train.sync.every=4"}),
                                {"only mode local_sgd or diloco takes it"}));
  EXPECT_TRUE(testing::contains(kRuns.configError({"train.sync.mode=local_sgd"}),
                                {"needs the steps between"}));
  const std::string sharded = kRuns.configError(
      {"train.sync.mode=diloco", "train.sync.every=2", "train.sharding=optimizer"});
  EXPECT_TRUE(testing::contains(sharded, {"train.sharding: optimizer keeps a shard"}));
}

}  // namespace
}  // namespace collie
