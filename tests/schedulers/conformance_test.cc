// The full conformance matrix for every shipped scheduler, one ctest entry per scheduler and
// group size: every collective it accepts × counts {0, 1, 7, n-1, 1000, 1,000,003} × ops ×
// dtypes, against closed forms, bit-identical on every rank and from run to run.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>

#include "check/conformance.h"
#include "expect.h"
#include "loopback_job.h"

namespace collie {
namespace {

config::PluginRef pluginRef(const std::string& plugin, const std::string& key = "",
                            const std::string& value = "") {
  config::PluginRef r;
  r.plugin = r.label = plugin;
  if (!key.empty()) r.params.set(key, value);
  return r;
}

check::Report runMatrix(const config::PluginRef& scheduler, int world, size_t large_count) {
  check::Options options;
  options.worlds = {world};
  options.large_count = large_count;
  return check::checkScheduler(testing::buildTreeLoader(), scheduler, pluginRef("loopback"),
                               options);
}

// The collectives plugins/NAME/README.md says the scheduler supports: the names in
// backquotes in its "Collectives:" paragraph before "declines", sorted (empty: no such
// paragraph).
std::vector<std::string> documentedCollectives(const std::string& scheduler) {
  std::ifstream in(std::string(COLLIE_TEST_SOURCE_DIR) + "/plugins/" + scheduler + "/README.md");
  std::string paragraph;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Collectives:", 0) == 0) inside = true;
    if (inside && line.empty()) break;
    if (inside) paragraph += line + " ";
  }
  paragraph = paragraph.substr(0, paragraph.find("declin"));
  std::set<std::string> names;
  const std::regex quoted("`([a-z_]+)`");
  for (std::sregex_iterator m(paragraph.begin(), paragraph.end(), quoted), end; m != end; ++m) {
    Collective coll;
    if (parseCollective((*m)[1], &coll)) names.insert((*m)[1]);
  }
  return {names.begin(), names.end()};
}

class Conformance : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Every collective the README names passes on every group size, and every other one is
// declined (auto takes what its candidates take: its README lists no collectives).
TEST_P(Conformance, FullMatrix) {
  auto [scheduler, world] = GetParam();
  auto report = runMatrix(pluginRef(scheduler), world, 1000003);
  EXPECT_TRUE(report.ok()) << check::describe(scheduler, report);
  EXPECT_GT(report.passed, 0u) << check::describe(scheduler, report);
  if (scheduler == "auto") return;
  const std::vector<std::string> documented = documentedCollectives(scheduler);
  ASSERT_FALSE(documented.empty())
      << "plugins/" << scheduler << "/README.md has no \"Collectives:\" paragraph";
  EXPECT_EQ(report.accepted, documented)
      << "what " << scheduler << " accepted on " << world << " ranks differs from its README\n"
      << check::describe(scheduler, report);
}

INSTANTIATE_TEST_SUITE_P(
    Schedulers, Conformance,
    ::testing::Combine(::testing::Values("ring", "tree", "halving_doubling", "hierarchical", "auto",
                                         "recursive_doubling", "swing", "bidirectional_ring",
                                         "double_binary_tree", "knomial", "bruck"),
                       ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 16)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_w" + std::to_string(std::get<1>(info.param));
    });

// The variants a param selects, on the group sizes whose shapes differ (powers of two and
// not, a fold, a partial last level).
class Variants : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Variants, FullMatrix) {
  auto [variant, world] = GetParam();
  const auto ref = variant == "swing_latency"    ? pluginRef("swing", "variant", "latency")
                   : variant == "knomial_radix2" ? pluginRef("knomial", "radix", "2")
                                                 : pluginRef("knomial", "radix", "3");
  auto report = runMatrix(ref, world, 1000003);
  EXPECT_TRUE(report.ok()) << check::describe(variant, report);
  EXPECT_GT(report.passed, 0u) << check::describe(variant, report);
}

INSTANTIATE_TEST_SUITE_P(Schedulers, Variants,
                         ::testing::Combine(::testing::Values("swing_latency", "knomial_radix2"),
                                            ::testing::Values(2, 3, 5, 8, 9, 16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_w" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Segments and chunks of a few elements, so that every count above 1 takes several messages
// per step (double_binary_tree at 64 bytes: at 8 its 1000-element cases post thousands of
// receives per rank and the loopback's wake-ups take most of a minute).
class TinyChunks : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TinyChunks, ReachEveryMultiSegmentPath) {
  auto [scheduler, world] = GetParam();
  const char* param =
      scheduler == "ring" || scheduler == "bidirectional_ring" || scheduler == "hierarchical"
          ? "chunk_bytes"
          : "segment_bytes";
  auto report = runMatrix(
      pluginRef(scheduler, param, scheduler == "double_binary_tree" ? "64" : "8"), world, 0);
  EXPECT_TRUE(report.ok()) << check::describe(scheduler, report);
}

INSTANTIATE_TEST_SUITE_P(Schedulers, TinyChunks,
                         ::testing::Combine(::testing::Values("ring", "tree", "bidirectional_ring",
                                                              "double_binary_tree", "knomial"),
                                            ::testing::Values(2, 3, 5, 8)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_w" +
                                  std::to_string(std::get<1>(info.param));
                         });

// hierarchical's pipeline (up to 64 chunks, the last shorter) on 2, 3 and 4 emulated nodes
// of 2 and 3 ranks: the node's steps on one thread, the column's on another.
INSTANTIATE_TEST_SUITE_P(Pipelined, TinyChunks,
                         ::testing::Combine(::testing::Values("hierarchical"),
                                            ::testing::Values(4, 6, 8, 9)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_w" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(Conformance, NativeDeclinesEverythingOnLoopback) {
  auto report = runMatrix(pluginRef("native"), 2, 0);
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.passed, 0u);
  ASSERT_FALSE(report.declines.empty());
  EXPECT_TRUE(
      testing::contains(report.declines[0].first, {"native: the backend has no native allreduce"}));
}

TEST(Conformance, BrokenSchedulerIsCaughtWithTheCasesNamed) {
  auto lossy = pluginRef(std::string(COLLIE_TEST_BINARY_DIR) +
                         "/conformance/plugins/libcollie_scheduler_lossy.so");
  lossy.label = "lossy";
  auto report = runMatrix(lossy, 3, 0);
  ASSERT_FALSE(report.ok());
  std::string text = check::describe("lossy", report);
  EXPECT_TRUE(testing::contains(
      text, {"FAIL lossy", "allreduce, 3 ranks, f32 sum, 7 elements: 3 wrong elements"}));
  EXPECT_GT(report.passed, 0u) << "the easy cases still pass";
}

TEST(Conformance, SwappedEqualBlocksAreCaught) {
  // Two swapped halves of 500 elements hold the same values under an input that repeats
  // every 5 elements (the sum's): the inputs must not repeat.
  auto swapped = pluginRef(
      std::string(COLLIE_TEST_BINARY_DIR) + "/conformance/plugins/libcollie_scheduler_lossy.so",
      "bug", "swap");
  swapped.label = "swapped";
  check::Options options;
  options.worlds = {2};
  options.large_count = 0;
  options.ops = {ReduceOp::kSum};
  options.dtypes = {DType::kF32, DType::kBF16};
  auto report =
      check::checkScheduler(testing::buildTreeLoader(), swapped, pluginRef("loopback"), options);
  const std::string text = check::describe("swapped", report);
  EXPECT_TRUE(testing::contains(text, {"allreduce, 2 ranks, f32 sum, 1000 elements",
                                       "allreduce, 2 ranks, bf16 sum, 1000 elements"}));
}

}  // namespace
}  // namespace collie
