// Ring schedule: who sends which block to whom at each step.
#pragma once

#include "collie/patterns/blocks.h"

namespace collie::patterns {

inline int ringNext(int rank, int size) { return mod(rank + 1, size); }
inline int ringPrev(int rank, int size) { return mod(rank - 1, size); }

// A ring in either direction as positions 0 .. size-1, each sending to the next position:
// forward, position = rank (next = rank + 1); backward, position = -rank (next = rank - 1).
// The steps below are in positions; a backward ring's block b ends on the rank at position b.
inline int ringPosition(int rank, int size, bool forward) {
  return forward ? rank : mod(-rank, size);
}
inline int ringRankAt(int position, int size, bool forward) {
  return forward ? position : mod(-position, size);
}

// The blocks a rank sends to ringNext and receives from ringPrev at one step.
struct RingStep {
  int send_block;
  int recv_block;
};

// Reduce-scatter, steps 0 .. size-2. After the last step, rank r holds the full reduction
// of block r (the block it received last), which is what reduce_scatter returns.
inline RingStep ringReduceScatterStep(int rank, int size, int step) {
  return {mod(rank - step - 1, size), mod(rank - step - 2, size)};
}

// All-gather, steps 0 .. size-2, starting with every rank holding its own block r.
inline RingStep ringAllGatherStep(int rank, int size, int step) {
  return {mod(rank - step, size), mod(rank - step - 1, size)};
}

}  // namespace collie::patterns
