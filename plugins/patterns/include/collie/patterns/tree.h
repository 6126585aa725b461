// Trees over ranks: the shape a tree schedule needs (a rank's parent and children), and the
// binary tree rooted at any rank in heap order of the rank's distance from the root
// ("virtual rank").
#pragma once

#include <boost/container/small_vector.hpp>

#include "collie/patterns/blocks.h"

namespace collie::patterns {

// A few ranks (a node's children), held inline up to 8: a schedule builds them for every
// collective, and a small collective must not allocate.
using Ranks = boost::container::small_vector<int, 8>;

// Position of `rank` in a tree rooted at `root` (the root has virtual rank 0).
inline int virtualRank(int rank, int root, int size) { return mod(rank - root, size); }
inline int realRank(int vrank, int root, int size) { return mod(vrank + root, size); }

// The parent of `rank`, or -1 for the root.
inline int treeParent(int rank, int root, int size) {
  int v = virtualRank(rank, root, size);
  return v == 0 ? -1 : realRank((v - 1) / 2, root, size);
}

// The children of `rank` (zero, one or two), left first.
inline Ranks treeChildren(int rank, int root, int size) {
  int v = virtualRank(rank, root, size);
  Ranks children;
  for (int c = 2 * v + 1; c <= 2 * v + 2 && c < size; ++c)
    children.push_back(realRank(c, root, size));
  return children;
}

// One rank's place in a tree: its parent (-1 at the root) and its children, in the order a
// schedule serves them.
struct TreeShape {
  int parent = -1;
  Ranks children;
};

inline TreeShape binaryTree(int rank, int root, int size) {
  return {treeParent(rank, root, size), treeChildren(rank, root, size)};
}

}  // namespace collie::patterns
