// The schedulers' peer arithmetic, checked by simulating the schedules symbolically.
#include <gtest/gtest.h>

#include <set>

#include "collie/patterns/ring.h"
#include "collie/patterns/tree.h"

namespace collie::patterns {
namespace {

TEST(Blocks, TileTheBufferInOrder) {
  for (size_t count : {0, 1, 7, 1000, 1000003}) {
    for (int parts = 1; parts <= 17; ++parts) {
      size_t next = 0;
      for (int i = 0; i < parts; ++i) {
        Range r = block(count, parts, i);
        EXPECT_EQ(r.offset, next);
        EXPECT_LE(r.count, count / parts + 1);
        EXPECT_GE(r.count, count / parts);
        next += r.count;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(Blocks, PiecesCoverTheRangeAndEmptyRangeIsOneMessage) {
  auto p = pieces({10, 7}, 3);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], (Range{10, 3}));
  EXPECT_EQ(p[1], (Range{13, 3}));
  EXPECT_EQ(p[2], (Range{16, 1}));
  auto empty = pieces({5, 0}, 4);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0].count, 0u);
}

TEST(Blocks, ModIsEuclidean) {
  EXPECT_EQ(mod(-1, 4), 3);
  EXPECT_EQ(mod(-9, 4), 3);
  EXPECT_EQ(mod(5, 4), 1);
}

// holds[r][b] = the set of ranks whose contribution block b on rank r contains.
using Holdings = std::vector<std::vector<std::set<int>>>;

TEST(Ring, ReduceScatterLeavesRankRWithBlockRComplete) {
  for (int n = 2; n <= 16; ++n) {
    Holdings holds(n, std::vector<std::set<int>>(n));
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < n; ++b) holds[r][b] = {r};
    for (int step = 0; step < n - 1; ++step) {
      Holdings next = holds;
      for (int r = 0; r < n; ++r) {
        auto s = ringReduceScatterStep(r, n, step);
        int to = ringNext(r, n);
        EXPECT_EQ(ringReduceScatterStep(to, n, step).recv_block, s.send_block);
        auto& into = next[to][s.send_block];
        into.insert(holds[r][s.send_block].begin(), holds[r][s.send_block].end());
      }
      holds = next;
    }
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(holds[r][r].size(), static_cast<size_t>(n)) << n << " " << r;
  }
}

TEST(Ring, AllGatherDeliversEveryBlockToEveryRank) {
  for (int n = 2; n <= 16; ++n) {
    std::vector<std::set<int>> has(n);
    for (int r = 0; r < n; ++r) has[r] = {r};
    for (int step = 0; step < n - 1; ++step) {
      auto next = has;
      for (int r = 0; r < n; ++r) {
        auto s = ringAllGatherStep(r, n, step);
        EXPECT_TRUE(has[r].count(s.send_block)) << "rank " << r << " sends a block it lacks";
        EXPECT_EQ(ringAllGatherStep(ringNext(r, n), n, step).recv_block, s.send_block);
        next[ringNext(r, n)].insert(s.send_block);
      }
      has = next;
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(has[r].size(), static_cast<size_t>(n));
  }
}

TEST(Tree, ParentsAndChildrenAgreeForEveryRoot) {
  for (int n = 1; n <= 17; ++n) {
    for (int root = 0; root < n; ++root) {
      int roots = 0, edges = 0;
      for (int r = 0; r < n; ++r) {
        int parent = treeParent(r, root, n);
        if (parent < 0) {
          ++roots;
          EXPECT_EQ(r, root);
          continue;
        }
        auto siblings = treeChildren(parent, root, n);
        EXPECT_NE(std::find(siblings.begin(), siblings.end(), r), siblings.end());
        ++edges;
        // Depth is logarithmic: walking up reaches the root within log2(n) + 1 hops.
        int hops = 0;
        for (int p = r; p != root; p = treeParent(p, root, n)) ASSERT_LE(++hops, 6);
      }
      EXPECT_EQ(roots, 1);
      EXPECT_EQ(edges, n - 1);
    }
  }
}

}  // namespace
}  // namespace collie::patterns

#include "collie/patterns/halving_doubling.h"

namespace collie::patterns {
namespace {

TEST(HalvingDoubling, FoldPairsTheExtraRanksAndNumbersTheCore) {
  for (int n = 1; n <= 33; ++n) {
    int p = powerOfTwoFloor(n), cores = 0;
    EXPECT_LE(p, n);
    EXPECT_GT(2 * p, n);
    std::set<int> indices;
    for (int r = 0; r < n; ++r) {
      Fold f = fold(r, n);
      if (f.core_index >= 0) {
        ++cores;
        indices.insert(f.core_index);
        EXPECT_EQ(coreRank(f.core_index, n), r);
      } else {
        EXPECT_EQ(fold(f.partner, n).partner, r) << "fold partners are mutual";
        EXPECT_GE(fold(f.partner, n).core_index, 0);
      }
    }
    EXPECT_EQ(cores, p);
    EXPECT_EQ(static_cast<int>(indices.size()), p);
  }
}

TEST(HalvingDoubling, HalvingLeavesCoreIndexVWithBlockVReduced) {
  for (int p = 1; p <= 32; p *= 2) {
    // holds[v][b] = contributions in block b on core index v; span[v] = blocks v still owns
    Holdings holds(p, std::vector<std::set<int>>(p));
    std::vector<BlockSpan> span(p, BlockSpan{0, p});
    for (int v = 0; v < p; ++v)
      for (int b = 0; b < p; ++b) holds[v][b] = {v};
    for (int k = 0; k < log2Exact(p); ++k) {
      Holdings next = holds;
      for (int v = 0; v < p; ++v) {
        HalvingStep s = halvingStep(v, p, k);
        HalvingStep back = halvingStep(s.partner, p, k);
        EXPECT_EQ(back.partner, v);
        EXPECT_EQ(back.give.begin, s.keep.begin) << "partner sends what v keeps";
        EXPECT_EQ(back.give.end, s.keep.end);
        EXPECT_GE(s.keep.begin, span[v].begin);
        EXPECT_LE(s.keep.end, span[v].end);
        for (int b = s.keep.begin; b < s.keep.end; ++b) {
          next[v][b].insert(holds[s.partner][b].begin(), holds[s.partner][b].end());
        }
      }
      for (int v = 0; v < p; ++v) span[v] = halvingStep(v, p, k).keep;
      holds = next;
    }
    for (int v = 0; v < p; ++v) {
      EXPECT_EQ(span[v].begin, v);
      EXPECT_EQ(span[v].end, v + 1);
      EXPECT_EQ(holds[v][v].size(), static_cast<size_t>(p));
    }
  }
}

TEST(HalvingDoubling, DoublingGathersEveryBlock) {
  for (int p = 1; p <= 32; p *= 2) {
    std::vector<std::set<int>> has(p);
    for (int v = 0; v < p; ++v) has[v] = {v};
    for (int k = 0; k < log2Exact(p); ++k) {
      auto next = has;
      for (int v = 0; v < p; ++v) {
        HalvingStep s = doublingStep(v, p, k);
        for (int b = s.keep.begin; b < s.keep.end; ++b) {
          EXPECT_TRUE(has[v].count(b)) << "v sends only blocks it has";
        }
        for (int b = s.give.begin; b < s.give.end; ++b) next[v].insert(b);
        HalvingStep back = doublingStep(s.partner, p, k);
        EXPECT_EQ(back.keep.begin, s.give.begin);
      }
      has = next;
    }
    for (int v = 0; v < p; ++v) EXPECT_EQ(has[v].size(), static_cast<size_t>(p));
  }
}

}  // namespace
}  // namespace collie::patterns

#include <functional>
#include <map>

#include "collie/patterns/bruck.h"
#include "collie/patterns/double_binary_tree.h"
#include "collie/patterns/knomial.h"
#include "collie/patterns/swing.h"

namespace collie::patterns {
namespace {

// Checks that `shape_of` describes one tree over n ranks: parents and children agree, one
// root, every rank reaches it within `max_depth` hops. Returns the number of children of each.
std::vector<size_t> expectTree(int n, int max_depth, const std::function<TreeShape(int)>& shape_of,
                               const std::string& what) {
  std::vector<size_t> children(n);
  int roots = 0, edges = 0;
  for (int r = 0; r < n; ++r) {
    TreeShape s = shape_of(r);
    children[r] = s.children.size();
    for (int c : s.children) {
      EXPECT_EQ(shape_of(c).parent, r) << what << ": child " << c << " of " << r;
      ++edges;
    }
    if (s.parent < 0) {
      ++roots;
      continue;
    }
    auto siblings = shape_of(s.parent).children;
    EXPECT_NE(std::find(siblings.begin(), siblings.end(), r), siblings.end()) << what;
    int hops = 0;
    for (int p = r; shape_of(p).parent >= 0 && hops <= max_depth; p = shape_of(p).parent) {
      ++hops;
    }
    EXPECT_LE(hops, max_depth) << what << ": rank " << r << " is too deep or in a cycle";
  }
  EXPECT_EQ(roots, 1) << what;
  EXPECT_EQ(edges, n - 1) << what;
  return children;
}

TEST(Ring, BackwardRingSendsToThePreviousRank) {
  for (int n = 1; n <= 9; ++n) {
    for (int r = 0; r < n; ++r) {
      const int position = ringPosition(r, n, false);
      EXPECT_EQ(ringRankAt(position, n, false), r);
      EXPECT_EQ(ringRankAt(ringNext(position, n), n, false), mod(r - 1, n));
      EXPECT_EQ(ringRankAt(ringPosition(r, n, true), n, true), r);
    }
  }
}

TEST(DoubleBinaryTree, TwoTreesAndNoRankIsALeafInBoth) {
  for (int n = 1; n <= 64; ++n) {
    const int depth = log2Exact(n) + 1;
    std::vector<size_t> kids[2];
    for (int t = 0; t < 2; ++t) {
      kids[t] = expectTree(
          n, depth, [&](int r) { return doubleBinaryTree(r, n, t); },
          "tree " + std::to_string(t) + " of " + std::to_string(n));
      for (size_t k : kids[t]) EXPECT_LE(k, 2u);
    }
    int inner_in_both = 0;
    for (int r = 0; r < n && n >= 2; ++r) {
      EXPECT_TRUE(kids[0][r] > 0 || kids[1][r] > 0) << "rank " << r << " of " << n;
      if (kids[0][r] > 0 && kids[1][r] > 0) ++inner_in_both;
    }
    EXPECT_LE(inner_in_both, n % 2 == 0 ? 0 : 1) << n << " ranks";
  }
}

TEST(Knomial, TreesForEveryRadixAndRoot) {
  for (int radix = 2; radix <= 5; ++radix) {
    for (int n = 1; n <= 40; ++n) {
      for (int root : {0, n / 2, n - 1}) {
        auto kids = expectTree(
            n, knomialDepth(n, radix), [&](int r) { return knomialTree(r, root, n, radix); },
            "radix " + std::to_string(radix) + ", " + std::to_string(n) + " ranks");
        EXPECT_LE(kids[root], static_cast<size_t>((radix - 1) * knomialDepth(n, radix)));
      }
    }
  }
  // Radix 2 is the binomial tree: 0's children in 8 ranks are 4, 2, 1; 6's parent is 4.
  EXPECT_EQ(knomialTree(0, 0, 8, 2).children, (Ranks{4, 2, 1}));
  EXPECT_EQ(knomialTree(6, 0, 8, 2).parent, 4);
  EXPECT_EQ(knomialTree(0, 0, 9, 3).children, (Ranks{6, 3, 2, 1}));
}

TEST(Swing, DistancesArePairedAndAlternate) {
  EXPECT_EQ(swingDistance(0), 1);
  EXPECT_EQ(swingDistance(1), -1);
  EXPECT_EQ(swingDistance(2), 3);
  EXPECT_EQ(swingDistance(3), -5);
  EXPECT_EQ(swingDistance(4), 11);
  for (int p = 2; p <= 64; p *= 2) {
    for (int s = 0; s < log2Exact(p); ++s) {
      for (int v = 0; v < p; ++v) EXPECT_EQ(swingPeer(swingPeer(v, s, p), s, p), v);
    }
  }
}

TEST(Swing, ReduceScatterLeavesEachRankItsSlotReduced) {
  for (int p = 1; p <= 64; p *= 2) {
    SwingLayout layout(p);
    std::set<int> slots;
    for (int v = 0; v < p; ++v) slots.insert(layout.slot(v));
    EXPECT_EQ(slots.size(), static_cast<size_t>(p));
    // holds[v][slot] = the ranks whose contribution that slot on v holds
    Holdings holds(p, std::vector<std::set<int>>(p));
    for (int v = 0; v < p; ++v)
      for (int b = 0; b < p; ++b) holds[v][b] = {v};
    std::vector<BlockSpan> span(p, BlockSpan{0, p});
    for (int t = 0; t < layout.steps(); ++t) {
      Holdings next = holds;
      for (int v = 0; v < p; ++v) {
        const int q = swingPeer(v, t, p);
        const BlockSpan keep = layout.kept(v, t), give = layout.kept(q, t);
        EXPECT_EQ(keep.end - keep.begin, p >> (t + 1));
        EXPECT_TRUE(keep.end <= give.begin || give.end <= keep.begin) << "disjoint";
        EXPECT_EQ(std::min(keep.begin, give.begin), span[v].begin) << "they split what v held";
        EXPECT_EQ(std::max(keep.end, give.end), span[v].end);
        for (int b = keep.begin; b < keep.end; ++b) {
          next[v][b].insert(holds[q][b].begin(), holds[q][b].end());
        }
      }
      for (int v = 0; v < p; ++v) span[v] = layout.kept(v, t);
      holds = next;
    }
    for (int v = 0; v < p; ++v) {
      EXPECT_EQ(span[v].begin, layout.slot(v));
      EXPECT_EQ(span[v].end, layout.slot(v) + 1);
      EXPECT_EQ(holds[v][layout.slot(v)].size(), static_cast<size_t>(p));
    }
  }
}

// The reduction order each rank ends with when every step adds the peer's partial result:
// a canonical string of the tree of additions (a + b == b + a, so pairs are sorted).
std::vector<std::string> exchangeOrders(int p, const std::vector<int>& steps) {
  std::vector<std::string> order(p);
  for (int v = 0; v < p; ++v) order[v] = std::to_string(v);
  for (int s : steps) {
    auto next = order;
    for (int v = 0; v < p; ++v) {
      auto a = order[v], b = order[swingPeer(v, s, p)];
      next[v] = "(" + std::min(a, b) + "+" + std::max(a, b) + ")";
    }
    order = next;
  }
  return order;
}

TEST(Swing, LatencyVariantFromTheFarthestPeerGivesEveryRankTheSameSum) {
  for (int p = 2; p <= 64; p *= 2) {
    std::vector<int> farthest_first;
    for (int s = log2Exact(p) - 1; s >= 0; --s) farthest_first.push_back(s);
    auto order = exchangeOrders(p, farthest_first);
    for (int v = 0; v < p; ++v) EXPECT_EQ(order[v], order[0]) << p << " ranks, rank " << v;
  }
  // The paper's order (nearest peer first) leaves 8 ranks with two different float sums.
  auto order = exchangeOrders(8, {0, 1, 2});
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()).size(), 2u);
}

TEST(Bruck, EveryRankGathersEveryBlockInRotatedOrder) {
  for (int n = 1; n <= 33; ++n) {
    // at[r][i] = the block in position i of rank r's rotated buffer, -1 while empty
    std::vector<std::vector<int>> at(n, std::vector<int>(n, -1));
    for (int r = 0; r < n; ++r) at[r][0] = r;
    for (int k = 0; k < bruckSteps(n); ++k) {
      auto next = at;
      for (int r = 0; r < n; ++r) {
        BruckStep s = bruckStep(r, n, k);
        EXPECT_EQ(bruckStep(s.send_to, n, k).recv_from, r);
        for (int i = 0; i < s.count; ++i) {
          ASSERT_GE(at[r][i], 0) << "rank " << r << " sends only what it has";
          EXPECT_EQ(next[s.send_to][s.have + i], -1) << "nothing lands twice";
          next[s.send_to][s.have + i] = at[r][i];
        }
      }
      at = next;
    }
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < n; ++i) EXPECT_EQ(at[r][i], (r + i) % n) << n << " ranks";
  }
}

}  // namespace
}  // namespace collie::patterns
