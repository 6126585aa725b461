// The fold of halving_doubling (patterns::fold) with its communication, for the schedules
// that run on the largest power-of-two core of a group (halving_doubling,
// recursive_doubling, swing): the ranks beyond the core hand their buffer to a partner
// before the core runs and get the result back after it.
#pragma once

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
