// Pipelined binary-tree all-reduce: segments flow up the tree (reduced at every node) and
// back down (broadcast), so a long message keeps every level busy. Latency grows with
// log2(n) rather than n, which wins for small messages.
#include <algorithm>
#include <cmath>

#include "collie/patterns/tree.h"
#include "collie/plugin.h"

namespace collie::tree {
namespace {

using patterns::Range;

enum Phase : uint32_t { kReduce = 1, kBroadcast = 2 };

class TreeScheduler : public Scheduler {
 public:
  explicit TreeScheduler(const PluginContext& context)
      : segment_bytes_(context.params->getBytes("segment_bytes", 256 << 10, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    switch (args.coll) {
      case Collective::kAllReduce:
      case Collective::kBroadcast:
      case Collective::kBarrier:
        return Decision::yes();
      default:
        return Decision::no(std::string("tree: ") + collectiveName(args.coll) +
                            " is not implemented (allreduce, broadcast, barrier are)");
    }
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    if (n == 1) return finishAverage(args.data, args.op, n);
    Buffer data = args.data;
    std::vector<Range> segments;
    if (args.coll == Collective::kBarrier) {
      data.count = 0;
      segments = {Range{}};  // one empty message per edge, up and down
    } else if (data.count > 0) {
      segments = patterns::pieces({0, data.count}, segmentElements(data));
    }
    const int root = args.coll == Collective::kBroadcast ? args.root : 0;
    std::vector<std::unique_ptr<Request>> sends_up;
    if (args.coll != Collective::kBroadcast) {
      sends_up = reduceUp(data, segments, args.op, args.seq, backend);
    }
    broadcastDown(data, segments, root, args.op, args.coll == Collective::kAllReduce, sends_up,
                  args.seq, backend);
  }

  // α-β-γ (README): s segments of g bytes flow up and down a pipeline of depth d. Per
  // segment an inner node takes in c children's messages and its parent's, and sends as
  // many, through its one port (the latency overlaps, the bytes do not), and reduces c of
  // them: the pipeline advances one segment every α + (c + 1)gβ + cgγ, over 2d + s - 1 beats.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (n == 1) return 0;
    const LinkCost& link = topology.nodeCount() > 1 ? model.inter : model.intra;
    const double m = static_cast<double>(args.data.bytes());
    const double s = std::max(1.0, std::ceil(m / static_cast<double>(segment_bytes_)));
    const double g = m / s, c = std::min(2, n - 1), d = std::floor(std::log2(n));
    switch (args.coll) {
      case Collective::kAllReduce:
        return (2 * d + s - 1) * (link.alpha + (c + 1) * g * link.beta + c * g * model.gamma);
      case Collective::kBroadcast:
        return (d + s - 1) * (link.alpha + c * g * link.beta);
      case Collective::kBarrier:
        return 2 * d * link.alpha;
      default:
        return kNoPrediction;
    }
  }

 private:
  size_t segmentElements(const Buffer& data) const {
    return std::max<size_t>(1, segment_bytes_ / dtypeSize(data.dtype));
  }

  // Reduces each segment of the children's data into ours and forwards it to the parent.
  // Returns the pending sends to the parent (one per segment).
  std::vector<std::unique_ptr<Request>> reduceUp(const Buffer& data,
                                                 const std::vector<Range>& segments, ReduceOp op,
                                                 uint64_t seq, Backend& backend) {
    const int rank = backend.rank(), n = backend.size();
    const int parent = patterns::treeParent(rank, 0, n);
    const auto children = patterns::treeChildren(rank, 0, n);
    std::vector<std::unique_ptr<ScratchBuffer>> incoming;
    std::vector<std::vector<std::unique_ptr<Request>>> recvs(children.size());
    for (size_t c = 0; c < children.size(); ++c) {
      incoming.push_back(std::make_unique<ScratchBuffer>(data, data.count));
      for (const Range& s : segments) {
        recvs[c].push_back(backend.irecv(children[c], incoming[c]->view().slice(s.offset, s.count),
                                         makeTag(seq, kReduce, 0)));
      }
    }
    std::vector<std::unique_ptr<Request>> sends;
    for (size_t i = 0; i < segments.size(); ++i) {
      Buffer mine = data.slice(segments[i].offset, segments[i].count);
      for (size_t c = 0; c < children.size(); ++c) {
        recvs[c][i]->wait(backend.timeout());
        reduceInto(mine, incoming[c]->view().slice(segments[i].offset, segments[i].count), op);
      }
      if (parent >= 0) sends.push_back(backend.isend(parent, mine, makeTag(seq, kReduce, 0)));
    }
    return sends;
  }

  // Sends each segment from `root` down the tree. With `average`, the root divides the
  // reduced segment by the group size before it goes down.
  void broadcastDown(const Buffer& data, const std::vector<Range>& segments, int root, ReduceOp op,
                     bool average, std::vector<std::unique_ptr<Request>>& sends_up, uint64_t seq,
                     Backend& backend) {
    const int rank = backend.rank(), n = backend.size();
    const int parent = patterns::treeParent(rank, root, n);
    const auto children = patterns::treeChildren(rank, root, n);
    std::vector<std::unique_ptr<Request>> recvs;
    if (parent >= 0) {
      for (size_t i = 0; i < segments.size(); ++i) {
        // Our reduced segment must have left before the result overwrites it.
        if (i < sends_up.size()) sends_up[i]->wait(backend.timeout());
        recvs.push_back(backend.irecv(parent, data.slice(segments[i].offset, segments[i].count),
                                      makeTag(seq, kBroadcast, 0)));
      }
    }
    std::vector<std::unique_ptr<Request>> sends;
    for (size_t i = 0; i < segments.size(); ++i) {
      Buffer segment = data.slice(segments[i].offset, segments[i].count);
      if (parent >= 0) {
        recvs[i]->wait(backend.timeout());
      } else if (average) {
        finishAverage(segment, op, n);
      }
      for (int child : children) {
        sends.push_back(backend.isend(child, segment, makeTag(seq, kBroadcast, 0)));
      }
    }
    waitAll(sends, backend.timeout());
  }

  uint64_t segment_bytes_;
};

}  // namespace
}  // namespace collie::tree

COLLIE_SCHEDULER_PLUGIN(
    "tree", "1.0.0", "pipelined binary-tree all-reduce: reduce up, broadcast down, log2(n) latency",
    collie::tree::TreeScheduler);
