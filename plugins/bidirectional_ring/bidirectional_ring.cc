// Bidirectional ring all-reduce: the buffer's first half goes around a ring to the next rank
// and its second half around the opposite ring at the same time, each as a ring all-reduce
// (reduce-scatter then all-gather, collie/schedules/rings.h). Every rank sends to both
// neighbours and receives from both at every step, using a full-duplex link in both
// directions, and each ring's steps carry half the bytes of a single ring's.
#include <algorithm>
#include <array>
#include <cmath>

#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/rings.h"

namespace collie::bidirectional_ring {
namespace {

using patterns::Range;

enum Phase : uint32_t {
  kForwardReduceScatter = 1,
  kForwardAllGather = 2,
  kBackwardReduceScatter = 3,
  kBackwardAllGather = 4
};

class BidirectionalRingScheduler : public schedules::OneCollectiveScheduler {
 public:
  explicit BidirectionalRingScheduler(const PluginContext& context)
      : OneCollectiveScheduler("bidirectional_ring", Collective::kAllReduce,
                               "; ring does reduce_scatter and allgather"),
        chunk_bytes_(context.params->getBytes("chunk_bytes", 1 << 20, 1, 1ull << 32)) {}

 protected:
  void runOne(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1 || args.data.count == 0) return finishAverage(args.data, args.op, n);
    const size_t half = (args.data.count + 1) / 2;
    const std::array<schedules::RingPart, 2> rings{
        schedules::ringPart(args.data.slice(0, half), true, chunk_bytes_, kForwardReduceScatter,
                            kForwardAllGather),
        schedules::ringPart(args.data.slice(half, args.data.count - half), false, chunk_bytes_,
                            kBackwardReduceScatter, kBackwardAllGather)};
    schedules::ringReduceScatter(rings, args.op, args.seq, backend);
    for (const schedules::RingPart& ring : rings) {
      Range mine = schedules::ownBlock(ring, backend);
      finishAverage(ring.data.slice(mine.offset, mine.count), args.op, n);
    }
    schedules::ringAllGather(rings, args.seq, backend);
  }

  // α-β-γ (README): a ring's 2(n-1) steps, each posting a message per direction whose
  // latencies overlap, over chunks of half-blocks; a rank still sends and receives
  // 2(n-1)/n of the message in all (stepSeconds prices a step: a rank's way out carries
  // both halves, and a node's link the flows that cross it).
  double predictOne(int n, const CollectiveArgs& args, const Topology& topology,
                    const CostModel& model) const override {
    const double m = static_cast<double>(args.data.bytes());
    const int pieces =
        static_cast<int>(std::max(1.0, std::ceil(m / 2 / n / static_cast<double>(chunk_bytes_))));
    // A step: every rank sends a block of each half, one to each neighbour, at once.
    std::vector<Flow> step;
    for (int r = 0; r < n; ++r) {
      step.push_back({r, (r + 1) % n, m / 2 / n, pieces});
      step.push_back({r, (r + n - 1) % n, m / 2 / n, pieces});
    }
    return 2 * (n - 1) * stepSeconds(step, topology, model) + (n - 1.0) / n * m * model.gamma;
  }

 private:
  uint64_t chunk_bytes_;
};

}  // namespace
}  // namespace collie::bidirectional_ring

COLLIE_SCHEDULER_PLUGIN("bidirectional_ring", "1.0.0",
                        "two rings in opposite directions, half the data each",
                        collie::bidirectional_ring::BidirectionalRingScheduler);
