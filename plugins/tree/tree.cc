// Pipelined binary-tree all-reduce: segments flow up the tree (reduced at every node) and
// back down (broadcast), so a long message keeps every level busy (collie/schedules/trees.h,
// shared with double_binary_tree and knomial). Latency grows with
// log2(n) rather than n, which wins for small messages.
#include "collie/patterns/tree.h"
#include "collie/plugin.h"
#include "collie/schedules/trees.h"

namespace collie::tree {
namespace {

// α-β-γ (README): s segments of g bytes flow up the tree (reduced at every node), then
// down, each phase a pipeline of depth + s - 1 beats in which every edge carries a segment
// at once (schedules::predictTrees: ranks and node links that several edges meet are
// shared). A barrier is one empty message up and down every edge.
class TreeScheduler : public schedules::SingleTreeScheduler {
 public:
  explicit TreeScheduler(const PluginContext& context)
      : SingleTreeScheduler("tree",
                            context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

 protected:
  patterns::TreeShape shapeOf(int rank, int root, int n) const override {
    return patterns::binaryTree(rank, root, n);
  }
};

}  // namespace
}  // namespace collie::tree

COLLIE_SCHEDULER_PLUGIN(
    "tree", "1.0.0", "pipelined binary-tree all-reduce: reduce up, broadcast down, log2(n) latency",
    collie::tree::TreeScheduler);
