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
// rank sees it), each carrying `segments` segments of `segment` bytes: reducing (when
// `reduce`), the segments flow up, then down, one phase after the other (runTrees starts
// the broadcast when the reduction is done). Each phase is a pipeline of depth + segments - 1
// beats; in a beat every edge of every tree carries one segment at once (stepSeconds: links
// that several edges cross are shared), and going up each rank also reduces one segment from
// each of its children.
inline double predictTrees(const std::vector<std::vector<patterns::TreeShape>>& shapes,
                           double segment, double segments, bool reduce, const Topology& topology,
                           const CostModel& model) {
  std::vector<Flow> up, down;
  int depth = 0;
  size_t children = 0;
  for (const auto& tree : shapes) {
    for (int rank = 0; rank < static_cast<int>(tree.size()); ++rank) {
      const patterns::TreeShape& shape = tree[rank];
      children = std::max(children, shape.children.size());
      if (shape.parent >= 0) up.push_back({rank, shape.parent, segment});
      for (int child : shape.children) down.push_back({rank, child, segment});
      int d = 0;
      for (int r = rank; tree[r].parent >= 0 && d <= static_cast<int>(tree.size()); ++d)
        r = tree[r].parent;
      depth = std::max(depth, d);
    }
  }
  if (depth == 0) return 0;
  const double beats = depth + segments - 1;
  double t = beats * stepSeconds(down, topology, model);
  if (reduce) {
    t += beats *
         (stepSeconds(up, topology, model) + static_cast<double>(children) * segment * model.gamma);
  }
  return t;
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
