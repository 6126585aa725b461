// The DDP trainer over loopback ranks (threads): equivalence with one process on the
// concatenated batch, identical weights under every scheduler, the verifier catching a
// perturbed rank, bit-identical resume, and overlapped communication.
#include <gtest/gtest.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>

#include "collie/error.h"
#include "loopback_job.h"
#include "run_command.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "train/checkpoint.h"
#include "train/sync.h"
#include "train/trainer.h"

namespace collie {
namespace {

namespace fs = std::filesystem;

// A small mlp run over loopback ranks; `sets` as with --set.
const char* kBase = R"(
name: trainer-test
launch: {nproc_per_node: 1}
backend: {plugin: loopback, params: {timeout: 30s}}
model: {plugin: mlp, params: {seq_len: 6, vocab: 48, d_embed: 8, hidden: 32, layers: 2}}
train:
  steps: 4
  micro_batch: 5
  lr: 0.01
  warmup_steps: 1
  log_every: 100
)";

fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

train::Result runTraining(const std::string& name, std::vector<std::string> sets) {
  const fs::path dir = scratch(name);
  sets.push_back("train.checkpoint_dir=" + (dir / "ckpt").string());
  const std::string config = testing::writeTempFile(name + ".yaml", kBase);
  auto experiments = config::loadExperiments(config, sets);
  return train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
}

// The final checkpoint's tensors of a run made by runTraining(name, ...).
std::map<std::string, at::Tensor> finalWeights(const std::string& name) {
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / name / "ckpt";
  train::Checkpoint c = train::loadCheckpoint(train::latestCheckpoint(dir.string()));
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, tensor] : c.tensors) {
    if (key.rfind("param/", 0) == 0) out[key] = tensor;
  }
  return out;
}

double maxDifference(const std::map<std::string, at::Tensor>& a,
                     const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [key, tensor] : a) {
    worst = std::max(worst, tensor.sub(b.at(key)).abs().max().item().toDouble());
  }
  return worst;
}

TEST(DdpEquivalence, TokensWeightingMatchesOneProcessOnTheConcatenatedBatch) {
  runTraining("solo", {"train.micro_batch=[5]", "train.grad_accum=2"});
  const auto solo = finalWeights("solo");
  struct Case {
    std::string name;
    int ranks;
    std::string micro_batch;
  };
  for (const Case& c : {Case{"equal", 5, "[1, 1, 1, 1, 1]"}, Case{"unequal2", 2, "[3, 2]"},
                        Case{"unequal3", 3, "[1, 3, 1]"}}) {
    SCOPED_TRACE(c.name);
    auto result = runTraining(c.name, {"launch.nproc_per_node=" + std::to_string(c.ranks),
                                       "train.micro_batch=" + c.micro_batch, "train.grad_accum=2"});
    EXPECT_TRUE(result.sync.identical);
    EXPECT_EQ(result.world_batch_samples, 10);
    const double diff = maxDifference(solo, finalWeights(c.name));
    EXPECT_LT(diff, 2e-6) << "N ranks with tokens weighting must update like one process";
  }
}

TEST(DdpEquivalence, SgdMatchesToo) {
  runTraining("solo-sgd", {"train.micro_batch=[4]", "train.optimizer=sgd", "train.lr=0.2"});
  runTraining("pair-sgd", {"launch.nproc_per_node=2", "train.micro_batch=[3, 1]",
                           "train.optimizer=sgd", "train.lr=0.2"});
  EXPECT_LT(maxDifference(finalWeights("solo-sgd"), finalWeights("pair-sgd")), 2e-6);
}

TEST(DdpEquivalence, UniformWeightingOfUnequalBatchesDiffers) {
  runTraining("solo-u", {"train.micro_batch=[5]", "train.optimizer=sgd", "train.lr=0.2"});
  auto result = runTraining(
      "uniform", {"launch.nproc_per_node=2", "train.micro_batch=[4, 1]",
                  "train.grad_weighting=uniform", "train.optimizer=sgd", "train.lr=0.2"});
  EXPECT_TRUE(result.sync.identical) << "uniform weighting drifts from one process, not apart";
  EXPECT_GT(maxDifference(finalWeights("solo-u"), finalWeights("uniform")), 1e-4)
      << "plain DDP's 1/world mean weights the rank with 1 sample like the one with 4";
}

class SchedulerSync : public ::testing::TestWithParam<std::string> {};

TEST_P(SchedulerSync, WeightsStayIdenticalOnEveryRank) {
  auto result = runTraining(
      "sync-" + GetParam(),
      {"launch.nproc_per_node=3", "train.micro_batch=[8, 6, 4]", "train.scheduler=" + GetParam(),
       "train.verify_sync_every=10", "train.bucket_bytes=4KiB", "train.steps=40", "train.lr=0.01"});
  EXPECT_TRUE(result.sync.identical) << result.sync.describe(3);
  EXPECT_EQ(result.sync.max_spread, 0.0);
  EXPECT_EQ(result.sync.step, 40);
  EXPECT_GT(result.buckets, 1);
  EXPECT_LT(result.last_loss, result.first_loss);
}

INSTANTIATE_TEST_SUITE_P(Schedulers, SchedulerSync,
                         ::testing::Values("ring", "tree", "halving_doubling", "hierarchical",
                                           "auto"));

// ZeRO stages 1 and 2 against plain data parallelism: the same parameters, bit for bit,
// after 20 steps with unequal micro-batches and accumulation (clipping off: a sharded run
// adds the squares of its norm in another order).
struct ShardingCase {
  std::string scheduler;
  std::string micro_batch;
};

void PrintTo(const ShardingCase& c, std::ostream* os) {
  *os << c.scheduler << " " << c.micro_batch;
}

size_t ranksOf(const ShardingCase& c) {
  return std::count(c.micro_batch.begin(), c.micro_batch.end(), ',') + 1;
}

// "ring_3ranks", "ring_3ranks_equal": the test's name and its runs' directories.
std::string caseName(const ShardingCase& c) {
  const bool equal = c.micro_batch == "[2, 2, 2]" || c.micro_batch == "[3, 3, 3, 3]";
  return c.scheduler + "_" + std::to_string(ranksOf(c)) + "ranks" + (equal ? "_equal" : "");
}

class Sharding : public ::testing::TestWithParam<ShardingCase> {};

TEST_P(Sharding, GivesTheParametersOfUnshardedTraining) {
  const ShardingCase c = GetParam();
  const size_t ranks = ranksOf(c);
  const std::string tag = caseName(c);  // unique: ctest runs the cases side by side
  const std::vector<std::string> sets = {"launch.nproc_per_node=" + std::to_string(ranks),
                                         "train.micro_batch=" + c.micro_batch,
                                         "train.grad_accum=2",
                                         "train.scheduler=" + c.scheduler,
                                         "train.bucket_bytes=1KiB",
                                         "train.grad_clip=0",
                                         "train.steps=20"};
  const auto plain_result = runTraining("zero0-" + tag, sets);
  const auto plain = finalWeights("zero0-" + tag);
  const uint64_t psi = static_cast<uint64_t>(plain_result.parameters);
  // Each bucket is padded by fewer than N elements: at most this many bytes per kind.
  const uint64_t padding = 4u * ranks * static_cast<uint64_t>(plain_result.buckets);
  EXPECT_EQ(plain_result.optimizer_bytes, 8u * psi);  // AdamW's two moments
  EXPECT_GE(plain_result.gradient_bytes, 4u * psi);
  EXPECT_LT(plain_result.gradient_bytes, 4u * psi + padding);
  for (const std::string stage : {"optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    auto sharded_sets = sets;
    sharded_sets.push_back("train.sharding=" + stage);
    const std::string name = "zero-" + stage + "-" + tag;
    auto result = runTraining(name, sharded_sets);
    EXPECT_TRUE(result.sync.identical) << result.sync.describe(static_cast<int>(ranks));
    EXPECT_GT(result.buckets, 1);
    EXPECT_EQ(result.sharding, stage);
    // Every rank keeps its 1/N of the moments; stage 2 its 1/N of the gradients too, stage
    // 3 of the parameters too (between steps: no unit is gathered then).
    EXPECT_GE(result.optimizer_bytes * ranks, 8u * psi);
    EXPECT_LT(result.optimizer_bytes * ranks, 8u * psi + 2 * padding);
    const uint64_t params =
        stage == "parameters" ? result.parameter_bytes * ranks : result.parameter_bytes;
    EXPECT_GE(params, 4u * psi);
    EXPECT_LT(params, 4u * psi + padding);
    const uint64_t grads =
        stage == "optimizer" ? result.gradient_bytes : result.gradient_bytes * ranks;
    EXPECT_GE(grads, 4u * psi);
    EXPECT_LT(grads, 4u * psi + padding);
    const auto sharded = finalWeights(name);
    ASSERT_EQ(plain.size(), sharded.size());
    for (const auto& [key, tensor] : plain) {
      EXPECT_TRUE(at::equal(tensor, sharded.at(key))) << key << " differs with sharding";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedulers, Sharding,
    ::testing::Values(ShardingCase{"ring", "[5, 3]"}, ShardingCase{"ring", "[4, 3, 2]"},
                      ShardingCase{"ring", "[4, 3, 2, 1]"}, ShardingCase{"ring", "[2, 2, 2]"},
                      ShardingCase{"halving_doubling", "[5, 3]"},
                      ShardingCase{"halving_doubling", "[4, 3, 2, 1]"},
                      ShardingCase{"halving_doubling", "[3, 3, 3, 3]"}),
    [](const ::testing::TestParamInfo<ShardingCase>& info) { return caseName(info.param); });

// With clipping the norm is gathered from the shards and adds in another order: the weights
// agree to float rounding, not bit for bit.
TEST(ShardingClipping, ClipsByTheGlobalNormOfTheShards) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=2", "train.micro_batch=[5, 3]",
                                         "train.bucket_bytes=1KiB", "train.grad_clip=0.05",
                                         "train.steps=10"};
  runTraining("zero0-clip", sets);
  for (const std::string stage : {"optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    auto sharded_sets = sets;
    sharded_sets.push_back("train.sharding=" + stage);
    runTraining("zero-clip-" + stage, sharded_sets);
    EXPECT_LT(maxDifference(finalWeights("zero0-clip"), finalWeights("zero-clip-" + stage)), 1e-6);
    runTraining("zero-noclip-" + stage,
                {"launch.nproc_per_node=2", "train.micro_batch=[5, 3]", "train.bucket_bytes=1KiB",
                 "train.grad_clip=0", "train.steps=10", "train.sharding=" + stage});
    EXPECT_GT(
        maxDifference(finalWeights("zero-clip-" + stage), finalWeights("zero-noclip-" + stage)),
        1e-4)
        << "clipping at 0.05 must change the update";
  }
}

// A sharded run's checkpoint holds the whole optimizer state per parameter, as an unsharded
// run's does: the same tensors, bit for bit, so either resumes from the other's.
TEST(ShardingCheckpoint, HoldsTheUnshardedStateAndResumesBitIdentically) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]",
                                         "train.grad_clip=0",       "train.bucket_bytes=1KiB",
                                         "train.steps=6",           "train.checkpoint_every=3"};
  runTraining("ckpt-zero0", sets);
  const fs::path base = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch";
  for (const std::string stage : {"optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    const std::string name = "ckpt-zero-" + stage;
    auto sharded_sets = sets;
    sharded_sets.push_back("train.sharding=" + stage);
    runTraining(name, sharded_sets);
    for (int step : {3, 6}) {
      auto a =
          train::loadCheckpoint(train::checkpointPath((base / "ckpt-zero0/ckpt").string(), step));
      auto b = train::loadCheckpoint(train::checkpointPath((base / name / "ckpt").string(), step));
      const std::map<std::string, at::Tensor> plain(a.tensors.begin(), a.tensors.end()),
          sharded(b.tensors.begin(), b.tensors.end());
      ASSERT_EQ(plain.size(), sharded.size());
      for (const auto& [key, tensor] : plain) {
        ASSERT_TRUE(sharded.count(key)) << key;
        EXPECT_TRUE(at::equal(tensor, sharded.at(key))) << key << " at step " << step;
      }
    }
    // The sharded run resumes from its step-3 checkpoint, and ends where the whole run ended.
    const fs::path dir = base / name;
    fs::remove(train::checkpointPath((dir / "ckpt").string(), 6));
    auto resumed_sets = sharded_sets;
    resumed_sets.push_back("train.checkpoint_dir=" + (dir / "ckpt").string());
    auto experiments =
        config::loadExperiments(testing::writeTempFile("resume-zero.yaml", kBase), resumed_sets);
    auto resumed = train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
    EXPECT_EQ(resumed.timed_steps, 2);
    const auto whole = finalWeights("ckpt-zero0"), again = finalWeights(name);
    for (const auto& [key, tensor] : whole) {
      EXPECT_TRUE(at::equal(tensor, again.at(key))) << key << " differs after a sharded resume";
    }
  }
}

// A scheduler without reduce-scatter cannot shard: said before the first step.
// Stage 3 on the gpt model: units (its blocks) gathered and freed around each block, a root
// (the tied embedding, the position embedding, the final LayerNorm) gathered for the step,
// under activation checkpointing (the replay computes with the gathered block) and bf16
// autocast: bit-identical to unsharded training with the same settings.
TEST(ShardingGpt, ParametersStageMatchesUnshardedWithCheckpointingAndBf16) {
  const char* gpt = R"(
name: trainer-test-gpt
launch: {nproc_per_node: 2}
backend: {plugin: loopback, params: {timeout: 30s}}
model: {plugin: gpt, params: {layers: 6, d_model: 32, heads: 2, seq_len: 8, vocab: 64}}
train:
  steps: 6
  micro_batch: [3, 2]
  grad_accum: 2
  lr: 0.01
  warmup_steps: 1
  grad_clip: 0
  bucket_bytes: 16KiB
  log_every: 100
)";
  const fs::path base = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch";
  auto train = [&](const std::string& name, std::vector<std::string> sets) {
    const fs::path dir = scratch(name);
    sets.push_back("train.checkpoint_dir=" + (dir / "ckpt").string());
    auto experiments = config::loadExperiments(testing::writeTempFile(name + ".yaml", gpt), sets);
    return train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
  };
  for (const std::string extra : {"train.grad_checkpointing=true", "train.precision=bf16"}) {
    SCOPED_TRACE(extra);
    const std::string tag = extra.substr(6, extra.find('=') - 6);
    const auto plain = train("gpt-zero0-" + tag, {extra});
    const auto sharded = train("gpt-zero3-" + tag, {extra, "train.sharding=parameters"});
    EXPECT_TRUE(sharded.sync.identical) << sharded.sync.describe(2);
    EXPECT_LT(sharded.last_loss, sharded.first_loss);
    // Between steps a rank holds half of every bucket's values, gathered units freed; during
    // a step never every unit at once (the root, the unit computing and the next one).
    EXPECT_LT(sharded.parameter_bytes, plain.parameter_bytes / 2 + 8u * plain.buckets);
    EXPECT_GT(sharded.gathered_peak_bytes, 0u);
    EXPECT_LT(sharded.gathered_peak_bytes, plain.parameter_bytes / 2);
    const auto a = finalWeights("gpt-zero0-" + tag), b = finalWeights("gpt-zero3-" + tag);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [key, tensor] : a) {
      EXPECT_TRUE(at::equal(tensor, b.at(key))) << key << " differs with sharding";
    }
  }
}

TEST(ShardingConfig, ASchedulerWithoutReduceScatterIsRefusedByName) {
  try {
    runTraining("zero-tree", {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]",
                              "train.scheduler=tree", "train.sharding=optimizer"});
    FAIL() << "tree has no reduce_scatter";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.sharding: optimizer needs reduce_scatter"),
              std::string::npos)
        << e.what();
  }
}

TEST(WeightSync, PerturbedRankIsNamedWithItsSpread) {
  std::mutex mu;
  std::vector<train::SyncCheck> verdicts;
  testing::runLoopback(3, [&](std::shared_ptr<Backend> backend) {
    Communicator comm(backend, "loopback", Topology::fromLabels({"a", "a", "a"}));
    comm.addRule("ring", testing::loadScheduler("ring"));
    Control control(*backend);
    std::vector<at::Tensor> params = {at::ones({4, 3}), at::ones({7})};
    if (backend->rank() == 2) params[1][5] = 1.25f;
    auto check = train::verifyWeights(comm, control, params, {"fc.weight", "fc.bias"}, 9);
    std::lock_guard<std::mutex> lock(mu);
    verdicts.push_back(check);
  });
  ASSERT_EQ(verdicts.size(), 3u);
  for (const auto& v : verdicts) {
    EXPECT_FALSE(v.identical);
    EXPECT_EQ(v.first_parameter, "fc.bias");
    EXPECT_EQ(v.ranks, std::vector<int>({2}));
    EXPECT_EQ(v.differing, 1);
    EXPECT_DOUBLE_EQ(v.max_spread, 0.25);
    EXPECT_NE(v.describe(3).find("'fc.bias' differs between rank 0 and rank(s) 2"),
              std::string::npos)
        << v.describe(3);
  }
}

// A scheduler with a real bug (each rank adds the contributions in its own order, so the
// sums round differently) makes the ranks drift apart; the verifier stops the run naming a
// parameter and the ranks. (Buckets are padded to the group size, so the lossy scheduler's
// default bug, a forgotten tail, never shows in training.)
TEST(WeightSync, BuggySchedulerFailsTheRunOrWarns) {
  const std::string lossy =
      std::string(COLLIE_TEST_BINARY_DIR) + "/conformance/plugins/libcollie_scheduler_lossy.so";
  const std::vector<std::string> sets = {
      "launch.nproc_per_node=3", "train.micro_batch=2",
      "train.scheduler={plugin: " + lossy + ", params: {bug: order}}"};
  try {
    runTraining("lossy", sets);
    FAIL() << "the lossy scheduler's divergence went unnoticed";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("weights diverged at step"), std::string::npos) << m;
    EXPECT_NE(m.find("differs between rank 0 and rank(s) 1, 2"), std::string::npos) << m;
    EXPECT_NE(m.find("plugin-check"), std::string::npos) << m;
  }
  auto warned = sets;
  warned.push_back("train.on_divergence=warn");
  auto result = runTraining("lossy-warn", warned);
  EXPECT_FALSE(result.sync.identical);
  EXPECT_GT(result.sync.max_spread, 0);
}

TEST(Checkpoint, ResumeIsBitIdenticalToAnUninterruptedRun) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]",
                                         "train.steps=6", "train.checkpoint_every=3"};
  runTraining("whole", sets);
  // The interrupted run: it stops after the step-3 checkpoint (its later ones are removed),
  // then a second run resumes from it.
  runTraining("interrupted", sets);
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "interrupted";
  fs::remove(train::checkpointPath((dir / "ckpt").string(), 6));
  ASSERT_EQ(train::latestCheckpoint((dir / "ckpt").string()),
            train::checkpointPath((dir / "ckpt").string(), 3));
  auto experiments = config::loadExperiments(
      testing::writeTempFile("resume.yaml", kBase),
      {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]", "train.steps=6",
       "train.checkpoint_every=3", "train.checkpoint_dir=" + (dir / "ckpt").string()});
  auto resumed = train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
  EXPECT_EQ(resumed.timed_steps, 2);  // steps 4..6, the first untimed
  const auto whole = finalWeights("whole"), again = finalWeights("interrupted");
  ASSERT_EQ(whole.size(), again.size());
  for (const auto& [key, tensor] : whole) {
    EXPECT_TRUE(at::equal(tensor, again.at(key))) << key << " differs after resume";
  }
}

TEST(Checkpoint, CorruptOrForeignFilesAreRejected) {
  runTraining("corrupt", {"train.steps=2"});
  const fs::path ckpt = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "corrupt" / "ckpt";
  const std::string path = train::latestCheckpoint(ckpt.string());
  {  // flip one byte in the middle
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
    f.put('\x7f');
  }
  try {
    train::loadCheckpoint(path);
    FAIL() << "a corrupt checkpoint loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("content hash mismatch"), std::string::npos) << e.what();
  }
  const std::string text = testing::writeTempFile("not-a-checkpoint.ckpt", "hello, I am YAML\n");
  EXPECT_THROW(train::loadCheckpoint(text), CheckpointError);
  fs::resize_file(path, 20);
  EXPECT_THROW(train::loadCheckpoint(path), CheckpointError);
}

// A checkpoint file with `header` and a 4-byte payload, sealed with a valid hash.
std::string craftedCheckpoint(const std::string& name, const std::string& header) {
  std::string file = "COLLIECK";
  const uint32_t version = 1;
  const uint64_t header_size = header.size();
  file.append(reinterpret_cast<const char*>(&version), sizeof(version));
  file.append(reinterpret_cast<const char*>(&header_size), sizeof(header_size));
  file += header;
  file.append(4, '\0');  // the payload
  const uint64_t digest = XXH3_64bits(file.data(), file.size());
  file.append(reinterpret_cast<const char*>(&digest), sizeof(digest));
  return testing::writeTempFile(name, file);
}

TEST(Checkpoint, AStepOutOfRangeIsRefused) {
  // A negative step would flow into the LR schedule and the sample indices.
  for (const char* step : {"-5", "100000001"}) {
    const std::string path = craftedCheckpoint(
        "step.ckpt", std::string(R"({"step": )") + step + R"(, "identity": "x", "tensors": []})");
    try {
      train::loadCheckpoint(path);
      FAIL() << "a checkpoint at step " << step << " loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("step ") + step + " is out of range"),
                std::string::npos)
          << e.what();
    }
  }
}

// A file with a valid hash but a header that asks for a tensor of 4 TB: refused before
// anything is allocated.
TEST(Checkpoint, CraftedHeaderCannotAskForHugeTensors) {
  const std::string header =
      R"({"step": 1, "identity": "x", "tensors": [{"name": "w", "dtype": "f32", )"
      R"("shape": [1000000000000], "offset": 0, "bytes": 4}]})";
  const std::string path = craftedCheckpoint("crafted.ckpt", header);
  try {
    train::loadCheckpoint(path);
    FAIL() << "a crafted header was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w' has an inconsistent entry"), std::string::npos)
        << e.what();
  }
}

TEST(Training, ANonFiniteLossStopsBeforeTheUpdateWithItsOwnError) {
  // SGD with a learning rate of 1000 and no clipping diverges within a few steps.
  auto experiments = config::loadExperiments(
      testing::writeTempFile("diverge.yaml", kBase),
      {"launch.nproc_per_node=2", "train.optimizer=sgd", "train.lr=1000", "train.grad_clip=0",
       "train.lr_schedule=constant", "train.steps=50", "train.checkpoint_dir="});
  try {
    train::run(testing::buildTreeLoader(), experiments.at(0), scratch("diverge").string());
    FAIL() << "training with lr 1000 did not diverge";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("stopped before the update"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.exitCode(), 1);
  }
}

TEST(Checkpoint, AnotherRunsCheckpointIsNotResumed) {
  runTraining("other", {"train.steps=2"});
  const fs::path ckpt = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "other" / "ckpt";
  auto experiments = config::loadExperiments(
      testing::writeTempFile("other.yaml", kBase),
      {"train.steps=2", "train.optimizer=sgd", "train.checkpoint_dir=" + ckpt.string()});
  try {
    train::run(testing::buildTreeLoader(), experiments.at(0), ckpt.parent_path().string());
    FAIL() << "resumed an adamw checkpoint into an sgd run";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("written by another run"), std::string::npos) << e.what();
  }
}

// Every step's line of rank-R.jsonl of run `name`, parsed.
std::vector<nlohmann::json> stepLines(const std::string& name, int rank) {
  std::ifstream in(fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / name /
                   ("rank-" + std::to_string(rank) + ".jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Overlap, BackwardHandsEveryBucketToTheCommunicationThread) {
  // Several buckets, so the all-reduce of the last layers can run while earlier layers
  // backprop. Whether it does in time depends on the machine's load; that backward's hooks
  // hand each bucket over as soon as its gradients are complete does not.
  const std::vector<std::string> sets = {"launch.nproc_per_node=2", "train.steps=3",
                                         "train.bucket_bytes=16KiB", "model.params.hidden=256",
                                         "model.params.layers=4"};
  auto result = runTraining("overlap", sets);
  ASSERT_GT(result.buckets, 2);
  EXPECT_GT(result.comm_seconds, 0);
  EXPECT_LE(result.exposed_seconds, result.step_seconds);
  auto deferred_sets = sets;
  deferred_sets.push_back("train.overlap=false");
  runTraining("no-overlap", deferred_sets);
  for (int rank = 0; rank < 2; ++rank) {
    auto overlapped = stepLines("overlap", rank), deferred = stepLines("no-overlap", rank);
    ASSERT_EQ(overlapped.size(), 3u);
    ASSERT_EQ(deferred.size(), 3u);
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(overlapped[s]["buckets"], result.buckets);
      EXPECT_EQ(overlapped[s]["buckets_launched_in_backward"], result.buckets)
          << "rank " << rank << " step " << s + 1;
      EXPECT_EQ(deferred[s]["buckets_launched_in_backward"], 0)
          << "overlap: false all-reduces after backward";
    }
  }
}

TEST(Gpt, ActivationCheckpointingGivesTheSameWeights) {
  const std::vector<std::string> gpt = {
      "model.plugin=gpt", "model.params={layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 64}",
      "launch.nproc_per_node=2", "train.micro_batch=2", "train.steps=3"};
  auto plain = gpt, recomputed = gpt;
  recomputed.push_back("train.grad_checkpointing=true");
  runTraining("gpt-plain", plain);
  auto result = runTraining("gpt-recomputed", recomputed);
  EXPECT_TRUE(result.sync.identical);
  EXPECT_EQ(result.parameters, 64 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32);
  EXPECT_LT(maxDifference(finalWeights("gpt-plain"), finalWeights("gpt-recomputed")), 1e-6);
}

TEST(Gpt, ActivationCheckpointingRecomputesUnderTheForwardsAutocast) {
  // The recompute in backward must run in bf16 as the forward did, or the gradients are
  // those of another (fp32) function.
  const std::vector<std::string> gpt = {
      "model.plugin=gpt",
      "model.params={layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 64}",
      "train.micro_batch=2",
      "train.steps=3",
      "train.precision=bf16",
      "train.lr=0.01"};
  auto recomputed = gpt;
  recomputed.push_back("train.grad_checkpointing=true");
  runTraining("gpt-bf16-plain", gpt);
  runTraining("gpt-bf16-recomputed", recomputed);
  EXPECT_LT(maxDifference(finalWeights("gpt-bf16-plain"), finalWeights("gpt-bf16-recomputed")),
            1e-6);
}

TEST(Gpt, Bf16AutocastTrainsAndDiffersFromFp32) {
  const std::vector<std::string> gpt = {
      "model.plugin=gpt", "model.params={layers: 1, d_model: 32, heads: 2, seq_len: 16, vocab: 64}",
      "train.micro_batch=4", "train.steps=8", "train.lr=0.01"};
  auto bf16 = gpt;
  bf16.push_back("train.precision=bf16");
  runTraining("gpt-fp32", gpt);
  auto result = runTraining("gpt-bf16", bf16);
  EXPECT_LT(result.last_loss, result.first_loss);
  EXPECT_GT(maxDifference(finalWeights("gpt-fp32"), finalWeights("gpt-bf16")), 1e-6)
      << "bf16 autocast must change the arithmetic";
}

TEST(MicroBatch, AutoSplitsTheGlobalBatchByMeasuredSpeed) {
  auto result = runTraining(
      "auto", {"launch.nproc_per_node=3", "train.micro_batch=auto", "train.global_batch=12"});
  ASSERT_EQ(result.micro_batch.size(), 3u);
  EXPECT_EQ(std::accumulate(result.micro_batch.begin(), result.micro_batch.end(), 0), 12);
  for (int b : result.micro_batch) EXPECT_GE(b, 1);
  EXPECT_EQ(result.world_batch_samples, 12);
  EXPECT_TRUE(result.sync.identical);
}

TEST(MicroBatch, ListMustHaveOneSizePerRank) {
  try {
    runTraining("bad-list", {"launch.nproc_per_node=2", "train.micro_batch=[1, 2, 3]"});
    FAIL() << "three micro-batch sizes for two ranks were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected one size for every rank or 2 sizes"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace collie
