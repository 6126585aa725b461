// Ping-pong and reduction probes for the cost model.
#include "bench/calibrate.h"

#include <algorithm>
#include <chrono>

namespace collie::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kProbeBytes[] = {8, 4096, 65536, 1 << 20, 4 << 20};

// Time of one step in which every rank sends `bytes` to its successor and receives from its
// predecessor at once (a ring shift, as each step of a collective does), so that the probe
// sees the contention for cores and memory that a collective sees. With `peer` set, only
// rank 0 and `peer` exchange (the probe between nodes). The median of a few, as rank 0 saw it.
double pingPong(Backend& backend, Control& control, uint64_t bytes, int peer) {
  const int iters = bytes >= (1 << 20) ? 12 : 30;
  Buffer like;
  like.dtype = DType::kF64;  // the probe moves raw bytes; any dtype of the right size will do
  const size_t count = std::max<uint64_t>(1, bytes / 8);
  ScratchBuffer out(like, count), in(like, count);
  std::vector<Tag> tags;  // drawn on every rank, so that the control sequence stays in step
  for (int i = 0; i < iters; ++i) tags.push_back(control.nextTag());
  const int rank = backend.rank(), n = backend.size();
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  if (peer >= 0) to = from = rank == 0 ? peer : (rank == peer ? 0 : -1);
  std::vector<double> times;
  control.barrier();
  if (to >= 0) {
    for (Tag tag : tags) {
      auto start = Clock::now();
      std::vector<std::unique_ptr<Request>> requests;
      requests.push_back(backend.irecv(from, in.view(), tag));
      requests.push_back(backend.isend(to, out.view(), tag));
      waitAll(requests, backend.timeout());
      times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  control.barrier();
  if (times.empty()) return 0;
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// α is the step time of the smallest message; β the extra time per byte of the largest.
LinkCost probeLink(Backend& backend, Control& control, int peer) {
  const double small = pingPong(backend, control, 8, peer);
  const uint64_t large_bytes = 1 << 20;
  const double large = pingPong(backend, control, large_bytes, peer);
  LinkCost link;
  link.alpha = small;
  link.beta = std::max(0.0, (large - small) / static_cast<double>(large_bytes));
  return link;
}

// Seconds per byte of reduceInto, on every rank at once (they share the cores), over buffers
// larger than the caches.
double probeReduction(Control& control, DType dtype) {
  Buffer like;
  like.dtype = dtype;
  const size_t count = (16 << 20) / dtypeSize(dtype);
  ScratchBuffer a(like, count), b(like, count);
  copyInto(a.view(), b.view());
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    control.barrier();
    auto start = Clock::now();
    reduceInto(a.view(), b.view(), ReduceOp::kSum);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best / static_cast<double>(a.view().bytes());
}

int firstPeer(const Topology& topology, bool same_node) {
  for (int r = 1; r < topology.world_size; ++r) {
    if ((topology.node_of_rank[r] == topology.node_of_rank[0]) == same_node) return r;
  }
  return -1;
}

}  // namespace

CostModel calibrate(Backend& backend, Control& control, const Topology& topology, DType dtype) {
  CostModel model;
  if (backend.size() > 1) {
    const int inter_peer = firstPeer(topology, false);
    model.intra = probeLink(backend, control, -1);
    model.inter = inter_peer >= 0 ? probeLink(backend, control, inter_peer) : model.intra;
  }
  model.gamma = probeReduction(control, dtype);
  auto all = control.allGather(
      {model.intra.alpha, model.intra.beta, model.inter.alpha, model.inter.beta, model.gamma});
  const auto& root = all[0];
  return {{root[0], root[1]}, {root[2], root[3]}, root[4]};
}

}  // namespace collie::bench
