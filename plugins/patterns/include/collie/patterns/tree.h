// Trees over ranks: the shape a tree schedule needs (a rank's parent and children), and the
// binary tree rooted at any rank in heap order of the rank's distance from the root
// ("virtual rank").
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

// One rank's place in a tree: its parent (-1 at the root) and its children, in the order a
// schedule serves them.
struct TreeShape {
  int parent = -1;
  std::vector<int> children;
};

inline TreeShape binaryTree(int rank, int root, int size) {
  return {treeParent(rank, root, size), treeChildren(rank, root, size)};
}

}  // namespace collie::patterns
