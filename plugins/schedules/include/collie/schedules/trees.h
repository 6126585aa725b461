// A pipelined tree collective with its communication, for the schedulers that run it over
// different tree shapes (tree, double_binary_tree, knomial): segments flow up the tree,
// reduced at every node, and back down from the root, so a long message keeps every level
// busy.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <set>
#include <vector>

#include "collie/patterns/blocks.h"
#include "collie/patterns/tree.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/small.h"

namespace collie::schedules {

// One tree's part of a collective: `data` flows through `shape` one segment at a time,
// reduced on the way up to the root (when `reduce`) and then broadcast from the root down.
struct TreePart {
  patterns::TreeShape shape;
  Buffer data;
  patterns::Pieces segments;  // of data: one message per segment and edge
  bool reduce = true;
  uint32_t up_phase = 1;
  uint32_t down_phase = 2;
};

// Runs every part (a container of TreePart: one tree or two) at once, taking their segments
// in turn, so that trees carrying different parts of one buffer share the time. With kAvg a
// root divides each reduced segment by `group_size` before it goes down, so every rank gets
// the root's bits.
//
// Over a backend with batch completion (nccl: a wait completes every request posted before
// it) the parts run one after the other. One tree cannot hang there: a rank waits for
// receives from below, whose senders wait for nothing of this rank's, and for sends up,
// whose receives were posted first; but it no longer pipelines (pipelinedSegments). Two
// interleaved can hang: a wait for one tree's segment also waits for the other tree's
// receives, whose senders may be waiting for this rank.
template <typename Parts>
void runTrees(const Parts& parts, ReduceOp op, int group_size, uint64_t seq, Backend& backend) {
  if (parts.size() > 1 && backend.capabilities().batch_completion) {
    for (const TreePart& p : parts) {
      runTrees(std::array<TreePart, 1>{p}, op, group_size, seq, backend);
    }
    return;
  }
  const auto timeout = backend.timeout();
  const size_t count = parts.size();
  size_t most = 0;
  for (const TreePart& p : parts) most = std::max(most, p.segments.size());

  // Up: every receive from every child is posted first; then each segment is reduced as its
  // children's copies arrive and passed to the parent.
  Small<Small<ScratchBuffer, 4>, 2> incoming(count);
  Small<Small<Requests, 4>, 2> from_children(count);
  Small<Requests, 2> to_parent(count);
  for (size_t t = 0; t < count; ++t) {
    const TreePart& p = parts[t];
    if (!p.reduce) continue;
    for (int child : p.shape.children) {
      const Buffer scratch = incoming[t].emplace_back(p.data, p.data.count).view();
      auto& recvs = from_children[t].emplace_back();
      for (const patterns::Range& s : p.segments) {
        recvs.push_back(
            backend.irecv(child, scratch.slice(s.offset, s.count), makeTag(seq, p.up_phase, 0)));
      }
    }
  }
  for (size_t i = 0; i < most; ++i) {
    for (size_t t = 0; t < count; ++t) {
      const TreePart& p = parts[t];
      if (!p.reduce || i >= p.segments.size()) continue;
      const patterns::Range s = p.segments[i];
      Buffer mine = p.data.slice(s.offset, s.count);
      for (size_t c = 0; c < p.shape.children.size(); ++c) {
        from_children[t][c][i]->wait(timeout);
        reduceInto(mine, incoming[t][c].view().slice(s.offset, s.count), op);
      }
      if (p.shape.parent >= 0) {
        to_parent[t].push_back(backend.isend(p.shape.parent, mine, makeTag(seq, p.up_phase, 0)));
      }
    }
  }

  // Down: a segment that went up must have left before the result overwrites it.
  Small<Requests, 2> from_parent(count);
  for (size_t t = 0; t < count; ++t) {
    const TreePart& p = parts[t];
    if (p.shape.parent < 0) continue;
    for (size_t i = 0; i < p.segments.size(); ++i) {
      if (i < to_parent[t].size()) to_parent[t][i]->wait(timeout);
      const patterns::Range s = p.segments[i];
      from_parent[t].push_back(backend.irecv(p.shape.parent, p.data.slice(s.offset, s.count),
                                             makeTag(seq, p.down_phase, 0)));
    }
  }
  Requests sends;
  for (size_t i = 0; i < most; ++i) {
    for (size_t t = 0; t < count; ++t) {
      const TreePart& p = parts[t];
      if (i >= p.segments.size()) continue;
      const patterns::Range s = p.segments[i];
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

namespace detail {

// Each rank's depth in `tree`: the edges between it and the root.
inline std::vector<int> depths(const std::vector<patterns::TreeShape>& tree) {
  const int n = static_cast<int>(tree.size());
  std::vector<int> depth(n, 0);
  for (int r = 0; r < n; ++r) {
    for (int p = tree[r].parent; p >= 0 && depth[r] <= n; p = tree[p].parent) ++depth[r];
  }
  return depth;
}

// The ranks of `tree` from the leaves up: children before their parents.
inline std::vector<int> leavesFirst(const std::vector<patterns::TreeShape>& tree) {
  const std::vector<int> depth = depths(tree);
  std::vector<int> ranks(tree.size());
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) { return depth[a] > depth[b]; });
  return ranks;
}

// Each rank's height in `tree`: the edges on the longest way from it down to a leaf.
inline std::vector<int> heights(const std::vector<patterns::TreeShape>& tree) {
  std::vector<int> height(tree.size(), 0);
  for (int r : leavesFirst(tree)) {  // every child's height is final before its parent's
    for (int child : tree[r].children) height[r] = std::max(height[r], height[child] + 1);
  }
  return height;
}

// When the last of `segments` is done, from the times the first ones were (`done`): past
// those the pipeline keeps the pace of its last segment.
inline double extrapolated(const std::vector<double>& done, double segments) {
  if (done.empty()) return 0;
  const double pace = done.size() > 1 ? done.back() - done[done.size() - 2] : 0;
  return done.back() + (segments - static_cast<double>(done.size())) * pace;
}

// Each edge's time for one segment: `first` where the segment finds the edge idle, which
// pays the level's α, and `next` where it follows the one before on the edge as a stream,
// which pays the gap instead (LinkCost::gap, where measured).
struct EdgeSeconds {
  std::vector<double> first, next;
  // When segment `i` has crossed `edge`, ready to go at `ready`, the edge done with the one
  // before at `busy`: after its latency from `ready`, or a gap after the one before,
  // whichever is later.
  double done(size_t edge, int i, double ready, double busy) const {
    return i == 0 ? ready + first[edge] : std::max(ready + first[edge], busy + next[edge]);
  }
};

// Up: when the root has reduced each of `simulated` segments. A rank sends segment i to its
// parent once it has it from every child and has reduced them (after segment i - 1), over
// an edge that carries one segment at a time (EdgeSeconds::done; edges numbered by
// `*next_edge`, in rank order).
inline std::vector<double> upPhase(const std::vector<patterns::TreeShape>& tree, int simulated,
                                   double reduce_seconds, const EdgeSeconds& seconds,
                                   size_t* next_edge) {
  const int n = static_cast<int>(tree.size());
  std::vector<size_t> edge(n);
  for (int r = 0; r < n; ++r) {
    if (tree[r].parent >= 0) edge[r] = (*next_edge)++;
  }
  const std::vector<int> order = leavesFirst(tree);
  std::vector<double> ready(n, 0), sent(n, 0), root_done;
  for (int i = 0; i < simulated; ++i) {
    for (int r : order) {
      double have = ready[r];
      for (int child : tree[r].children) have = std::max(have, sent[child]);
      ready[r] = have + static_cast<double>(tree[r].children.size()) * reduce_seconds;
      if (tree[r].parent < 0) {
        root_done.push_back(ready[r]);
      } else {
        sent[r] = seconds.done(edge[r], i, ready[r], sent[r]);
      }
    }
  }
  return root_done;
}

// Down from `start`, when the root holds every segment: when the last rank has each of
// `simulated` segments. A rank passes segment i to each child once it has it, over edges
// that carry one segment at a time (numbered by `*next_edge`, in rank and child order).
inline std::vector<double> downPhase(const std::vector<patterns::TreeShape>& tree, int simulated,
                                     double start, const EdgeSeconds& seconds, size_t* next_edge) {
  const int n = static_cast<int>(tree.size());
  std::vector<std::vector<size_t>> edges(n);
  std::vector<std::vector<double>> free(n);
  for (int r = 0; r < n; ++r) {
    for (size_t c = 0; c < tree[r].children.size(); ++c) edges[r].push_back((*next_edge)++);
    free[r].assign(tree[r].children.size(), start);
  }
  std::vector<int> order = leavesFirst(tree);
  std::reverse(order.begin(), order.end());
  std::vector<double> has(n, start), last_done;
  for (int i = 0; i < simulated; ++i) {
    double last = start;
    for (int r : order) {
      for (size_t c = 0; c < tree[r].children.size(); ++c) {
        free[r][c] = seconds.done(edges[r][c], i, has[r], free[r][c]);
        has[tree[r].children[c]] = free[r][c];
      }
      last = std::max(last, has[r]);
    }
    last_done.push_back(last);
  }
  return last_done;
}

}  // namespace detail

// The α-β-γ price of runTrees for trees whose shapes are `shapes[t][rank]` (tree t as every
// rank sees it), each carrying `segments` segments of `segment` bytes. Reducing (when
// `reduce`), the segments flow up, then down: runTrees starts the broadcast when the root
// has reduced the last one. Each edge carries one segment at a time, in the time
// flowSeconds gives it with every edge of the phase (of every tree) busy at once; the phase
// ends when the last segment reaches the root (up) or the last rank (down). A single
// segment keeps one level busy at a time, so its edges meet only the edges of their own
// level, in every tree: going up, the edges from ranks of the same height (a leaf sends at
// once, wherever it sits); going down, the edges to ranks of the same depth. A segment that
// finds its edge idle pays the level's α; one that queues behind the segment before it
// follows as a stream and pays the gap instead, where the calibration measured one (a leaf
// posts all its segments at once, and every receive is posted before the first arrives).
// Past 256 segments the pipeline's pace is steady and the rest is extrapolated.
inline double predictTrees(const std::vector<std::vector<patterns::TreeShape>>& shapes,
                           double segment, double segments, bool reduce, const Topology& topology,
                           const CostModel& model) {
  const int simulated = static_cast<int>(std::min(segments, 256.0));
  // Each phase's edges in the order upPhase and downPhase number them, with the level of
  // each: the height of the rank below it going up, its depth going down.
  std::vector<Flow> up, down;
  std::vector<int> up_level, down_level;
  for (const auto& tree : shapes) {
    const std::vector<int> depth = detail::depths(tree), height = detail::heights(tree);
    for (int rank = 0; rank < static_cast<int>(tree.size()); ++rank) {
      if (tree[rank].parent >= 0) {
        up.push_back({rank, tree[rank].parent, segment});
        up_level.push_back(height[rank]);
      }
      for (int child : tree[rank].children) {
        down.push_back({rank, child, segment});
        down_level.push_back(depth[child]);
      }
    }
  }
  // A segment that queues behind another: the gap in place of α, alone or among the node's flows.
  CostModel streaming = model;
  for (LinkCost* link : {&streaming.intra, &streaming.inter}) {
    if (link->gap <= 0) continue;  // never dearer than a message alone
    link->alpha = std::min(link->alpha, link->gap);
    if (link->alpha_alone > 0) link->alpha_alone = std::min(link->alpha_alone, link->gap);
  }
  auto pricedBy = [&](const std::vector<Flow>& edges, const std::vector<int>& levels,
                      const CostModel& costs) {
    if (segments > 1) return flowSeconds(edges, topology, costs);
    std::vector<double> seconds(edges.size());
    for (int level : std::set<int>(levels.begin(), levels.end())) {
      std::vector<Flow> same;
      std::vector<size_t> which;
      for (size_t e = 0; e < edges.size(); ++e) {
        if (levels[e] != level) continue;
        same.push_back(edges[e]);
        which.push_back(e);
      }
      const std::vector<double> s = flowSeconds(same, topology, costs);
      for (size_t i = 0; i < which.size(); ++i) seconds[which[i]] = s[i];
    }
    return seconds;
  };
  auto priced = [&](const std::vector<Flow>& edges, const std::vector<int>& levels) {
    return detail::EdgeSeconds{pricedBy(edges, levels, model), pricedBy(edges, levels, streaming)};
  };
  double up_end = 0;
  if (reduce) {
    const detail::EdgeSeconds seconds = priced(up, up_level);
    size_t next = 0;
    for (const auto& tree : shapes) {
      up_end = std::max(
          up_end,
          detail::extrapolated(
              detail::upPhase(tree, simulated, segment * model.gamma, seconds, &next), segments));
    }
  }
  const detail::EdgeSeconds seconds = priced(down, down_level);
  double end = up_end;
  size_t next = 0;
  for (const auto& tree : shapes) {
    end = std::max(end, detail::extrapolated(
                            detail::downPhase(tree, simulated, up_end, seconds, &next), segments));
  }
  return end;
}

// `data` cut into segments of at most `segment_bytes` (none when it is empty).
inline patterns::Pieces segmentsOf(const Buffer& data, uint64_t segment_bytes) {
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
    part.data = args.data.slice(0, 0);  // in the caller's memory kind, which the backend moves
    part.segments = patterns::pieces(patterns::Range{}, 1);  // one empty message
  } else {
    part.data = args.data;
    part.segments = segmentsOf(args.data, segment_bytes);
  }
  part.reduce = args.coll != Collective::kBroadcast;
  part.shape = shape_of(part.reduce ? 0 : args.root);
  return part;
}

// How many segments of at most `segment_bytes` a tree's `m` bytes flow in, as a pipeline.
// Over a backend with batch completion, one: a rank's first wait for a segment from a child
// completes every segment's receive (they were posted together), and its sends up go out
// together at its next wait, so each level takes in the whole message before passing it on.
inline double pipelinedSegments(double m, uint64_t segment_bytes, const Topology& topology) {
  if (topology.capabilities.batch_completion) return 1;
  return std::max(1.0, std::ceil(m / static_cast<double>(segment_bytes)));
}

// The α-β-γ price of the single-tree collective singleTree() builds over the shapes
// `shape_of(rank, root)` gives (all-reduce, broadcast, barrier), or kNoPrediction for
// another collective.
template <typename ShapeOf>
double predictSingleTree(const CollectiveArgs& args, uint64_t segment_bytes,
                         const Topology& topology, const CostModel& model, ShapeOf&& shape_of) {
  return predictOnly({Collective::kAllReduce, Collective::kBroadcast, Collective::kBarrier}, args,
                     topology, [&](int n) {
                       const bool barrier = args.coll == Collective::kBarrier;
                       const bool reduce = args.coll != Collective::kBroadcast;
                       std::vector<patterns::TreeShape> shapes;
                       for (int r = 0; r < n; ++r)
                         shapes.push_back(shape_of(r, reduce ? 0 : args.root));
                       const double m = barrier ? 0 : static_cast<double>(args.data.bytes());
                       const double s = pipelinedSegments(m, segment_bytes, topology);
                       return predictTrees({shapes}, m / s, s, reduce, topology, model);
                     });
}

// A scheduler of one tree (tree, knomial): all-reduce, broadcast and barrier over the shape
// shapeOf(rank, root, n) gives, run by singleTree() and runTrees() in segments of
// `segment_bytes` and priced by predictSingleTree(). A scheduler of this family is its
// shape.
class SingleTreeScheduler : public Scheduler {
 public:
  SingleTreeScheduler(const char* name, uint64_t segment_bytes)
      : name_(name), segment_bytes_(segment_bytes) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return acceptOnly(name_, {Collective::kAllReduce, Collective::kBroadcast, Collective::kBarrier},
                      args);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1) return finishAverage(args.data, args.op, n);
    const int rank = backend.rank();
    auto part = singleTree(args, segment_bytes_, kUp, kDown,
                           [&](int root) { return shapeOf(rank, root, n); });
    runTrees(std::array<TreePart, 1>{part}, args.op, n, args.seq, backend);
  }

  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    return predictSingleTree(args, segment_bytes_, topology, model,
                             [&](int rank, int root) { return shapeOf(rank, root, n); });
  }

 protected:
  // Rank `rank`'s place in the tree rooted at `root` over n ranks.
  virtual patterns::TreeShape shapeOf(int rank, int root, int n) const = 0;

 private:
  enum Phase : uint32_t { kUp = 1, kDown = 2 };
  const char* name_;
  uint64_t segment_bytes_;
};

}  // namespace collie::schedules
