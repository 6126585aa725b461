// Ring all-reduce: a reduce-scatter phase then an all-gather phase around the ring, each
// block cut into chunks so that reducing one chunk overlaps receiving the next, and each
// chunk sent on as soon as it is ready (the steps are collie/schedules/rings.h, shared with
// bidirectional_ring).
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/rings.h"

namespace collie::ring {
namespace {

using patterns::Range;

enum Phase : uint32_t { kReduceScatter = 1, kAllGather = 2 };

class RingScheduler : public Scheduler {
 public:
  explicit RingScheduler(const PluginContext& context)
      : chunk_bytes_(context.params->getBytes("chunk_bytes", 1 << 20, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return schedules::acceptOnly(
        "ring", {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather}, args);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    switch (args.coll) {
      case Collective::kAllReduce: {
        if (n == 1 || args.data.count == 0) return finishAverage(args.data, args.op, n);
        const std::array<schedules::RingPart, 1> ring{partOf(args.data)};
        schedules::ringReduceScatter(ring, args.op, args.seq, backend);
        Range mine = schedules::ownBlock(ring[0], backend);
        finishAverage(args.data.slice(mine.offset, mine.count), args.op, n);
        schedules::ringAllGather(ring, args.seq, backend);
        return;
      }
      case Collective::kReduceScatter: {
        // Reduce in a copy so that the input stays intact (in the input itself when the caller
        // needs it no more), then hand out this rank's block.
        std::optional<ScratchBuffer> copy;
        if (!args.input_is_scratch) {
          copy.emplace(args.data, args.data.count);
          copyInto(copy->view(), args.data);
        }
        const Buffer& work = copy ? copy->view() : args.data;
        const std::array<schedules::RingPart, 1> ring{partOf(work)};
        if (n > 1) schedules::ringReduceScatter(ring, args.op, args.seq, backend);
        Range mine = schedules::ownBlock(ring[0], backend);
        copyInto(args.output, work.slice(mine.offset, mine.count));
        return finishAverage(args.output, args.op, n);
      }
      case Collective::kAllGather: {
        const std::array<schedules::RingPart, 1> ring{partOf(args.output)};
        Range mine = schedules::ownBlock(ring[0], backend);
        copyInto(args.output.slice(mine.offset, mine.count), args.data);
        if (n > 1) schedules::ringAllGather(ring, args.seq, backend);
        return;
      }
      default:
        throw InternalError("ring: run() called for a collective it declined");
    }
  }

  // α-β-γ (README): 2(n-1) steps, in each of which every rank sends a block of m/n bytes, in
  // ⌈block/chunk⌉ messages, to the next rank (stepSeconds prices the step: links between
  // nodes that several of these flows cross are shared); (n-1)/n of the message reduced.
  // Reduce-scatter and all-gather: one phase.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    return schedules::predictOnly(
        {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather}, args,
        topology, [&](int n) {
          const double m = static_cast<double>(args.bufferBytes());
          const double pieces = std::max(1.0, std::ceil(m / n / static_cast<double>(chunk_bytes_)));
          std::vector<Flow> step;
          for (int r = 0; r < n; ++r)
            step.push_back({r, (r + 1) % n, m / n, static_cast<int>(pieces)});
          const double phase = (n - 1) * stepSeconds(step, topology, model);
          const double reduce = (n - 1.0) / n * m * model.gamma;
          switch (args.coll) {
            case Collective::kAllReduce:
              return 2 * phase + reduce;
            case Collective::kReduceScatter:
              return phase + reduce;
            case Collective::kAllGather:
              return phase;
            default:
              return kNoPrediction;
          }
        });
  }

 private:
  schedules::RingPart partOf(const Buffer& data) const {
    return schedules::ringPart(data, true, chunk_bytes_, kReduceScatter, kAllGather);
  }

  uint64_t chunk_bytes_;
};

}  // namespace
}  // namespace collie::ring

COLLIE_SCHEDULER_PLUGIN(
    "ring", "1.0.0", "ring all-reduce: chunked reduce-scatter then all-gather, bandwidth-optimal",
    collie::ring::RingScheduler);
