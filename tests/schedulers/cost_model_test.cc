// The α-β-γ predictions, auto's choices (built-in and from a rules file), and rules files.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

TEST(CostModel, HierarchicalColumnsShareTheNodesLink) {
  // 2 nodes x 2 ranks, a link between nodes 100x slower than inside: for a large message
  // the link decides. A host-ordered ring sends 1.5 m across each node's link, hierarchical
  // m (two columns of m/2 each, at once, sharing it): 1.5x, not the 3x of columns that each
  // had the whole link.
  Params params;
  params.set("intra", "ring");
  params.set("inter", "ring");
  Params one_message;
  one_message.set("chunk_bytes", "1GiB");
  auto hier = loadScheduler("hierarchical", params), ring = loadScheduler("ring", one_message);
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel lab = model(0, 100.0, 1e6);
  lab.inter = {0, 1.0 / 1e9};
  // ring over the slow level (a ring's steps all cross it, 1.5 m per rank) against
  // hierarchical's split.
  CostModel flat = lab;
  flat.intra = lab.inter;
  const auto args = allreduceOf(64 << 20);
  const double ratio = ring->predictSeconds(args, Topology::singleNode(4), flat) /
                       hier->predictSeconds(args, two_nodes, lab);
  EXPECT_NEAR(ratio, 1.5, 0.1);
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

TEST(Auto, ARuleRunsItsSchedulerWithTheParamsItWasMeasuredWith) {
  std::string path = testing::writeTempFile("seg.yaml", R"(collective: allreduce
rules:
  - {plugin: tree, params: {segment_bytes: 4KiB}}
)");
  Params params;
  params.set("rules_file", path);
  auto chooser = loadScheduler("auto", params);
  Params small;
  small.set("segment_bytes", "4KiB");
  auto segmented = loadScheduler("tree", small), plain = loadScheduler("tree");
  Topology t = Topology::singleNode(4);
  CostModel any = model(30e-6, 2.0, 3.0);
  const auto args = allreduceOf(1 << 20);
  ASSERT_NE(segmented->predictSeconds(args, t, any), plain->predictSeconds(args, t, any));
  EXPECT_DOUBLE_EQ(chooser->predictSeconds(args, t, any), segmented->predictSeconds(args, t, any));
  EXPECT_EQ(chooser->accepts(args, t).reason, "tree{segment_bytes: 4KiB}");
}

TEST(Auto, RulesMeasuredForAnotherGroupOrCollectiveDoNotApply) {
  // Measured on 8 ranks: on 4 ranks auto chooses by the model, not by the file.
  std::string path = testing::writeTempFile("eight.yaml", R"(collective: allreduce
world_size: 8
rules:
  - {plugin: tree}
)");
  Params params;
  params.set("rules_file", path);
  auto chooser = loadScheduler("auto", params);
  Topology four = Topology::singleNode(4), eight = Topology::singleNode(8);
  const auto large = allreduceOf(64 << 20);  // the model picks ring or halving_doubling here
  EXPECT_NE(chooser->accepts(large, four).reason, "tree");
  EXPECT_EQ(chooser->accepts(large, eight).reason, "tree");
  CollectiveArgs gather = large;
  gather.coll = Collective::kAllGather;  // the file is for allreduce
  EXPECT_NE(chooser->accepts(gather, eight).reason, "tree");
}

TEST(Auto, ACalibrationFileReplacesTheBuiltInModel) {
  // A slow link with no per-message cost (1 MB/s, α 1 ns): auto's choice at every size is
  // the lowest prediction under this model, which is not what the built-in model picks.
  std::string path = testing::writeTempFile("cal.json", R"({"intra": {"alpha": 1e-9, "beta": 1e-6},
 "inter": {"alpha": 1e-9, "beta": 1e-6}, "gamma": 1e-12})");
  Params params;
  params.set("calibration", path);
  auto chooser = loadScheduler("auto", params), plain = loadScheduler("auto");
  const CostModel slow{{1e-9, 1e-6}, {1e-9, 1e-6}, 1e-12};
  Topology t = Topology::singleNode(6);
  std::map<std::string, std::shared_ptr<Scheduler>> candidates = {
      {"ring", loadScheduler("ring")},
      {"tree", loadScheduler("tree")},
      {"halving_doubling", loadScheduler("halving_doubling")}};
  int differ = 0;
  for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
    std::string best;
    double best_time = INFINITY;
    for (const auto& [name, s] : candidates) {
      const double p = s->predictSeconds(allreduceOf(bytes), t, slow);
      if (p < best_time) best_time = p, best = name;
    }
    EXPECT_EQ(chooser->accepts(allreduceOf(bytes), t).reason, best) << bytes;
    differ += plain->accepts(allreduceOf(bytes), t).reason != best ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "the calibration changed no choice";
  // A file that is not a calibration is refused, naming it.
  Params bad;
  bad.set("calibration", testing::writeTempFile("bad.json", "{\"intra\": 3}"));
  try {
    loadScheduler("auto", bad);
    FAIL() << "accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is not a calibration the bench wrote"), std::string::npos)
        << e.what();
  }
}

TEST(Rules, RoundTripAndLocatedErrors) {
  RulesFile rules;
  rules.world_size = 4;
  rules.backend = "loopback";
  rules.rules = {{256 << 10, {"tree", {}}},
                 {1 << 20, {"hierarchical", {{"intra", "ring"}, {"inter", "tree"}}}},
                 {0, {"ring", {}}}};
  std::string path = testing::writeTempFile("out-rules.yaml", "");
  config::writeRulesFile(path, rules, "test");
  RulesFile back = config::readRulesFile(path);
  ASSERT_EQ(back.rules.size(), 3u);
  EXPECT_EQ(back.rules[0].max_bytes, 256u << 10);
  // A scheduler's params survive the round trip: hierarchical stays {intra ring, inter tree}.
  EXPECT_EQ(back.rules[1].choice.plugin, "hierarchical");
  EXPECT_EQ(back.rules[1].choice.params,
            (std::map<std::string, std::string>{{"intra", "ring"}, {"inter", "tree"}}));
  EXPECT_EQ(back.rules[1].choice.name(), "hierarchical{inter: tree, intra: ring}");
  EXPECT_EQ(back.rules[2].choice.name(), "ring");
  EXPECT_EQ(firstAdmitting(back.rules, 4096)->choice.plugin, "tree");
  EXPECT_EQ(firstAdmitting(back.rules, 1 << 30)->choice.plugin, "ring");
  EXPECT_EQ(
      firstAdmitting(back.rules, 4096, [](const auto& r) { return r.choice.plugin != "tree"; })
          ->choice.plugin,
      "hierarchical");
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
