// Double binary tree all-reduce (NCCL's): two binary trees over the same ranks, each carrying
// half of the buffer as a pipelined reduce-then-broadcast (collie/schedules/trees.h), with
// the second tree mirrored (or shifted, for odd groups) so that a leaf of one is an inner node
// of the other. Every rank then does about the same work, and the two halves flow at once:
// log2(n) latency like a tree, with the bandwidth a single tree wastes at its leaves.
#include <algorithm>
#include <cmath>

#include "collie/patterns/double_binary_tree.h"
#include "collie/patterns/halving_doubling.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/trees.h"

namespace collie::double_binary_tree {
namespace {

enum Phase : uint32_t { kReduce0 = 1, kBroadcast0 = 2, kReduce1 = 3, kBroadcast1 = 4 };

class DoubleBinaryTreeScheduler : public Scheduler {
 public:
  explicit DoubleBinaryTreeScheduler(const PluginContext& context)
      : segment_bytes_(context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return schedules::acceptOnly("double_binary_tree", Collective::kAllReduce, args);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    schedules::requireOnly("double_binary_tree", Collective::kAllReduce, args);
    const int n = backend.size(), rank = backend.rank();
    if (n == 1 || args.data.count == 0) return finishAverage(args.data, args.op, n);
    const size_t half = (args.data.count + 1) / 2;
    std::vector<schedules::TreePart> trees(2);
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

  // α-β-γ (README): each tree carries m/2 in s segments of g bytes through a pipeline of
  // depth d = ⌈log2 n⌉. Per beat a rank serves one segment of each tree, as an inner node of
  // one (c children and a parent) and a leaf of the other (a parent): (c + 2)·g through its
  // port each way, c·g reduced; 2d + s − 1 beats.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (args.coll != Collective::kAllReduce) return kNoPrediction;
    if (n == 1) return 0;
    const LinkCost& link = topology.nodeCount() > 1 ? model.inter : model.intra;
    const double m = static_cast<double>(args.data.bytes()) / 2;  // per tree
    const double s = std::max(1.0, std::ceil(m / static_cast<double>(segment_bytes_)));
    const double g = m / s, c = std::min(2, n - 1), d = patterns::log2Exact(n);
    return (2 * d + s - 1) * (link.alpha + (c + 2) * g * link.beta + c * g * model.gamma);
  }

 private:
  uint64_t segment_bytes_;
};

}  // namespace
}  // namespace collie::double_binary_tree

COLLIE_SCHEDULER_PLUGIN("double_binary_tree", "1.0.0",
                        "NCCL's double binary tree: two complementary trees, half the data each",
                        collie::double_binary_tree::DoubleBinaryTreeScheduler);
