// Token sources and sharding: deterministic samples, files checked before training starts.
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <set>

#include "collie/error.h"
#include "expect.h"
#include "run_command.h"
#include "train/data.h"

namespace collie::train {
namespace {

std::string writeTokens(const std::string& name, const std::vector<uint16_t>& ids) {
  std::string bytes;
  for (uint16_t id : ids) {
    bytes += static_cast<char>(id & 0xFF);
    bytes += static_cast<char>(id >> 8);
  }
  return testing::writeTempFile(name, bytes);
}

std::string errorOf(const config::DataSpec& spec, int64_t window, int64_t vocab) {
  try {
    openSource(spec, window, vocab);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Sharding, RanksTogetherReadOneProcessBatch) {
  Sharding many{{3, 2}, 2}, one{{5}, 2};
  EXPECT_EQ(many.globalBatch(), 10);
  for (int64_t step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      EXPECT_EQ(many.firstSample(step, micro, 0), one.firstSample(step, micro, 0));
      EXPECT_EQ(many.firstSample(step, micro, 1), one.firstSample(step, micro, 0) + 3);
    }
  }
  EXPECT_EQ(many.firstSample(1, 1, 1), 10u + 5u + 3u);
}

TEST(Sharding, ProportionalSplitGivesEveryRankItsShare) {
  EXPECT_EQ(proportionalSplit(8, {1, 1, 1, 1}), std::vector<int>({2, 2, 2, 2}));
  EXPECT_EQ(proportionalSplit(22, {1, 1, 0.75}), std::vector<int>({8, 8, 6}));
  EXPECT_EQ(proportionalSplit(3, {1, 1000}), std::vector<int>({1, 2})) << "at least one each";
  // In proportion, not one each and the rest in proportion ([9, 7, 6]).
  EXPECT_EQ(proportionalSplit(22, {119.7, 87.6, 63.2}), std::vector<int>({10, 7, 5}));
  // Two ranks under one sample get one each; the other two share the 8 left 3:1.
  EXPECT_EQ(proportionalSplit(10, {300, 100, 1, 2}), std::vector<int>({6, 2, 1, 1}));
  auto split = proportionalSplit(10, {3.3, 1.1, 2.2});
  EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), 10);
  EXPECT_GT(split[0], split[2]);
  EXPECT_GT(split[2], split[1]);
}

// micro_batch: auto during a run: a rank that slowed down gives samples away; a split that
// matches the measured speeds stays (no oscillation); a gain inside the hysteresis is
// refused; unmeasured ranks keep the split.
TEST(Sharding, ResplitFollowsTheSpeedsWithHysteresis) {
  // Rank 1 now takes twice as long per sample: 32/32 moves halfway to 43/21 (2:1, 42.7 and
  // 21.3), to 38/26 (37.5 and 26.5, the tie to rank 0); then to 41/23, 42/22 and the rest of
  // the way, which shortens the slowest compute by 2 % (0.044 s to 0.043 s).
  Resplit r = resplit(64, {32, 32}, {0.001, 0.002}, 0.05);
  EXPECT_TRUE(r.take);
  EXPECT_EQ(r.split, std::vector<int>({38, 26}));
  EXPECT_NEAR(r.slowest_now, 0.064, 1e-12);
  EXPECT_NEAR(r.slowest_next, 0.052, 1e-12);
  EXPECT_EQ(resplit(64, {38, 26}, {0.001, 0.002}, 0.05).split, std::vector<int>({41, 23}));
  EXPECT_EQ(resplit(64, {41, 23}, {0.001, 0.002}, 0.05).split, std::vector<int>({42, 22}));
  r = resplit(64, {42, 22}, {0.001, 0.002}, 0.05);
  EXPECT_FALSE(r.take) << "2 % is inside the hysteresis";
  EXPECT_EQ(r.split, std::vector<int>({43, 21}));
  EXPECT_TRUE(resplit(64, {42, 22}, {0.001, 0.002}, 0.0).take);
  // The same speeds measured again at the new split: nothing to gain.
  r = resplit(64, {43, 21}, {0.001, 0.002}, 0.0);
  EXPECT_FALSE(r.take);
  EXPECT_EQ(r.split, std::vector<int>({43, 21}));
  // 10 % slower on rank 1: 33/31 would shorten the slowest compute by 3 %, under 5 %.
  r = resplit(64, {32, 32}, {0.001, 0.0011}, 0.05);
  EXPECT_FALSE(r.take);
  EXPECT_EQ(r.split, std::vector<int>({33, 31}));
  EXPECT_TRUE(resplit(64, {32, 32}, {0.001, 0.0011}, 0.0).take);
  for (const double bad : {0.0, -1.0, std::nan("")}) {
    r = resplit(64, {32, 32}, {0.001, bad}, 0.05);
    EXPECT_FALSE(r.take);
    EXPECT_EQ(r.split, std::vector<int>({32, 32}));
  }
}

TEST(Synthetic, DeterministicInVocabAndLearnable) {
  config::DataSpec spec;
  auto a = openSource(spec, 17, 50), b = openSource(spec, 17, 50);
  at::Tensor x = batch(*a, 100, 4, 17), y = batch(*b, 100, 4, 17);  // (4, 17)
  EXPECT_TRUE(at::equal(x, y));
  EXPECT_GE(x.min().item().toLong(), 0);
  EXPECT_LT(x.max().item().toLong(), 50);
  EXPECT_FALSE(at::equal(batch(*a, 0, 1, 17), batch(*a, 1, 1, 17)));
  // Most tokens follow the rule t -> 5t + 3 (mod V).
  int64_t follows = 0, total = 0;
  const int64_t* t = x.data_ptr<int64_t>();
  for (int64_t s = 0; s < 4; ++s) {
    for (int64_t i = 1; i < 17; ++i, ++total)
      follows += t[s * 17 + i] == (t[s * 17 + i - 1] * 5 + 3) % 50;
  }
  EXPECT_GT(follows * 2, total);
  spec.seed = 99;
  EXPECT_FALSE(at::equal(batch(*openSource(spec, 17, 50), 100, 4, 17), x));
}

TEST(TokensFile, WindowsComeFromTheFile) {
  std::vector<uint16_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);  // token i at position i: a window is consecutive
  config::DataSpec spec;
  spec.source = config::DataSpec::Source::kTokens;
  spec.path = writeTokens("ids.bin", ids);
  auto source = openSource(spec, 9, 1000);
  at::Tensor x = batch(*source, 0, 8, 9);
  const int64_t* t = x.data_ptr<int64_t>();
  std::set<int64_t> starts;
  for (int s = 0; s < 8; ++s) {
    starts.insert(t[s * 9]);
    for (int i = 1; i < 9; ++i) EXPECT_EQ(t[s * 9 + i], t[s * 9] + i);
  }
  EXPECT_GT(starts.size(), 1u) << "windows start at seeded random offsets";
  EXPECT_TRUE(testing::contains(source->describe(), {"1000 tokens"}));
}

TEST(TokensFile, BadFilesAreNamedWithTheFix) {
  config::DataSpec spec;
  spec.source = config::DataSpec::Source::kTokens;
  spec.path = "/nonexistent/train.bin";
  EXPECT_TRUE(testing::contains(errorOf(spec, 9, 100), {"cannot open"}));
  spec.path = testing::writeTempFile("odd.bin", "abc");
  EXPECT_TRUE(testing::contains(errorOf(spec, 9, 100), {"odd size"}));
  spec.path = writeTokens("short.bin", {1, 2, 3});
  EXPECT_TRUE(testing::contains(errorOf(spec, 9, 100), {"expected at least 10 tokens"}));
  std::vector<uint16_t> ids(50, 7);
  ids[31] = 4000;
  spec.path = writeTokens("big.bin", ids);
  const std::string m = errorOf(spec, 9, 100);
  EXPECT_TRUE(testing::contains(m, {"token 4000 at index 31 is outside the model's vocab (100)"}));
}

TEST(TextFile, BytesAreTokensAndNeedVocab256) {
  config::DataSpec spec;
  spec.source = config::DataSpec::Source::kText;
  spec.path = testing::writeTempFile("words.txt", std::string(200, 'a') + "hello world");
  EXPECT_TRUE(testing::contains(errorOf(spec, 9, 128), {"vocab of at least 256"}));
  auto source = openSource(spec, 9, 256);
  at::Tensor x = batch(*source, 3, 2, 9);
  EXPECT_LE(x.max().item().toLong(), 'w');
  EXPECT_GE(x.min().item().toLong(), ' ');
}

}  // namespace
}  // namespace collie::train
