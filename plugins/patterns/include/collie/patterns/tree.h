// Binary tree over ranks, rooted at any rank: parents and children in heap order of the
// rank's distance from the root ("virtual rank").
#pragma once

#include <vector>

#include "collie/patterns/blocks.h"

namespace collie::patterns {

// Position of `rank` in a tree rooted at `root` (the root has virtual rank 0).
inline int virtualRank(int rank, int root, int size) { return mod(rank - root, size); }
inline int realRank(int vrank, int root, int size) { return mod(vrank + root, size); }

// The parent of `rank`, or -1 for the root.
inline int treeParent(int rank, int root, int size) {
  int v = virtualRank(rank, root, size);
  return v == 0 ? -1 : realRank((v - 1) / 2, root, size);
}

// The children of `rank` (zero, one or two), left first.
inline std::vector<int> treeChildren(int rank, int root, int size) {
  int v = virtualRank(rank, root, size);
  std::vector<int> children;
  for (int c = 2 * v + 1; c <= 2 * v + 2 && c < size; ++c)
    children.push_back(realRank(c, root, size));
  return children;
}

}  // namespace collie::patterns
