// The DDP trainer over loopback ranks (threads): equivalence with one process on the
// concatenated batch, identical weights under every scheduler, the verifier catching a
// perturbed rank, bit-identical resume, and overlapped communication.
#include <gtest/gtest.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>

#include "auto_split.h"
#include "collie/error.h"
#include "expect.h"
#include "format_one.h"
#include "loopback_job.h"
#include "run_command.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/device.h"
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

std::string fileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// What reading checkpoint `path` throws ("" when it reads).
std::string readingFails(const std::string& path) {
  try {
    train::CheckpointReader(path).readAll();
    return "";
  } catch (const CheckpointError& e) {
    return e.what();
  }
}

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
  train::CheckpointReader reader(train::latestCheckpoint(dir.string()));
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, tensor] : reader.readAll()) {
    if (key.find('/') == std::string::npos) out[key] = tensor;  // not "exp_avg/NAME"
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
  // What auto chose is reported by size; a scheduler that runs itself reports nothing.
  if (GetParam() == "auto") {
    EXPECT_TRUE(std::regex_search(result.schedulers_ran,
                                  std::regex("^auto ran [^ ]+ for [1-9][0-9,]*( B| / )")))
        << result.schedulers_ran;
  } else {
    EXPECT_EQ(result.schedulers_ran, "");
  }
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
  EXPECT_EQ(plain_result.gather_seconds, 0.0);  // all-reduce only
  for (const std::string stage : {"optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    auto sharded_sets = sets;
    sharded_sets.push_back("train.sharding=" + stage);
    const std::string name = "zero-" + stage + "-" + tag;
    auto result = runTraining(name, sharded_sets);
    EXPECT_TRUE(result.sync.identical) << result.sync.describe(static_cast<int>(ranks));
    EXPECT_GT(result.buckets, 1);
    EXPECT_EQ(result.sharding, stage);
    // The all-gathers are timed apart from the reduce-scatters, both within the total.
    EXPECT_GT(result.gather_seconds, 0.0);
    EXPECT_LT(result.gather_seconds, result.comm_seconds);
    EXPECT_LE(result.gather_exposed_seconds, result.exposed_seconds);
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
                      ShardingCase{"halving_doubling", "[4, 3, 2]"},
                      ShardingCase{"halving_doubling", "[4, 3, 2, 1]"},
                      ShardingCase{"halving_doubling", "[3, 3, 3, 3]"}),
    [](const ::testing::TestParamInfo<ShardingCase>& info) { return caseName(info.param); });

// With clipping the sharded norm is gathered from the shards; an unsharded run adds the same
// blocks' squares in the same order, so the weights stay the same bit for bit.
TEST(ShardingClipping, ClipsByTheGlobalNormOfTheShards) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=3", "train.micro_batch=[5, 3, 2]",
                                         "train.bucket_bytes=1KiB", "train.grad_clip=0.05",
                                         "train.steps=10"};
  runTraining("zero0-clip", sets);
  for (const std::string stage : {"optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    auto sharded_sets = sets;
    sharded_sets.push_back("train.sharding=" + stage);
    runTraining("zero-clip-" + stage, sharded_sets);
    EXPECT_EQ(maxDifference(finalWeights("zero0-clip"), finalWeights("zero-clip-" + stage)), 0.0);
    runTraining("zero-noclip-" + stage, {"launch.nproc_per_node=3", "train.micro_batch=[5, 3, 2]",
                                         "train.bucket_bytes=1KiB", "train.grad_clip=0",
                                         "train.steps=10", "train.sharding=" + stage});
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
          train::CheckpointReader(train::checkpointPath((base / "ckpt-zero0/ckpt").string(), step))
              .readAll();
      auto b = train::CheckpointReader(train::checkpointPath((base / name / "ckpt").string(), step))
                   .readAll();
      const std::map<std::string, at::Tensor> plain(a.begin(), a.end()),
          sharded(b.begin(), b.end());
      ASSERT_EQ(plain.size(), sharded.size());
      for (const auto& [key, tensor] : plain) {
        ASSERT_TRUE(sharded.count(key)) << key;
        EXPECT_TRUE(at::equal(tensor, sharded.at(key))) << key << " at step " << step;
      }
    }
    // The sharded run resumes from its step-3 checkpoint, and ends where the whole run ended.
    const fs::path dir = base / name;
    fs::remove_all(train::checkpointPath((dir / "ckpt").string(), 6));
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

// A sharded checkpoint of 4 ranks (stage 3, small buckets: parameters straddle ranks)
// continues on 2 ranks sharding gradients, and on 3 unsharded, with other buckets: every
// rank assembles its blocks from whichever shards hold them. The same samples per step, so
// the run ends where the 4-rank run ended, up to the order in which gradients were added.
TEST(ShardingCheckpoint, ResumesAtAnotherWorldSizeShardingAndBucketSize) {
  const std::vector<std::string> four = {"launch.nproc_per_node=4",
                                         "train.micro_batch=[2, 2, 2, 1]",
                                         "train.grad_clip=0",
                                         "train.bucket_bytes=1KiB",
                                         "train.steps=6",
                                         "train.checkpoint_every=3",
                                         "train.sharding=parameters"};
  runTraining("reshard-whole", four);
  const fs::path base = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch";
  const auto whole = finalWeights("reshard-whole");
  const std::vector<std::vector<std::string>> continuations = {
      {"launch.nproc_per_node=2", "train.micro_batch=[4, 3]", "train.sharding=gradients",
       "train.bucket_bytes=4KiB"},
      {"launch.nproc_per_node=3", "train.micro_batch=[3, 2, 2]", "train.sharding=none",
       "train.bucket_bytes=2KiB"}};
  for (const auto& continuation : continuations) {
    SCOPED_TRACE(continuation[0]);
    runTraining("reshard", four);
    const fs::path ckpt = base / "reshard" / "ckpt";
    fs::remove_all(train::checkpointPath(ckpt.string(), 6));
    const auto at_three = finalWeights("reshard");
    auto sets = continuation;
    for (const char* s : {"train.grad_clip=0", "train.steps=6", "train.checkpoint_every=3"})
      sets.push_back(s);
    sets.push_back("train.checkpoint_dir=" + ckpt.string());
    auto experiments = config::loadExperiments(testing::writeTempFile("reshard.yaml", kBase), sets);
    auto resumed =
        train::run(testing::buildTreeLoader(), experiments.at(0), (base / "reshard").string());
    EXPECT_EQ(resumed.timed_steps, 2);
    EXPECT_TRUE(resumed.sync.identical) << resumed.sync.describe(2);
    const auto again = finalWeights("reshard");
    EXPECT_LT(maxDifference(whole, again), 1e-5) << "the resumed run went elsewhere";
    EXPECT_GT(maxDifference(at_three, again), 1e-4) << "the resumed run did not train";
  }
}

// Resuming needs every shard the rank reads; one missing or corrupt is named.
TEST(ShardingCheckpoint, AMissingOrCorruptShardIsRefusedNamingTheFile) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]",
                                         "train.steps=2", "train.sharding=optimizer"};
  runTraining("shard-missing", sets);
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "shard-missing";
  const std::string step = train::checkpointPath((dir / "ckpt").string(), 2);
  ASSERT_TRUE(fs::exists(step + "/shard-00000-of-00002.safetensors"));
  const std::string shard = step + "/shard-00001-of-00002.safetensors";
  auto resume = [&] {
    auto again = sets;
    again.push_back("train.steps=4");
    again.push_back("train.checkpoint_dir=" + (dir / "ckpt").string());
    auto experiments =
        config::loadExperiments(testing::writeTempFile("shard-missing.yaml", kBase), again);
    try {
      train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  const std::string bytes = fileText(shard);
  fs::remove(shard);
  std::string error = resume();
  EXPECT_TRUE(testing::contains(error, {shard + ": cannot open"}));
  std::string corrupt = bytes;
  corrupt[corrupt.size() - 3] ^= 0x10;  // in the last tensor's bytes
  std::ofstream(shard, std::ios::binary) << corrupt;
  error = resume();
  EXPECT_TRUE(testing::contains(error, {shard + ": content hash mismatch"}));
  std::ofstream(shard, std::ios::binary) << bytes;
  EXPECT_EQ(resume(), "");
}

// A resumed run must read the same samples per step: another sum of micro-batches is
// refused (their split may change).
TEST(Checkpoint, AnotherBatchIsRefusedAndAnotherSplitResumes) {
  runTraining("batch", {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]", "train.steps=2"});
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "batch";
  auto resume = [&](const std::string& micro_batch) {
    auto experiments = config::loadExperiments(
        testing::writeTempFile("batch.yaml", kBase),
        {"launch.nproc_per_node=2", "train.micro_batch=" + micro_batch, "train.steps=3",
         "train.checkpoint_every=100", "train.checkpoint_dir=" + (dir / "ckpt").string()});
    return train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
  };
  EXPECT_TRUE(testing::throwsWith<CheckpointError>(
      [&] { resume("[3, 3]"); }, {"written by a run of 5 samples per micro-batch step "
                                  "(micro_batch [3, 2]) x grad_accum 1, this run takes 6"}))
      << "resumed 6 samples per step from a run of 5";
  EXPECT_EQ(resume("[1, 4]").timed_steps, 1);  // step 3
}

// The pieces of a tensor, written in one split over files, read back in any other.
TEST(Checkpoint, PiecesWrittenInOneSplitAreReadInAnother) {
  const fs::path dir = scratch("pieces");
  const at::Tensor a = at::arange(36, at::kFloat).reshape({6, 6});
  const at::Tensor b = at::arange(100, 110, at::kFloat);
  auto piece = [](const std::string& key, const at::Tensor& t, int64_t start, int64_t numel) {
    return std::make_pair(train::Piece{key, t.sizes().vec(), start, numel},
                          t.reshape({-1}).narrow(0, start, numel));
  };
  train::CheckpointInfo info;
  info.step = 9;
  info.identity = "pieces";
  info.micro_batch = {1, 1, 1};
  const std::vector<std::vector<std::pair<train::Piece, at::Tensor>>> split = {
      {piece("a", a, 0, 10), piece("b", b, 0, 4)},
      {piece("a", a, 10, 15)},
      {piece("a", a, 25, 11), piece("b", b, 4, 6)}};
  std::vector<train::ShardFile> files;
  for (int f = 0; f < 3; ++f)
    files.push_back(train::writeShard(dir.string(), f, 3, info, split[f]));
  train::writeManifest(dir.string(), info, files, 0);
  train::CheckpointReader reader(dir.string());
  EXPECT_EQ(reader.info().step, 9);
  const auto all = reader.readAll();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(at::equal(all[0].second, a));
  EXPECT_TRUE(at::equal(all[1].second, b));
  const at::Tensor middle = at::zeros({25}, at::kFloat), tail = at::zeros({3}, at::kFloat);
  reader.read({{train::Piece{"a", {6, 6}, 5, 25}, middle}, {train::Piece{"b", {10}, 3, 3}, tail}});
  EXPECT_TRUE(at::equal(middle, a.reshape({-1}).narrow(0, 5, 25)));
  EXPECT_TRUE(at::equal(tail, b.narrow(0, 3, 3)));
  EXPECT_TRUE(testing::throwsWith<CheckpointError>(
      [&] {
        reader.read({{train::Piece{"a", {36}, 0, 36}, at::zeros({36}, at::kFloat)}});
      },
      {"holds 'a' of shape [6, 6], this run's is [36]"}))
      << "read 'a' in another shape";
  // A manifest whose pieces overlap is refused.
  files[1].pieces[0].start = 9;
  train::writeManifest(dir.string(), info, files, 0);
  EXPECT_TRUE(
      testing::contains(readingFails(dir.string()), {"the pieces of 'a' overlap or leave a gap"}));
}

// The shards are safetensors files: Python with NumPy and nothing of collie reads every
// tensor of a 3-rank sharded checkpoint (parameters straddling ranks assembled from their
// pieces) and finds them equal to the whole tensors of an unsharded run's one file.
TEST(ShardingCheckpoint, PythonAndNumPyReadTheShards) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=3", "train.micro_batch=[3, 2, 2]",
                                         "train.grad_clip=0", "train.bucket_bytes=1KiB",
                                         "train.steps=2"};
  runTraining("py-whole", sets);
  auto sharded = sets;
  sharded.push_back("train.sharding=optimizer");
  runTraining("py-sharded", sharded);
  const fs::path base = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch";
  const std::string command = std::string("'") + COLLIE_TEST_PYTHON + "' '" +
                              COLLIE_TEST_SOURCE_DIR + "/tests/training/read_safetensors.py' '" +
                              train::latestCheckpoint((base / "py-sharded/ckpt").string()) + "' '" +
                              train::latestCheckpoint((base / "py-whole/ckpt").string()) + "' > '" +
                              (base / "py.log").string() + "' 2>&1";
  const int status = std::system(command.c_str());
  const std::string log = fileText((base / "py.log").string());
  EXPECT_EQ(status, 0) << log;
  EXPECT_TRUE(testing::contains(log, {"split over files and equal to the unsharded run's"}));
}

// Format 1 (one .ckpt file, before the shards) still loads: a run resumes from one.
TEST(Checkpoint, FormatOneStillLoads) {
  const std::vector<std::string> sets = {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]",
                                         "train.steps=6", "train.checkpoint_every=3"};
  runTraining("format-one", sets);
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "format-one";
  const auto whole = finalWeights("format-one");
  const std::string ckpt = (dir / "ckpt").string();
  // Step 3's state written as format 1 wrote it: "param/NAME", then "KIND/K" by index.
  std::vector<std::pair<std::string, at::Tensor>> tensors, state;
  std::vector<std::string> names;
  for (auto& [key, t] : train::CheckpointReader(train::checkpointPath(ckpt, 3)).readAll()) {
    if (key.find('/') == std::string::npos) {
      names.push_back(key);
      tensors.emplace_back("param/" + key, t);
    } else {
      state.emplace_back(key, t);
    }
  }
  for (auto& [key, t] : state) {
    const std::string name = key.substr(key.find('/') + 1);
    const size_t k = std::find(names.begin(), names.end(), name) - names.begin();
    tensors.emplace_back(key.substr(0, key.find('/') + 1) + std::to_string(k), t);
  }
  auto experiments = config::loadExperiments(testing::writeTempFile("format-one.yaml", kBase), [&] {
    auto s = sets;
    s.push_back("train.checkpoint_dir=" + ckpt);
    return s;
  }());
  testing::writeFormatOne(train::checkpointPath(ckpt, 3) + ".ckpt", 3,
                          train::formatOneIdentity(experiments.at(0), {3, 2}), tensors);
  fs::remove_all(train::checkpointPath(ckpt, 3));
  fs::remove_all(train::checkpointPath(ckpt, 6));
  ASSERT_EQ(train::latestCheckpoint(ckpt), train::checkpointPath(ckpt, 3) + ".ckpt");
  auto resumed = train::run(testing::buildTreeLoader(), experiments.at(0), dir.string());
  EXPECT_EQ(resumed.timed_steps, 2);
  const auto again = finalWeights("format-one");
  for (const auto& [key, tensor] : whole) {
    EXPECT_TRUE(at::equal(tensor, again.at(key))) << key << " differs after a format-1 resume";
  }
}

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
    // Gathered values and full gradients borrow buffers of a pool, given back when freed:
    // it holds what was in use at once (here 128-144 KiB, as many gathered units and full
    // gradients as overlapped), never the whole model (made afresh, 9 MB).
    EXPECT_GT(sharded.pooled_bytes, 0u);
    EXPECT_LT(sharded.pooled_bytes, plain.parameter_bytes);
    EXPECT_EQ(plain.pooled_bytes, 0u);
    // The weight check and its sample go bucket by bucket at stage 3 (one bucket gathered at
    // a time): every parameter checked, the same samples as unsharded.
    EXPECT_EQ(sharded.sync.parameters, plain.sync.parameters);
    EXPECT_EQ(sharded.weight_sample, plain.weight_sample);
    EXPECT_EQ(sharded.units, 6);
    EXPECT_EQ(plain.unit_parameters, sharded.unit_parameters);
    EXPECT_GT(plain.unit_parameters, 0);
    const auto a = finalWeights("gpt-zero0-" + tag), b = finalWeights("gpt-zero3-" + tag);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [key, tensor] : a) {
      EXPECT_TRUE(at::equal(tensor, b.at(key))) << key << " differs with sharding";
    }
  }
}

// Stage 2 keeps a bucket's full gradient only until its block is reduced, and at most two
// buckets' at once: with the reductions held up (rank 1 sleeps before a run of collectives
// of the first steps, so every rank's reductions wait for it) the backward waits instead of
// piling up full gradients. The model's gradients are some 50 buckets of 16 KiB and its
// activations a fraction of that, so a pile-up would be the peak.
TEST(StepMemory, Stage2HoldsTwoBucketsOfFullGradientsHoweverLateTheReductions) {
  std::string faults;
  for (int c = 80; c < 200; c += 6)
    faults += "{rank: 1, at_collective: " + std::to_string(c) + ", action: delay, delay: 30ms}, ";
  const std::string config = R"(
name: trainer-test-full-gradients
launch: {nproc_per_node: 2}
backend: {plugin: loopback, params: {timeout: 30s}}
model: {plugin: gpt, params: {layers: 6, d_model: 64, heads: 2, seq_len: 8, vocab: 64}}
train: {steps: 3, micro_batch: 1, bucket_bytes: 16KiB, log_every: 100, sharding: gradients}
faults: [)" + faults + "]\n";
  auto experiments =
      config::loadExperiments(testing::writeTempFile("full-gradients.yaml", config), {});
  const auto r =
      train::run(testing::buildTreeLoader(), experiments.at(0), scratch("full-gradients").string());
  ASSERT_GE(r.buckets, 40);
  const double all = 4.0 * static_cast<double>(r.parameters);  // every gradient, 1.2 MB
  for (const auto& m : r.step_memory) {
    // Two full buckets (32 KiB), a parameter's gradient on its way and the backward's
    // temporaries: 158 KB here, against 1.27 MB with the full gradients piled up.
    EXPECT_LT(m.backward, all / 4) << "full gradients piled up";
    EXPECT_GT(m.backward, 2 * 16384);
  }
  // The full gradients borrow their buffers from a pool that keeps what was in use at once:
  // two or three buckets', not one per bucket made afresh.
  EXPECT_GT(r.pooled_bytes, 0u);
  EXPECT_LT(static_cast<double>(r.pooled_bytes), all / 4) << "the buffers were not reused";
  EXPECT_TRUE(r.sync.identical);
}

// Each rank's memory at its peak during a step, by use (train/memory_ledger.h): the state the
// set-up made stays live, the forward's activations are there, and stage 3 holds some of its
// gathered units, never all; unsharded, none.
TEST(StepMemory, EachRanksPeakAddsUpItsUsesAndStage3CountsItsGatheredUnits) {
  const char* gpt = R"(
name: trainer-test-step-memory
launch: {nproc_per_node: 2}
backend: {plugin: loopback, params: {timeout: 30s}}
model: {plugin: gpt, params: {layers: 6, d_model: 32, heads: 2, seq_len: 8, vocab: 64}}
train: {steps: 3, micro_batch: 4, bucket_bytes: 16KiB, log_every: 100}
)";
  auto train = [&](const std::string& name, const std::string& sharding) {
    auto experiments = config::loadExperiments(testing::writeTempFile(name + ".yaml", gpt),
                                               {"train.sharding=" + sharding});
    return train::run(testing::buildTreeLoader(), experiments.at(0), scratch(name).string());
  };
  const auto plain = train("step-memory-none", "none");
  const auto sharded = train("step-memory-parameters", "parameters");
  for (const auto* r : {&plain, &sharded}) {
    SCOPED_TRACE(r->sharding);
    ASSERT_EQ(r->step_memory.size(), 2u);
    for (const auto& m : r->step_memory) {
      EXPECT_EQ(m.process_ranks, 2);  // ranks as threads
      EXPECT_DOUBLE_EQ(m.tracked, m.set_up + m.forward + m.backward + m.gathered + m.gradient_sync +
                                      m.optimizer + m.other);
      EXPECT_GE(m.set_up + m.optimizer,
                static_cast<double>(r->parameter_bytes + r->gradient_bytes + r->optimizer_bytes));
      EXPECT_GT(m.forward, 0.0);
      EXPECT_GE(m.resident, m.resident_at_start);
    }
  }
  for (const auto& m : plain.step_memory) EXPECT_EQ(m.gathered, 0.0);
  for (const auto& m : sharded.step_memory) {
    EXPECT_GT(m.gathered, 0.0);
    EXPECT_LT(m.gathered, static_cast<double>(plain.parameter_bytes));
  }
  EXPECT_LT(sharded.step_memory[0].tracked, plain.step_memory[0].tracked);
}

// Stage 3 needs the model's units: a model without them is refused before training, as is
// one whose units name a parameter its module lacks (the plugin's bug).
TEST(ShardingConfig, AModelWithoutUnitsCannotShardItsParameters) {
  const std::string bigram =
      std::string(COLLIE_TEST_BINARY_DIR) + "/training/plugins/libcollie_model_bigram.so";
  auto refusal = [&](const std::string& units) {
    try {
      runTraining("no-units",
                  {"launch.nproc_per_node=2", "train.sharding=parameters",
                   "model={plugin: " + bigram + ", params: {seq_len: 6, vocab: 48" + units + "}}"});
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  std::string error = refusal("");
  EXPECT_TRUE(
      testing::contains(error, {"train.sharding: parameters needs the model's units, and model",
                                "declares none. HINT: use train.sharding: gradients"}));
  error = refusal(", units: unknown");
  EXPECT_TRUE(testing::contains(
      error, {"names parameter 'head.weight' in units(), which its module does not have"}));
  // Without stage 3 it trains.
  EXPECT_NO_THROW(runTraining("no-units-2",
                              {"launch.nproc_per_node=2", "train.sharding=gradients",
                               "model={plugin: " + bigram + ", params: {seq_len: 6, vocab: 48}}"}));
}

// A model that draws from LibTorch's global generator (shared by ranks that are threads) is
// refused by name at the first step it does, on any backend.
TEST(ModelContract, AModelDrawingFromTheGlobalGeneratorIsRefused) {
  const std::string bigram =
      std::string(COLLIE_TEST_BINARY_DIR) + "/training/plugins/libcollie_model_bigram.so";
  std::string error;
  try {
    runTraining("global-draws", {"launch.nproc_per_node=2",
                                 "model={plugin: " + bigram +
                                     ", params: {seq_len: 6, vocab: 48, dropout: global}}"});
  } catch (const PluginError& e) {
    error = e.what();
  }
  EXPECT_TRUE(testing::contains(
      error, {"drew from LibTorch's global random generator (cpu) during step 1",
              "HINT: draw from the generator the trainer passes to Model::setGenerator"}));
  // The same model without its global draws trains.
  EXPECT_NO_THROW(runTraining("global-draws-none",
                              {"launch.nproc_per_node=2",
                               "model={plugin: " + bigram + ", params: {seq_len: 6, vocab: 48}}"}));
}

// A scheduler without reduce-scatter cannot shard: said before the first step.
TEST(ShardingConfig, ASchedulerWithoutReduceScatterIsRefusedByName) {
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [&] {
        runTraining("zero-tree", {"launch.nproc_per_node=2", "train.micro_batch=[3, 2]",
                                  "train.scheduler=tree", "train.sharding=optimizer"});
      },
      {"train.sharding: optimizer needs reduce_scatter"}))
      << "tree has no reduce_scatter";
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
    EXPECT_TRUE(
        testing::contains(v.describe(3), {"'fc.bias' differs between rank 0 and rank(s) 2"}));
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
  EXPECT_TRUE(testing::throwsWith<CommError>(
      [&] { runTraining("lossy", sets); },
      {"weights diverged at step", "differs between rank 0 and rank(s) 1, 2", "plugin-check"}))
      << "the lossy scheduler's divergence went unnoticed";
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
  fs::remove_all(train::checkpointPath((dir / "ckpt").string(), 6));
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

TEST(Checkpoint, CorruptMissingOrForeignFilesAreRefusedNamingThem) {
  runTraining("corrupt", {"train.steps=2"});
  const fs::path ckpt = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "corrupt" / "ckpt";
  const std::string dir = train::latestCheckpoint(ckpt.string());
  ASSERT_EQ(dir, train::checkpointPath(ckpt.string(), 2));
  ASSERT_EQ(readingFails(dir), "");
  const std::string shard = dir + "/shard-00000-of-00001.safetensors";
  const std::string saved = fileText(shard);
  {  // flip one byte in the middle
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    f.put('\x7f');
  }
  std::string error = readingFails(dir);
  EXPECT_TRUE(testing::contains(error, {shard + ": content hash mismatch"}));
  fs::resize_file(shard, 20);
  error = readingFails(dir);
  EXPECT_TRUE(testing::contains(error, {shard + ": 20 bytes, the manifest says"}));
  fs::remove(shard);
  error = readingFails(dir);
  EXPECT_TRUE(testing::contains(error, {shard + ": cannot open"}));
  std::ofstream(shard, std::ios::binary) << saved;
  ASSERT_EQ(readingFails(dir), "");
  // A manifest cut short, or none (a crash before it was committed: never resumed from).
  const std::string manifest = fileText(dir + "/manifest.json");
  std::ofstream(dir + "/manifest.json") << manifest.substr(0, manifest.size() / 2);
  error = readingFails(dir);
  EXPECT_TRUE(testing::contains(error, {dir + "/manifest.json: unreadable"}));
  fs::remove(dir + "/manifest.json");
  error = readingFails(dir);
  EXPECT_TRUE(testing::contains(error, {"manifest.json is missing"}));
  EXPECT_EQ(train::latestCheckpoint(ckpt.string()), "");
  // A manifest naming a file outside its directory.
  std::string hostile = manifest;
  const size_t at = hostile.find("shard-00000-of-00001.safetensors");
  ASSERT_NE(at, std::string::npos);
  hostile.replace(at, 32, "../../../../../../etc/passwd.bin");
  std::ofstream(dir + "/manifest.json") << hostile;
  error = readingFails(dir);
  EXPECT_TRUE(testing::contains(error, {"lists a file named '../../"}));
  // Not a checkpoint at all.
  const std::string text =
      testing::writeTempFile("not-a-checkpoint.ckpt", "hello: I am YAML, not a checkpoint\n");
  EXPECT_TRUE(testing::contains(readingFails(text), {"not a collie checkpoint"}));
}

// A checkpoint file with `header` and a 4-byte payload, sealed with a valid hash.
std::string craftedCheckpoint(const std::string& name, const std::string& header) {
  return testing::writeTempFile(name, testing::sealFormatOne(header, std::string(4, '\0')));
}

TEST(Checkpoint, AStepOutOfRangeIsRefused) {
  // A negative step would flow into the LR schedule and the sample indices.
  for (const char* step : {"-5", "100000001"}) {
    const std::string path = craftedCheckpoint(
        "step.ckpt", std::string(R"({"step": )") + step + R"(, "identity": "x", "tensors": []})");
    EXPECT_TRUE(testing::throwsWith<CheckpointError>(
        [&] { train::loadFormatOne(path); }, {std::string("step ") + step + " is out of range"}))
        << "a checkpoint at step " << step << " loaded";
  }
}

// A file with a valid hash but a header that asks for a tensor of 4 TB: refused before
// anything is allocated.
TEST(Checkpoint, CraftedHeaderCannotAskForHugeTensors) {
  const std::string header =
      R"({"step": 1, "identity": "x", "tensors": [{"name": "w", "dtype": "f32", )"
      R"("shape": [1000000000000], "offset": 0, "bytes": 4}]})";
  const std::string path = craftedCheckpoint("crafted.ckpt", header);
  EXPECT_TRUE(testing::throwsWith<CheckpointError>([&] { train::loadFormatOne(path); },
                                                   {"tensor 'w' has an inconsistent entry"}))
      << "a crafted header was accepted";
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
    EXPECT_TRUE(testing::contains(std::string(e.what()), {"stopped before the update"}));
    EXPECT_EQ(e.exitCode(), 1);
  }
}

TEST(Checkpoint, AnotherRunsCheckpointIsNotResumed) {
  runTraining("other", {"train.steps=2"});
  const fs::path ckpt = fs::path(COLLIE_TEST_BINARY_DIR) / "training-scratch" / "other" / "ckpt";
  auto experiments = config::loadExperiments(
      testing::writeTempFile("other.yaml", kBase),
      {"train.steps=2", "train.optimizer=sgd", "train.checkpoint_dir=" + ckpt.string()});
  EXPECT_TRUE(testing::throwsWith<CheckpointError>(
      [&] {
        train::run(testing::buildTreeLoader(), experiments.at(0), ckpt.parent_path().string());
      },
      {"written by another run"}))
      << "resumed an adamw checkpoint into an sgd run";
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
  // Every step all-reduced every bucket: the measured time is split whole into the link's,
  // the waiting and the rest (the Communicator's time of each collective, inside the comm
  // column's, which the communication thread times), and the exposed part is predicted from
  // the link probed busy.
  const train::CommExplained& e = result.comm_explained;
  ASSERT_TRUE(e.explained);
  EXPECT_GT(e.link, 0);
  EXPECT_GT(e.link_busy, 0);
  EXPECT_GE(e.waiting, 0);
  EXPECT_TRUE(e.busy_probed);
  EXPECT_LE(e.link + e.waiting + e.beyond, result.comm_seconds);
  // The comm column adds only the choice of schedule and the buffer's checks around each
  // collective: half of it is a bound that a per-step mean counted wrong would break.
  EXPECT_GT(e.link + e.waiting + e.beyond, 0.5 * result.comm_seconds);
  EXPECT_GT(e.predicted_exposed, 0);
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

// True when the two runs' final weights are the same bits.
bool bitIdentical(const std::map<std::string, at::Tensor>& a,
                  const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, tensor] : a) {
    auto other = b.find(key);
    if (other == b.end() || !at::equal(tensor, other->second)) return false;
  }
  return true;
}

// Dropout draws from each rank's own generator, a function of (seed, rank, step): ranks that
// are threads of one process (loopback) draw what ranks that are processes (gloo) draw, run
// after run, and activation checkpointing's replay draws the forward's masks again. Drawn
// from LibTorch's global generator, which threads share, the masks would follow the threads'
// timing, and a replay could draw another rank's.
TEST(Gpt, DropoutIsTheSameWhereverRanksRunAndWhenReplayed) {
  const std::vector<std::string> gpt = {
      "model.plugin=gpt",
      "model.params={layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 64, dropout: 0.1}",
      "launch.nproc_per_node=3",
      "train.micro_batch=2",
      "train.steps=4",
      "train.scheduler=ring"};
  runTraining("dropout-reference", gpt);
  const auto reference = finalWeights("dropout-reference");
  for (int run = 0; run < 5; ++run) {
    for (const bool recompute : {false, true}) {
      SCOPED_TRACE("run " + std::to_string(run) + (recompute ? " checkpointing" : " plain"));
      auto sets = gpt;
      sets.push_back(std::string("train.grad_checkpointing=") + (recompute ? "true" : "false"));
      const std::string name = "dropout-" + std::to_string(run) + (recompute ? "-ckpt" : "");
      EXPECT_TRUE(runTraining(name, sets).sync.identical);
      EXPECT_TRUE(bitIdentical(reference, finalWeights(name)))
          << "largest difference " << maxDifference(reference, finalWeights(name));
    }
  }
  // Without dropout the weights differ: the test sees the masks.
  auto no_dropout = gpt;
  no_dropout[1] = "model.params={layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 64}";
  runTraining("dropout-none", no_dropout);
  EXPECT_FALSE(bitIdentical(reference, finalWeights("dropout-none")));
  // Ranks as gloo processes, with and without checkpointing.
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "gloo checkpointing" : "gloo plain");
    const fs::path dir = scratch(recompute ? "dropout-gloo-ckpt" : "dropout-gloo");
    std::vector<std::string> args = {"run", testing::writeTempFile("dropout-gloo.yaml", kBase),
                                     "--out", dir.string()};
    for (const auto& s : gpt) args.insert(args.end(), {"--set", s});
    for (const std::string& s : std::vector<std::string>{
             "backend.plugin=gloo", "train.checkpoint_dir=" + (dir / "ckpt").string(),
             std::string("train.grad_checkpointing=") + (recompute ? "true" : "false")}) {
      args.insert(args.end(), {"--set", s});
    }
    const auto r = testing::runCollie(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    train::CheckpointReader reader(train::latestCheckpoint((dir / "ckpt").string()));
    std::map<std::string, at::Tensor> weights;
    for (const auto& [key, tensor] : reader.readAll()) {
      if (key.find('/') == std::string::npos) weights[key] = tensor;
    }
    EXPECT_TRUE(bitIdentical(reference, weights))
        << "largest difference " << maxDifference(reference, weights);
  }
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

// On a GPU (scripts/gpu-check.sh): two loopback ranks train on the GPU, their buckets staged
// through host memory (loopback moves host memory only), and end where the CPU run ends.
TEST(GpuTraining, TwoRanksOnTheGpuEndWhereTheCpuRunEnds) {
  if (cudaDeviceCount() == 0) GTEST_SKIP() << "no GPU: " << torchDescription();
  const std::vector<std::string> gpt = {
      "model.plugin=gpt",
      "model.params={layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 64}",
      "launch.nproc_per_node=2",
      "train.micro_batch=2",
      "train.steps=3",
      "train.grad_checkpointing=true"};
  auto on_gpu = gpt;
  on_gpu.push_back("train.device=cuda");
  runTraining("gpu-cpu", gpt);
  const train::Result result = runTraining("gpu-cuda", on_gpu);
  EXPECT_TRUE(result.sync.identical);
  EXPECT_EQ(result.device.rfind("cuda:", 0), 0u) << result.device;
  EXPECT_EQ(result.comm_memory, "host-staged");
  EXPECT_LT(maxDifference(finalWeights("gpu-cpu"), finalWeights("gpu-cuda")), 1e-4);
}

// Rank 0 logs every rank's probe speed and the split; the split is the proportional rule
// applied to those speeds, and it is the one the run trained with. Ranks that are threads
// cannot be made slower (tests/process/heterogeneous_test.cc slows one with a CPU share), but
// 1,200 samples make a split that ignored their speeds (an even one) miss the rule as soon as
// two threads' speeds differ by a quarter of a percent.
TEST(MicroBatch, AutoSplitsTheGlobalBatchByMeasuredSpeed) {
  const fs::path dir = scratch("auto");
  std::vector<std::string> args = {"run", testing::writeTempFile("auto.yaml", kBase), "--out",
                                   dir.string()};
  for (const std::string& s : std::vector<std::string>{
           "launch.nproc_per_node=3", "train.micro_batch=auto", "train.global_batch=1200"})
    args.insert(args.end(), {"--set", s});
  const auto r = testing::runCollie(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const testing::LoggedSplit logged = testing::loggedAutoSplit(r.output);
  ASSERT_EQ(logged.split.size(), 3u) << r.output;
  testing::expectProportional(logged, 1200);
  const auto summary = nlohmann::json::parse(fileText((dir / "summary.json").string())).at(0);
  EXPECT_EQ(summary.at("micro_batch").get<std::vector<int>>(), logged.split) << r.output;
  EXPECT_EQ(summary.at("world_batch_samples").get<int>(), 1200);
  EXPECT_TRUE(summary.at("sync").at("identical").get<bool>());
}

TEST(MicroBatch, ListMustHaveOneSizePerRank) {
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [&] {
        runTraining("bad-list", {"launch.nproc_per_node=2", "train.micro_batch=[1, 2, 3]"});
      },
      {"expected one size for every rank or 2 sizes"}))
      << "three micro-batch sizes for two ranks were accepted";
}

}  // namespace
}  // namespace collie
