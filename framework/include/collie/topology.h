// The group a collective runs on, as schedulers see it in accepts(): which ranks share a
// node (built by the runtime; hierarchical schedulers read it) and what the backend can do.
#pragma once

#include <string>
#include <vector>

#include "collie/backend.h"

namespace collie {

struct Topology {
  int world_size = 1;
  std::vector<int> node_of_rank;  // node id of each rank (0-based, in order of first rank)
  std::vector<std::string> node_names;
  Capabilities capabilities;  // of the group's backend
  // Whether schedulers may use the group and its sub-groups from threads of their own
  // (collie::concurrentGroups: false on a simulator, whose ranks are its actors, and on a
  // backend whose capabilities say so, nccl).
  bool concurrent_groups = true;
  std::string backend;  // that backend as the experiment names it (its label: "gloo")

  // One node holding every rank: what an in-process run has unless labels say otherwise.
  static Topology singleNode(int world_size);
  // Ranks with equal labels share a node; node ids follow the order of first appearance.
  static Topology fromLabels(const std::vector<std::string>& labels);
  int nodeCount() const { return static_cast<int>(node_names.size()); }
  std::vector<int> ranksOnNode(int node) const;
  // The node of `rank` and its position among the node's ranks.
  int localRank(int rank) const;
};

}  // namespace collie
