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
