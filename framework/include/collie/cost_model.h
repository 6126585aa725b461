// The α-β-γ cost model (Hockney, extended with a reduction term) that schedulers use to
// predict their time, calibrated by the bench on the actual backend, and the price of one
// step of a schedule whose messages share links (stepSeconds).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "collie/topology.h"

namespace collie {

// One level of the network: α seconds per message, β seconds per byte on the wire while
// the opposite direction carries data too (both ends send, as in an exchange: the
// acknowledgements of each direction queue behind the other's data), and `beta_one_way`
// while the opposite direction is idle (0: not measured, the same as β).
//
// Inside a node the calibration also measures a pair of ranks alone (the node's other ranks
// idle): `alpha_alone` and `beta_alone` (0: not measured). With them, α and β are what each
// of the `flows` flows of the calibration's exchange met when every rank of the node moved
// data at once. Where ranks outnumber cores they share the cores (4 threads on 2 CPUs: a
// loopback copy is CPU work, and so is a socket's), so the node as a whole moves `flows`
// flows at α and β each, and a step with fewer flows on the node runs faster than the
// exchange did, though never faster than a pair alone (flowSeconds).
//
// A flow of several messages posted at once (a ring's chunks) is a stream: its first message
// pays α, each further one `gap` (LogGP's g: how soon the next message follows, which on
// ranks that share cores is mostly the CPU time each message costs its two ends), and the
// bytes pay β. The calibration measures it as a stream of small messages on the same flows
// as α; 0: not measured, every message pays α, as when they go one after the other.
//
// Where bytes move through memory (inside a node), their β depends on how much memory the
// collective touches: buffers that fit a cache move several times faster than buffers that
// outgrow it (4 loopback ranks on a 2-CPU VM, one calibration: 256 KiB at 13 GB/s a flow,
// 16 MiB at 7 GB/s). `by_buffer` keeps, smallest first, β and beta_alone as the calibration
// measured them with buffers of each probe size (the slope from its smallest probe to that one),
// the largest the fitted line's; empty: the line's at every size. forBuffer() picks a size's.
struct BufferBeta {
  double bytes = 0;
  double beta = 0;
  double beta_alone = 0;  // 0: not measured
};

// Why `by_buffer` cannot be a level's β by buffer size, or "" where it can: sizes above zero
// (and exact in a double) in increasing order, every β finite and not negative. For readers of a
// saved calibration.
inline std::string byBufferProblem(const std::vector<BufferBeta>& by_buffer) {
  for (size_t i = 0; i < by_buffer.size(); ++i) {
    const BufferBeta& b = by_buffer[i];
    if (!(b.bytes > 0 && b.bytes <= 0x1p53)) return "a size of by_buffer is not in (0, 2^53]";
    if (i > 0 && b.bytes <= by_buffer[i - 1].bytes) return "by_buffer's sizes out of order";
    for (double beta : {b.beta, b.beta_alone}) {
      if (!(std::isfinite(beta) && beta >= 0)) return "a beta of by_buffer is negative or infinite";
    }
  }
  return "";
}

// A link may bank what it did not send: a token bucket (tc's tbf, a switch port's shaper)
// lets a direction that stood idle send up to `bank` bytes at once, faster than its rate,
// and the rate after (a bucket of megabytes, as a cloud instance's burst allowance, is past
// what the calibration reads: measure::bankFromTrips). The calibration measures it
// between nodes: the bytes a message sent after a pause passed beyond the pace of larger
// ones (measure::bankFromTrips; 0: none, a wire). collie::bankedSeconds prices what it saves
// a collective.
struct LinkCost {
  double alpha = 0;
  double beta = 0;
  double beta_one_way = 0;
  double alpha_alone = 0;
  double beta_alone = 0;
  int flows = 0;
  double gap = 0;
  std::vector<BufferBeta> by_buffer = {};
  double bank = 0;  // bytes
  // Time of one message of `bytes`.
  double message(double bytes) const { return alpha + beta * bytes; }
  // The per-message part of a stream of `messages` whose first message pays `first`: the
  // gap for each further one, or `first` again where the gap is not measured (each message
  // alone); nothing for no message.
  double perMessage(int messages, double first) const {
    if (messages <= 0) return 0;
    return first + (messages - 1) * (gap > 0 ? gap : first);
  }
  double perMessage(int messages) const { return perMessage(messages, alpha); }
  // β of a direction whose opposite direction is busy (`both_ways`) or idle.
  double betaFor(bool both_ways) const {
    return both_ways || beta_one_way <= 0 ? beta : beta_one_way;
  }
  // Whether the node's shared capacity is measured (the pair alone and the exchange's flows).
  bool sharesCores() const { return flows > 1 && (alpha_alone > 0 || beta_alone > 0); }
  // This link for a collective whose buffers hold `bytes` per rank: β and beta_alone
  // interpolated in log(bytes) between the two sizes of by_buffer either side of it (the
  // nearest one's beyond them), by_buffer then empty; the link itself where it is empty.
  LinkCost forBuffer(double bytes) const {
    LinkCost sized = *this;
    sized.by_buffer.clear();
    if (by_buffer.empty()) return sized;
    size_t hi = 0;
    while (hi < by_buffer.size() && by_buffer[hi].bytes < bytes) ++hi;
    const BufferBeta& b = by_buffer[std::min(hi, by_buffer.size() - 1)];
    const BufferBeta& a = by_buffer[hi == 0 ? 0 : hi - 1];
    double w = 1;
    if (hi > 0 && hi < by_buffer.size() && b.bytes > a.bytes && a.bytes > 0)
      w = std::log(bytes / a.bytes) / std::log(b.bytes / a.bytes);
    auto between = [w](double x, double y) { return x + w * (y - x); };
    sized.beta = between(a.beta, b.beta);
    if (a.beta_alone > 0 && b.beta_alone > 0)
      sized.beta_alone = between(a.beta_alone, b.beta_alone);
    return sized;
  }
};

struct CostModel {
  LinkCost intra;    // between ranks of one node
  LinkCost inter;    // between nodes (equal to intra on one node)
  double gamma = 0;  // seconds per byte reduced locally
  // The model for a collective whose buffers hold `bytes` per rank (LinkCost::forBuffer):
  // what a scheduler's prediction is handed, by the framework and by `auto`.
  CostModel forBuffer(double bytes) const {
    return {intra.forBuffer(bytes), inter.forBuffer(bytes), gamma};
  }
};

// What a scheduler without a model returns.
constexpr double kNoPrediction = std::numeric_limits<double>::quiet_NaN();

// `bytes` that rank `from` sends rank `to` in one step of a schedule, as `messages` messages
// posted at once: a stream (LinkCost::gap); 0 messages cost no α.
struct Flow {
  int from = 0;
  int to = 0;
  double bytes = 0;
  int messages = 1;
};

// The time of each flow of `flows` when all of them run at once: a flow pays its level's α
// for its first message and the gap for each further one (LinkCost::perMessage), and β for
// the most bytes that pass one of the resources it needs, because flows that meet there
// share it:
// - inside a node, the sending rank's way out and the receiving rank's way in (each
//   direction on its own: a rank that sends and receives at once does both at full speed,
//   as the calibration's probe inside a node measured);
// - between nodes, the sending node's link out and the receiving node's link in, which
//   every flow leaving or entering that node shares (the calibration measured one flow
//   alone on it): two ranks of a host that send to another host at once get half the
//   link each.
// The β is the level's one-way β (LinkCost::betaFor) unless the flow's way back carries
// data too: the sender's way in or the receiver's way out (its acknowledgements travel
// there).
// Where the calibration measured a pair alone inside a node (LinkCost::sharesCores), a flow
// inside a node takes the longer of two times: its ranks' ways out and in at a pair's α
// and β, and its node's share, every message and byte that moves inside the node in the
// step at the exchange's α (each flow's first message), gap (each further one) and β,
// divided among the `flows` flows the node moved at once in the calibration.
inline std::vector<double> flowSeconds(const std::vector<Flow>& flows, const Topology& topology,
                                       const CostModel& model) {
  const int ranks = topology.world_size;
  const int nodes = std::max(1, topology.nodeCount());
  auto node = [&](int rank) {
    return rank < static_cast<int>(topology.node_of_rank.size()) ? topology.node_of_rank[rank] : 0;
  };
  std::vector<double> out(ranks), in(ranks), egress(nodes), ingress(nodes);
  std::vector<double> node_bytes(nodes), node_messages(nodes);  // inside each node: bytes, and
  for (const Flow& f : flows) {                                 // what their messages cost
    if (node(f.from) == node(f.to)) {
      out[f.from] += f.bytes;
      in[f.to] += f.bytes;
      node_bytes[node(f.from)] += f.bytes;
      node_messages[node(f.from)] += model.intra.perMessage(f.messages);
    } else {
      egress[node(f.from)] += f.bytes;
      ingress[node(f.to)] += f.bytes;
    }
  }
  const LinkCost& intra = model.intra;
  std::vector<double> seconds;
  for (const Flow& f : flows) {
    const bool local = node(f.from) == node(f.to);
    const LinkCost& link = local ? intra : model.inter;
    const double load = local ? std::max(out[f.from], in[f.to])
                              : std::max(egress[node(f.from)], ingress[node(f.to)]);
    const bool both_ways = local ? in[f.from] > 0 || out[f.to] > 0
                                 : ingress[node(f.from)] > 0 || egress[node(f.to)] > 0;
    if (local && intra.sharesCores()) {
      const int n = node(f.from);
      // (The gap was measured with the node's every rank streaming, as α was: a pair alone
      // pays it whole, which prices a lone stream on the safe side.)
      const double alone =
          intra.perMessage(f.messages, intra.alpha_alone) + load * intra.beta_alone;
      const double share =
          (node_messages[n] + node_bytes[n] * intra.beta) / static_cast<double>(intra.flows);
      seconds.push_back(std::max(alone, share));
      continue;
    }
    seconds.push_back(link.perMessage(f.messages) + load * link.betaFor(both_ways));
  }
  return seconds;
}

// A collective's predicted `seconds` where the links between nodes bank `bank_seconds` of
// their time (LinkCost::bank at its one-way β), `link_seconds` being the part of `seconds`
// that bytes between nodes take on its critical path. Calls back to back, as the bench and
// a training step make them, reach a steady state: a direction banks while it stands idle,
// and the bank, up to its size, pays for that many of the bytes' seconds in the next call.
// The direction counts as busy for its bytes' whole time at the rate, the banked ones too,
// so it stands idle for the call's time less that: the saving S is the least of the bytes'
// time, the bank's and the idle time, S = min(link, bank, T - link) with T = seconds - S,
// so T = max(seconds - min(link, bank), (seconds + link) / 2). That the banked bytes take
// their whole time is not what a bucket does (they pass at once). Counting them as free,
// T = max(seconds - min(link, bank), link): in one lab run that moved 64 KiB's error over
// gloo from -39 % to -46 % for the ring (-12 % with no bank) and over UCX from +8 % to -1 %
// (+16 % with no bank); the data do not choose between the two, and this one saves the
// less. A `link_seconds` that is not a part of `seconds` (not finite, or longer) saves
// nothing, so that the result stays between half of `seconds` and `seconds`. Before the bank, a
// ring all-reduce of 64 KiB on two lab hosts at 1 Gbit/s (a 128 KB bucket) ran 1.36x faster than
// the line predicted.
inline double bankedSeconds(double seconds, double link_seconds, double bank_seconds) {
  if (!(link_seconds > 0) || !(link_seconds <= seconds) || !(bank_seconds > 0)) return seconds;
  return std::max(seconds - std::min(link_seconds, bank_seconds), (seconds + link_seconds) / 2);
}

// The time of one step of a schedule in which every flow of `flows` runs at once: the step
// ends with its slowest flow (flowSeconds).
inline double stepSeconds(const std::vector<Flow>& flows, const Topology& topology,
                          const CostModel& model) {
  double slowest = 0;
  for (double t : flowSeconds(flows, topology, model)) slowest = std::max(slowest, t);
  return slowest;
}

}  // namespace collie
