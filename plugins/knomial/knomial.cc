// k-nomial tree all-reduce, broadcast and barrier (UCC's knomial family; radix 2 is the
// binomial tree): a pipelined reduce to rank 0 and broadcast back down the k-nomial tree
// (collie/schedules/trees.h). A larger radix makes the tree shallower (⌈log_k n⌉ levels) at
// the price of more children per node.
#include <algorithm>
#include <cmath>

#include "collie/patterns/knomial.h"
#include "collie/plugin.h"
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
    switch (args.coll) {
      case Collective::kAllReduce:
      case Collective::kBroadcast:
      case Collective::kBarrier:
        return Decision::yes();
      default:
        return Decision::no(std::string("knomial: ") + collectiveName(args.coll) +
                            " is not implemented (allreduce, broadcast, barrier are)");
    }
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1) return finishAverage(args.data, args.op, n);
    const int rank = backend.rank();
    auto part = schedules::singleTree(args, segment_bytes_, kReduce, kBroadcast, [&](int root) {
      return patterns::knomialTree(rank, root, n, radix_);
    });
    schedules::runTrees({part}, args.op, n, args.seq, backend);
  }

  // α-β-γ (README): the first segment takes d = ⌈log_k n⌉ levels of k−1 messages each; every
  // further one is held up by the root, which takes in (or sends out) all C of its children's.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (n == 1) return 0;
    const LinkCost& link = topology.nodeCount() > 1 ? model.inter : model.intra;
    const double d = patterns::knomialDepth(n, radix_);
    if (args.coll == Collective::kBarrier) return 2 * d * link.alpha;
    const double root_children = patterns::knomialTree(0, 0, n, radix_).children.size();
    const double m = static_cast<double>(args.data.bytes());
    const double s = std::max(1.0, std::ceil(m / static_cast<double>(segment_bytes_)));
    const double g = m / s;
    auto phase = [&](double per_byte) {
      return d * (link.alpha + (radix_ - 1) * g * per_byte) +
             (s - 1) * (link.alpha + root_children * g * per_byte);
    };
    switch (args.coll) {
      case Collective::kAllReduce:
        return phase(link.beta + model.gamma) + phase(link.beta);
      case Collective::kBroadcast:
        return phase(link.beta);
      default:
        return kNoPrediction;
    }
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
