// The fold of halving_doubling (patterns::fold) with its communication, for the schedules
// that run on the largest power-of-two core of a group (halving_doubling,
// recursive_doubling, swing): the ranks beyond the core hand their buffer to a partner
// before the core runs and get the result back after it.
#pragma once

#include <vector>

#include "collie/patterns/halving_doubling.h"
#include "collie/plugin.h"

namespace collie::schedules {

// Before the core runs. A folded rank sends `data` to its partner and receives the result
// into it: returns false, and it is done. A core rank with a partner adds the partner's
// buffer into `data`; every core rank returns true.
inline bool foldIn(const Buffer& data, ReduceOp op, const patterns::Fold& f, uint64_t seq,
                   uint32_t fold_phase, uint32_t unfold_phase, Backend& backend) {
  if (f.core_index < 0) {
    backend.send(f.partner, data, makeTag(seq, fold_phase, 0));
    backend.recv(f.partner, data, makeTag(seq, unfold_phase, 0));
    return false;
  }
  if (f.partner >= 0) {
    ScratchBuffer incoming(data, data.count);
    backend.recv(f.partner, incoming.view(), makeTag(seq, fold_phase, 0));
    reduceInto(data, incoming.view(), op);
  }
  return true;
}

// After the core ran: a core rank with a partner sends it the result.
inline void foldOut(const Buffer& data, const patterns::Fold& f, uint64_t seq,
                    uint32_t unfold_phase, Backend& backend) {
  if (f.partner >= 0) backend.send(f.partner, data, makeTag(seq, unfold_phase, 0));
}

// An all-reduce on the largest power-of-two core of the group with the fold around it (and
// nothing to do on one rank or no elements): `core(f)` runs on every core rank once the
// folded ranks' data is added in, and must leave each core rank with the whole result,
// averaged for kAvg; the folded ranks get it back afterwards.
template <typename Core>
void allReduceOnCore(const CollectiveArgs& args, uint32_t fold_phase, uint32_t unfold_phase,
                     Backend& backend, Core&& core) {
  const int n = backend.size();
  const Buffer& data = args.data;
  if (n == 1 || data.count == 0) return finishAverage(data, args.op, n);
  const patterns::Fold f = patterns::fold(backend.rank(), n);
  if (!foldIn(data, args.op, f, args.seq, fold_phase, unfold_phase, backend)) return;
  core(f);
  foldOut(data, f, args.seq, unfold_phase, backend);
}

// The core of recursive_doubling and of swing's latency variant: at each of `steps` steps i
// this core rank swaps its whole buffer with core rank `peer(i)` and adds in what it
// received. Every core rank ends with the same bits when each pair adds the same two
// operands (the schedules' order of steps sees to it). Step i's messages carry step i in
// their tag (a timeout names it). Allocates nothing (the hot path).
template <typename PeerOf>
void exchangeWhole(const Buffer& data, ReduceOp op, uint64_t seq, uint32_t phase, int steps,
                   PeerOf peer, Backend& backend) {
  ScratchBuffer incoming(data, data.count);
  const int n = backend.size();
  for (int i = 0; i < steps; ++i) {
    const int partner = patterns::coreRank(peer(i), n);
    const Tag tag = makeTag(seq, phase, static_cast<uint32_t>(i));
    auto recv = backend.irecv(partner, incoming.view(), tag);
    auto send = backend.isend(partner, data, tag);
    // The send first: data is read by it until it completes, and over Gloo a receive
    // waited for first costs a wake-up more (benchmarks/overhead.cc).
    send->wait(backend.timeout());
    recv->wait(backend.timeout());
    reduceInto(data, incoming.view(), op);
  }
}

// The α-β-γ price of exchangeWhole on the core of n ranks, for `bytes`: each step's
// exchanges between every core rank v and `peer(v, step)` at once (stepSeconds shares the
// node links several of them cross), and a reduction of the whole message.
template <typename PeerOf>
double predictWholeExchanges(int n, double bytes, const Topology& topology, const CostModel& model,
                             PeerOf peer) {
  const int p = patterns::powerOfTwoFloor(n);
  double t = 0;
  for (int step = 0; step < patterns::log2Exact(p); ++step) {
    std::vector<Flow> flows;
    for (int v = 0; v < p; ++v)
      flows.push_back({patterns::coreRank(v, n), patterns::coreRank(peer(v, step), n), bytes});
    t += stepSeconds(flows, topology, model) + bytes * model.gamma;
  }
  return t;
}

// The α-β-γ price of foldIn and foldOut for `bytes` on n ranks (0 when n is a power of two):
// the folded ranks' message in, its reduction, and the result back (stepSeconds shares the
// links that the pairs cross at once).
inline double predictFold(int n, double bytes, const Topology& topology, const CostModel& model) {
  const int p = patterns::powerOfTwoFloor(n);
  if (p == n) return 0;
  std::vector<Flow> in, out;
  for (int r = 0; r < 2 * (n - p); r += 2) {
    in.push_back({r, r + 1, bytes});
    out.push_back({r + 1, r, bytes});
  }
  return stepSeconds(in, topology, model) + bytes * model.gamma + stepSeconds(out, topology, model);
}

}  // namespace collie::schedules
