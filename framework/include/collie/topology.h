// Which ranks share a node: built by the runtime, read by schedulers (hierarchical ones).
#pragma once

#include <string>
#include <vector>

namespace collie {

struct Topology {
  int world_size = 1;
  std::vector<int> node_of_rank;  // node id of each rank (0-based, in order of first rank)
  std::vector<std::string> node_names;

  // One node holding every rank: what an in-process run has unless labels say otherwise.
  static Topology singleNode(int world_size);
  int nodeCount() const { return static_cast<int>(node_names.size()); }
  std::vector<int> ranksOnNode(int node) const;
};

}  // namespace collie
