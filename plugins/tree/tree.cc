// Pipelined binary-tree all-reduce: segments flow up the tree (reduced at every node) and
// back down (broadcast), so a long message keeps every level busy (collie/schedules/trees.h,
// shared with double_binary_tree and knomial). Latency grows with
// log2(n) rather than n, which wins for small messages.
#include <algorithm>
#include <array>
#include <cmath>

#include "collie/patterns/tree.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/trees.h"

namespace collie::tree {
namespace {

enum Phase : uint32_t { kReduce = 1, kBroadcast = 2 };

class TreeScheduler : public Scheduler {
 public:
  explicit TreeScheduler(const PluginContext& context)
      : segment_bytes_(context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return schedules::acceptOnly(
        "tree", {Collective::kAllReduce, Collective::kBroadcast, Collective::kBarrier}, args);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1) return finishAverage(args.data, args.op, n);
    const int rank = backend.rank();
    auto part = schedules::singleTree(args, segment_bytes_, kReduce, kBroadcast, [&](int root) {
      return patterns::binaryTree(rank, root, n);
    });
    schedules::runTrees(std::array<schedules::TreePart, 1>{part}, args.op, n, args.seq, backend);
  }

  // α-β-γ (README): s segments of g bytes flow up the tree (reduced at every node), then
  // down, each phase a pipeline of depth + s - 1 beats in which every edge carries a
  // segment at once (schedules::predictTrees: ranks and node links that several edges meet
  // are shared). A barrier is one empty message up and down every edge.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    return schedules::predictSingleTree(
        args, segment_bytes_, topology, model,
        [&](int rank, int root) { return patterns::binaryTree(rank, root, n); });
  }

 private:
  uint64_t segment_bytes_;
};

}  // namespace
}  // namespace collie::tree

COLLIE_SCHEDULER_PLUGIN(
    "tree", "1.0.0", "pipelined binary-tree all-reduce: reduce up, broadcast down, log2(n) latency",
    collie::tree::TreeScheduler);
