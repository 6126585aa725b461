// The Open MPI policy: collie's schedulers mapped to the Open MPI 4.1 algorithms that run the
// same schedule, the classic rules text, and the strict reader that checks it.
#include "bench/policy.h"

#include <gtest/gtest.h>

#include "collie/error.h"
#include "expect.h"

namespace collie::bench {
namespace {

RulesFile measured() {
  RulesFile rules;
  rules.collective = "allreduce";
  rules.world_size = 4;
  rules.rules = {{32 << 10, RuleChoice{"recursive_doubling", {}}},
                 {1 << 20, RuleChoice{"tree", {{"segment_bytes", "65536"}}}},
                 {0, RuleChoice{"/opt/collie/libcollie_scheduler_ring.so", {}}}};
  return rules;
}

TEST(OpenMpiPolicy, EachRangeGetsTheEquivalentAlgorithmOrOpenMpisOwnDecision) {
  const OpenMpiPolicy policy = openMpiPolicy(measured());
  EXPECT_EQ(policy.collective_id, 2);
  EXPECT_EQ(policy.world_size, 4);
  ASSERT_EQ(policy.ranges.size(), 3u);
  EXPECT_EQ(policy.ranges[0].min_bytes, 0u);
  EXPECT_EQ(policy.ranges[0].algorithm.id, 3);
  EXPECT_EQ(policy.ranges[1].min_bytes, (32u << 10) + 1);
  EXPECT_EQ(policy.ranges[1].algorithm.id, 0);  // no Open MPI algorithm is collie's tree
  EXPECT_EQ(policy.ranges[1].scheduler, "tree{segment_bytes: 65536}");
  EXPECT_EQ(policy.ranges[2].min_bytes, (1u << 20) + 1);
  EXPECT_EQ(policy.ranges[2].algorithm.id, 4);  // a path to the ring plugin is ring
  // halving_doubling halves farthest partner first, Open MPI's rabenseifner nearest first.
  EXPECT_EQ(openMpiEquivalent("allreduce", RuleChoice{"halving_doubling", {}}).id, 0);
  EXPECT_EQ(openMpiEquivalent("allgather", RuleChoice{"bruck", {}}).id, 2);
  EXPECT_EQ(openMpiEquivalent("allgather", RuleChoice{"recursive_doubling", {}}).id, 0);
}

TEST(OpenMpiPolicy, TheTextReadsBackForTheMeasuredGroupOnly) {
  const std::string text = openMpiRulesText(openMpiPolicy(measured()), "a test");
  const OpenMpiPolicy four = readOpenMpiRules(text, 4);
  ASSERT_EQ(four.ranges.size(), 3u);
  EXPECT_EQ(four.ranges[1].min_bytes, (32u << 10) + 1);
  EXPECT_EQ(four.ranges[2].algorithm.id, 4);
  for (int other : {2, 3, 5, 64}) {
    const OpenMpiPolicy policy = readOpenMpiRules(text, other);
    ASSERT_EQ(policy.ranges.size(), 1u) << other;
    EXPECT_EQ(policy.ranges[0].algorithm.id, 0) << other;  // Open MPI's own decision
  }
}

TEST(OpenMpiPolicy, AMalformedFileIsRefusedNamingWhy) {
  auto refusal = [](const std::string& text) {
    try {
      readOpenMpiRules(text, 4);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(read)");
  };
  EXPECT_TRUE(
      testing::contains(refusal("1 2 1 4 1 16 4 0 0"), {"the first message size must be 0"}));
  EXPECT_TRUE(
      testing::contains(refusal("1 2 1 4 2 0 4 0 0 0 3 0 0"), {"message sizes must ascend"}));
  EXPECT_TRUE(testing::contains(refusal("1 2 1 4 2 0 4 0 0"), {"ends where a message size"}));
  EXPECT_TRUE(testing::contains(refusal("1 2 1 4 1 0 4 0 0 7"), {"numbers after the last rule"}));
  EXPECT_TRUE(testing::contains(refusal("1 2 1 4 1 0 -4 0 0"), {"'-' where an algorithm"}));
  EXPECT_EQ(refusal("# a comment 12\n1 2 1 4 1 0 4 0 0 # ring\n"), "(read)");
}

// A measured range that ends at a size, as the last one, leaves larger sizes to Open MPI;
// rules whose sizes do not ascend are not written.
TEST(OpenMpiPolicy, RangesAreWhatTheRulesCoverAndNoMore) {
  RulesFile ends = measured();
  ends.rules.back().max_bytes = 8 << 20;
  const OpenMpiPolicy policy = openMpiPolicy(ends);
  ASSERT_EQ(policy.ranges.size(), 4u);
  EXPECT_EQ(policy.ranges[3].min_bytes, (8u << 20) + 1);
  EXPECT_EQ(policy.ranges[3].algorithm.id, 0);
  RulesFile shadowed = measured();
  shadowed.rules[1].max_bytes = 1024;  // below the first rule's 32 KiB
  EXPECT_THROW(openMpiPolicy(shadowed), InternalError);
  RulesFile early_any = measured();
  early_any.rules[0].max_bytes = 0;  // "any size" before the last rule
  EXPECT_THROW(openMpiPolicy(early_any), InternalError);
}

TEST(OpenMpiPolicy, ACollectiveOpenMpisRulesCannotNameIsRefused) {
  RulesFile rules = measured();
  rules.collective = "broadcast";
  EXPECT_THROW(openMpiPolicy(rules), ConfigError);
}

}  // namespace
}  // namespace collie::bench
