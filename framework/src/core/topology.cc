// Node grouping of ranks.
#include "collie/topology.h"

namespace collie {

Topology Topology::singleNode(int world_size) {
  Topology topology;
  topology.world_size = world_size;
  topology.node_of_rank.assign(world_size, 0);
  topology.node_names = {"node0"};
  return topology;
}

std::vector<int> Topology::ranksOnNode(int node) const {
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r) {
    if (node_of_rank[r] == node) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace collie
