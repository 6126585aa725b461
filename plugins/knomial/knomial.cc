// k-nomial tree all-reduce, broadcast and barrier (UCC's knomial family; radix 2 is the
// binomial tree): a pipelined reduce to rank 0 and broadcast back down the k-nomial tree
// (collie/schedules/trees.h). A larger radix makes the tree shallower (⌈log_k n⌉ levels) at
// the price of more children per node.
#include <algorithm>
#include <array>
#include <cmath>

#include "collie/patterns/knomial.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/trees.h"

namespace collie::knomial {
namespace {

enum Phase : uint32_t { kReduce = 1, kBroadcast = 2 };

class KnomialScheduler : public Scheduler {
 public:
  explicit KnomialScheduler(const PluginContext& context)
      : radix_(static_cast<int>(context.params->getInt("radix", 4, 2, 64))),
        segment_bytes_(context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return schedules::acceptOnly(
        "knomial", {Collective::kAllReduce, Collective::kBroadcast, Collective::kBarrier}, args);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1) return finishAverage(args.data, args.op, n);
    const int rank = backend.rank();
    auto part = schedules::singleTree(args, segment_bytes_, kReduce, kBroadcast, [&](int root) {
      return patterns::knomialTree(rank, root, n, radix_);
    });
    schedules::runTrees(std::array<schedules::TreePart, 1>{part}, args.op, n, args.seq, backend);
  }

  // α-β-γ (README): as tree's, over the k-nomial shapes (schedules::predictSingleTree): the
  // segments go up, then down, in pipelines whose pace the root sets, as it takes in (or
  // sends out) a segment from (to) each of its C children at once.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    return schedules::predictSingleTree(
        args, segment_bytes_, topology, model,
        [&](int rank, int root) { return patterns::knomialTree(rank, root, n, radix_); });
  }

 private:
  int radix_;
  uint64_t segment_bytes_;
};

}  // namespace
}  // namespace collie::knomial

COLLIE_SCHEDULER_PLUGIN("knomial", "1.0.0",
                        "k-nomial tree all-reduce/broadcast/barrier (radix param; 2 = binomial)",
                        collie::knomial::KnomialScheduler);
