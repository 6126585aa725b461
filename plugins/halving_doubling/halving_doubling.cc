// Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling
// all-gather, over the largest power-of-two core of the group; the other ranks fold their
// data into a partner first and get the result back at the end. log2(n) steps per phase
// (the latency of a tree) moving the bytes of a ring.
#include <algorithm>
#include <cmath>

#include "collie/patterns/halving_doubling.h"
#include "collie/plugin.h"
#include "collie/schedules/fold.h"
#include "collie/schedules/small.h"

namespace collie::halving_doubling {
namespace {

using patterns::Range;

enum Phase : uint32_t { kFold = 1, kHalving = 2, kDoubling = 3, kUnfold = 4, kBarrier = 5 };

bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

Buffer elements(const Buffer& data, Range r) { return data.slice(r.offset, r.count); }

class HalvingDoublingScheduler : public Scheduler {
 public:
  explicit HalvingDoublingScheduler(const PluginContext&) {}

  Decision accepts(const CollectiveArgs& args, const Topology& topology) const override {
    switch (args.coll) {
      case Collective::kAllReduce:
      case Collective::kBarrier:
        return Decision::yes();
      case Collective::kReduceScatter:
      case Collective::kAllGather:
        if (isPowerOfTwo(topology.world_size)) return Decision::yes();
        return Decision::no(std::string("halving_doubling: ") + collectiveName(args.coll) +
                            " needs a power-of-two group, this one has " +
                            std::to_string(topology.world_size) + " ranks");
      default:
        return Decision::no("halving_doubling: broadcast is not implemented (use tree)");
    }
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    switch (args.coll) {
      case Collective::kAllReduce:
        return allReduce(args, backend);
      case Collective::kBarrier:
        return barrier(args.seq, backend);
      case Collective::kReduceScatter: {
        ScratchBuffer work(args.data, args.data.count);
        copyInto(work.view(), args.data);
        halving(work.view(), args.op, backend.rank(), n, args.seq, backend);
        copyInto(args.output,
                 elements(work.view(), patterns::block(args.data.count, n, backend.rank())));
        return finishAverage(args.output, args.op, n);
      }
      case Collective::kAllGather: {
        copyInto(elements(args.output, patterns::block(args.output.count, n, backend.rank())),
                 args.data);
        return doubling(args.output, backend.rank(), n, args.seq, backend);
      }
      default:
        throw InternalError("halving_doubling: run() called for a collective it declined");
    }
  }

  // α-β-γ (README): each halving and doubling step is one exchange between core partners of
  // the span they give (stepSeconds prices it: node links that several exchanges cross at
  // once are shared), and halving reduces (p-1)/p of the message. With n not a power of
  // two the folded ranks hand their data in and get the result back (one whole-message
  // message each way) and their partners reduce it. A barrier: ⌈log2 n⌉ rounds of empty
  // messages.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (n == 1) return 0;
    if (args.coll == Collective::kBarrier) {
      double t = 0;
      for (int d = 1; d < n; d *= 2) {
        std::vector<Flow> round;
        for (int r = 0; r < n; ++r) round.push_back({r, (r + d) % n, 0});
        t += stepSeconds(round, topology, model);
      }
      return t;
    }
    if (args.coll != Collective::kAllReduce) return kNoPrediction;
    const int p = patterns::powerOfTwoFloor(n);
    const double m = static_cast<double>(args.data.bytes());
    const double element = static_cast<double>(dtypeSize(args.data.dtype));
    auto bytes = [&](patterns::BlockSpan span) {
      return element * static_cast<double>(
                           patterns::blockSpan(args.data.count, p, span.begin, span.end).count);
    };
    double t = static_cast<double>(p - 1) / p * m * model.gamma;
    for (int k = 0; k < patterns::log2Exact(p); ++k) {
      std::vector<Flow> halving, doubling;
      for (int v = 0; v < p; ++v) {
        const patterns::HalvingStep h = patterns::halvingStep(v, p, k);
        halving.push_back(
            {patterns::coreRank(v, n), patterns::coreRank(h.partner, n), bytes(h.give)});
        const patterns::HalvingStep d = patterns::doublingStep(v, p, k);
        doubling.push_back(
            {patterns::coreRank(v, n), patterns::coreRank(d.partner, n), bytes(d.keep)});
      }
      t += stepSeconds(halving, topology, model) + stepSeconds(doubling, topology, model);
    }
    return t + schedules::predictFold(n, m, topology, model);
  }

 private:
  void allReduce(const CollectiveArgs& args, Backend& backend) {
    const int n = backend.size();
    const Buffer& data = args.data;
    if (n == 1 || data.count == 0) return finishAverage(data, args.op, n);
    const patterns::Fold f = patterns::fold(backend.rank(), n);
    if (!schedules::foldIn(data, args.op, f, args.seq, kFold, kUnfold, backend)) return;
    halving(data, args.op, f.core_index, f.core_size, args.seq, backend);
    finishAverage(elements(data, patterns::block(data.count, f.core_size, f.core_index)), args.op,
                  n);
    doubling(data, f.core_index, f.core_size, args.seq, backend);
    schedules::foldOut(data, f, args.seq, kUnfold, backend);
  }

  // Recursive halving among the p core ranks: core index v ends with block v reduced.
  void halving(const Buffer& data, ReduceOp op, int v, int p, uint64_t seq, Backend& backend) {
    const int n = backend.size();
    ScratchBuffer incoming(data, patterns::blockSpan(data.count, p, 0, std::max(1, p / 2)).count);
    for (int k = 0; k < patterns::log2Exact(p); ++k) {
      patterns::HalvingStep s = patterns::halvingStep(v, p, k);
      const int peer = patterns::coreRank(s.partner, n);
      Range keep = patterns::blockSpan(data.count, p, s.keep.begin, s.keep.end);
      Range give = patterns::blockSpan(data.count, p, s.give.begin, s.give.end);
      Buffer into = incoming.view().slice(0, keep.count);
      auto recv = backend.irecv(peer, into, makeTag(seq, kHalving, k));
      auto send = backend.isend(peer, elements(data, give), makeTag(seq, kHalving, k));
      recv->wait(backend.timeout());
      reduceInto(elements(data, keep), into, op);
      send->wait(backend.timeout());
    }
  }

  // Recursive doubling among the p core ranks, starting from block v on core index v.
  void doubling(const Buffer& data, int v, int p, uint64_t seq, Backend& backend) {
    const int n = backend.size();
    for (int k = 0; k < patterns::log2Exact(p); ++k) {
      patterns::HalvingStep s = patterns::doublingStep(v, p, k);
      const int peer = patterns::coreRank(s.partner, n);
      Range have = patterns::blockSpan(data.count, p, s.keep.begin, s.keep.end);
      Range want = patterns::blockSpan(data.count, p, s.give.begin, s.give.end);
      schedules::Requests requests;
      requests.push_back(backend.irecv(peer, elements(data, want), makeTag(seq, kDoubling, k)));
      requests.push_back(backend.isend(peer, elements(data, have), makeTag(seq, kDoubling, k)));
      waitAll(requests, backend.timeout());
    }
  }

  // Dissemination barrier: ceil(log2 n) rounds of empty messages at distances 1, 2, 4, ...
  void barrier(uint64_t seq, Backend& backend) {
    const int n = backend.size(), rank = backend.rank();
    Buffer empty;
    for (int k = 0, d = 1; d < n; ++k, d *= 2) {
      schedules::Requests requests;
      requests.push_back(
          backend.irecv(patterns::mod(rank - d, n), empty, makeTag(seq, kBarrier, k)));
      requests.push_back(
          backend.isend(patterns::mod(rank + d, n), empty, makeTag(seq, kBarrier, k)));
      waitAll(requests, backend.timeout());
    }
  }
};

}  // namespace
}  // namespace collie::halving_doubling

COLLIE_SCHEDULER_PLUGIN("halving_doubling", "1.0.0",
                        "Rabenseifner all-reduce: recursive halving then doubling, any group size",
                        collie::halving_doubling::HalvingDoublingScheduler);
