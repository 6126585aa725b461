// Recursive-doubling all-reduce: log2(p) steps in which every rank swaps its whole buffer
// with the rank 2^k away and adds it in, over the largest power-of-two core of the group
// (the other ranks fold their data into a partner first and get the result back). The
// fewest steps of any all-reduce, each carrying the whole message: the small-message choice
// of MPI libraries.
#include <algorithm>
#include <cmath>

#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/fold.h"

namespace collie::recursive_doubling {
namespace {

enum Phase : uint32_t { kFold = 1, kExchange = 2, kUnfold = 3 };

class RecursiveDoublingScheduler : public schedules::OneCollectiveScheduler {
 public:
  explicit RecursiveDoublingScheduler(const PluginContext&)
      : OneCollectiveScheduler("recursive_doubling", Collective::kAllReduce) {}

 protected:
  void runOne(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    schedules::allReduceOnCore(args, kFold, kUnfold, backend, [&](const patterns::Fold& f) {
      // After step k the 2^(k+1) core ranks that agree on their low bits above k hold the
      // same partial result, bit for bit: each side adds the same two operands.
      schedules::exchangeWhole(
          args.data, args.op, args.seq, kExchange, patterns::log2Exact(f.core_size),
          [&f](int k) { return f.core_index ^ (1 << k); }, backend);
      finishAverage(args.data, args.op, backend.size());
    });
  }

  // α-β-γ (README): log2(p) exchanges of the whole message between core partners, each
  // reduced (stepSeconds prices a step: node links that several exchanges cross at once are
  // shared); off powers of two the fold and unfold add a message each way and one reduction.
  double predictOne(int n, const CollectiveArgs& args, const Topology& topology,
                    const CostModel& model) const override {
    const double m = static_cast<double>(args.data.bytes());
    const double t = schedules::predictWholeExchanges(n, m, topology, model,
                                                      [](int v, int k) { return v ^ (1 << k); });
    return t + schedules::predictFold(n, m, topology, model);
  }
};

}  // namespace
}  // namespace collie::recursive_doubling

COLLIE_SCHEDULER_PLUGIN("recursive_doubling", "1.0.0",
                        "log2(p) whole-message exchanges: latency-optimal",
                        collie::recursive_doubling::RecursiveDoublingScheduler);
