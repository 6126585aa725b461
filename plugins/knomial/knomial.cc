// k-nomial tree all-reduce, broadcast and barrier (UCC's knomial family; radix 2 is the
// binomial tree): a pipelined reduce to rank 0 and broadcast back down the k-nomial tree
// (collie/schedules/trees.h). A larger radix makes the tree shallower (⌈log_k n⌉ levels) at
// the price of more children per node.
#include "collie/patterns/knomial.h"
#include "collie/plugin.h"
#include "collie/schedules/trees.h"

namespace collie::knomial {
namespace {

// α-β-γ (README): as tree's, over the k-nomial shapes (schedules::predictSingleTree): the
// segments go up, then down, in pipelines whose pace the root sets, as it takes in (or sends
// out) a segment from (to) each of its C children at once.
class KnomialScheduler : public schedules::SingleTreeScheduler {
 public:
  explicit KnomialScheduler(const PluginContext& context)
      : SingleTreeScheduler("knomial",
                            context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)),
        radix_(static_cast<int>(context.params->getInt("radix", 4, 2, 64))) {}

 protected:
  patterns::TreeShape shapeOf(int rank, int root, int n) const override {
    return patterns::knomialTree(rank, root, n, radix_);
  }

 private:
  int radix_;
};

}  // namespace
}  // namespace collie::knomial

COLLIE_SCHEDULER_PLUGIN("knomial", "1.0.0",
                        "k-nomial tree all-reduce/broadcast/barrier (radix param; 2 = binomial)",
                        collie::knomial::KnomialScheduler);
