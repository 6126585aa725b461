// The k-nomial tree (radix k >= 2; k = 2 is the binomial tree) rooted at any rank, over
// virtual ranks v = rank - root (mod n): the parent of v > 0 is v with its lowest non-zero
// base-k digit cleared, and v's children are v + j·k^i for every digit position i below that
// digit (every position, for the root) and j = 1 .. k-1. Depth ⌈log_k n⌉.
#pragma once

#include <cstdint>

#include "collie/patterns/tree.h"

namespace collie::patterns {

// The place of k^i of v's lowest non-zero base-k digit (v > 0).
inline int64_t lowestDigitWeight(int64_t v, int radix) {
  int64_t weight = 1;
  while ((v / weight) % radix == 0) weight *= radix;
  return weight;
}

// Children come largest subtree first (the highest digit position), as a broadcast sends
// them: the child with the most below it starts first.
inline TreeShape knomialTree(int rank, int root, int n, int radix) {
  const int64_t v = virtualRank(rank, root, n);
  TreeShape shape;
  int64_t limit = n;  // the root's children span every digit position
  if (v > 0) {
    limit = lowestDigitWeight(v, radix);
    shape.parent = realRank(static_cast<int>(v - (v / limit) % radix * limit), root, n);
  }
  int64_t top = 1;  // the highest digit position below the limit
  while (top * radix < limit && top * radix < n) top *= radix;
  for (int64_t w = top; w >= 1 && w < limit && w < n; w /= radix) {
    for (int j = radix - 1; j >= 1; --j) {
      if (v + j * w < n) shape.children.push_back(realRank(static_cast<int>(v + j * w), root, n));
    }
  }
  return shape;
}

// ⌈log_k n⌉: the number of levels below the root.
inline int knomialDepth(int n, int radix) {
  int depth = 0;
  for (int64_t reach = 1; reach < n; reach *= radix) ++depth;
  return depth;
}

}  // namespace collie::patterns
