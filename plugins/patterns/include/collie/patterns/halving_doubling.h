// Recursive halving / doubling (Rabenseifner) on any group size: the ranks beyond the largest
// power of two fold into a partner first, the power-of-two core halves and doubles, and the
// folded ranks get the result back at the end.
#pragma once

#include "collie/patterns/blocks.h"

namespace collie::patterns {

// The largest power of two <= n (n >= 1).
inline int powerOfTwoFloor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

inline int log2Exact(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

// How a rank takes part when n is not a power of two. With p = powerOfTwoFloor(n) and
// extra = n - p, ranks 0 .. 2*extra-1 pair up (2i, 2i+1): the even one hands its data to the
// odd one and sits out ("folded"); every remaining rank gets a core index 0 .. p-1.
struct Fold {
  int core_size;   // p
  int core_index;  // this rank's index in the core, or -1 when folded
  int partner;     // the rank it exchanges with in the fold, or -1
};

inline Fold fold(int rank, int n) {
  const int p = powerOfTwoFloor(n), extra = n - p;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) return {p, -1, rank + 1};
    return {p, rank / 2, rank - 1};
  }
  return {p, rank - extra, -1};
}

// The real rank of core index v.
inline int coreRank(int v, int n) {
  const int extra = n - powerOfTwoFloor(n);
  return v < extra ? 2 * v + 1 : v + extra;
}

// Blocks [begin, end) of the p-block split of the buffer.
struct BlockSpan {
  int begin;
  int end;
};

// Step k (0 .. log2(p)-1) of recursive halving for core index v: exchange with `partner`,
// keep `keep` and send `give`. Before step 0 every core rank holds all p blocks; after the
// last step core index v holds exactly block v, fully reduced.
struct HalvingStep {
  int partner;  // a core index
  BlockSpan keep;
  BlockSpan give;
};

inline HalvingStep halvingStep(int v, int p, int k) {
  const int distance = p >> (k + 1);
  // Before step k, v holds the span of size 2*distance that contains block v.
  const int begin = (v / (2 * distance)) * (2 * distance), middle = begin + distance;
  const BlockSpan lower{begin, middle}, upper{middle, begin + 2 * distance};
  const bool low = (v & distance) == 0;
  return {v ^ distance, low ? lower : upper, low ? upper : lower};
}

// Recursive doubling all-gather, the halving steps in reverse: at step k (0 .. log2(p)-1)
// core index v sends the span it holds and receives the partner's, doubling what it holds.
inline HalvingStep doublingStep(int v, int p, int k) {
  const int steps = log2Exact(p);
  HalvingStep h = halvingStep(v, p, steps - 1 - k);
  return {h.partner, h.keep, h.give};  // send `keep` (what v has), receive into `give`
}

}  // namespace collie::patterns
