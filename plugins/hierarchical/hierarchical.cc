// Hierarchical all-reduce built from two other schedulers: reduce-scatter inside each node
// (`intra`), all-reduce of each block between the nodes (`inter`, among the ranks that hold
// the same block on every node), then all-gather inside each node. Only 1/L of the message
// crosses between nodes per rank (L ranks per node), which is what makes it pay off when the
// network between nodes is slower than inside them.
//
// A large message is cut into chunks (`chunk_bytes`) that go through the three steps as a
// pipeline: while the ranks of a column all-reduce chunk c between the nodes (on a second
// thread, over the column's own sub-group), the node reduce-scatters chunk c + 1 and
// all-gathers chunk c - 1, so the link between nodes and the links inside them work at once.
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "collie/patterns/blocks.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/simulation.h"

namespace collie::hierarchical {
namespace {

using patterns::Range;

// The two sub-groups of one rank: its node, and its "column" (same local rank on every node).
struct Groups {
  std::unique_ptr<Backend> node;
  std::unique_ptr<Backend> column;
};

class HierarchicalScheduler : public Scheduler {
 public:
  explicit HierarchicalScheduler(const PluginContext& context)
      : intra_name_(context.params->getString("intra", "ring")),
        inter_name_(context.params->getString("inter", "ring")),
        chunk_bytes_(context.params->getBytes("chunk_bytes", 4 << 20, 0, 1ull << 40)) {
    Params intra_params("scheduler '" + intra_name_ + "' (hierarchical.intra)");
    Params inter_params("scheduler '" + inter_name_ + "' (hierarchical.inter)");
    intra_ = context.make_scheduler(intra_name_, intra_params);
    inter_ = context.make_scheduler(inter_name_, inter_params);
  }

  Decision accepts(const CollectiveArgs& args, const Topology& topology) const override {
    if (args.coll != Collective::kAllReduce)
      return schedules::acceptOnly("hierarchical", Collective::kAllReduce, args);
    const int per_node = static_cast<int>(topology.ranksOnNode(0).size());
    for (int node = 1; node < topology.nodeCount(); ++node) {
      if (static_cast<int>(topology.ranksOnNode(node).size()) != per_node) {
        return Decision::no(
            "hierarchical: nodes hold different numbers of ranks; it needs "
            "equal nodes");
      }
    }
    const int nodes = topology.nodeCount();
    // One level only: that level's all-reduce is all it runs (run()).
    std::vector<std::tuple<Scheduler*, std::string, Collective, int>> needs;
    if (nodes == 1) {
      needs = {{intra_.get(), intra_name_, Collective::kAllReduce, per_node}};
    } else if (per_node == 1) {
      needs = {{inter_.get(), inter_name_, Collective::kAllReduce, nodes}};
    } else {
      needs = {{intra_.get(), intra_name_, Collective::kReduceScatter, per_node},
               {intra_.get(), intra_name_, Collective::kAllGather, per_node},
               {intra_.get(), intra_name_, Collective::kAllReduce, per_node},
               {inter_.get(), inter_name_, Collective::kAllReduce, nodes}};
    }
    for (const auto& [scheduler, name, coll, size] : needs) {
      CollectiveArgs probe = args;
      probe.coll = coll;
      if (probe.op == ReduceOp::kAvg) probe.op = ReduceOp::kSum;  // run() sums, then divides
      Topology group = subTopology(topology, size);
      Decision d = scheduler->accepts(probe, group);
      if (!d.accepted) return Decision::no("hierarchical: its " + name + " cannot: " + d.reason);
    }
    return Decision::yes();
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology& topology) override {
    Groups& groups = groupsFor(backend, topology);
    const int per_node = groups.node->size(), nodes = groups.column->size();
    const ReduceOp op = args.op == ReduceOp::kAvg ? ReduceOp::kSum : args.op;
    const Buffer& data = args.data;
    if (nodes == 1 || per_node == 1) {
      // One level only: the other's steps would only copy the message into a block and back
      // (on 4 ranks of one node the three steps took 1.3-1.9x a ring all-reduce). That
      // level's all-reduce is the same sum.
      CollectiveArgs whole = subArgs(args, Collective::kAllReduce, op, 3, 0);
      if (nodes == 1) {
        intra_->run(whole, *groups.node, subTopology(topology, per_node));
      } else {
        inter_->run(whole, *groups.column, subTopology(topology, nodes));
      }
      finishAverage(data, args.op, backend.size());
      return;
    }
    const size_t block = data.count / per_node;
    Range main{0, block * per_node}, tail{block * per_node, data.count % per_node};

    if (main.count > 0) {
      ScratchBuffer mine(data, block);
      const Chunks chunks =
          chunksOf(block, per_node, dtypeSize(data.dtype), concurrentGroups(backend));
      // Chunk c: elements [c·k·L, ...) of the message, and [c·k, ...) of this rank's block.
      auto step = [&](Collective coll, int part, size_t c) {
        const size_t first = c * chunks.per_rank;
        const size_t count = std::min(chunks.per_rank, block - first);
        CollectiveArgs sub = subArgs(args, coll, op, part, c);
        const Buffer piece = mine.view().slice(first, count);
        const Buffer whole = data.slice(main.offset + first * per_node, count * per_node);
        if (coll == Collective::kAllReduce) {
          sub.data = piece;
          inter_->run(sub, *groups.column, subTopology(topology, nodes));
        } else if (coll == Collective::kReduceScatter) {
          sub.data = whole;
          sub.output = piece;
          intra_->run(sub, *groups.node, subTopology(topology, per_node));
        } else {
          sub.data = piece;
          sub.output = whole;
          intra_->run(sub, *groups.node, subTopology(topology, per_node));
        }
      };
      if (chunks.count == 1) {
        step(Collective::kReduceScatter, 0, 0);
        step(Collective::kAllReduce, 0, 0);
        step(Collective::kAllGather, 1, 0);
      } else {
        pipeline(chunks.count, step);
      }
    }
    if (tail.count > 0) {
      // Fewer elements than ranks per node: all-reduce them inside the node, then every
      // column all-reduces the same node sums (identical inputs give identical results).
      CollectiveArgs ar = subArgs(args, Collective::kAllReduce, op, 2, 0);
      ar.data = data.slice(tail.offset, tail.count);
      intra_->run(ar, *groups.node, subTopology(topology, per_node));
      inter_->run(ar, *groups.column, subTopology(topology, nodes));
    }
    finishAverage(data, args.op, backend.size());
  }

  // α-β-γ: intra reduce-scatter + all-gather on the intra link (I), the inter all-reduce of a
  // 1/L block between nodes (A), each as its own scheduler predicts, per chunk; K chunks
  // overlap the two: (K - 1)·max(I, A) + I + A. One level alone (one node, or one rank a
  // node): that level's all-reduce.
  void useCostModel(const CostModel& model) override {
    intra_->useCostModel(model);
    inter_->useCostModel(model);
  }

  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    if (args.coll != Collective::kAllReduce) return kNoPrediction;
    const int per_node = static_cast<int>(topology.ranksOnNode(0).size());
    const int nodes = topology.nodeCount();
    CostModel local = model;
    local.inter = model.intra;
    if (nodes == 1) return intra_->predictSeconds(args, subTopology(topology, per_node), local);
    CostModel remote = model;
    remote.intra = model.inter;
    if (per_node == 1) return inter_->predictSeconds(args, subTopology(topology, nodes), remote);
    const size_t block = args.data.count / static_cast<size_t>(per_node);
    const Chunks chunks =
        chunksOf(block, per_node, dtypeSize(args.data.dtype), topology.concurrent_groups);
    CollectiveArgs whole = args;
    // One chunk: the whole message, the tail of fewer than L elements included.
    if (chunks.count > 1) whole.data.count = chunks.per_rank * static_cast<size_t>(per_node);
    // An intra all-reduce costs one reduce-scatter plus one all-gather.
    const double intra = intra_->predictSeconds(whole, subTopology(topology, per_node), local);
    CollectiveArgs part = args;
    part.data.count = chunks.count > 1 ? chunks.per_rank : block;
    // The per_node column all-reduces run at once and share each node's link: each flow
    // gets 1/per_node of the link the calibration measured with one flow alone (each way).
    remote.intra.beta *= per_node;
    remote.intra.beta_one_way *= per_node;
    const double inter =
        inter_->predictSeconds(part, subTopology(topology, topology.nodeCount()), remote);
    return static_cast<double>(chunks.count - 1) * std::max(intra, inter) + intra + inter;
  }

 private:
  // How a rank's block of `block` elements is cut: `count` chunks of `per_rank` elements
  // (the last may be shorter), each chunk_bytes of the message or more; at most kMaxChunks.
  // One chunk where the backend cannot be used from a second thread (a simulator's actors):
  // the levels then run one after the other.
  struct Chunks {
    size_t count = 1, per_rank = 0;
  };
  static constexpr size_t kMaxChunks = 64;

  Chunks chunksOf(size_t block, int per_node, size_t element, bool concurrent) const {
    const double message = static_cast<double>(block) * per_node * element;
    if (chunk_bytes_ == 0 || !concurrent || message < 2.0 * static_cast<double>(chunk_bytes_))
      return {1, block};
    size_t count = std::min<size_t>(
        kMaxChunks, static_cast<size_t>(message / static_cast<double>(chunk_bytes_)));
    count = std::min(count, block);
    const size_t per_rank = (block + count - 1) / count;
    return {(block + per_rank - 1) / per_rank, per_rank};
  }

  // The three steps of `chunks` chunks as a pipeline. This thread runs the node's steps in
  // one order on every rank: reduce-scatter 0, reduce-scatter 1, all-gather 0, reduce-scatter
  // 2, all-gather 1, ..., all-gather of the last; a second thread all-reduces each chunk
  // between the nodes as soon as its reduce-scatter is done. A failure on either side stops
  // the other at its next chunk (its step in progress ends, or times out, in the backend);
  // the first failure is rethrown.
  template <typename Step>
  static void pipeline(size_t chunks, Step& step) {
    std::mutex mu;
    std::condition_variable cv;
    size_t scattered = 0, reduced = 0;
    std::exception_ptr failure;
    auto fail = [&] {
      std::lock_guard<std::mutex> lock(mu);
      if (!failure) failure = std::current_exception();
      cv.notify_all();
    };
    // Waits until `done` reaches `want`; false when the other side failed.
    auto await = [&](const size_t& done, size_t want) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done >= want || failure; });
      return !failure;
    };
    auto mark = [&](size_t& done) {
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    };
    std::thread between([&] {
      try {
        for (size_t c = 0; c < chunks; ++c) {
          if (!await(scattered, c + 1)) return;
          step(Collective::kAllReduce, 0, c);
          mark(reduced);
        }
      } catch (...) {
        fail();
      }
    });
    try {
      for (size_t c = 0; c <= chunks; ++c) {
        if (c < chunks) {
          step(Collective::kReduceScatter, 0, c);
          mark(scattered);
        }
        if (c == 0) continue;
        if (!await(reduced, c)) break;
        step(Collective::kAllGather, 1, c - 1);
      }
    } catch (...) {
      fail();
    }
    between.join();
    if (failure) std::rethrow_exception(failure);
  }

  static Topology subTopology(const Topology& parent, int size) {
    Topology t = Topology::singleNode(size);
    t.capabilities = parent.capabilities;
    t.concurrent_groups = parent.concurrent_groups;
    t.backend = parent.backend;
    return t;
  }

  // A sub-collective with its own sequence number: `part` (0: reduce-scatter and the
  // all-reduce between nodes, 1: all-gather, 2: the tail, 3: one level's whole all-reduce)
  // and the chunk keep the sub-collectives of one call apart on the same sub-group, so their
  // tags never meet.
  static CollectiveArgs subArgs(const CollectiveArgs& args, Collective coll, ReduceOp op, int part,
                                size_t chunk) {
    CollectiveArgs sub = args;
    sub.coll = coll;
    sub.op = op;
    sub.output = Buffer();
    sub.seq = (args.seq * 4 + static_cast<uint64_t>(part)) * kMaxChunks + chunk;
    return sub;
  }

  // Splits the backend once into the node and column groups (every rank, in the same order).
  Groups& groupsFor(Backend& backend, const Topology& topology) {
    auto it = groups_.find(&backend);
    if (it != groups_.end()) return it->second;
    const int rank = backend.rank();
    const int node = topology.node_of_rank[rank], local = topology.localRank(rank);
    std::vector<int> column;
    for (int n = 0; n < topology.nodeCount(); ++n) column.push_back(topology.ranksOnNode(n)[local]);
    std::sort(column.begin(), column.end());
    Groups groups;
    groups.node = backend.split(topology.ranksOnNode(node));
    groups.column = backend.split(column);
    return groups_.emplace(&backend, std::move(groups)).first->second;
  }

  std::string intra_name_, inter_name_;
  uint64_t chunk_bytes_;  // 0: no pipeline
  std::shared_ptr<Scheduler> intra_, inter_;
  std::map<const Backend*, Groups> groups_;
};

}  // namespace
}  // namespace collie::hierarchical

COLLIE_SCHEDULER_PLUGIN("hierarchical", "1.0.0",
                        "two-level: reduce-scatter in a node, all-reduce across, all-gather",
                        collie::hierarchical::HierarchicalScheduler);
