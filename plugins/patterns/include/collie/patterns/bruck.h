// Bruck's all-gather on any n: ⌈log2 n⌉ steps. Each rank keeps the blocks it has gathered in
// rotated order (position i holds the block of rank r + i); at step k it sends its first
// `count` positions to r − 2^k and receives as many from r + 2^k into positions 2^k .. , so
// after the last step it holds all n, and one rotation puts them in rank order.
#pragma once

#include <algorithm>

#include "collie/patterns/blocks.h"

namespace collie::patterns {

struct BruckStep {
  int send_to;
  int recv_from;
  int have;   // positions held before the step (2^k): received blocks land from here
  int count;  // positions sent and received: min(2^k, n − 2^k)
};

inline int bruckSteps(int n) {
  int steps = 0;
  for (int reach = 1; reach < n; reach *= 2) ++steps;
  return steps;
}

inline BruckStep bruckStep(int rank, int n, int k) {
  const int have = 1 << k;
  return {mod(rank - have, n), mod(rank + have, n), have, std::min(have, n - have)};
}

}  // namespace collie::patterns
