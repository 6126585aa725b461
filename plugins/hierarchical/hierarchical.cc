// Hierarchical all-reduce built from two other schedulers: reduce-scatter inside each node
// (`intra`), all-reduce of each block between the nodes (`inter`, among the ranks that hold
// the same block on every node), then all-gather inside each node. Only 1/L of the message
// crosses between nodes per rank (L ranks per node), which is what makes it pay off when the
// network between nodes is slower than inside them.
#include <algorithm>
#include <map>
#include <tuple>

#include "collie/patterns/blocks.h"
#include "collie/plugin.h"

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
        inter_name_(context.params->getString("inter", "ring")) {
    Params intra_params("scheduler '" + intra_name_ + "' (hierarchical.intra)");
    Params inter_params("scheduler '" + inter_name_ + "' (hierarchical.inter)");
    intra_ = context.make_scheduler(intra_name_, intra_params);
    inter_ = context.make_scheduler(inter_name_, inter_params);
  }

  Decision accepts(const CollectiveArgs& args, const Topology& topology) const override {
    if (args.coll != Collective::kAllReduce) {
      return Decision::no(std::string("hierarchical: ") + collectiveName(args.coll) +
                          " is not implemented (allreduce is)");
    }
    const int per_node = static_cast<int>(topology.ranksOnNode(0).size());
    for (int node = 1; node < topology.nodeCount(); ++node) {
      if (static_cast<int>(topology.ranksOnNode(node).size()) != per_node) {
        return Decision::no(
            "hierarchical: nodes hold different numbers of ranks; it needs "
            "equal nodes");
      }
    }
    for (auto [scheduler, name, coll, size] :
         {std::tuple{intra_.get(), intra_name_, Collective::kReduceScatter, per_node},
          std::tuple{intra_.get(), intra_name_, Collective::kAllGather, per_node},
          std::tuple{intra_.get(), intra_name_, Collective::kAllReduce, per_node},
          std::tuple{inter_.get(), inter_name_, Collective::kAllReduce, topology.nodeCount()}}) {
      CollectiveArgs probe = args;
      probe.coll = coll;
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
    const size_t block = data.count / per_node;
    Range main{0, block * per_node}, tail{block * per_node, data.count % per_node};

    if (main.count > 0) {
      ScratchBuffer mine(data, block);
      CollectiveArgs rs = subArgs(args, Collective::kReduceScatter, op, 0);
      rs.data = data.slice(main.offset, main.count);
      rs.output = mine.view();
      intra_->run(rs, *groups.node, subTopology(topology, per_node));
      CollectiveArgs ar = subArgs(args, Collective::kAllReduce, op, 0);
      ar.data = mine.view();
      inter_->run(ar, *groups.column, subTopology(topology, nodes));
      CollectiveArgs ag = subArgs(args, Collective::kAllGather, op, 1);
      ag.data = mine.view();
      ag.output = data.slice(main.offset, main.count);
      intra_->run(ag, *groups.node, subTopology(topology, per_node));
    }
    if (tail.count > 0) {
      // Fewer elements than ranks per node: all-reduce them inside the node, then every
      // column all-reduces the same node sums (identical inputs give identical results).
      CollectiveArgs ar = subArgs(args, Collective::kAllReduce, op, 2);
      ar.data = data.slice(tail.offset, tail.count);
      intra_->run(ar, *groups.node, subTopology(topology, per_node));
      inter_->run(ar, *groups.column, subTopology(topology, nodes));
    }
    finishAverage(data, args.op, backend.size());
  }

  // α-β-γ: intra reduce-scatter + all-gather on the intra link, the inter all-reduce of a
  // 1/L block between nodes, each as its own scheduler predicts.
  void useCostModel(const CostModel& model) override {
    intra_->useCostModel(model);
    inter_->useCostModel(model);
  }

  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    if (args.coll != Collective::kAllReduce) return kNoPrediction;
    const int per_node = static_cast<int>(topology.ranksOnNode(0).size());
    CostModel local = model;
    local.inter = model.intra;
    CollectiveArgs whole = args;
    double intra = intra_->predictSeconds(whole, subTopology(topology, per_node), local);
    CollectiveArgs part = args;
    part.data.count = args.data.count / per_node;
    // The per_node column all-reduces run at once and share each node's link: each flow
    // gets 1/per_node of the link the calibration measured with one flow alone.
    CostModel remote = model;
    remote.intra = {model.inter.alpha, model.inter.beta * per_node};
    double inter =
        inter_->predictSeconds(part, subTopology(topology, topology.nodeCount()), remote);
    return intra + inter;  // an intra all-reduce costs one reduce-scatter plus one all-gather
  }

 private:
  static Topology subTopology(const Topology& parent, int size) {
    Topology t = Topology::singleNode(size);
    t.capabilities = parent.capabilities;
    t.backend = parent.backend;
    return t;
  }

  // A sub-collective with its own sequence number: `part` (0-3) keeps the sub-collectives of
  // one call apart on the same sub-group, so their tags never meet.
  static CollectiveArgs subArgs(const CollectiveArgs& args, Collective coll, ReduceOp op,
                                int part) {
    CollectiveArgs sub = args;
    sub.coll = coll;
    sub.op = op;
    sub.output = Buffer();
    sub.seq = args.seq * 4 + part;
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
  std::shared_ptr<Scheduler> intra_, inter_;
  std::map<const Backend*, Groups> groups_;
};

}  // namespace
}  // namespace collie::hierarchical

COLLIE_SCHEDULER_PLUGIN("hierarchical", "1.0.0",
                        "two-level all-reduce: intra-node reduce-scatter, inter-node all-reduce, "
                        "intra-node all-gather",
                        collie::hierarchical::HierarchicalScheduler);
