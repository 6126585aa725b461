// "lossy": a direct all-reduce with a realistic bug, chosen by params.bug:
// - tail (default): it reduces only the first (count / n) * n elements, so a count that the
//   group size does not divide loses its tail;
// - swap: the sum is right but its two halves come back swapped, as a scheduler that mixes
//   up two equal blocks would deliver (only inputs without a period can see it);
// - order: every rank adds the contributions starting from its own, so that float sums
//   round differently on different ranks (right to within rounding, not bit for bit).
// It passes the easy cases (0 elements, divisible counts) and must fail plugin-check.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collie/plugin.h"

namespace {

class LossyScheduler : public collie::Scheduler {
 public:
  explicit LossyScheduler(const collie::PluginContext& context)
      : swap_(context.params->getString("bug", "tail") == "swap"),
        own_order_(context.params->getString("bug", "tail") == "order") {}

  collie::Decision accepts(const collie::CollectiveArgs& args,
                           const collie::Topology&) const override {
    if (args.coll == collie::Collective::kAllReduce) return collie::Decision::yes();
    return collie::Decision::no("lossy: allreduce only");
  }

  void run(const collie::CollectiveArgs& args, collie::Backend& backend,
           const collie::Topology&) override {
    const int n = backend.size(), rank = backend.rank();
    const size_t reduced = args.data.count / n * n;  // the bug: the remainder is forgotten
    const collie::Tag tag = collie::makeTag(args.seq, 1, 0);
    collie::ScratchBuffer result(args.data, reduced), incoming(args.data, reduced);
    collie::Buffer mine = args.data.slice(0, reduced);
    std::vector<std::unique_ptr<collie::Request>> sends;
    for (int peer = 0; peer < n; ++peer) {
      if (peer != rank) sends.push_back(backend.isend(peer, mine, tag));
    }
    for (int i = 0; i < n; ++i) {  // in rank order, identical on every rank (but with `order`)
      const int peer = own_order_ ? (rank + i) % n : i;
      collie::Buffer contribution = mine;
      if (peer != rank) {
        backend.recv(peer, incoming.view(), tag);
        contribution = incoming.view();
      }
      if (i == 0) {
        collie::copyInto(result.view(), contribution);
      } else {
        collie::reduceInto(result.view(), contribution, args.op);
      }
    }
    collie::waitAll(sends, backend.timeout());
    collie::copyInto(mine, result.view());
    collie::finishAverage(mine, args.op, n);
    if (swap_) swapHalves(args.data);
  }

 private:
  static void swapHalves(const collie::Buffer& data) {
    const size_t half = data.count / 2 * collie::dtypeSize(data.dtype);
    if (half == 0) return;
    auto* bytes = static_cast<char*>(data.data);
    std::vector<char> first(bytes, bytes + half);
    std::memmove(bytes, bytes + half, half);
    std::memcpy(bytes + half, first.data(), half);
  }

  bool swap_;
  bool own_order_;
};

}  // namespace

COLLIE_SCHEDULER_PLUGIN("lossy", "0.0.1", "a deliberately broken all-reduce for tests",
                        LossyScheduler);
