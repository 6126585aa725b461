// The α-β-γ predictions, auto's choices (built-in and from a rules file), and rules files.
#include <gtest/gtest.h>

#include <cmath>

#include "collie/error.h"
#include "collie/rules.h"
#include "config/rules.h"
#include "loopback_job.h"
#include "run_command.h"

namespace collie {
namespace {

using testing::loadScheduler;

CollectiveArgs allreduceOf(uint64_t bytes) {
  CollectiveArgs args;
  args.data.count = bytes / 4;
  args.data.dtype = DType::kF32;
  return args;
}

CostModel model(double alpha, double gbps, double gamma_gbps) {
  CostModel m;
  m.intra = {alpha, 1.0 / (gbps * 1e9)};
  m.inter = m.intra;
  m.gamma = 1.0 / (gamma_gbps * 1e9);
  return m;
}

TEST(CostModel, RingMatchesItsClosedForm) {
  Params params;
  params.set("chunk_bytes", "1GiB");  // one message per step
  auto ring = loadScheduler("ring", params);
  const double m = 8 << 20, n = 4;
  CostModel cm = model(10e-6, 1.0, 4.0);
  double expected =
      2 * (n - 1) * 10e-6 + 2 * (n - 1) / n * m * cm.intra.beta + (n - 1) / n * m * cm.gamma;
  EXPECT_NEAR(ring->predictSeconds(allreduceOf(8 << 20), Topology::singleNode(4), cm), expected,
              expected * 1e-9);
}

TEST(CostModel, LatencyFavoursTreeAndBandwidthFavoursRing) {
  auto ring = loadScheduler("ring"), tree = loadScheduler("tree");
  CostModel cm = model(50e-6, 1.0, 4.0);
  Topology eight = Topology::singleNode(8);
  EXPECT_LT(tree->predictSeconds(allreduceOf(4096), eight, cm),
            ring->predictSeconds(allreduceOf(4096), eight, cm));
  EXPECT_LT(ring->predictSeconds(allreduceOf(64 << 20), eight, cm),
            tree->predictSeconds(allreduceOf(64 << 20), eight, cm));
}

TEST(CostModel, HalvingDoublingPaysForTheFoldOffPowersOfTwo) {
  auto hd = loadScheduler("halving_doubling");
  CostModel cm = model(10e-6, 1.0, 4.0);
  EXPECT_GT(hd->predictSeconds(allreduceOf(1 << 20), Topology::singleNode(5), cm),
            hd->predictSeconds(allreduceOf(1 << 20), Topology::singleNode(4), cm));
}

TEST(CostModel, HierarchicalUsesTheSlowerLinkForItsInterPart) {
  Params params;
  params.set("intra", "ring");
  params.set("inter", "ring");
  auto hier = loadScheduler("hierarchical", params);
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel fast = model(10e-6, 10.0, 4.0), slow_between = fast;
  slow_between.inter = {100e-6, 1.0 / 0.1e9};
  EXPECT_GT(hier->predictSeconds(allreduceOf(1 << 20), two_nodes, slow_between),
            hier->predictSeconds(allreduceOf(1 << 20), two_nodes, fast));
}

TEST(Auto, BuiltInChoiceIsTheLowestPrediction) {
  auto chooser = loadScheduler("auto");
  auto tree = loadScheduler("tree"), ring = loadScheduler("ring"),
       hd = loadScheduler("halving_doubling");
  Topology t = Topology::singleNode(8);
  CostModel any = model(30e-6, 2.0, 3.0);
  for (uint64_t bytes : {4096ull, 1ull << 20, 64ull << 20}) {
    double best = std::min({tree->predictSeconds(allreduceOf(bytes), t, any),
                            ring->predictSeconds(allreduceOf(bytes), t, any),
                            hd->predictSeconds(allreduceOf(bytes), t, any)});
    EXPECT_DOUBLE_EQ(chooser->predictSeconds(allreduceOf(bytes), t, any), best) << bytes;
  }
}

TEST(Auto, RulesFileDecidesAndADecliningRuleFallsThrough) {
  std::string path = testing::writeTempFile("rules.yaml", R"(collective: allreduce
world_size: 4
rules:
  - {max_bytes: 64KiB, plugin: ring}
  - {plugin: tree}
)");
  Params params;
  params.set("rules_file", path);
  auto chooser = loadScheduler("auto", params);
  auto ring = loadScheduler("ring"), tree = loadScheduler("tree");
  Topology t = Topology::singleNode(4);
  CostModel any = model(30e-6, 2.0, 3.0);
  EXPECT_DOUBLE_EQ(chooser->predictSeconds(allreduceOf(4096), t, any),
                   ring->predictSeconds(allreduceOf(4096), t, any));
  EXPECT_DOUBLE_EQ(chooser->predictSeconds(allreduceOf(1 << 20), t, any),
                   tree->predictSeconds(allreduceOf(1 << 20), t, any));
  CollectiveArgs rs = allreduceOf(1 << 20);  // tree declines reduce_scatter: ring takes it
  rs.coll = Collective::kReduceScatter;
  EXPECT_TRUE(chooser->accepts(rs, t).accepted);
}

TEST(Rules, RoundTripAndLocatedErrors) {
  RulesFile rules;
  rules.world_size = 4;
  rules.backend = "loopback";
  rules.rules = {{256 << 10, "tree"}, {0, "ring"}};
  std::string path = testing::writeTempFile("out-rules.yaml", "");
  config::writeRulesFile(path, rules, "test");
  RulesFile back = config::readRulesFile(path);
  ASSERT_EQ(back.rules.size(), 2u);
  EXPECT_EQ(back.rules[0].max_bytes, 256u << 10);
  EXPECT_EQ(back.rules[1].choice, "ring");
  EXPECT_EQ(firstAdmitting(back.rules, 4096)->choice, "tree");
  EXPECT_EQ(firstAdmitting(back.rules, 1 << 30)->choice, "ring");
  EXPECT_EQ(
      firstAdmitting(back.rules, 4096, [](const auto& r) { return r.choice != "tree"; })->choice,
      "ring");
  std::string bad =
      testing::writeTempFile("bad-rules.yaml", "rules:\n  - {max_bytes: huge, plugin: ring}\n");
  try {
    config::readRulesFile(bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad-rules.yaml:2:17: rules[0].max_bytes"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace collie
