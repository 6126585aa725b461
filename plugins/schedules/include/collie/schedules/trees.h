// A pipelined tree collective with its communication, for the schedulers that run it over
// different tree shapes (tree, double_binary_tree, knomial): segments flow up the tree,
// reduced at every node, and back down from the root, so a long message keeps every level
// busy.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "collie/patterns/blocks.h"
#include "collie/patterns/tree.h"
#include "collie/plugin.h"

namespace collie::schedules {

// One tree's part of a collective: `data` flows through `shape` one segment at a time,
// reduced on the way up to the root (when `reduce`) and then broadcast from the root down.
struct TreePart {
  patterns::TreeShape shape;
  Buffer data;
  std::vector<patterns::Range> segments;  // of data: one message per segment and edge
  bool reduce = true;
  uint32_t up_phase = 1;
  uint32_t down_phase = 2;
};

// Runs every part at once, taking their segments in turn, so that trees carrying different
// parts of one buffer share the time. With kAvg a root divides each reduced segment by
// `group_size` before it goes down, so every rank gets the root's bits.
inline void runTrees(const std::vector<TreePart>& parts, ReduceOp op, int group_size, uint64_t seq,
                     Backend& backend) {
  const auto timeout = backend.timeout();
  const size_t count = parts.size();
  size_t most = 0;
  for (const TreePart& p : parts) most = std::max(most, p.segments.size());

  // Up: every receive from every child is posted first; then each segment is reduced as its
  // children's copies arrive and passed to the parent.
  std::vector<std::vector<std::unique_ptr<ScratchBuffer>>> incoming(count);
  std::vector<std::vector<std::vector<std::unique_ptr<Request>>>> from_children(count);
  std::vector<std::vector<std::unique_ptr<Request>>> to_parent(count);
  for (size_t t = 0; t < count; ++t) {
    const TreePart& p = parts[t];
    if (!p.reduce) continue;
    for (int child : p.shape.children) {
      incoming[t].push_back(std::make_unique<ScratchBuffer>(p.data, p.data.count));
      auto& recvs = from_children[t].emplace_back();
      for (const patterns::Range& s : p.segments) {
        recvs.push_back(backend.irecv(child, incoming[t].back()->view().slice(s.offset, s.count),
                                      makeTag(seq, p.up_phase, 0)));
      }
    }
  }
  for (size_t i = 0; i < most; ++i) {
    for (size_t t = 0; t < count; ++t) {
      const TreePart& p = parts[t];
      if (!p.reduce || i >= p.segments.size()) continue;
      const patterns::Range& s = p.segments[i];
      Buffer mine = p.data.slice(s.offset, s.count);
      for (size_t c = 0; c < p.shape.children.size(); ++c) {
        from_children[t][c][i]->wait(timeout);
        reduceInto(mine, incoming[t][c]->view().slice(s.offset, s.count), op);
      }
      if (p.shape.parent >= 0) {
        to_parent[t].push_back(backend.isend(p.shape.parent, mine, makeTag(seq, p.up_phase, 0)));
      }
    }
  }

  // Down: a segment that went up must have left before the result overwrites it.
  std::vector<std::vector<std::unique_ptr<Request>>> from_parent(count);
  for (size_t t = 0; t < count; ++t) {
    const TreePart& p = parts[t];
    if (p.shape.parent < 0) continue;
    for (size_t i = 0; i < p.segments.size(); ++i) {
      if (i < to_parent[t].size()) to_parent[t][i]->wait(timeout);
      const patterns::Range& s = p.segments[i];
      from_parent[t].push_back(backend.irecv(p.shape.parent, p.data.slice(s.offset, s.count),
                                             makeTag(seq, p.down_phase, 0)));
    }
  }
  std::vector<std::unique_ptr<Request>> sends;
  for (size_t i = 0; i < most; ++i) {
    for (size_t t = 0; t < count; ++t) {
      const TreePart& p = parts[t];
      if (i >= p.segments.size()) continue;
      const patterns::Range& s = p.segments[i];
      Buffer segment = p.data.slice(s.offset, s.count);
      if (p.shape.parent >= 0) {
        from_parent[t][i]->wait(timeout);
      } else if (p.reduce) {
        finishAverage(segment, op, group_size);
      }
      for (int child : p.shape.children) {
        sends.push_back(backend.isend(child, segment, makeTag(seq, p.down_phase, 0)));
      }
    }
  }
  waitAll(sends, timeout);
}

// The α-β-γ price of runTrees for trees whose shapes are `shapes[t][rank]` (tree t as every
// rank sees it), each carrying `segments` segments of `segment` bytes. Reducing (when
// `reduce`), the segments flow up, then down: runTrees starts the broadcast when the root
// has reduced the last one. Each edge carries one segment at a time, in the time
// flowSeconds gives it with every edge of the phase (of every tree) busy at once; a rank
// sends segment i up once it has it from all its children and has reduced them, and passes
// it down once it has it from its parent. The phase ends when the last segment reaches the
// root (up) or the last rank (down). Past 256 segments the pipeline's pace is steady and
// the rest is extrapolated.
inline double predictTrees(const std::vector<std::vector<patterns::TreeShape>>& shapes,
                           double segment, double segments, bool reduce, const Topology& topology,
                           const CostModel& model) {
  constexpr int kSimulated = 256;
  const int simulated = static_cast<int>(std::min<double>(segments, kSimulated));
  std::vector<Flow> up, down;
  for (const auto& tree : shapes) {
    for (int rank = 0; rank < static_cast<int>(tree.size()); ++rank) {
      if (tree[rank].parent >= 0) up.push_back({rank, tree[rank].parent, segment});
      for (int child : tree[rank].children) down.push_back({rank, child, segment});
    }
  }
  const std::vector<double> up_time = flowSeconds(up, topology, model);
  const std::vector<double> down_time = flowSeconds(down, topology, model);
  // Ranks from the leaves up: children before their parents.
  auto order = [](const std::vector<patterns::TreeShape>& tree) {
    std::vector<int> ranks, depth(tree.size(), 0);
    for (int r = 0; r < static_cast<int>(tree.size()); ++r) {
      for (int p = tree[r].parent, guard = 0; p >= 0 && guard <= static_cast<int>(tree.size());
           p = tree[p].parent, ++guard)
        ++depth[r];
      ranks.push_back(r);
    }
    std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) { return depth[a] > depth[b]; });
    return ranks;
  };
  // finish[i]: when segment i of the phase is done; extrapolated past `simulated`.
  auto extrapolate = [&](const std::vector<double>& finish) {
    if (finish.empty()) return 0.0;
    const double last = finish.back();
    const double pace = finish.size() > 1 ? last - finish[finish.size() - 2] : 0;
    return last + (segments - static_cast<double>(finish.size())) * pace;
  };
  double up_end = 0;
  size_t up_flow = 0, down_flow = 0;
  std::vector<std::vector<int>> orders;
  for (const auto& tree : shapes) orders.push_back(order(tree));
  if (reduce) {
    for (size_t t = 0; t < shapes.size(); ++t) {
      const auto& tree = shapes[t];
      const int n = static_cast<int>(tree.size());
      std::vector<double> edge_free(n, 0), ready(n, 0), arrived(n, 0);
      std::vector<int> edge_of(n, -1);
      for (int r = 0; r < n; ++r) {
        if (tree[r].parent >= 0) edge_of[r] = static_cast<int>(up_flow++);
      }
      std::vector<double> root_done;
      for (int i = 0; i < simulated; ++i) {
        for (int r : orders[t]) {
          double have = ready[r];  // the previous segment is reduced first
          for (int child : tree[r].children) have = std::max(have, arrived[child]);
          ready[r] = have + static_cast<double>(tree[r].children.size()) * segment * model.gamma;
          if (tree[r].parent < 0) {
            root_done.push_back(ready[r]);
            continue;
          }
          edge_free[r] = std::max(ready[r], edge_free[r]) + up_time[edge_of[r]];
          arrived[r] = edge_free[r];
        }
      }
      up_end = std::max(up_end, extrapolate(root_done));
    }
  }
  double end = up_end;
  for (size_t t = 0; t < shapes.size(); ++t) {
    const auto& tree = shapes[t];
    const int n = static_cast<int>(tree.size());
    std::vector<std::vector<int>> edges(n);
    for (int r = 0; r < n; ++r) {
      for (size_t c = 0; c < tree[r].children.size(); ++c)
        edges[r].push_back(static_cast<int>(down_flow++));
    }
    std::vector<double> has(n, up_end), last;
    std::vector<std::vector<double>> edge_free(n);
    for (int r = 0; r < n; ++r) edge_free[r].assign(tree[r].children.size(), up_end);
    std::vector<int> top_down = orders[t];
    std::reverse(top_down.begin(), top_down.end());
    for (int i = 0; i < simulated; ++i) {
      double slowest = 0;
      for (int r : top_down) {
        for (size_t c = 0; c < tree[r].children.size(); ++c) {
          const int child = tree[r].children[c];
          edge_free[r][c] = std::max(has[r], edge_free[r][c]) + down_time[edges[r][c]];
          has[child] = edge_free[r][c];
        }
        slowest = std::max(slowest, has[r]);
      }
      last.push_back(slowest);
    }
    if (!last.empty() && last.back() > up_end) end = std::max(end, extrapolate(last));
  }
  return end;
}

// `data` cut into segments of at most `segment_bytes` (none when it is empty).
inline std::vector<patterns::Range> segmentsOf(const Buffer& data, uint64_t segment_bytes) {
  if (data.count == 0) return {};
  const size_t elements = std::max<size_t>(1, segment_bytes / dtypeSize(data.dtype));
  return patterns::pieces({0, data.count}, elements);
}

// The one part of a single-tree collective: an all-reduce (reduced to rank 0, broadcast
// back from it), a broadcast (from its root) or a barrier (one empty message up and down
// each edge), over the shape `shape_of(root)` gives this rank.
template <typename ShapeOf>
TreePart singleTree(const CollectiveArgs& args, uint64_t segment_bytes, uint32_t up_phase,
                    uint32_t down_phase, ShapeOf&& shape_of) {
  TreePart part;
  part.up_phase = up_phase;
  part.down_phase = down_phase;
  if (args.coll == Collective::kBarrier) {
    part.segments = {patterns::Range{}};
  } else {
    part.data = args.data;
    part.segments = segmentsOf(args.data, segment_bytes);
  }
  part.reduce = args.coll != Collective::kBroadcast;
  part.shape = shape_of(part.reduce ? 0 : args.root);
  return part;
}

}  // namespace collie::schedules
