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

class RecursiveDoublingScheduler : public Scheduler {
 public:
  explicit RecursiveDoublingScheduler(const PluginContext&) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return schedules::acceptOnly("recursive_doubling", Collective::kAllReduce, args);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    schedules::requireOnly("recursive_doubling", Collective::kAllReduce, args);
    const int n = backend.size();
    const Buffer& data = args.data;
    if (n == 1 || data.count == 0) return finishAverage(data, args.op, n);
    const patterns::Fold f = patterns::fold(backend.rank(), n);
    if (!schedules::foldIn(data, args.op, f, args.seq, kFold, kUnfold, backend)) return;
    ScratchBuffer incoming(data, data.count);
    // After step k the 2^(k+1) core ranks that agree on their low bits above k hold the same
    // partial result, bit for bit: each side adds the same two operands.
    for (int k = 0; k < patterns::log2Exact(f.core_size); ++k) {
      const int peer = patterns::coreRank(f.core_index ^ (1 << k), n);
      auto recv = backend.irecv(peer, incoming.view(), makeTag(args.seq, kExchange, k));
      auto send = backend.isend(peer, data, makeTag(args.seq, kExchange, k));
      // The send first: data is read by it until it completes, and over Gloo a receive
      // waited for first costs a wake-up more (benchmarks/overhead.cc).
      send->wait(backend.timeout());
      recv->wait(backend.timeout());
      reduceInto(data, incoming.view(), args.op);
    }
    finishAverage(data, args.op, n);
    schedules::foldOut(data, f, args.seq, kUnfold, backend);
  }

  // α-β-γ (README): log2(p) exchanges of the whole message between core partners, each
  // reduced (stepSeconds prices a step: node links that several exchanges cross at once are
  // shared); off powers of two the fold and unfold add a message each way and one reduction.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (args.coll != Collective::kAllReduce) return kNoPrediction;
    if (n == 1) return 0;
    const int p = patterns::powerOfTwoFloor(n);
    const double m = static_cast<double>(args.data.bytes());
    double t = 0;
    for (int k = 0; k < patterns::log2Exact(p); ++k) {
      std::vector<Flow> step;
      for (int v = 0; v < p; ++v)
        step.push_back({patterns::coreRank(v, n), patterns::coreRank(v ^ (1 << k), n), m});
      t += stepSeconds(step, topology, model) + m * model.gamma;
    }
    return t + schedules::predictFold(n, m, topology, model);
  }
};

}  // namespace
}  // namespace collie::recursive_doubling

COLLIE_SCHEDULER_PLUGIN("recursive_doubling", "1.0.0",
                        "recursive-doubling all-reduce: log2(p) whole-message exchanges, "
                        "latency-optimal",
                        collie::recursive_doubling::RecursiveDoublingScheduler);
