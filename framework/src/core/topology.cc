// Node grouping of ranks.
#include "collie/topology.h"

#include <algorithm>

namespace collie {

Topology Topology::singleNode(int world_size) {
  Topology topology;
  topology.world_size = world_size;
  topology.node_of_rank.assign(world_size, 0);
  topology.node_names = {"node0"};
  return topology;
}

Topology Topology::fromLabels(const std::vector<std::string>& labels) {
  Topology topology;
  topology.world_size = static_cast<int>(labels.size());
  for (const auto& label : labels) {
    auto it = std::find(topology.node_names.begin(), topology.node_names.end(), label);
    topology.node_of_rank.push_back(static_cast<int>(it - topology.node_names.begin()));
    if (it == topology.node_names.end()) topology.node_names.push_back(label);
  }
  return topology;
}

int Topology::localRank(int rank) const {
  int local = 0;
  for (int r = 0; r < rank; ++r) local += node_of_rank[r] == node_of_rank[rank] ? 1 : 0;
  return local;
}

std::vector<int> Topology::ranksOnNode(int node) const {
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r) {
    if (node_of_rank[r] == node) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace collie
