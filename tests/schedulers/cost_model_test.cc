// The α-β-γ predictions, auto's choices (built-in and from a rules file), and rules files.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "collie/cost_model_json.h"
#include "collie/error.h"
#include "collie/rules.h"
#include "config/rules.h"
#include "expect.h"
#include "loopback_job.h"
#include "measure/calibrate.h"
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

TEST(CostModel, HierarchicalOfOneLevelIsThatLevelsAllReduce) {
  // One node: ring's all-reduce inside it. One rank a node: tree's between the nodes, on
  // the link between them.
  Params params;
  params.set("intra", "ring");
  params.set("inter", "tree");
  auto hier = loadScheduler("hierarchical", params);
  CostModel cm = model(10e-6, 10.0, 4.0);
  cm.inter = {100e-6, 1.0 / 0.1e9};
  CostModel between = cm;
  between.intra = cm.inter;
  const auto args = allreduceOf(64 << 20);
  const Topology four = Topology::singleNode(4);
  EXPECT_DOUBLE_EQ(hier->predictSeconds(args, Topology::fromLabels({"a", "a", "a", "a"}), cm),
                   loadScheduler("ring")->predictSeconds(args, four, cm));
  EXPECT_DOUBLE_EQ(hier->predictSeconds(args, Topology::fromLabels({"a", "b", "c", "d"}), cm),
                   loadScheduler("tree")->predictSeconds(args, four, between));
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
  const auto args = allreduceOf(64 << 20);
  const double ratio =
      ring->predictSeconds(args, two_nodes, lab) / hier->predictSeconds(args, two_nodes, lab);
  EXPECT_NEAR(ratio, 1.5, 0.1);
}

TEST(CostModel, HierarchicalPipelineHidesTheFasterLevel) {
  // Inside the nodes as slow as between them: without the pipeline the two levels add up;
  // with 16 chunks of 4 MiB the slower level sets the pace and the other is hidden but for
  // one chunk, (K - 1)·max(I, A) + I + A = 17/16 of one level's time.
  Params piped, whole;
  whole.set("chunk_bytes", "0");
  auto pipeline = loadScheduler("hierarchical", piped),
       sequential = loadScheduler("hierarchical", whole);
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel cm = model(0, 1.0, 1e6);  // the intra ring of one chunk: the same bytes per β
  cm.inter = {0, 1.0 / 1e9};
  const auto args = allreduceOf(64 << 20);
  const double ratio = sequential->predictSeconds(args, two_nodes, cm) /
                       pipeline->predictSeconds(args, two_nodes, cm);
  EXPECT_GT(ratio, 1.5);
  EXPECT_LT(ratio, 2.0);
}

TEST(CostModel, FlowsLeavingOneNodeShareItsLink) {
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel cm = model(0, 100.0, 1e6);
  cm.inter = {1e-3, 1.0 / 1e9};
  const double m = 1e9;
  // One flow alone on the link between the nodes: α + m·β.
  EXPECT_NEAR(stepSeconds({{0, 2, m}}, two_nodes, cm), 1.001, 1e-9);
  // Both ranks of node a send to node b at once: the link carries 2m.
  EXPECT_NEAR(stepSeconds({{0, 2, m}, {1, 3, m}}, two_nodes, cm), 2.001, 1e-9);
  // Opposite directions do not meet: each node's link out carries one flow.
  EXPECT_NEAR(stepSeconds({{0, 2, m}, {3, 1, m}}, two_nodes, cm), 1.001, 1e-9);
  // Inside a node a flow pays the inside level, and a rank's own way out is shared by what
  // it sends; the slowest flow ends the step.
  EXPECT_NEAR(stepSeconds({{0, 1, m}}, two_nodes, cm), m * cm.intra.beta, 1e-9);
  EXPECT_NEAR(stepSeconds({{0, 1, m, 4}, {0, 1, m}}, two_nodes, cm), 2 * m * cm.intra.beta, 1e-9);
  // Messages pay α each.
  EXPECT_NEAR(stepSeconds({{0, 2, 0, 3}}, two_nodes, cm), 3e-3, 1e-12);
  EXPECT_EQ(stepSeconds({}, two_nodes, cm), 0);
}

TEST(CostModel, AFlowWhoseWayBackIsIdlePaysTheOneWayBeta) {
  // Between nodes 1 GB/s each way of an exchange, 1.25 GB/s one way (the calibration's
  // stream): a flow pays the one-way β unless its way back (the sender's way in, the
  // receiver's way out) carries data.
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel cm = model(0, 100.0, 1e6);
  cm.inter = {0, 1.0 / 1e9, 1.0 / 1.25e9};
  const double m = 1e9;
  EXPECT_NEAR(stepSeconds({{0, 2, m}}, two_nodes, cm), 0.8, 1e-9);
  // Two flows one way share the link at the one-way rate: a tree's phase.
  EXPECT_NEAR(stepSeconds({{0, 2, m}, {1, 3, m}}, two_nodes, cm), 1.6, 1e-9);
  // Both ways at once, from different ranks too: a ring's step across two hosts.
  for (double t : flowSeconds({{1, 2, m}, {3, 0, m}}, two_nodes, cm)) EXPECT_NEAR(t, 1.0, 1e-9);
  // Traffic inside a node is not the link's way back.
  EXPECT_NEAR(stepSeconds({{0, 2, m}, {3, 2, 1}}, two_nodes, cm), 0.8, 1e-9);
  // Not measured (0): as β.
  cm.inter.beta_one_way = 0;
  EXPECT_NEAR(stepSeconds({{0, 2, m}}, two_nodes, cm), 1.0, 1e-9);
}

// 4 ranks on one node whose cores they share, as the calibration measures it: a pair alone
// pays 10 us and 2 GB/s per message, each of the exchange's 4 flows at once 40 us and 1 GB/s.
CostModel sharedCores() {
  CostModel cm = model(40e-6, 1.0, 1e6);
  cm.intra.alpha_alone = 10e-6;
  cm.intra.beta_alone = 1.0 / 2e9;
  cm.intra.flows = 4;
  return cm;
}

TEST(CostModel, RanksThatShareCoresShareTheNodesCapacity) {
  const Topology four = Topology::singleNode(4);
  const CostModel cm = sharedCores();
  const double m = 1e6, exchange = 40e-6 + 1e-3;
  // The calibration's own pattern, a shift around the node's ring: what each flow met.
  EXPECT_NEAR(stepSeconds({{0, 1, m}, {1, 2, m}, {2, 3, m}, {3, 0, m}}, four, cm), exchange, 1e-12);
  // One flow alone: a pair's price (0.51 ms), more than its share of the node (0.26 ms).
  EXPECT_NEAR(stepSeconds({{0, 1, m}}, four, cm), 10e-6 + 0.5e-3, 1e-12);
  // Two flows into one rank: its way in carries 2m at a pair's β.
  EXPECT_NEAR(stepSeconds({{1, 0, m}, {2, 0, m}}, four, cm), 10e-6 + 1e-3, 1e-12);
  // Three flows between different ranks: the node's share (3/4 of the exchange's work) is
  // the longer.
  EXPECT_NEAR(stepSeconds({{0, 1, m}, {1, 2, m}, {2, 3, m}}, four, cm), 0.75 * exchange, 1e-12);
  // Without a pair measured alone nothing is shared: every flow pays the exchange's price.
  CostModel plain = sharedCores();
  plain.intra.alpha_alone = plain.intra.beta_alone = 0;
  EXPECT_NEAR(stepSeconds({{0, 1, m}}, four, plain), exchange, 1e-12);
  // Between nodes the cores of a node play no part.
  const Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel across = sharedCores();
  across.inter = {1e-3, 1.0 / 1e9};
  EXPECT_NEAR(stepSeconds({{0, 2, m}}, two_nodes, across), 1e-3 + 1e-3, 1e-12);
}

// Inside a node β follows the collective's buffers: the probe sizes' β either side,
// interpolated in log(bytes), the nearest's beyond them; nothing changes without them.
TEST(CostModel, ABuffersBetaIsTheProbesEitherSideOfIt) {
  CostModel cm = model(10e-6, 1.0, 4.0);  // the line: 1 GB/s
  EXPECT_EQ(cm.forBuffer(1 << 20).intra.beta, cm.intra.beta);
  cm.intra.beta_alone = 0.5e-9;
  cm.intra.by_buffer = {{4096, 0.1e-9, 0.05e-9}, {65536, 0.2e-9, 0}, {1 << 20, 1e-9, 0.5e-9}};
  EXPECT_DOUBLE_EQ(cm.forBuffer(8).intra.beta, 0.1e-9);       // below the smallest: its β
  EXPECT_DOUBLE_EQ(cm.forBuffer(4096).intra.beta, 0.1e-9);    // at a probe: that probe's
  EXPECT_DOUBLE_EQ(cm.forBuffer(16384).intra.beta, 0.15e-9);  // halfway in log(bytes)
  EXPECT_DOUBLE_EQ(cm.forBuffer(256 << 10).intra.beta, 0.6e-9);
  EXPECT_DOUBLE_EQ(cm.forBuffer(64 << 20).intra.beta, 1e-9);  // past the largest: its β
  EXPECT_DOUBLE_EQ(cm.forBuffer(8).intra.beta_alone, 0.05e-9);
  // A pair alone not measured at one of the two sizes: the line's.
  EXPECT_DOUBLE_EQ(cm.forBuffer(16384).intra.beta_alone, 0.5e-9);
  EXPECT_TRUE(cm.forBuffer(16384).intra.by_buffer.empty());  // sized once
  EXPECT_EQ(cm.forBuffer(16384).intra.alpha, cm.intra.alpha);
  // A ring of 64 KiB on 4 ranks pays 64 KiB buffers' β for its 16 KiB blocks.
  auto ring = loadScheduler("ring");
  const Topology four = Topology::singleNode(4);
  const double block = 16384, sized = 6 * (10e-6 + block * 0.2e-9) + 0.75 * 65536 * cm.gamma;
  EXPECT_NEAR(ring->predictSeconds(allreduceOf(65536), four, cm.forBuffer(65536)), sized, 1e-12);
  // predictCollective, how the framework and auto ask, sizes the model so.
  EXPECT_NEAR(predictCollective(*ring, allreduceOf(65536), four, cm), sized, 1e-12);
  EXPECT_GT(ring->predictSeconds(allreduceOf(65536), four, cm), sized * 1.2);
}

// A flow of several messages posted at once is a stream: α for the first, the gap for each
// further one. Without a gap measured every message pays α, as before it was.
TEST(CostModel, AStreamPaysTheGapForEachMessageAfterTheFirst) {
  const Topology two = Topology::singleNode(2);
  CostModel cm = model(100e-6, 1.0, 4.0);
  const double m = 1e6, bytes = m * cm.intra.beta;
  EXPECT_NEAR(stepSeconds({{0, 1, m, 16}}, two, cm), 16 * 100e-6 + bytes, 1e-12);
  cm.intra.gap = 5e-6;
  EXPECT_NEAR(stepSeconds({{0, 1, m, 16}}, two, cm), 100e-6 + 15 * 5e-6 + bytes, 1e-12);
  EXPECT_NEAR(stepSeconds({{0, 1, m, 1}}, two, cm), 100e-6 + bytes, 1e-12);
  EXPECT_NEAR(stepSeconds({{0, 1, m, 0}}, two, cm), bytes, 1e-12);  // no message, no α
  // A ring of 4 MiB blocks in 64 KiB chunks: 64 messages a step, 63 of them at the gap.
  Params params;
  params.set("chunk_bytes", "64KiB");
  auto ring = loadScheduler("ring", params);
  const Topology four = Topology::singleNode(4);
  cm.inter = cm.intra;
  const double step = 100e-6 + 63 * 5e-6 + (4 << 20) * cm.intra.beta;
  EXPECT_NEAR(ring->predictSeconds(allreduceOf(16 << 20), four, cm),
              6 * step + 0.75 * (16 << 20) * cm.gamma, 1e-12);
  // Where ranks share cores the node's share counts each flow's α once and the gap for the
  // rest, and a pair alone streams at the same gap.
  CostModel shared = sharedCores();
  shared.intra.gap = 5e-6;
  const double exchange = 40e-6 + 1e-3;
  EXPECT_NEAR(stepSeconds({{0, 1, m, 8}, {1, 2, m, 8}, {2, 3, m, 8}, {3, 0, m, 8}}, four, shared),
              exchange + 7 * 5e-6, 1e-12);
  EXPECT_NEAR(stepSeconds({{0, 1, m, 8}}, four, shared), 10e-6 + 7 * 5e-6 + 0.5e-3, 1e-12);
}

TEST(CostModel, ASingleSegmentTreeMovesOneLevelAtATime) {
  // tree on 4 ranks, 0 with children 1 and 2, 1 with child 3. One segment of m: up, the
  // leaves send at once (3 -> 1 and 2 -> 0), then 1 -> 0 alone; down, 0 -> 1 and 0 -> 2
  // together (rank 0's way out carries 2m), then 1 -> 3. Each level's flows share the node
  // only among themselves; with many segments every edge is busy at once and shares it with
  // all the others.
  const Topology four = Topology::singleNode(4);
  const CostModel cm = sharedCores();
  auto tree = loadScheduler("tree");
  const double m = 64 << 10, exchange = 40e-6 + m / 1e9;
  const double one = std::max(10e-6 + m / 2e9, exchange / 4);
  const double pair = std::max(10e-6 + m / 2e9, 2 * exchange / 4);
  const double two = std::max(10e-6 + 2 * m / 2e9, 2 * exchange / 4);
  EXPECT_NEAR(tree->predictSeconds(allreduceOf(64 << 10), four, cm), pair + one + two + one, 1e-9);
}

TEST(CostModel, ATreesLaterSegmentsFollowTheFirstAsAStream) {
  // tree on 2 ranks, 8 segments of 64 KiB: up, 1 -> 0, then down, 0 -> 1. On each edge the
  // first segment pays α and each later one the gap; the root reduces each segment as it
  // lands (faster than the next one arrives), so only the last reduction adds to the time.
  Params params;
  params.set("segment_bytes", "64KiB");
  auto tree = loadScheduler("tree", params);
  const Topology two = Topology::singleNode(2);
  CostModel cm = model(100e-6, 1.0, 4.0);
  const double m = 64 << 10, mb = m * cm.intra.beta, reduce = m * cm.gamma;
  const auto args = allreduceOf(8 * (64 << 10));
  EXPECT_NEAR(tree->predictSeconds(args, two, cm), 2 * 8 * (100e-6 + mb) + reduce, 1e-12);
  cm.intra.gap = cm.inter.gap = 5e-6;
  EXPECT_NEAR(tree->predictSeconds(args, two, cm), 2 * (100e-6 + mb + 7 * (5e-6 + mb)) + reduce,
              1e-12);
}

TEST(CostModel, OnlyTheTreesPhasesRunOneWay) {
  // 2 nodes x 2 ranks, the link far slower than inside: with a one-way β 25 % faster than
  // an exchange's, the tree (whose phases each cross the link one way) is predicted 1.25x
  // faster; the ring and halving-doubling, which cross both ways at once, are not.
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel both = model(0, 1000.0, 1e6);
  both.inter = {0, 1.0 / 1e9};
  CostModel one_way = both;
  one_way.inter.beta_one_way = 1.0 / 1.25e9;
  const auto args = allreduceOf(64 << 20);
  for (const char* name : {"ring", "halving_doubling", "tree"}) {
    auto s = loadScheduler(name);
    const double ratio =
        s->predictSeconds(args, two_nodes, both) / s->predictSeconds(args, two_nodes, one_way);
    EXPECT_NEAR(ratio, std::string(name) == "tree" ? 1.25 : 1.0, 0.02) << name;
  }
}

TEST(CostModel, FlatSchedulesOverTwoNodesPayForTheFlowsThatShareTheLink) {
  // 2 nodes x 2 ranks, a link between nodes far slower than inside, large messages. A
  // host-ordered ring: one flow of m/4 per node per step, 6 steps, 1.5 m. Halving-doubling
  // first exchanges halves across the link, both ranks of a node at once (m out of each
  // node), and last doubles back the same way: 2 m. The tree (0 with children 1 and 2, 1
  // with child 3) sends both of node b's segments over its link going up and both of node
  // a's going down: 2 m each way, one phase after the other, 4 m.
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel lab = model(0, 1000.0, 1e6);
  lab.inter = {0, 1.0 / 1e9};
  const auto args = allreduceOf(64 << 20);
  const double m = 64 << 20, mb = m * lab.inter.beta;
  EXPECT_NEAR(loadScheduler("ring")->predictSeconds(args, two_nodes, lab), 1.5 * mb, 0.01 * mb);
  EXPECT_NEAR(loadScheduler("halving_doubling")->predictSeconds(args, two_nodes, lab), 2 * mb,
              0.01 * mb);
  EXPECT_NEAR(loadScheduler("tree")->predictSeconds(args, two_nodes, lab), 4 * mb, 0.03 * mb);
}

TEST(CostModel, ALinkThatBanksSavesWhatItStoodIdleUpToItsBank) {
  // The closed form: a call of 10 ms whose bytes between nodes take 4 ms of it, the bank
  // 1 ms. The bank refills in the 6 ms idle, so it saves its whole 1 ms.
  EXPECT_DOUBLE_EQ(bankedSeconds(10e-3, 4e-3, 1e-3), 9e-3);
  // A bank of 8 ms could save all 4 ms of the bytes, but the direction, busy for its bytes'
  // 4 ms, stands idle only 3 ms a call (T = 7 ms): T = (10 + 4) / 2.
  EXPECT_DOUBLE_EQ(bankedSeconds(10e-3, 4e-3, 8e-3), 7e-3);
  EXPECT_DOUBLE_EQ(bankedSeconds(10e-3, 0, 8e-3), 10e-3);  // nothing crosses: nothing saved
  EXPECT_DOUBLE_EQ(bankedSeconds(10e-3, 4e-3, 0), 10e-3);  // a wire
  // A link time that is no part of the call (a prediction not linear in β) saves nothing.
  EXPECT_DOUBLE_EQ(bankedSeconds(10e-3, 30e-3, 1e-3), 10e-3);
  EXPECT_DOUBLE_EQ(bankedSeconds(10e-3, INFINITY, 1e-3), 10e-3);
  // predictCollective finds the time of the bytes between nodes on the schedule's critical
  // path from its slope in β. A host-ordered ring of 2 nodes x 2 ranks moves 1.5 m across
  // each way, one flow a step (the previous test): 1.5 m β of its time.
  Topology two_nodes = Topology::fromLabels({"a", "a", "b", "b"});
  CostModel lab = model(10e-6, 1000.0, 1e6);
  lab.inter = {100e-6, 1.0 / 0.125e9};  // 1 Gbit/s
  auto ring = loadScheduler("ring");
  const auto args = allreduceOf(64 << 10);
  const double plain = ring->predictSeconds(args, two_nodes, lab);
  EXPECT_DOUBLE_EQ(predictCollective(*ring, args, two_nodes, lab), plain);  // no bank
  const double link = 1.5 * (64 << 10) * lab.inter.beta;
  lab.inter.bank = 128e3;
  const double banked = predictCollective(*ring, args, two_nodes, lab);
  EXPECT_NEAR(banked, bankedSeconds(plain, link, 128e3 * lab.inter.beta), 0.02 * plain);
  EXPECT_LT(banked, plain - 0.9 * std::min(link, (plain - link) / 2))
      << "64 KiB fits the bank: the ring saves what its link stands idle, up to its bytes' time";
  // auto prices its choice under the same bank once: as the ring itself.
  Params only_ring;
  only_ring.set("candidates", "ring");
  auto chooser = loadScheduler("auto", only_ring);
  chooser->useCostModel(lab);
  EXPECT_DOUBLE_EQ(predictCollective(*chooser, args, two_nodes, lab), banked);
  // On one node nothing crosses a link between nodes, whatever it banks.
  const Topology one_node = Topology::singleNode(4);
  EXPECT_DOUBLE_EQ(predictCollective(*ring, args, one_node, lab),
                   ring->predictSeconds(args, one_node, lab));
  // A message far past the bank saves at most the bank.
  const auto large = allreduceOf(64 << 20);
  const double large_plain = ring->predictSeconds(large, two_nodes, lab);
  EXPECT_NEAR(predictCollective(*ring, large, two_nodes, lab), large_plain - 128e3 * lab.inter.beta,
              1e-6);
}

using Candidates = std::vector<std::pair<std::string, std::shared_ptr<Scheduler>>>;

TEST(CostModel, RecursiveDoublingHalvesTheLatencyAndPaysInBytes) {
  auto rd = loadScheduler("recursive_doubling"), hd = loadScheduler("halving_doubling");
  CostModel cm = model(50e-6, 1.0, 4.0);
  Topology eight = Topology::singleNode(8);
  const double m = 4096;
  EXPECT_NEAR(rd->predictSeconds(allreduceOf(4096), eight, cm),
              3 * (50e-6 + m * cm.intra.beta + m * cm.gamma), 1e-12);
  EXPECT_LT(rd->predictSeconds(allreduceOf(4096), eight, cm),
            hd->predictSeconds(allreduceOf(4096), eight, cm));
  EXPECT_GT(rd->predictSeconds(allreduceOf(64 << 20), eight, cm),
            hd->predictSeconds(allreduceOf(64 << 20), eight, cm));
}

TEST(CostModel, DoubleBinaryTreeTakesHalfATreesTime) {
  // No latency: a large message's time is its bytes through the busiest port. One tree's
  // inner ranks take in two segments per beat going up and send two going down: 2m each
  // way. Two trees of m/2 each: a rank inner in one and a leaf in the other takes in two
  // half-size segments and sends two (its own parent's and the other tree's), m each way.
  auto tree = loadScheduler("tree"), dbt = loadScheduler("double_binary_tree");
  CostModel cm = model(0, 1.0, 1e9);
  Topology sixteen = Topology::singleNode(16);
  const double ratio = dbt->predictSeconds(allreduceOf(256 << 20), sixteen, cm) /
                       tree->predictSeconds(allreduceOf(256 << 20), sixteen, cm);
  EXPECT_NEAR(ratio, 0.5, 0.02);
}

TEST(CostModel, KnomialRadixTradesDepthForWidth) {
  Params two, eight;
  two.set("radix", "2");
  eight.set("radix", "8");
  auto binomial = loadScheduler("knomial", two), wide = loadScheduler("knomial", eight);
  Topology t = Topology::singleNode(64);
  CollectiveArgs barrier;
  barrier.coll = Collective::kBarrier;
  CostModel latency_bound = model(100e-6, 100.0, 100.0);
  EXPECT_NEAR(binomial->predictSeconds(barrier, t, latency_bound), 2 * 6 * 100e-6, 1e-12);
  EXPECT_NEAR(wide->predictSeconds(barrier, t, latency_bound), 2 * 2 * 100e-6, 1e-12);
  CostModel bandwidth_bound = model(1e-9, 0.1, 1.0);
  EXPECT_LT(binomial->predictSeconds(allreduceOf(1 << 20), t, bandwidth_bound),
            wide->predictSeconds(allreduceOf(1 << 20), t, bandwidth_bound));
}

TEST(CostModel, BruckGathersInLogSteps) {
  auto bruck = loadScheduler("bruck"), ring = loadScheduler("ring");
  CollectiveArgs gather;
  gather.coll = Collective::kAllGather;
  gather.data.count = 1;
  gather.output.count = 9;
  CostModel cm = model(10e-6, 1.0, 1.0);
  Topology nine = Topology::singleNode(9);
  EXPECT_NEAR(bruck->predictSeconds(gather, nine, cm), 4 * 10e-6 + 8.0 / 9 * 36 * 1e-9, 1e-12);
  EXPECT_LT(bruck->predictSeconds(gather, nine, cm), ring->predictSeconds(gather, nine, cm));
}

// auto's default candidates (plugins/auto/README.md) in its order, by the name its
// provenance gives.
Candidates defaultCandidates() {
  Candidates all;
  for (const char* name : {"ring", "tree", "halving_doubling", "recursive_doubling", "swing"}) {
    all.emplace_back(name, loadScheduler(name));
  }
  Params latency;
  latency.set("variant", "latency");
  all.emplace_back("swing{variant: latency}", loadScheduler("swing", latency));
  for (const char* name : {"bidirectional_ring", "double_binary_tree", "knomial", "bruck"}) {
    all.emplace_back(name, loadScheduler(name));
  }
  return all;
}

// The lowest prediction among `candidates` for `args`, and who makes it (the first, on ties).
std::pair<std::string, double> lowest(const Candidates& candidates, const CollectiveArgs& args,
                                      const Topology& t, const CostModel& m) {
  std::pair<std::string, double> best{"", INFINITY};
  for (const auto& [name, s] : candidates) {
    if (!s->accepts(args, t).accepted) continue;
    const double p = s->predictSeconds(args, t, m);
    if (p < best.second) best = {name, p};
  }
  return best;
}

TEST(Auto, BuiltInChoiceIsTheLowestPrediction) {
  auto chooser = loadScheduler("auto");
  const auto candidates = defaultCandidates();
  Topology t = Topology::singleNode(8);
  CostModel any = model(30e-6, 2.0, 3.0);
  std::set<std::string> chosen;
  for (uint64_t bytes : {4096ull, 1ull << 20, 64ull << 20}) {
    EXPECT_DOUBLE_EQ(chooser->predictSeconds(allreduceOf(bytes), t, any),
                     lowest(candidates, allreduceOf(bytes), t, any).second)
        << bytes;
    chosen.insert(chooser->accepts(allreduceOf(bytes), t).reason);
  }
  EXPECT_GT(chosen.size(), 1u) << "one scheduler for every size";
  // bruck is the latency choice for all-gather off powers of two (on them, halving_doubling's
  // recursive doubling takes as many steps and bytes).
  CollectiveArgs gather = allreduceOf(4096);
  gather.coll = Collective::kAllGather;
  gather.output = gather.data;
  gather.data.count /= 8;
  EXPECT_DOUBLE_EQ(chooser->predictSeconds(gather, t, any),
                   lowest(candidates, gather, t, any).second);
  const Topology six = Topology::singleNode(6);
  gather.output.count = gather.data.count * 6;
  EXPECT_EQ(chooser->accepts(gather, six).reason, "bruck");
  EXPECT_DOUBLE_EQ(chooser->predictSeconds(gather, six, any),
                   lowest(candidates, gather, six, any).second);
}

TEST(Auto, CandidatesTakeParamsInBraces) {
  Params params;
  params.set("candidates", "ring, swing{variant: latency}, knomial{radix: 2, segment_bytes: 8KiB}");
  auto chooser = loadScheduler("auto", params);
  Topology t = Topology::singleNode(8);
  EXPECT_EQ(chooser->accepts(allreduceOf(4096), t).reason, "swing{variant: latency}");
  CollectiveArgs broadcast = allreduceOf(4096);
  broadcast.coll = Collective::kBroadcast;
  EXPECT_EQ(chooser->accepts(broadcast, t).reason, "knomial{radix: 2, segment_bytes: 8KiB}");
  for (const char* bad : {"ring, swing{variant: latency", "swing}", "{variant: latency}",
                          "swing{variant}", "swing{variant: latency} x"}) {
    Params p;
    p.set("candidates", bad);
    EXPECT_TRUE(testing::throwsWith<ConfigError>([&] { loadScheduler("auto", p); },
                                                 {"auto: params.candidates"}))
        << bad << " was accepted";
  }
  Params unknown;
  unknown.set("candidates", "swing{variant: fastest}");
  EXPECT_THROW(loadScheduler("auto", unknown), ConfigError);
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

TEST(Auto, RulesMeasuredForAnotherGroupCollectiveOrBackendDoNotApply) {
  // Measured on 8 ranks over gloo: on 4 ranks, for another collective or over ucx auto
  // chooses by the model, not by the file; a group that does not name its backend takes it.
  std::string path = testing::writeTempFile("eight.yaml", R"(collective: allreduce
world_size: 8
backend: gloo
rules:
  - {plugin: tree}
)");
  Params params;
  params.set("rules_file", path);
  auto chooser = loadScheduler("auto", params);
  Topology four = Topology::singleNode(4), eight = Topology::singleNode(8);
  Topology eight_gloo = eight, eight_ucx = eight;
  eight_gloo.backend = "gloo";
  eight_ucx.backend = "ucx";
  const auto large = allreduceOf(64 << 20);  // the model picks ring or halving_doubling here
  EXPECT_NE(chooser->accepts(large, four).reason, "tree");
  EXPECT_EQ(chooser->accepts(large, eight).reason, "tree");
  EXPECT_EQ(chooser->accepts(large, eight_gloo).reason, "tree");
  EXPECT_NE(chooser->accepts(large, eight_ucx).reason, "tree");
  CollectiveArgs gather = large;
  gather.coll = Collective::kAllGather;  // the file is for allreduce
  EXPECT_NE(chooser->accepts(gather, eight).reason, "tree");
}

TEST(CostModelJson, EveryFieldRoundTripsAndOlderFilesReadAsNotMeasured) {
  CostModel m;
  m.intra = {1e-5,  2e-10, 3e-10, 4e-6,
             5e-11, 4,     6e-6,  {{4096, 1e-10, 2e-11}, {1 << 20, 3e-10, 4e-11}}};
  m.inter = {7e-5, 8e-9, 9e-9, 0, 0, 0, 1e-5, {}, 128e3};
  m.gamma = 1.5e-10;
  const nlohmann::json text = nlohmann::json::parse(costModelJson(m).dump());
  const CostModel back = costModelFromJson(text);
  for (const auto& [a, b] : {std::pair{&m.intra, &back.intra}, std::pair{&m.inter, &back.inter}}) {
    EXPECT_EQ(a->alpha, b->alpha);
    EXPECT_EQ(a->beta, b->beta);
    EXPECT_EQ(a->beta_one_way, b->beta_one_way);
    EXPECT_EQ(a->alpha_alone, b->alpha_alone);
    EXPECT_EQ(a->beta_alone, b->beta_alone);
    EXPECT_EQ(a->flows, b->flows);
    EXPECT_EQ(a->gap, b->gap);
    EXPECT_EQ(a->bank, b->bank);
    ASSERT_EQ(a->by_buffer.size(), b->by_buffer.size());
    for (size_t i = 0; i < a->by_buffer.size(); ++i) {
      EXPECT_EQ(a->by_buffer[i].bytes, b->by_buffer[i].bytes);
      EXPECT_EQ(a->by_buffer[i].beta, b->by_buffer[i].beta);
      EXPECT_EQ(a->by_buffer[i].beta_alone, b->by_buffer[i].beta_alone);
    }
  }
  EXPECT_EQ(back.gamma, m.gamma);
  // A level written before the later fields were measured: only α and β.
  const LinkCost old = linkCostFromJson(nlohmann::json::parse(R"({"alpha": 1e-5, "beta": 1e-9})"));
  EXPECT_EQ(old.alpha, 1e-5);
  EXPECT_EQ(old.beta, 1e-9);
  EXPECT_EQ(old.beta_one_way, 0);
  EXPECT_FALSE(old.sharesCores());
  EXPECT_EQ(old.gap, 0);
  EXPECT_TRUE(old.by_buffer.empty());
  EXPECT_EQ(old.bank, 0);
  // What is missing or wrong is named.
  auto refused = [](const std::string& text, const std::string& why) {
    EXPECT_TRUE(testing::throwsWith<std::invalid_argument>(
        [&] { costModelFromJson(nlohmann::json::parse(text)); }, {why}))
        << text;
  };
  refused(R"({"intra": {"beta": 1e-9}, "inter": {"alpha": 0, "beta": 0}, "gamma": 0})",
          "intra: no 'alpha'");
  refused(
      R"({"intra": {"alpha": 0, "beta": "fast"}, "inter": {"alpha": 0, "beta": 0}, "gamma": 0})",
      "intra: 'beta' is not a number");
  refused(R"({"intra": {"alpha": 0, "beta": 0, "flows": 2.5}, "inter": {"alpha": 0, "beta": 0},
 "gamma": 0})",
          "intra: 'flows' is 2.5, not a count of flows");
  refused(R"({"intra": {"alpha": 0, "beta": 0}, "gamma": 0})", "no 'inter'");
  refused(R"({"intra": {"alpha": 0, "beta": 0}, "inter": {"alpha": 0, "beta": 0}})",
          "no number 'gamma'");
  refused(R"({"intra": {"alpha": 0, "beta": 0, "by_buffer": [[4096, 1e-9]]},
 "inter": {"alpha": 0, "beta": 0}, "gamma": 0})",
          "intra: an entry of 'by_buffer' is not [bytes, beta, beta_alone]");
}

// On one node the level between nodes is the one inside, less what its shared cores add:
// a flow between nodes has a link of its own.
TEST(CostModel, OneNodesLevelBetweenNodesIsTheLevelInsideWithoutSharedCores) {
  const LinkCost intra{10e-6, 1e-10, 0, 5e-6, 5e-11, 4, 3e-6, {{1 << 20, 2e-10, 6e-11}}};
  ASSERT_TRUE(intra.sharesCores());
  const LinkCost inter = measure::interOnOneNode(intra);
  EXPECT_EQ(inter.alpha, intra.alpha);
  EXPECT_EQ(inter.beta, intra.beta);
  EXPECT_EQ(inter.gap, intra.gap);
  EXPECT_FALSE(inter.sharesCores());
  EXPECT_EQ(inter.flows, 0);
  EXPECT_EQ(inter.alpha_alone, 0);
  EXPECT_EQ(inter.beta_alone, 0);
  ASSERT_EQ(inter.by_buffer.size(), 1u);
  EXPECT_EQ(inter.by_buffer[0].bytes, intra.by_buffer[0].bytes);
  EXPECT_EQ(inter.by_buffer[0].beta, intra.by_buffer[0].beta);
  EXPECT_EQ(inter.by_buffer[0].beta_alone, 0);
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
  const auto candidates = defaultCandidates();
  int differ = 0;
  for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
    const std::string best = lowest(candidates, allreduceOf(bytes), t, slow).first;
    EXPECT_EQ(chooser->accepts(allreduceOf(bytes), t).reason, best) << bytes;
    differ += plain->accepts(allreduceOf(bytes), t).reason != best ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "the calibration changed no choice";
  // A file that is not a calibration is refused, naming what is wrong with it.
  auto refused = [](const std::string& name, const std::string& text, const std::string& why) {
    Params bad;
    bad.set("calibration", testing::writeTempFile(name, text));
    EXPECT_TRUE(testing::throwsWith<std::exception>([&] { loadScheduler("auto", bad); }, {why}))
        << name << " accepted";
  };
  refused("bad.json", "{\"intra\": 3}", "is not a calibration the bench wrote");
  // Nor a one-way β below zero.
  refused("bad-one-way.json", R"({"intra": {"alpha": 1e-9, "beta": 1e-6},
 "inter": {"alpha": 1e-9, "beta": 1e-6, "beta_one_way": -1e-6}, "gamma": 1e-12})",
          "inter: 'beta_one_way' is -1e-06: negative or infinite");
  // Nor a negative gap.
  refused("bad-gap.json", R"({"intra": {"alpha": 1e-9, "beta": 1e-6, "gap": -1e-9},
 "inter": {"alpha": 1e-9, "beta": 1e-6}, "gamma": 1e-12})",
          "intra: 'gap' is -1e-09: negative or infinite");
  // Nor β by buffer size out of order, or below zero.
  refused("bad-by-buffer.json", R"({"intra": {"alpha": 1e-9, "beta": 1e-6,
 "by_buffer": [[65536, 1e-9, 0], [4096, 1e-9, 0]]},
 "inter": {"alpha": 1e-9, "beta": 1e-6}, "gamma": 1e-12})",
          "by_buffer's sizes out of order");
  refused("bad-by-buffer-beta.json", R"({"intra": {"alpha": 1e-9, "beta": 1e-6,
 "by_buffer": [[4096, -1e-9, 0]]}, "inter": {"alpha": 1e-9, "beta": 1e-6}, "gamma": 1e-12})",
          "a beta of by_buffer is negative or infinite");
  refused("bad-by-buffer-entry.json", R"({"intra": {"alpha": 1e-9, "beta": 1e-6,
 "by_buffer": {"4096": [1e-9, 0]}}, "inter": {"alpha": 1e-9, "beta": 1e-6}, "gamma": 1e-12})",
          "intra: 'by_buffer' is not a list");
  // Nor a negative count of flows sharing a node.
  refused("bad-flows.json", R"({"intra": {"alpha": 1e-9,
 "beta": 1e-6, "alpha_alone": 1e-9, "beta_alone": 1e-7, "flows": -4},
 "inter": {"alpha": 1e-9, "beta": 1e-6}, "gamma": 1e-12})",
          "intra: 'flows' is -4: negative or infinite");
}

TEST(Auto, TheRunsCalibrationReplacesTheBuiltInModelButNotAFile) {
  // useCostModel (the bench and the trainer call it after calibrating): auto then chooses
  // by that model; with params.calibration the file's model stays.
  const CostModel slow{{1e-9, 1e-6}, {1e-9, 1e-6}, 1e-12};
  const CostModel fast{{30e-6, 1.0 / 2e9}, {30e-6, 1.0 / 2e9}, 1.0 / 3e9};  // the built-in
  std::string path =
      testing::writeTempFile("cal-fast.json", R"({"intra": {"alpha": 30e-6, "beta": 5e-10},
 "inter": {"alpha": 30e-6, "beta": 5e-10}, "gamma": 3.3333333333e-10})");
  Params with_file;
  with_file.set("calibration", path);
  auto chooser = loadScheduler("auto"), pinned = loadScheduler("auto", with_file);
  chooser->useCostModel(slow);
  pinned->useCostModel(slow);
  Topology t = Topology::singleNode(6);
  const auto candidates = defaultCandidates();
  int differ = 0;
  for (uint64_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
    const std::string by_slow = lowest(candidates, allreduceOf(bytes), t, slow).first;
    const std::string by_fast = lowest(candidates, allreduceOf(bytes), t, fast).first;
    EXPECT_EQ(chooser->accepts(allreduceOf(bytes), t).reason, by_slow) << bytes;
    EXPECT_EQ(pinned->accepts(allreduceOf(bytes), t).reason, by_fast) << bytes;
    differ += by_slow != by_fast ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "the two models choose alike: the test shows nothing";
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
    EXPECT_TRUE(
        testing::contains(std::string(e.what()), {"bad-rules.yaml:2:17: rules[0].max_bytes"}));
  }
}

}  // namespace
}  // namespace collie
