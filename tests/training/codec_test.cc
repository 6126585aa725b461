// Codec plugins (train.compression) on loopback ranks: each codec's sum against a closed form
// or an independent computation (PowerSGD against NumPy), error feedback losing nothing,
// the group refusing what the contract does not allow, and training with every codec:
// identical ranks, the float32 path reproduced bit for bit before PowerSGD starts, a resume
// that carries the codec's state, and the refusals.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <regex>

#include "collie/codec.h"
#include "collie/error.h"
#include "expect.h"
#include "loopback_job.h"
#include "run_command.h"
#include "runtime/communicator.h"
#include "train/checkpoint.h"
#include "train/codec_group.h"
#include "train/trainer.h"
#include "training_runs.h"

namespace collie {
namespace {

namespace fs = std::filesystem;

// What every rank of runCodec saw and held, indexed [rank][step].
struct CodecRun {
  std::vector<std::vector<at::Tensor>> sent, result;
  // [rank][0]: after prepare(); [rank][s + 1]: after step s.
  std::vector<std::vector<std::map<std::string, at::Tensor>>> state;
  std::vector<std::vector<Provenance>> calls;  // [rank]: every collective, in order
};

// A rank's gradient at a step: numel float32 values.
using GradientOf = std::function<at::Tensor(int rank, int step, int64_t numel)>;

// Runs `steps` steps of codec `name` on `world` loopback ranks over one bucket of
// parameters shaped `shapes` (padded to a multiple of world, as the trainer's buckets are),
// rank r weighing shares[r].
CodecRun runCodec(const std::string& name, const std::map<std::string, std::string>& params,
                  int world, const std::vector<std::vector<int64_t>>& shapes, int steps,
                  const GradientOf& gradient, const std::vector<double>& shares) {
  CodecRun run;
  run.sent.resize(world);
  run.result.resize(world);
  run.state.resize(world);
  run.calls.resize(world);
  testing::runLoopback(world, [&](std::shared_ptr<Backend> backend) {
    const int r = backend->rank();
    Communicator comm(backend, "loopback",
                      Topology::fromLabels(std::vector<std::string>(world, "a")));
    comm.addRule("ring", testing::loadScheduler("ring"));
    Params p("codec '" + name + "'");
    for (const auto& [key, value] : params) p.set(key, value);
    std::shared_ptr<Codec> codec = testing::buildTreeLoader().createCodec(name, p);
    CodecBucket bucket;
    int64_t numel = 0;
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      numel += n;
    }
    bucket.gradient = at::zeros({(numel + world - 1) / world * world});
    int64_t at = 0;
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      bucket.parameters.push_back(bucket.gradient.narrow(0, at, n).view(shape));
      at += n;
    }
    bucket.share = shares[r];
    auto snapshot = [&] {
      std::map<std::string, at::Tensor> out;
      for (const auto& [key, tensor] : codec->state()) out[key] = tensor.clone();
      return out;
    };
    codec->prepare({bucket}, {7, r, world});
    std::vector<std::map<std::string, at::Tensor>> states = {snapshot()};
    std::vector<at::Tensor> sent, result;
    std::vector<Provenance> calls;
    for (int s = 0; s < steps; ++s) {
      bucket.gradient.zero_();
      bucket.gradient.narrow(0, 0, numel).copy_(gradient(r, s, numel));
      sent.push_back(bucket.gradient.narrow(0, 0, numel).clone());
      bucket.step = s;
      train::CommunicatorGroup group(comm, name, at::Device(at::kCPU), &calls);
      codec->synchronize(bucket, group);
      result.push_back(bucket.gradient.narrow(0, 0, numel).clone());
      states.push_back(snapshot());
    }
    run.sent[r] = sent;
    run.result[r] = result;
    run.state[r] = states;
    run.calls[r] = calls;
  });
  return run;
}

// Deterministic values of a normal distribution for (rank, step), scaled.
GradientOf normal(double scale) {
  return [scale](int rank, int step, int64_t numel) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1000 + rank * 31 + step);
    return at::randn({numel}, generator, at::kFloat).mul_(scale);
  };
}

at::Tensor sumOver(const std::vector<std::vector<at::Tensor>>& per_rank, int step) {
  at::Tensor sum = at::zeros_like(per_rank[0][step], at::kDouble);
  for (const auto& rank : per_rank) sum.add_(rank[step].to(at::kDouble));
  return sum;
}

void expectSameOnEveryRank(const CodecRun& run) {
  for (size_t r = 1; r < run.result.size(); ++r) {
    for (size_t s = 0; s < run.result[r].size(); ++s) {
      EXPECT_TRUE(at::equal(run.result[r][s], run.result[0][s]))
          << "rank " << r << " holds another sum than rank 0 at step " << s;
    }
  }
}

const std::vector<double> kThirds = {1.0 / 3, 1.0 / 3, 1.0 / 3};

TEST(Bf16, SumsThatBfloat16HoldsAreExactAndHalfTheBytes) {
  // Multiples of 2^-6 below 2^2: 8 significant bits, so every value and sum is exact.
  const GradientOf exact = [](int rank, int, int64_t numel) {
    return at::arange(numel, at::kFloat).remainder_(9).sub_(4).mul_((rank + 1) / 64.0);
  };
  const CodecRun run = runCodec("bf16", {}, 3, {{5, 4}, {7}}, 1, exact, kThirds);
  expectSameOnEveryRank(run);
  EXPECT_TRUE(at::equal(run.result[0][0], sumOver(run.sent, 0).to(at::kFloat)));
  ASSERT_EQ(run.calls[0].size(), 1u);
  EXPECT_EQ(run.calls[0][0].bytes, 27u * 2);  // 27 elements of 2 bytes
}

TEST(Bf16, RoundsEachSumToBfloat16sPrecision) {
  const CodecRun run = runCodec("bf16", {}, 3, {{40, 25}}, 1, normal(1.0), kThirds);
  expectSameOnEveryRank(run);
  at::Tensor magnitude = at::zeros({1000}, at::kDouble);
  for (const auto& rank : run.sent) magnitude.add_(rank[0].abs().to(at::kDouble));
  // Each rank's value and each of the ring's partial sums rounded once: 2^-8 relative each.
  const at::Tensor error = run.result[0][0].to(at::kDouble).sub(sumOver(run.sent, 0)).abs();
  EXPECT_TRUE(error.le(magnitude.mul(4 * std::ldexp(1.0, -8))).all().item<bool>());
  EXPECT_GT(error.max().item<double>(), 0) << "a float32 sum would not round at all";
}

TEST(Fp16, ScalesGradientsFloat16WouldLoseOrOverflow) {
  // float16 holds nothing below 6e-8 and nothing above 65504.
  ASSERT_EQ(at::tensor({1e-9f}).to(at::kHalf).item<float>(), 0.0f);
  ASSERT_TRUE(std::isinf(at::tensor({1e6f}).to(at::kHalf).item<float>()));
  for (const double scale : {1e-9, 1e6}) {
    const CodecRun run = runCodec("fp16", {}, 3, {{30, 10}}, 1, normal(scale), kThirds);
    expectSameOnEveryRank(run);
    at::Tensor magnitude = at::zeros({300}, at::kDouble);
    for (const auto& rank : run.sent) magnitude.add_(rank[0].abs().to(at::kDouble));
    const at::Tensor exact = sumOver(run.sent, 0);
    const at::Tensor error = run.result[0][0].to(at::kDouble).sub(exact).abs();
    EXPECT_TRUE(error.le(magnitude.mul(4 * std::ldexp(1.0, -11))).all().item<bool>())
        << "scale " << scale << ": worst error " << error.max().item<double>();
    // A float32 maximum of one value, then the float16 sum.
    ASSERT_EQ(run.calls[0].size(), 2u);
    EXPECT_EQ(run.calls[0][0].bytes, 4u);
    EXPECT_EQ(run.calls[0][1].bytes, 300u * 2);
  }
}

TEST(Int8, BlocksThatInt8HoldsAreExact) {
  // Every block of 4 is {127, -64, 3, 0} times a power of two: its scale is that power and
  // every code exact.
  const GradientOf exact = [](int rank, int, int64_t numel) {
    const at::Tensor block = at::tensor({127.0f, -64.0f, 3.0f, 0.0f});
    return block.repeat({numel / 4}).mul_(std::ldexp(1.0, -(rank + 3)));
  };
  const CodecRun run = runCodec("int8", {{"block", "4"}}, 3, {{6, 2}}, 1, exact, kThirds);
  expectSameOnEveryRank(run);
  EXPECT_TRUE(at::equal(run.result[0][0], sumOver(run.sent, 0).to(at::kFloat)));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run.state[r][1].at("error/0").abs().max().item<float>(), 0);
  // The scales (3 blocks of float32) and the codes (12 bytes), gathered from 3 ranks.
  ASSERT_EQ(run.calls[0].size(), 2u);
  EXPECT_EQ(run.calls[0][0].bytes, 3u * 3 * 4);
  EXPECT_EQ(run.calls[0][1].bytes, 3u * 12);
}

// With error feedback nothing is lost: what the sums delivered over the steps plus what the
// ranks still owe is what they computed.
TEST(Int8, ErrorFeedbackLosesNothingOverSteps) {
  const GradientOf once = [](int rank, int step, int64_t numel) {
    return step == 0 ? normal(0.01)(rank, step, numel) : at::zeros({numel});
  };
  const CodecRun run = runCodec("int8", {{"block", "64"}}, 2, {{50, 9}}, 3, once, {0.5, 0.5});
  expectSameOnEveryRank(run);
  at::Tensor delivered = at::zeros({450}, at::kDouble), owed = at::zeros({450}, at::kDouble);
  for (int s = 0; s < 3; ++s) delivered.add_(run.result[0][s].to(at::kDouble));
  for (int r = 0; r < 2; ++r) owed.add_(run.state[r][3].at("error/0").to(at::kDouble));
  const at::Tensor computed = sumOver(run.sent, 0);
  EXPECT_LT(delivered.add(owed).sub(computed).abs().max().item<double>(), 1e-7);
  // The first step's sum alone misses what rounding left out; the next steps deliver it.
  EXPECT_GT(run.result[0][0].to(at::kDouble).sub(computed).abs().max().item<double>(), 1e-6);
  EXPECT_GT(run.result[0][1].abs().max().item<float>(), 0);
}

// PowerSGD on 2 ranks of unequal shares over 3 steps (warm start and error feedback at
// work), against tests/training/powersgd_reference.py: NumPy, from the same inputs and the
// first Q, nothing of collie's.
TEST(PowerSgd, ThreeStepsMatchANumPyReference) {
  // A vector and a 3x2 matrix too small to gain 2x (6 < 2 x 2 x 5) go whole; three matrices,
  // one of them from a 3-dimensional parameter (8 x 12), are compressed.
  const std::vector<std::vector<int64_t>> shapes = {{16, 12}, {7}, {10, 20}, {3, 2}, {8, 4, 3}};
  const std::vector<double> shares = {0.7, 0.3};
  // Gradients of order 1, and of order 1e-5, whose P columns (of order |M|^2) are far below
  // any fixed epsilon: the orthogonalisation must not shrink them.
  for (const double scale : {1.0, 1e-5}) {
    const CodecRun run = runCodec("powersgd", {{"rank", "2"}}, 2, shapes, 3, normal(scale), shares);
    expectSameOnEveryRank(run);
    auto list = [](const at::Tensor& t) {
      const at::Tensor c = t.to(at::kDouble).contiguous();
      return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    };
    nlohmann::json doc;
    doc["shapes"] = shapes;
    doc["rank"] = 2;
    doc["min_compression_rate"] = 2.0;
    doc["shares"] = shares;
    doc["q0"] = list(run.state[0][0].at("q/0"));
    for (int r = 0; r < 2; ++r) {
      for (int s = 0; s < 3; ++s) {
        doc["sent"][r][s] = list(run.sent[r][s]);
        doc["result"][r][s] = list(run.result[r][s]);
        doc["error"][r][s] = list(run.state[r][s + 1].at("error/0"));
      }
    }
    const fs::path file = fs::path(COLLIE_TEST_BINARY_DIR) / "powersgd-run.json";
    const fs::path log = fs::path(COLLIE_TEST_BINARY_DIR) / "powersgd-reference.log";
    std::ofstream(file) << doc.dump();
    const std::string command = std::string("'") + COLLIE_TEST_PYTHON + "' '" +
                                COLLIE_TEST_SOURCE_DIR +
                                "/tests/training/powersgd_reference.py' '" + file.string() +
                                "' > '" + log.string() + "' 2>&1";
    const int status = std::system(command.c_str());
    std::ifstream in(log);
    const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(status, 0) << "gradients of order " << scale << ": " << said;
    EXPECT_TRUE(testing::contains(said, {"powersgd: 3 steps of 2 ranks match"}));
    // Each step: the vector and the 3x2 matrix whole in one all-reduce, then every P, then
    // every Q.
    ASSERT_EQ(run.calls[0].size(), 9u);
    EXPECT_EQ(run.calls[0][0].bytes, (7u + 6) * 4);
    EXPECT_EQ(run.calls[0][1].bytes, (16u + 10 + 8) * 2 * 4);
    EXPECT_EQ(run.calls[0][2].bytes, (12u + 20 + 12) * 2 * 4);
  }
}

TEST(PowerSgd, BeforeItsStartStepItIsTheFloat32AllReduce) {
  const CodecRun run =
      runCodec("powersgd", {{"start_step", "1"}}, 3, {{16, 12}}, 2, normal(1.0), kThirds);
  ASSERT_EQ(run.calls[0].size(), 1u + 2);
  EXPECT_EQ(run.calls[0][0].bytes, 192u * 4);
  EXPECT_LT(run.result[0][0].to(at::kDouble).sub(sumOver(run.sent, 0)).abs().max().item<double>(),
            1e-5);
}

// A codec that breaks the group's contract is named; a one-byte gather travels as words.
TEST(CodecGroup, RefusesWhatTheContractDoesNotAndGathersBytes) {
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<at::Tensor> gathered(2);
  testing::runLoopback(2, [&](std::shared_ptr<Backend> backend) {
    Communicator comm(backend, "loopback", Topology::fromLabels({"a", "a"}));
    comm.addRule("ring", testing::loadScheduler("ring"));
    std::vector<Provenance> calls;
    train::CommunicatorGroup group(comm, "broken", at::Device(at::kCPU), &calls);
    auto refused = [&](const std::function<void()>& call) {
      try {
        call();
      } catch (const PluginError& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    };
    refused([&] { group.allReduce(at::zeros({8}, at::kChar), ReduceOp::kSum); });
    refused([&] { group.allReduce(at::zeros({8}), ReduceOp::kProd); });
    refused([&] { group.allGather(at::zeros({3}), at::zeros({5})); });
    refused([&] { group.allGather(at::zeros({6}, at::kChar), at::zeros({12}, at::kChar)); });
    refused([&] { group.allReduce(at::zeros({4, 4}).t(), ReduceOp::kSum); });
    const at::Tensor mine = at::arange(8, at::kChar).add_(static_cast<int>(backend->rank() * 10));
    at::Tensor all = at::zeros({16}, at::kChar);
    group.allGather(mine, all);
    gathered[backend->rank()] = all;
  });
  ASSERT_EQ(errors.size(), 10u);
  for (const auto& e : errors) EXPECT_NE(e.find("codec 'broken'"), std::string::npos) << e;
  const at::Tensor expected =
      at::cat({at::arange(8, at::kChar), at::arange(8, at::kChar).add_(10)});
  for (const auto& all : gathered) EXPECT_TRUE(at::equal(all, expected));
}

// ---- training with a codec -------------------------------------------------------------

const testing::TrainingRuns kRuns("codec-scratch", testing::kUnequalRanksMlp, {"train.lr=0.01"});

class Compression : public ::testing::TestWithParam<const char*> {};

// Unequal micro-batches weighted by tokens, two micro-batches a step, clipping, SGD (whose
// update follows the gradient, so a codec's error shows in the weights in proportion):
// every codec keeps the ranks identical (the run's weight check), sends fewer bytes, and
// ends near training without a codec, against how far that training moved the weights.
TEST_P(Compression, TrainsWithIdenticalRanksInFewerBytes) {
  const std::string codec = GetParam();
  const std::string name = codec[0] == '{' ? "powersgd" : codec;
  const std::vector<std::string> sgd = {"train.optimizer=sgd", "train.lr=0.1",
                                        "train.grad_clip=0.5"};
  // Runs of their own per codec: ctest runs the codecs' tests at once.
  auto initial = sgd;
  initial.insert(initial.end(), {"train.lr=0", "train.steps=1"});
  kRuns.run("sgd-initial-" + name, initial);
  kRuns.run("sgd-plain-" + name, sgd);
  auto sets = sgd;
  sets.push_back("train.compression=" + codec);
  const train::Result r = kRuns.run("sgd-" + name, sets);
  EXPECT_TRUE(r.sync.identical);
  EXPECT_EQ(r.compression, name);
  // Fewer bytes sent than the float32 all-reduce's 2(N-1)/N of the gradients.
  EXPECT_GT(r.sent_bytes_per_step, 0);
  EXPECT_LT(r.sent_bytes_per_step, 2.0 * 2 / 3 * static_cast<double>(r.allreduce_bytes));
  const auto plain = kRuns.weights("sgd-plain-" + name);
  const double moved = testing::largestDifference(plain, kRuns.weights("sgd-initial-" + name));
  const double off = testing::largestDifference(kRuns.weights("sgd-" + name), plain);
  std::printf(
      "%s: training moved the weights by up to %g; the codec's run ends up to %g from "
      "where training without it does\n",
      name.c_str(), moved, off);
  EXPECT_GT(off, 0);
  // The casts and int8 round each sum to a few significant digits (measured: 3e-3, 5e-4 and
  // 2e-3 of the movement); PowerSGD's rank-2 sums are far coarser per step, its error fed
  // back into the next ones (its sums are checked against NumPy above).
  EXPECT_LT(off, (name == "powersgd" ? 0.5 : 0.02) * moved);
}

INSTANTIATE_TEST_SUITE_P(Codecs, Compression,
                         ::testing::Values("bf16", "fp16", "int8",
                                           "{plugin: powersgd, params: {rank: 2}}"),
                         [](const auto& info) {
                           const std::string name = info.param;
                           return name[0] == '{' ? std::string("powersgd") : name;
                         });

// Before its start step PowerSGD all-reduces each bucket in float32: the codec path (the
// group, the buckets' views, the shares) gives the weights of training without a codec,
// bit for bit.
TEST(CompressionTraining, PowerSgdBeforeItsStartIsTrainingWithoutACodec) {
  for (const char* weighting : {"tokens", "uniform"}) {
    const std::string set = std::string("train.grad_weighting=") + weighting;
    kRuns.run("plain", {set});
    kRuns.run("late", {set, "train.compression={plugin: powersgd, params: {start_step: 100}}"});
    const auto plain = kRuns.weights("plain"), late = kRuns.weights("late");
    ASSERT_EQ(plain.size(), late.size());
    for (const auto& [key, tensor] : plain)
      EXPECT_TRUE(at::equal(tensor, late.at(key))) << weighting << ": " << key;
  }
}

// The error feedback and PowerSGD's Q are every rank's own: a checkpoint holds them, and a
// run resumed from it ends where the uninterrupted one does, bit for bit.
TEST(CompressionTraining, ResumeCarriesEveryRanksCodecState) {
  const std::vector<std::string> sets = {"train.compression={plugin: powersgd, params: {rank: 2}}",
                                         "train.checkpoint_every=3"};
  kRuns.run("whole", sets);
  kRuns.run("interrupted", sets);
  const fs::path ckpt = kRuns.dir("interrupted") / "ckpt";
  fs::remove_all(train::checkpointPath(ckpt.string(), 6));
  train::CheckpointReader reader(train::latestCheckpoint(ckpt.string()));
  size_t codec_tensors = 0;
  for (const auto& [key, shape] : reader.tensors()) codec_tensors += key.rfind("codec/", 0) == 0;
  EXPECT_GT(codec_tensors, 0u);
  const train::Result resumed = kRuns.run("interrupted", sets, /*fresh=*/false);
  EXPECT_EQ(resumed.timed_steps, 2);  // steps 4..6, the first untimed
  const auto whole = kRuns.weights("whole"), again = kRuns.weights("interrupted");
  for (const auto& [key, tensor] : whole) EXPECT_TRUE(at::equal(tensor, again.at(key))) << key;
}

TEST(CompressionTraining, ShardingAndUnknownParamsAreRefusedByName) {
  const std::string sharded =
      kRuns.configError({"train.compression=powersgd", "train.sharding=optimizer"});
  EXPECT_TRUE(testing::contains(sharded, {"codec 'powersgd'", "train.sharding: optimizer"}));
  const std::string param =
      kRuns.configError({"train.compression={plugin: powersgd, params: {rnk: 2}}"});
  EXPECT_TRUE(testing::contains(param, {"unknown param 'rnk'", "rank"}));
  const std::string none =
      kRuns.configError({"train.compression={plugin: none, params: {rank: 2}}"});
  EXPECT_TRUE(testing::contains(none, {"'none' takes no params"}));
  // tree runs no all-gather, which int8 needs: said before the first step.
  const std::string tree = kRuns.configError({"train.compression=int8", "train.scheduler=tree"});
  EXPECT_TRUE(testing::contains(tree, {"codec 'int8' needs allgather"}));
  const std::string rules = kRuns.configError({"train.compression={rules: [{plugin: bf16}]}"});
  EXPECT_TRUE(testing::contains(rules, {"train.compression: 'rules' choose a scheduler"}));
}

// ---- train.compression: auto ----------------------------------------------------------

// auto times every candidate on fresh buffers and makes a fresh instance of the one it
// chooses: with one candidate, the run is the run that names it, bit for bit (nothing of
// the rehearsal reaches the gradients or the codec's state), and the summary says why.
TEST(AutoCompression, TheChosenCodecTrainsAsIfNamed) {
  const std::string powersgd = "{plugin: powersgd, params: {rank: 2}}";
  kRuns.run("named", {"train.compression=" + powersgd});
  const train::Result chosen = kRuns.run(
      "auto-one", {"train.compression={plugin: auto, params: {candidates: [" + powersgd + "]}}"});
  EXPECT_EQ(chosen.compression, "powersgd");
  EXPECT_TRUE(testing::contains(chosen.compression_choice, {"chose powersgd", "arithmetic"}));
  const auto named = kRuns.weights("named"), again = kRuns.weights("auto-one");
  ASSERT_EQ(named.size(), again.size());
  for (const auto& [key, tensor] : named) EXPECT_TRUE(at::equal(tensor, again.at(key))) << key;
}

// A candidate whose collectives train.scheduler cannot run is passed over, by name: tree
// runs no all-gather, so among int8 and none auto takes none, and trains as without a codec.
TEST(AutoCompression, PassesOverACandidateTheSchedulerCannotRun) {
  kRuns.run("tree-plain", {"train.scheduler=tree"});
  const train::Result r = kRuns.run(
      "tree-auto", {"train.scheduler=tree",
                    "train.compression={plugin: auto, params: {candidates: [int8, none]}}"});
  EXPECT_EQ(r.compression, "none");
  EXPECT_TRUE(testing::contains(r.compression_choice,
                                {"int8 (train.scheduler runs none of its collectives)"}));
  const auto plain = kRuns.weights("tree-plain"), chosen = kRuns.weights("tree-auto");
  for (const auto& [key, tensor] : plain) EXPECT_TRUE(at::equal(tensor, chosen.at(key))) << key;
  const std::string none = kRuns.configError(
      {"train.scheduler=tree", "train.compression={plugin: auto, params: {candidates: [int8]}}"});
  EXPECT_TRUE(testing::contains(none, {"runs the collectives of none of the candidates"}));
}

// Between two candidates the run can take, auto takes the one whose predicted step (the
// link's share plus the timed arithmetic, both in the summary's account) is the smaller.
TEST(AutoCompression, TakesTheCandidateWithTheShortestPredictedStep) {
  const train::Result r = kRuns.run(
      "auto-two", {"train.compression={plugin: auto, params: {candidates: [none, bf16]}}"});
  std::map<std::string, double> predicted;
  const std::regex account(
      R"((none|bf16) ([0-9.]+) s \(([0-9.]+) s on the link \+ ([0-9.]+) s arithmetic\))");
  for (auto it =
           std::sregex_iterator(r.compression_choice.begin(), r.compression_choice.end(), account);
       it != std::sregex_iterator(); ++it) {
    const double total = std::stod((*it)[2]), link = std::stod((*it)[3]),
                 arithmetic = std::stod((*it)[4]);
    EXPECT_NEAR(total, link + arithmetic, 1.5e-4) << r.compression_choice;
    predicted[(*it)[1]] = total;
  }
  ASSERT_EQ(predicted.size(), 2u) << r.compression_choice;
  EXPECT_GT(predicted.at("none"), 0);
  EXPECT_TRUE(testing::contains(r.compression_choice, {"chose " + r.compression}));
  const std::string other = r.compression == "none" ? "bf16" : "none";
  EXPECT_LE(predicted.at(r.compression), predicted.at(other)) << r.compression_choice;
  EXPECT_TRUE(r.sync.identical);
}

TEST(AutoCompression, BadCandidatesAreRefusedByName) {
  auto refused = [](const std::string& compression) {
    return kRuns.configError({"train.compression=" + compression});
  };
  const std::string word = refused("auto");
  EXPECT_TRUE(testing::contains(word, {"auto chooses among params.candidates"}));
  const std::string missing = refused("{plugin: auto}");
  EXPECT_TRUE(testing::contains(missing, {"train.compression.params: missing required key"}));
  const std::string empty = refused("{plugin: auto, params: {candidates: []}}");
  EXPECT_TRUE(testing::contains(empty, {"at least 1"}));
  const std::string nested = refused("{plugin: auto, params: {candidates: [bf16, auto]}}");
  EXPECT_TRUE(testing::contains(nested, {"candidates[1]: auto is the choice"}));
  const std::string twice = refused("{plugin: auto, params: {candidates: [bf16, bf16]}}");
  EXPECT_TRUE(testing::contains(twice, {"a second candidate labelled 'bf16'"}));
  const std::string none =
      refused("{plugin: auto, params: {candidates: [{plugin: none, params: {rank: 2}}]}}");
  EXPECT_TRUE(testing::contains(none, {"'none' takes no params"}));
  EXPECT_TRUE(testing::throwsWith<std::exception>(
      [&] {
        kRuns.run("refused",
                  {"train.compression={plugin: auto, params: {candidates: [bf16, nosuch]}}"});
      },
      {"no codec plugin named 'nosuch'"}))
      << "a missing candidate plugin ran";
  const std::string other = refused("{plugin: auto, params: {candidates: [bf16], rank: 2}}");
  EXPECT_TRUE(testing::contains(other, {"train.compression.params.rank: unknown key"}));
}

// A codec whose rehearsal fails on one rank fails the run on every rank before the first
// step, never leaving the others waiting for it: each rank's error names the codec and the
// rank, and that rank's says why. Named and as an auto candidate, over three processes.
TEST(CodecRehearsal, FailingOnOneRankFailsEveryRankNamingIt) {
  const std::string codec =
      std::string(COLLIE_TEST_BINARY_DIR) + "/training/plugins/libcollie_codec_refusing.so";
  const std::string config = testing::writeTempFile("refusing.yaml", R"(name: refusing
launch: {nproc_per_node: 3}
backend: {plugin: gloo, params: {timeout: 20s}}
model: {plugin: mlp, params: {seq_len: 6, vocab: 48, d_embed: 8, hidden: 32, layers: 2}}
train: {steps: 3, micro_batch: 2, bucket_bytes: 4KiB, log_every: 1}
)");
  const std::string refusing = "{plugin: " + codec + ", params: {fail_rank: 1}, label: refusing}";
  for (const std::string& compression :
       {refusing, "{plugin: auto, params: {candidates: [bf16, " + refusing + "]}}"}) {
    const auto r = testing::runCollie({"run", config, "--out", kRuns.dir("refusing").string(),
                                       "--set", "train.compression=" + compression});
    EXPECT_EQ(r.exit_code, 2) << r.output;                                // a plugin's error
    EXPECT_EQ(r.output.find("step 1/3"), std::string::npos) << r.output;  // no step ran
    const std::string said =
        "codec 'refusing' failed its rehearsal before the first step on rank 1";
    for (int rank = 0; rank < 3; ++rank) {
      const std::string line = "[rank " + std::to_string(rank) + "] collie: error: ";
      const auto at = r.output.find(line);
      ASSERT_NE(at, std::string::npos) << compression << ": rank " << rank << " said nothing\n"
                                       << r.output;
      const std::string error = r.output.substr(at, r.output.find('\n', at) - at);
      EXPECT_TRUE(testing::contains(
          error, {said, rank == 1 ? "rank 1 refuses to prepare" : "its error says why"}));
    }
  }
}

// ---- the loss against wall time --------------------------------------------------------

// The summary's loss curve is the job's mean loss of each step (every rank's loss weighted
// by its samples, as the step logs hold them), and train.target_loss's step is the first
// whose mean over the last 8 steps reached it.
TEST(LossCurve, IsTheJobsMeanAndTheTargetItsFirstEightStepMean) {
  const std::vector<std::string> falling = {"train.steps=20", "train.lr=0.05",
                                            "train.lr_schedule=constant"};
  const train::Result r = kRuns.run("curve", falling);
  ASSERT_EQ(r.loss_curve.size(), 20u);
  ASSERT_EQ(r.loss_curve_seconds.size(), 20u);
  std::vector<double> job(20, 0.0);
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream in(kRuns.dir("curve") / ("rank-" + std::to_string(rank) + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto step = nlohmann::json::parse(line);
      job.at(step["step"].get<size_t>() - 1) +=
          step["loss"].get<double>() * step["samples"].get<double>() / 2;  // per micro-batch
    }
  }
  for (size_t i = 0; i < job.size(); ++i) {
    EXPECT_NEAR(r.loss_curve[i], job[i] / 7, 1e-6 * job[i]) << "step " << i + 1;
    if (i > 0) {
      EXPECT_GE(r.loss_curve_seconds[i], r.loss_curve_seconds[i - 1]);
    }
  }
  EXPECT_NEAR(r.loss_curve.back(), r.last_loss, 1e-9);
  EXPECT_EQ(r.steps_to_target, 0);  // no target
  // The 8-step means ending at steps 8..20; the first that falls below every earlier one
  // (training lowers the loss) sets the target between it and them.
  auto window = [&](size_t end) {
    double mean = 0;
    for (size_t i = end - 8; i < end; ++i) mean += r.loss_curve[i] / 8;
    return mean;
  };
  size_t expected = 0;
  double target = 0, lowest = window(8);
  for (size_t end = 9; end <= 20 && expected == 0; ++end) {
    if (window(end) < lowest) {
      expected = end;
      target = (window(end) + lowest) / 2;
    }
    lowest = std::min(lowest, window(end));
  }
  ASSERT_GT(expected, 0u) << "the loss did not fall over steps 9-20";
  auto with_target = falling;
  with_target.push_back(fmt::format("train.target_loss={:.17g}", target));
  const train::Result t = kRuns.run("curve-target", with_target);
  EXPECT_EQ(t.loss_curve, r.loss_curve);  // the same training
  EXPECT_EQ(t.steps_to_target, static_cast<int64_t>(expected));
  EXPECT_DOUBLE_EQ(t.seconds_to_target, t.loss_curve_seconds[expected - 1]);
  auto unreachable = falling;
  unreachable.push_back("train.target_loss=0.001");
  const train::Result never = kRuns.run("curve-never", unreachable);
  EXPECT_EQ(never.steps_to_target, 0);
  // Resumed after step 10, the curve is the resumed steps' (the same losses: the run
  // continues bit for bit), said to start at step 11, and the step a target is reached at
  // counts from the run's first step.
  auto resumable = with_target;
  resumable.push_back("train.checkpoint_every=10");
  kRuns.run("curve-resumed", resumable);
  fs::remove_all(train::checkpointPath((kRuns.dir("curve-resumed") / "ckpt").string(), 20));
  const train::Result resumed = kRuns.run("curve-resumed", resumable, /*fresh=*/false);
  EXPECT_EQ(resumed.loss_curve_first_step, 11);
  ASSERT_EQ(resumed.loss_curve.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(resumed.loss_curve[i], r.loss_curve[10 + i]) << i;
  // Its windows are its own steps': the first ends at step 18.
  int64_t resumed_expected = 0;
  for (size_t end = 18; end <= 20 && resumed_expected == 0; ++end) {
    if (window(end) <= target) resumed_expected = static_cast<int64_t>(end);
  }
  EXPECT_EQ(resumed.steps_to_target, resumed_expected);
  EXPECT_EQ(t.loss_curve_first_step, 1);
}

}  // namespace
}  // namespace collie
