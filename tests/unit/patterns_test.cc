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
