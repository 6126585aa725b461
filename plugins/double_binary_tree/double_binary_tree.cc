// Double binary tree all-reduce (NCCL's): two binary trees over the same ranks, each carrying
// half of the buffer as a pipelined reduce-then-broadcast (collie/schedules/trees.h), with
// the second tree mirrored (or shifted, for odd groups) so that a leaf of one is an inner node
// of the other. Every rank then does about the same work, and the two halves flow at once:
// log2(n) latency like a tree, with the bandwidth a single tree wastes at its leaves.
#include <algorithm>
#include <array>
#include <cmath>

#include "collie/patterns/double_binary_tree.h"
#include "collie/patterns/halving_doubling.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/trees.h"

namespace collie::double_binary_tree {
namespace {

enum Phase : uint32_t { kReduce0 = 1, kBroadcast0 = 2, kReduce1 = 3, kBroadcast1 = 4 };

class DoubleBinaryTreeScheduler : public schedules::OneCollectiveScheduler {
 public:
  explicit DoubleBinaryTreeScheduler(const PluginContext& context)
      : OneCollectiveScheduler("double_binary_tree", Collective::kAllReduce),
        segment_bytes_(context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

 protected:
  void runOne(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size(), rank = backend.rank();
    if (n == 1 || args.data.count == 0) return finishAverage(args.data, args.op, n);
    const size_t half = (args.data.count + 1) / 2;
    std::array<schedules::TreePart, 2> trees;
    trees[0].data = args.data.slice(0, half);
    trees[1].data = args.data.slice(half, args.data.count - half);
    for (int t = 0; t < 2; ++t) {
      trees[t].shape = patterns::doubleBinaryTree(rank, n, t);
      trees[t].segments = schedules::segmentsOf(trees[t].data, segment_bytes_);
      trees[t].up_phase = t == 0 ? kReduce0 : kReduce1;
      trees[t].down_phase = t == 0 ? kBroadcast0 : kBroadcast1;
    }
    schedules::runTrees(trees, args.op, n, args.seq, backend);
  }

  // α-β-γ (README): each tree carries m/2 in s segments of g bytes, up and then down, in
  // pipelines of depth + s - 1 beats; in a beat every edge of both trees carries a segment
  // at once, so a rank inner in one tree and a leaf in the other serves both
  // (schedules::predictTrees, which also shares the links between nodes). Over a backend
  // with batch completion the trees run one after the other, each a level at a time
  // (schedules::runTrees, pipelinedSegments).
  double predictOne(int n, const CollectiveArgs& args, const Topology& topology,
                    const CostModel& model) const override {
    std::vector<std::vector<patterns::TreeShape>> shapes(2);
    for (int t = 0; t < 2; ++t) {
      for (int r = 0; r < n; ++r) shapes[t].push_back(patterns::doubleBinaryTree(r, n, t));
    }
    const double m = static_cast<double>(args.data.bytes()) / 2;  // per tree
    const double s = schedules::pipelinedSegments(m, segment_bytes_, topology);
    if (!topology.capabilities.batch_completion) {
      return schedules::predictTrees(shapes, m / s, s, true, topology, model);
    }
    double seconds = 0;
    for (const auto& tree : shapes) {
      seconds += schedules::predictTrees({tree}, m / s, s, true, topology, model);
    }
    return seconds;
  }

 private:
  uint64_t segment_bytes_;
};

}  // namespace
}  // namespace collie::double_binary_tree

COLLIE_SCHEDULER_PLUGIN("double_binary_tree", "1.0.0",
                        "NCCL's double binary tree: two complementary trees, half the data each",
                        collie::double_binary_tree::DoubleBinaryTreeScheduler);
