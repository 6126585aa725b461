// Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling
// all-gather, over the largest power-of-two core of the group; the other ranks fold their
// data into a partner first and get the result back at the end. log2(n) steps per phase
// (the latency of a tree) moving the bytes of a ring.
#include <algorithm>
#include <cmath>

#include "collie/patterns/halving_doubling.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/fold.h"
#include "collie/schedules/small.h"

namespace collie::halving_doubling {
namespace {

using patterns::Range;

enum Phase : uint32_t {
  kFold = 1,
  kHalving = 2,
  kDoubling = 3,
  kUnfold = 4,
  kBarrier = 5,
  kScatter = 6,  // reduce_scatter off powers of two: the core's blocks to their owners
  kGather = 7,   // allgather off powers of two: every rank's block to the core
};

bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

Buffer elements(const Buffer& data, Range r) { return data.slice(r.offset, r.count); }

class HalvingDoublingScheduler : public Scheduler {
 public:
  explicit HalvingDoublingScheduler(const PluginContext&) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    switch (args.coll) {
      case Collective::kAllReduce:
      case Collective::kBarrier:
      case Collective::kReduceScatter:
      case Collective::kAllGather:
        return Decision::yes();
      default:
        return Decision::no("halving_doubling: broadcast is not implemented (use tree)");
    }
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    switch (args.coll) {
      case Collective::kAllReduce:
        return allReduce(args, backend);
      case Collective::kBarrier:
        return barrier(args, backend);
      case Collective::kReduceScatter:
        return reduceScatter(args, backend);
      case Collective::kAllGather:
        return allGather(args, backend);
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
    return schedules::predictOnly(
        {Collective::kAllReduce, Collective::kBarrier, Collective::kReduceScatter,
         Collective::kAllGather},
        args, topology, [&](int n) {
          if (args.coll == Collective::kBarrier) {
            double t = 0;
            for (int d = 1; d < n; d *= 2) {
              std::vector<Flow> round;
              for (int r = 0; r < n; ++r) round.push_back({r, (r + d) % n, 0});
              t += stepSeconds(round, topology, model);
            }
            return t;
          }
          const bool reduces = args.coll != Collective::kAllGather;
          const bool gathers = args.coll != Collective::kReduceScatter;
          // The whole buffer: the input of all-reduce and reduce_scatter, allgather's output.
          const size_t count = gathers && !reduces ? args.output.count : args.data.count;
          const int p = patterns::powerOfTwoFloor(n);
          const double element = static_cast<double>(dtypeSize(args.data.dtype));
          const double m = element * static_cast<double>(count);
          auto bytes = [&](patterns::BlockSpan span) {
            return element *
                   static_cast<double>(patterns::blockSpan(count, p, span.begin, span.end).count);
          };
          double t = reduces ? static_cast<double>(p - 1) / p * m * model.gamma : 0;
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
            if (reduces) t += stepSeconds(halving, topology, model);
            if (gathers) t += stepSeconds(doubling, topology, model);
          }
          if (p == n) return t;
          if (args.coll == Collective::kAllReduce)
            return t + schedules::predictFold(n, m, topology, model);
          // Off powers of two: reduce_scatter folds in (a whole message, reduced) and scatters the
          // core's blocks to their owners; allgather gathers the blocks to the core and folds out.
          std::vector<Flow> fold, moves;
          for (int r = 0; r < 2 * (n - p); r += 2) fold.push_back({r, r + 1, m});
          for (int v = 0; v < p; ++v) {
            for (int r = 0; r < n; ++r) {
              const int core = patterns::coreRank(v, n);
              const size_t piece =
                  patterns::intersect(patterns::block(count, p, v), patterns::block(count, n, r))
                      .count;
              if (piece == 0 || core == r) continue;
              moves.push_back(reduces ? Flow{core, r, element * static_cast<double>(piece)}
                                      : Flow{r, core, element * static_cast<double>(piece)});
            }
          }
          if (!reduces) {
            for (Flow& f : fold) std::swap(f.from, f.to);
          }
          return t + stepSeconds(fold, topology, model) + (reduces ? m * model.gamma : 0) +
                 stepSeconds(moves, topology, model);
        });
  }

 private:
  void allReduce(const CollectiveArgs& args, Backend& backend) {
    const Buffer& data = args.data;
    schedules::allReduceOnCore(args, kFold, kUnfold, backend, [&](const patterns::Fold& f) {
      halving(data, args.op, f.core_index, f.core_size, args.seq, backend);
      finishAverage(elements(data, patterns::block(data.count, f.core_size, f.core_index)), args.op,
                    backend.size());
      doubling(data, f.core_index, f.core_size, args.seq, backend);
    });
  }

  // Off powers of two the core reduces exactly as allReduce() does (so every element is the
  // same sum, added in the same order) and then sends each rank the part of its block of
  // the n-way split that lies in the core rank's block of the p-way split.
  void reduceScatter(const CollectiveArgs& args, Backend& backend) {
    const int n = backend.size(), rank = backend.rank();
    const size_t count = args.data.count;
    const patterns::Range mine = patterns::block(count, n, rank);
    if (n == 1 || count == 0) {
      copyInto(args.output, elements(args.data, mine));
      return finishAverage(args.output, args.op, n);
    }
    if (isPowerOfTwo(n)) {
      ScratchBuffer work(args.data, count);
      copyInto(work.view(), args.data);
      halving(work.view(), args.op, rank, n, args.seq, backend);
      copyInto(args.output, elements(work.view(), mine));
      return finishAverage(args.output, args.op, n);
    }
    const patterns::Fold f = patterns::fold(rank, n);
    const int p = f.core_size;
    schedules::Requests requests;
    // Every rank receives its block's pieces from the core ranks that hold them reduced,
    // posted first, so that they land in place. Over a backend with batch completion (nccl)
    // they are posted once the fold and the halving are over: it matches in posting order
    // whatever the tags, so the halving's messages would land in them.
    const bool early = !backend.capabilities().batch_completion;
    const auto receivePieces = [&] {
      for (int v = 0; v < p; ++v) {
        const patterns::Range piece = patterns::intersect(patterns::block(count, p, v), mine);
        const int from = patterns::coreRank(v, n);
        if (piece.count == 0 || from == rank) continue;
        requests.push_back(
            backend.irecv(from, elements(args.output, {piece.offset - mine.offset, piece.count}),
                          makeTag(args.seq, kScatter, 0)));
      }
    };
    if (early) receivePieces();
    if (f.core_index < 0) {
      backend.send(f.partner, args.data, makeTag(args.seq, kFold, 0));
      if (!early) receivePieces();
    } else {
      ScratchBuffer work(args.data, count);
      copyInto(work.view(), args.data);
      if (f.partner >= 0) {
        ScratchBuffer incoming(args.data, count);
        backend.recv(f.partner, incoming.view(), makeTag(args.seq, kFold, 0));
        reduceInto(work.view(), incoming.view(), args.op);
      }
      halving(work.view(), args.op, f.core_index, p, args.seq, backend);
      if (!early) receivePieces();
      const patterns::Range held = patterns::block(count, p, f.core_index);
      for (int r = 0; r < n; ++r) {
        const patterns::Range piece = patterns::intersect(held, patterns::block(count, n, r));
        if (piece.count == 0) continue;
        if (r == rank) {
          copyInto(elements(args.output, {piece.offset - mine.offset, piece.count}),
                   elements(work.view(), piece));
        } else {
          requests.push_back(
              backend.isend(r, elements(work.view(), piece), makeTag(args.seq, kScatter, 0)));
        }
      }
      waitAll(requests, backend.timeout());  // before `work` goes
    }
    waitAll(requests, backend.timeout());
    finishAverage(args.output, args.op, n);
  }

  // Off powers of two every rank sends its block's pieces to the core ranks whose block of
  // the p-way split holds them, the core doubles, and the folded ranks get the whole result.
  void allGather(const CollectiveArgs& args, Backend& backend) {
    const int n = backend.size(), rank = backend.rank();
    const size_t count = args.output.count;
    const patterns::Range mine = patterns::block(count, n, rank);
    copyInto(elements(args.output, mine), args.data);
    if (n == 1 || count == 0) return;
    if (isPowerOfTwo(n)) return doubling(args.output, rank, n, args.seq, backend);
    const patterns::Fold f = patterns::fold(rank, n);
    const int p = f.core_size;
    schedules::Requests requests;
    for (int v = 0; v < p; ++v) {
      const patterns::Range piece = patterns::intersect(mine, patterns::block(count, p, v));
      const int to = patterns::coreRank(v, n);
      if (piece.count == 0 || to == rank) continue;
      requests.push_back(
          backend.isend(to, elements(args.output, piece), makeTag(args.seq, kGather, 0)));
    }
    if (f.core_index >= 0) {
      const patterns::Range held = patterns::block(count, p, f.core_index);
      for (int r = 0; r < n; ++r) {
        const patterns::Range piece = patterns::intersect(held, patterns::block(count, n, r));
        if (piece.count == 0 || r == rank) continue;
        requests.push_back(
            backend.irecv(r, elements(args.output, piece), makeTag(args.seq, kGather, 0)));
      }
    }
    waitAll(requests, backend.timeout());  // the whole output is overwritten below
    if (f.core_index < 0) {
      return backend.recv(f.partner, args.output, makeTag(args.seq, kUnfold, 0));
    }
    doubling(args.output, f.core_index, p, args.seq, backend);
    schedules::foldOut(args.output, f, args.seq, kUnfold, backend);
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

  // Dissemination barrier: ceil(log2 n) rounds of empty messages at distances 1, 2, 4, ...,
  // in the memory of the caller's (empty) buffer, which the backend moves.
  void barrier(const CollectiveArgs& args, Backend& backend) {
    const uint64_t seq = args.seq;
    const int n = backend.size(), rank = backend.rank();
    const Buffer empty = args.data.slice(0, 0);
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
