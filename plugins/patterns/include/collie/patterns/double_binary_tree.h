// NCCL's double binary tree: two binary trees over the same ranks, each carrying half of the
// data, so that (for an even group) every rank is a leaf in one tree and an inner node in the
// other, and the two halves keep every rank's links busy in both directions.
#pragma once

#include "collie/patterns/tree.h"

namespace collie::patterns {

// The in-order binary tree over positions 0 .. n-1 built from the lowest set bit: position
// x > 0 with lowest set bit b hangs under (x ^ b) | 2b, or under x ^ b when that is past the
// end; position 0 is the root and has one child. Every odd position is a leaf, every even one
// but 0 has children, and the depth is about log2(n).
inline int inOrderParent(int x, int n) {
  if (x == 0) return -1;
  const int b = x & -x;
  const int up = (x ^ b) | (b << 1);
  return up < n ? up : x ^ b;
}

inline Ranks inOrderChildren(int x, int n) {
  Ranks children;
  int half;  // half of x's lowest set bit; for the root, a bit above every position
  if (x == 0) {
    half = 1;
    while (half < n) half *= 2;
  } else {
    half = (x & -x) / 2;
    if (half >= 1) children.push_back(x - half);
  }
  for (int c = half; c >= 1; c /= 2) {  // the right child, or the nearest one within the group
    if (x + c < n) {
      children.push_back(x + c);
      break;
    }
  }
  return children;
}

// Tree 0 places rank r at position r. Tree 1 mirrors it (position n-1-r) when n is even and
// shifts it by one (position r-1) when n is odd: either way a leaf of one tree (odd position)
// is an inner node of the other, except that for odd n one rank is inner in both.
inline int doubleTreePosition(int rank, int n, int tree) {
  if (tree == 0) return rank;
  return n % 2 == 0 ? n - 1 - rank : mod(rank - 1, n);
}

inline int doubleTreeRank(int position, int n, int tree) {
  if (tree == 0) return position;
  return n % 2 == 0 ? n - 1 - position : mod(position + 1, n);
}

inline TreeShape doubleBinaryTree(int rank, int n, int tree) {
  const int x = doubleTreePosition(rank, n, tree);
  TreeShape shape;
  const int up = inOrderParent(x, n);
  shape.parent = up < 0 ? -1 : doubleTreeRank(up, n, tree);
  for (int c : inOrderChildren(x, n)) shape.children.push_back(doubleTreeRank(c, n, tree));
  return shape;
}

}  // namespace collie::patterns
