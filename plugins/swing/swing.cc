// Swing all-reduce (De Sensi et al., NSDI 2024): recursive-doubling-like steps whose peers
// are v ± ρ(s), ρ(s) = (1 − (−2)^(s+1))/3, so that on a ring or torus each step's peer stays
// near. Two variants by param: latency-optimal (log2 p exchanges of the whole message) and
// bandwidth-optimal (a reduce-scatter halving the data each step, then an all-gather), over
// the largest power-of-two core of the group after the fold of halving_doubling.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "collie/patterns/swing.h"
#include "collie/plugin.h"
#include "collie/schedules/accept.h"
#include "collie/schedules/fold.h"
#include "collie/schedules/small.h"

namespace collie::swing {
namespace {

using patterns::BlockSpan;
using patterns::Range;

enum Phase : uint32_t { kFold = 1, kExchange = 2, kReduceScatter = 3, kAllGather = 4, kUnfold = 5 };

Buffer elements(const Buffer& data, Range r) { return data.slice(r.offset, r.count); }

class SwingScheduler : public schedules::OneCollectiveScheduler {
 public:
  explicit SwingScheduler(const PluginContext& context)
      : OneCollectiveScheduler("swing", Collective::kAllReduce) {
    const std::string variant = context.params->getString("variant", "bandwidth");
    if (variant != "latency" && variant != "bandwidth") {
      throw ConfigError("swing: params.variant is '" + variant +
                        "'; it takes latency (log2 p whole-message exchanges) or bandwidth "
                        "(reduce-scatter then all-gather)");
    }
    latency_ = variant == "latency";
  }

 protected:
  void runOne(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const Buffer& data = args.data;
    schedules::allReduceOnCore(args, kFold, kUnfold, backend, [&](const patterns::Fold& f) {
      if (latency_) {
        exchange(data, args.op, f, args.seq, backend);
        finishAverage(data, args.op, backend.size());
        return;
      }
      const patterns::SwingLayout& layout = layoutFor(f.core_size);
      reduceScatter(data, args.op, f, layout, args.seq, backend);
      Range mine = patterns::blockSpan(data.count, f.core_size, layout.slot(f.core_index),
                                       layout.slot(f.core_index) + 1);
      finishAverage(elements(data, mine), args.op, backend.size());
      allGather(data, f, layout, args.seq, backend);
    });
  }

  // α-β-γ (README): at step s every core rank exchanges with its swing peer at distance
  // ρ(s): the whole message in the latency variant (and reduces it), m/2^(s+1) twice (in the
  // reduce-scatter and the all-gather) in the bandwidth variant, like Rabenseifner; each
  // step is priced by stepSeconds (node links that several exchanges cross are shared). Off
  // powers of two the fold adds a message each way and a reduction.
  double predictOne(int n, const CollectiveArgs& args, const Topology& topology,
                    const CostModel& model) const override {
    const int p = patterns::powerOfTwoFloor(n);
    const double m = static_cast<double>(args.data.bytes());
    auto peer = [p](int v, int s) { return patterns::swingPeer(v, s, p); };
    if (latency_) {
      return schedules::predictWholeExchanges(n, m, topology, model, peer) +
             schedules::predictFold(n, m, topology, model);
    }
    double t = (p - 1.0) / p * m * model.gamma;
    for (int s = 0; s < patterns::log2Exact(p); ++s) {
      std::vector<Flow> step;
      for (int v = 0; v < p; ++v)
        step.push_back({patterns::coreRank(v, n), patterns::coreRank(peer(v, s), n),
                        m / static_cast<double>(2 << s)});
      t += 2 * stepSeconds(step, topology, model);
    }
    return t + schedules::predictFold(n, m, topology, model);
  }

 private:
  // Latency variant: the whole buffer each step. The steps run from the farthest peer to the
  // nearest: in that order every rank adds the same operands in the same tree, so all end
  // with the same bits (in the paper's order, 8 or more ranks end with p/4 differently
  // rounded float sums; tests/unit/patterns_test.cc shows both).
  void exchange(const Buffer& data, ReduceOp op, const patterns::Fold& f, uint64_t seq,
                Backend& backend) {
    // Step i talks to the peer of swing step steps - 1 - i: the farthest first (a tag, and
    // so a timeout's message, names i).
    const int steps = patterns::log2Exact(f.core_size);
    schedules::exchangeWhole(
        data, op, seq, kExchange, steps,
        [&](int i) { return patterns::swingPeer(f.core_index, steps - 1 - i, f.core_size); },
        backend);
  }

  // Bandwidth variant, reduce-scatter: at step t keep the span the layout gives this rank and
  // send the peer its own; the core rank ends with its slot's block reduced.
  void reduceScatter(const Buffer& data, ReduceOp op, const patterns::Fold& f,
                     const patterns::SwingLayout& layout, uint64_t seq, Backend& backend) {
    const int n = backend.size(), p = f.core_size, v = f.core_index;
    ScratchBuffer incoming(data, patterns::blockSpan(data.count, p, 0, std::max(1, p / 2)).count);
    for (int t = 0; t < layout.steps(); ++t) {
      const int q = patterns::swingPeer(v, t, p);
      const BlockSpan keep_slots = layout.kept(v, t), give_slots = layout.kept(q, t);
      Range keep = patterns::blockSpan(data.count, p, keep_slots.begin, keep_slots.end);
      Range give = patterns::blockSpan(data.count, p, give_slots.begin, give_slots.end);
      Buffer into = incoming.view().slice(0, keep.count);
      const int peer = patterns::coreRank(q, n);
      auto recv = backend.irecv(peer, into, makeTag(seq, kReduceScatter, t));
      auto send = backend.isend(peer, elements(data, give), makeTag(seq, kReduceScatter, t));
      recv->wait(backend.timeout());
      reduceInto(elements(data, keep), into, op);  // keep and give do not overlap
      send->wait(backend.timeout());
    }
  }

  // Bandwidth variant, all-gather: the reduce-scatter's steps in reverse, sending what this
  // rank holds and receiving what its peer holds.
  void allGather(const Buffer& data, const patterns::Fold& f, const patterns::SwingLayout& layout,
                 uint64_t seq, Backend& backend) {
    const int n = backend.size(), p = f.core_size, v = f.core_index;
    for (int t = layout.steps() - 1; t >= 0; --t) {
      const int q = patterns::swingPeer(v, t, p);
      const BlockSpan have_slots = layout.kept(v, t), want_slots = layout.kept(q, t);
      Range have = patterns::blockSpan(data.count, p, have_slots.begin, have_slots.end);
      Range want = patterns::blockSpan(data.count, p, want_slots.begin, want_slots.end);
      const int peer = patterns::coreRank(q, n);
      schedules::Requests requests;
      requests.push_back(backend.irecv(peer, elements(data, want), makeTag(seq, kAllGather, t)));
      requests.push_back(backend.isend(peer, elements(data, have), makeTag(seq, kAllGather, t)));
      waitAll(requests, backend.timeout());
    }
  }

  // The layout of a core size, built on first use and kept (under a lock: nothing in the
  // Scheduler contract says one object runs one collective at a time).
  const patterns::SwingLayout& layoutFor(int p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = layouts_.find(p);
    if (it == layouts_.end()) {
      it = layouts_.emplace(p, std::make_unique<patterns::SwingLayout>(p)).first;
    }
    return *it->second;
  }

  bool latency_ = false;
  std::mutex mu_;
  std::map<int, std::unique_ptr<patterns::SwingLayout>> layouts_;
};

}  // namespace
}  // namespace collie::swing

COLLIE_SCHEDULER_PLUGIN("swing", "1.0.0",
                        "Swing (NSDI'24): peers at v±(1-(-2)^(s+1))/3, latency or bandwidth",
                        collie::swing::SwingScheduler);
