// Pipelined binary-tree all-reduce: segments flow up the tree (reduced at every node) and
// back down (broadcast), so a long message keeps every level busy (collie/schedules/trees.h,
// shared with double_binary_tree and knomial). Latency grows with
// log2(n) rather than n, which wins for small messages.
#include <algorithm>
#include <cmath>

#include "collie/patterns/tree.h"
#include "collie/plugin.h"
#include "collie/schedules/trees.h"

namespace collie::tree {
namespace {

enum Phase : uint32_t { kReduce = 1, kBroadcast = 2 };

class TreeScheduler : public Scheduler {
 public:
  explicit TreeScheduler(const PluginContext& context)
      : segment_bytes_(context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    switch (args.coll) {
      case Collective::kAllReduce:
      case Collective::kBroadcast:
      case Collective::kBarrier:
        return Decision::yes();
      default:
        return Decision::no(std::string("tree: ") + collectiveName(args.coll) +
                            " is not implemented (allreduce, broadcast, barrier are)");
    }
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1) return finishAverage(args.data, args.op, n);
    const int rank = backend.rank();
    auto part = schedules::singleTree(args, segment_bytes_, kReduce, kBroadcast, [&](int root) {
      return patterns::binaryTree(rank, root, n);
    });
    schedules::runTrees({part}, args.op, n, args.seq, backend);
  }

  // α-β-γ (README): s segments of g bytes flow up and down a pipeline of depth d. Per
  // segment an inner node takes in c children's messages and its parent's, and sends as
  // many, through its one port (the latency overlaps, the bytes do not), and reduces c of
  // them: the pipeline advances one segment every α + (c + 1)gβ + cgγ, over 2d + s - 1 beats.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (n == 1) return 0;
    const LinkCost& link = topology.nodeCount() > 1 ? model.inter : model.intra;
    const double m = static_cast<double>(args.data.bytes());
    const double s = std::max(1.0, std::ceil(m / static_cast<double>(segment_bytes_)));
    const double g = m / s, c = std::min(2, n - 1), d = std::floor(std::log2(n));
    switch (args.coll) {
      case Collective::kAllReduce:
        return (2 * d + s - 1) * (link.alpha + (c + 1) * g * link.beta + c * g * model.gamma);
      case Collective::kBroadcast:
        return (d + s - 1) * (link.alpha + c * g * link.beta);
      case Collective::kBarrier:
        return 2 * d * link.alpha;
      default:
        return kNoPrediction;
    }
  }

 private:
  uint64_t segment_bytes_;
};

}  // namespace
}  // namespace collie::tree

COLLIE_SCHEDULER_PLUGIN(
    "tree", "1.0.0", "pipelined binary-tree all-reduce: reduce up, broadcast down, log2(n) latency",
    collie::tree::TreeScheduler);
