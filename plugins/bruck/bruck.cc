// Bruck's all-gather: ⌈log2 n⌉ steps for any group size. Each rank gathers blocks in rotated
// order (position i holds rank r + i's) and at step k sends what it holds to the rank 2^k
// behind and receives as much from the rank 2^k ahead; one rotation at the end puts the
// blocks in rank order.
#include <algorithm>
#include <cmath>

#include "collie/patterns/bruck.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/small.h"

namespace collie::bruck {
namespace {

enum Phase : uint32_t { kGather = 1 };

class BruckScheduler : public schedules::OneCollectiveScheduler {
 public:
  explicit BruckScheduler(const PluginContext&)
      : OneCollectiveScheduler("bruck", Collective::kAllGather) {}

 protected:
  void runOne(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size(), rank = backend.rank();
    const size_t k = args.data.count;
    if (n == 1 || k == 0) {
      if (k > 0) copyInto(args.output, args.data);
      return;
    }
    ScratchBuffer rotated(args.data, static_cast<size_t>(n) * k);
    const Buffer& work = rotated.view();
    copyInto(work.slice(0, k), args.data);
    for (int step = 0; step < patterns::bruckSteps(n); ++step) {
      const patterns::BruckStep s = patterns::bruckStep(rank, n, step);
      const size_t count = static_cast<size_t>(s.count) * k;
      schedules::Requests requests;
      requests.push_back(backend.irecv(s.recv_from, work.slice(s.have * k, count),
                                       makeTag(args.seq, kGather, step)));
      requests.push_back(
          backend.isend(s.send_to, work.slice(0, count), makeTag(args.seq, kGather, step)));
      waitAll(requests, backend.timeout());
    }
    // Position i holds rank (rank + i) mod n's block.
    const size_t head = static_cast<size_t>(n - rank) * k;
    copyInto(args.output.slice(static_cast<size_t>(rank) * k, head), work.slice(0, head));
    if (rank > 0) {
      copyInto(args.output.slice(0, static_cast<size_t>(rank) * k),
               work.slice(head, static_cast<size_t>(rank) * k));
    }
  }

  // α-β (README): ⌈log2 n⌉ steps moving n−1 blocks of m/n bytes in all (m the gathered size),
  // each step priced by stepSeconds (node links that several sends cross at once are shared).
  double predictOne(int n, const CollectiveArgs& args, const Topology& topology,
                    const CostModel& model) const override {
    const double block = static_cast<double>(args.output.bytes()) / n;
    double t = 0;
    for (int k = 0; k < patterns::bruckSteps(n); ++k) {
      std::vector<Flow> step;
      for (int r = 0; r < n; ++r) {
        const patterns::BruckStep s = patterns::bruckStep(r, n, k);
        step.push_back({r, s.send_to, s.count * block});
      }
      t += stepSeconds(step, topology, model);
    }
    return t;
  }
};

}  // namespace
}  // namespace collie::bruck

COLLIE_SCHEDULER_PLUGIN("bruck", "1.0.0", "Bruck all-gather: ceil(log2 n) steps for any n",
                        collie::bruck::BruckScheduler);
