// Probes for the cost model, one link level at a time, and the least-squares fit.
#include "measure/calibrate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/simulation.h"

namespace collie::measure {

double median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

namespace {

// Probe sizes, and the fewest timed exchanges each gets (fewer for the large ones, which a
// slow link makes long: 4 MiB is 0.34 s at 100 Mbit/s; kBatchSeconds asks for more where
// they are quick). Each level probes up to its own largest size (calibrate()).
constexpr std::pair<uint64_t, int> kProbes[] = {
    {8, 50}, {4096, 50}, {65536, 30}, {262144, 10}, {1 << 20, 6}, {4 << 20, 6}, {16 << 20, 6}};

// The largest probe inside a node: 16 MiB, past the caches: 4 loopback ranks passed 4 MiB
// anywhere from 4 to 14 GB/s a flow from one run to the next, as much or as little of it
// in a cache, and a sweep's larger sizes at 3-4 GB/s. (Between nodes: kLargestInterProbe.)
constexpr uint64_t kLargestIntra = 16 << 20;

// The one-way probe between nodes streams the sizes from here up: smaller streams are
// passed at once by a lab link's token bucket.
constexpr uint64_t kOneWayFrom = 1 << 20;

// Whom a rank exchanges with in one probe: it sends to `to` and receives from `from` at
// once; -1 for both: it sits this probe out.
struct Partners {
  int to = -1, from = -1;
};

// Inside every node at once: a ring shift among the node's ranks.
Partners intraPartners(const Topology& t, int rank) {
  const auto ranks = t.ranksOnNode(t.node_of_rank[rank]);
  const int k = static_cast<int>(ranks.size());
  if (k < 2) return {};
  const int i = t.localRank(rank);
  return {ranks[(i + 1) % k], ranks[(i + k - 1) % k]};
}

// Between nodes: rank 0 and the first rank of another node, alone on the link.
Partners interPartners(const Topology& t, int rank) {
  int peer = -1;
  for (int r = 1; r < t.world_size && peer < 0; ++r) {
    if (t.node_of_rank[r] != t.node_of_rank[0]) peer = r;
  }
  if (peer < 0 || (rank != 0 && rank != peer)) return {};
  const int other = rank == 0 ? peer : 0;
  return {other, other};
}

// A scratch buffer whose every page is written, as a collective's own buffers are: a buffer
// nobody wrote reads as the kernel's zero page and is mapped in on the first touch, which
// timed the page tables rather than the link (a 1 MiB exchange of 4 loopback ranks took
// three times as long as in a ring all-reduce of the same chunks).
ScratchBuffer writtenScratch(const Buffer& like, size_t count) {
  ScratchBuffer buffer(like, count);
  if (like.memory == MemoryKind::kNone) return buffer;
  if (like.memory == MemoryKind::kHost) {
    std::memset(buffer.view().data, 0, buffer.view().bytes());
    return buffer;
  }
  std::vector<std::byte> zeros(buffer.view().bytes());  // device memory: written from the host
  Buffer host = buffer.view();
  host.data = zeros.data();
  host.memory = MemoryKind::kHost;
  copyInto(buffer.view(), host);
  if (like.memory == MemoryKind::kCuda) synchronizeDevice(like.device);
  return buffer;
}

// A probe's exchanges run in this many batches, timed as the bench times a collective: the
// mean of a batch of back-to-back calls, on the slowest rank, and the median over batches.
// (A median over single exchanges hid what ranks that share cores meet: a rank descheduled
// now and then, which every mean pays; 4 gloo processes on 2 CPUs took 17 us per exchange
// by the median and 110 us per step of an all-reduce.)
constexpr int kBatches = 5;

// A batch lasts at least this long where the link allows (a batch of 10 exchanges of 8
// bytes lasted 0.3 ms, and its mean swung with every wake-up that happened to fall in it),
// with at most kMaxPerBatch exchanges.
constexpr double kBatchSeconds = 2e-3;
constexpr int kMaxPerBatch = 200;

// The repetitions of each further batch, alike on every rank, from the first batch's
// `seconds` of one repetition on this rank (0 where it sits out): as many as kBatchSeconds
// asks on the slowest rank, no fewer than `per_batch` and no more than kMaxPerBatch.
// Simulated time has no noise to average: `per_batch` there.
int sizedBatch(const Backend& backend, Control& control, double seconds, int per_batch) {
  if (simulatedTime(backend)) return per_batch;
  const double slowest = control.max({seconds})[0];
  if (slowest <= 0 || per_batch >= kMaxPerBatch) return per_batch;
  return static_cast<int>(std::clamp(std::ceil(kBatchSeconds / slowest),
                                     static_cast<double>(per_batch),
                                     static_cast<double>(kMaxPerBatch)));
}

// The batches of one probe (an exchange, a ping-pong): `one(count)` runs a batch of `count`
// repetitions after a barrier and returns this rank's mean seconds per repetition (0 where
// it sits out). kBatches batches, the first of max(1, iters / kBatches) repetitions, which
// sizes the others (sizedBatch, from `scale` times its mean: a ping-pong's repetition is
// half a round trip); each batch's mean on this rank, then a barrier. Collective.
std::vector<double> timedBatches(const Backend& backend, Control& control, int iters, double scale,
                                 const std::function<double(int)>& one) {
  int per_batch = std::max(1, iters / kBatches);
  std::vector<double> means;
  for (int batch = 0; batch < kBatches; ++batch) {
    means.push_back(one(per_batch));
    if (batch == 0) per_batch = sizedBatch(backend, control, means[0] * scale, per_batch);
  }
  control.barrier();
  return means;
}

// Each batch's mean time of one exchange of `bytes` for this rank (0 when it sits out), at
// least `iters` exchanges in all, more where kBatchSeconds asks (timedBatches). An exchange is a
// step as a collective takes it: each rank posts a step's receive from `from` and its send to `to`
// once the previous step's receive has completed (as a collective sends on what it received), and
// waits for the receive; it waits for its own sends only when the batch ends, as a collective does.
// The next step's receive is not posted ahead: nccl issues everything posted before a wait as one
// group and completes none of it before all of it, which a receive posted ahead would never let
// happen. Where a batch has several exchanges its clock starts when the first one's receive
// completes, so that the ranks' release from the barrier is not timed. An exchange of several
// `messages` posts them all at once each way, as a ring posts its chunks: a stream.
std::vector<double> exchange(Backend& backend, Control& control, uint64_t bytes, int iters,
                             Partners p, int messages = 1) {
  // The probe moves raw bytes; any dtype of the right size will do. Only a rank that
  // probes holds buffers (16 MiB each inside a node).
  const Buffer like = measurementLike(backend, DType::kF64, control.device());
  const size_t count = std::max<uint64_t>(1, bytes / 8);
  std::vector<ScratchBuffer> out, in;  // out: read by every send at once; in: one per message
  if (p.to >= 0) {
    out.push_back(writtenScratch(like, count));
    for (int m = 0; m < messages; ++m) in.push_back(writtenScratch(like, count));
  }
  return timedBatches(backend, control, iters, 1, [&](int per_batch) {
    // The first exchange untimed, where a batch has several: a batch of one is timed whole
    // (on a slow link an untimed exchange of 4 MiB would double the probe's time, where the
    // ranks' release from the barrier is a small part of it).
    const bool untimed_first = per_batch > 1;
    const int steps = per_batch + (untimed_first ? 1 : 0);
    std::vector<Tag> tags;  // drawn on every rank, so that the control sequence stays in step
    for (int i = 0; i < steps * messages; ++i) tags.push_back(control.nextTag());
    control.barrier();
    if (p.to < 0) return 0.0;
    std::vector<std::unique_ptr<Request>> sends;
    double start = clockSeconds(backend);
    for (int step = 0; step < steps; ++step) {
      std::vector<std::unique_ptr<Request>> recvs;
      for (int m = 0; m < messages; ++m)
        recvs.push_back(backend.irecv(p.from, in[m].view(), tags[step * messages + m]));
      for (int m = 0; m < messages; ++m)
        sends.push_back(backend.isend(p.to, out[0].view(), tags[step * messages + m]));
      waitAll(recvs, backend.timeout());
      if (step == 0 && untimed_first) start = clockSeconds(backend);
    }
    waitAll(sends, backend.timeout());
    return (clockSeconds(backend) - start) / per_batch;
  });
}

// Messages in the stream that measures the gap, and how many streams are timed.
constexpr int kStream = 16, kStreamIters = 50;

// The gap of one level (LinkCost::gap): the level's partners exchange single 8-byte
// messages, then streams of kStream of them each way posted at once, one probe right after
// the other (twice: the first round warms up); what a stream took beyond a single message,
// per further message. 0 (not measured: each message pays α) where the stream took no
// longer than the single message, which only noise does.
double probeGap(Backend& backend, Control& control, Partners mine) {
  double single = 0, stream = 0;
  for (int round = 0; round < 2; ++round) {
    single = median(control.max(exchange(backend, control, 8, kStreamIters, mine)));
    stream = median(control.max(exchange(backend, control, 8, kStreamIters, mine, kStream)));
  }
  return std::max(0.0, (stream - single) / (kStream - 1));
}

// A pair alone inside each node: the node's first two ranks send a message back and forth
// while its other ranks sit out, each from a buffer of its own and into another, as a
// collective's edge sends what its own rank reduced or received. (Bouncing one buffer made
// every copy read lines the other rank had just written: on ranks that share cores its price
// followed where the kernel put the pair, one core or two, and it priced the trees of
// configs/compare-allreduce.yaml 1.5-5x slow from 64 KiB to 2 MiB.) Each batch's mean time of
// one way (half a round trip), on ranks of a pair; 0 elsewhere (timedBatches).
std::vector<double> pingPong(Backend& backend, Control& control, uint64_t bytes, int iters,
                             const Topology& t) {
  const int rank = backend.rank();
  const auto ranks = t.ranksOnNode(t.node_of_rank[rank]);
  const int local = t.localRank(rank);
  const int peer = ranks.size() < 2 || local > 1 ? -1 : ranks[1 - local];
  const Buffer like = measurementLike(backend, DType::kF64, control.device());
  const size_t count = std::max<uint64_t>(1, bytes / 8);
  std::optional<ScratchBuffer> out, in;  // only on the pair: 16 MiB each at most
  if (peer >= 0) {
    out.emplace(writtenScratch(like, count));
    in.emplace(writtenScratch(like, count));
  }
  return timedBatches(backend, control, iters, 2, [&](int per_batch) {
    std::vector<Tag> tags;
    for (int i = 0; i < 2 * per_batch; ++i) tags.push_back(control.nextTag());
    control.barrier();
    if (peer < 0) return 0.0;
    const double start = clockSeconds(backend);
    for (size_t i = 0; i < tags.size(); i += 2) {
      // The first rank of the pair sends first; each way is its own tag.
      if (local == 0) backend.isend(peer, out->view(), tags[i])->wait(backend.timeout());
      backend.irecv(peer, in->view(), tags[i + (local == 0)])->wait(backend.timeout());
      if (local == 1) backend.isend(peer, out->view(), tags[i + 1])->wait(backend.timeout());
    }
    return (clockSeconds(backend) - start) / (2.0 * per_batch);
  });
}

// One way between nodes: rank 0 streams `iters` messages of `bytes` to the first rank of
// another node, which only receives, so the way back stays idle. The seconds per message
// from the first message's arrival to the last's (0 for ranks that sit out; the stream's
// start, which the first message pays, is the exchange's to measure). Over a backend with
// batch completion the first wait returns with the last message: there it is the whole
// stream's time per message, its start included, which adds the same to every size the
// one-way fit takes (kProbes streams 6 messages of each), so the fitted slope does not see
// it.
double stream(Backend& backend, Control& control, uint64_t bytes, int iters, Partners p) {
  const Buffer like = measurementLike(backend, DType::kF64, control.device());
  const size_t count = std::max<uint64_t>(1, bytes / 8);
  std::vector<Tag> tags;
  for (int i = 0; i < iters; ++i) tags.push_back(control.nextTag());
  double seconds = 0;
  control.barrier();
  if (p.to >= 0) {
    ScratchBuffer data = writtenScratch(like, count);  // only read, by every send at once
    std::vector<std::unique_ptr<Request>> sends;
    for (Tag tag : tags) sends.push_back(backend.isend(p.to, data.view(), tag));
    waitAll(sends, backend.timeout());
  } else if (p.from >= 0) {
    std::vector<ScratchBuffer> into;  // a buffer per message: they arrive while others land
    into.reserve(iters);
    for (int i = 0; i < iters; ++i) into.push_back(writtenScratch(like, count));
    std::vector<std::unique_ptr<Request>> recvs;
    for (int i = 0; i < iters; ++i) recvs.push_back(backend.irecv(p.from, into[i].view(), tags[i]));
    const double posted = clockSeconds(backend);
    recvs.front()->wait(backend.timeout());
    const double first = clockSeconds(backend);
    for (size_t i = 1; i < recvs.size(); ++i) recvs[i]->wait(backend.timeout());
    const double last = clockSeconds(backend);
    seconds = backend.capabilities().batch_completion
                  ? (last - posted) / static_cast<double>(iters)
                  : (last - first) / static_cast<double>(iters - 1);
  }
  control.barrier();
  return seconds;
}

// The one-way β between nodes (LinkCost::beta_one_way): the slope of the stream's seconds
// per message over the largest probe sizes, where the bandwidth decides; 0 without a pair
// of nodes.
double probeOneWay(Backend& backend, Control& control, Partners exchange_partners, int rank,
                   LinkFit* fit) {
  Partners mine;  // rank 0 sends, its partner receives
  if (exchange_partners.to >= 0) (rank == 0 ? mine.to : mine.from) = exchange_partners.to;
  std::vector<std::pair<double, double>> points;
  for (const auto& [bytes, iters] : kProbes) {
    if (bytes < kOneWayFrom || bytes > kLargestInterProbe) continue;
    const double t = stream(backend, control, bytes, iters, mine);
    const double slowest = control.max({t})[0];
    if (slowest > 0) points.emplace_back(static_cast<double>(bytes), slowest);
  }
  fit->probed = points.size() > 1;
  fit->sizes = static_cast<int>(points.size());
  fit->points = points;
  if (!fit->probed) return 0;
  return fitLine(points, &fit->residual).beta;
}

// The bank between nodes (LinkCost::bank): after a pause that lets any bank fill (a token
// bucket refills at its rate; 20 ms is 2.5 MB at 1 Gbit/s, 25 KB at 10 Mbit/s), rank 0
// sends one message of each kBankSizes size to its partner, which answers with 8 bytes,
// kBankRepeats times, and bankFromTrips reads the bank from the fastest round trip of each
// size. The fastest, because a round trip's noise only ever adds (a rank woken late after
// the pause, TCP's state after the probes before): between the lab's hosts an 8-byte one
// took 0.4-3.3 ms, and the median of 15 read a 128 KB bucket as anything from nothing to
// 155 KB, the fastest of 25 as 108-136 KB in eight calibrations. Simulated time has no
// noise: one round trip each there. Collective; every rank returns rank 0's.
constexpr uint64_t kBankSizes[] = {8, 256 << 10, 1 << 20};
constexpr int kBankRepeats = 25;
constexpr double kBankPause = 20e-3;

double probeBank(Backend& backend, Control& control, Partners exchange_partners, int rank,
                 LinkFit* fit) {
  const int peer = exchange_partners.to;
  const Buffer like = measurementLike(backend, DType::kF64, control.device());
  const int repeats = simulatedTime(backend) ? 1 : kBankRepeats;
  std::vector<std::pair<double, double>> points;
  for (uint64_t bytes : kBankSizes) {
    std::vector<double> trips;
    std::optional<ScratchBuffer> data, ack;  // only on the pair
    if (peer >= 0) {
      data.emplace(writtenScratch(like, std::max<uint64_t>(1, bytes / 8)));
      ack.emplace(writtenScratch(like, 1));
    }
    for (int i = 0; i < repeats; ++i) {
      const Tag there = control.nextTag(), back = control.nextTag();
      control.barrier();
      sleepSeconds(backend, kBankPause);  // every rank: the link stands idle
      if (peer < 0) continue;
      if (rank == 0) {
        const double start = clockSeconds(backend);
        auto answer = backend.irecv(peer, ack->view(), back);
        backend.isend(peer, data->view(), there)->wait(backend.timeout());
        answer->wait(backend.timeout());
        trips.push_back(clockSeconds(backend) - start);
      } else {
        backend.irecv(peer, data->view(), there)->wait(backend.timeout());
        backend.isend(peer, ack->view(), back)->wait(backend.timeout());
      }
    }
    const double fastest = trips.empty() ? 0.0 : *std::min_element(trips.begin(), trips.end());
    const double trip = control.max({fastest})[0];
    if (trip > 0) points.emplace_back(static_cast<double>(std::max<uint64_t>(bytes, 8)), trip);
  }
  fit->probed = points.size() == std::size(kBankSizes);
  fit->sizes = static_cast<int>(points.size());
  fit->points = points;
  fit->residual = 0;
  return bankFromTrips(points);
}

// Every size up to `largest`, each timed by `batches(bytes, iters)` (the batches' means on
// this rank, 0 where it sits out): the median over batches of the slowest probing rank, and
// the fitted line. Every rank returns the same.
//
// The sizes go from the largest down, so that the small ones, which decide α, meet the
// ranks as a running collective leaves them. Threads of one process that had only just
// started passed 8 bytes around a ring of 4 loopback ranks on 2 CPUs in 12 us a step, and
// after the large probes in 30 us, which is what the sweep's collectives then took; run
// smallest first, α came out anywhere between the two from one run to the next (before
// the loopback woke its waiters outside its lock, which made every step cheaper). Each
// size's batches run one after the other: batches of every size in turn, round after
// round, were tried and not kept (docs/measuring.md).
template <typename Batches>
LinkCost probeSizes(Control& control, uint64_t largest, LinkFit* fit, Batches&& batches) {
  // The first batches after a quiet spell ran slower (8 B took up to 4x the time of 4 KiB on
  // loopback): a round at the smallest size goes untimed first.
  batches(kProbes[0].first, kProbes[0].second);
  std::vector<std::pair<double, double>> points;
  for (auto it = std::rbegin(kProbes); it != std::rend(kProbes); ++it) {
    const auto [bytes, iters] = *it;
    if (bytes > largest) continue;
    const double slowest = median(control.max(batches(bytes, iters)));
    if (slowest > 0)
      points.emplace(points.begin(), static_cast<double>(std::max<uint64_t>(bytes, 8)), slowest);
  }
  fit->probed = !points.empty();
  fit->sizes = static_cast<int>(points.size());
  fit->points = points;
  if (!fit->probed) return {};
  return fitLine(points, &fit->residual);
}

// One level: every size exchanged with the same partners (probeSizes).
LinkCost probeLevel(Backend& backend, Control& control, Partners mine, uint64_t largest,
                    LinkFit* fit) {
  return probeSizes(control, largest, fit, [&](uint64_t bytes, int iters) {
    return exchange(backend, control, bytes, iters, mine);
  });
}

// The pair alone inside a node (LinkCost::alpha_alone, beta_alone), over the sizes the
// exchange probed: nothing (0, 0) without two ranks on a node.
LinkCost probeAlone(Backend& backend, Control& control, const Topology& t, uint64_t largest,
                    LinkFit* fit) {
  return probeSizes(control, largest, fit, [&](uint64_t bytes, int iters) {
    return pingPong(backend, control, bytes, iters, t);
  });
}

// Seconds per byte of reduceInto, on every rank at once, over buffers larger than the
// caches: the slowest rank's best of three, so that ranks which share cores (4 threads on 2
// CPUs) price the reduction as the collective's slowest rank meets it, not as the rank that
// had a core to itself.
double probeReduction(Backend& backend, Control& control, DType dtype) {
  const Buffer like = measurementLike(backend, dtype, control.device());
  const size_t count = (16 << 20) / dtypeSize(dtype);
  ScratchBuffer a = writtenScratch(like, count), b = writtenScratch(like, count);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    control.barrier();
    const double start = clockSeconds(backend);
    reduceInto(a.view(), b.view(), ReduceOp::kSum);
    if (like.memory == MemoryKind::kCuda) synchronizeDevice(like.device);  // a GPU's is queued
    best = std::min(best, clockSeconds(backend) - start);
  }
  return control.max({best})[0] / static_cast<double>(a.view().bytes());
}

// LinkCost::by_buffer of a level whose fitted line is `line`, from its exchange's probes and
// a pair's alone (empty where none): at each probe size whose time is at least twice the
// smallest probe's (the bytes' part, not α's swing, decides the slope), the slope from the
// smallest probe to it; the largest size the line's own. A pair alone's slope comes from
// the nearest size at or above it where its own time doubled, else from the line.
std::vector<BufferBeta> byBuffer(const LinkCost& line,
                                 const std::vector<std::pair<double, double>>& points,
                                 const std::vector<std::pair<double, double>>& alone) {
  using Points = std::vector<std::pair<double, double>>;
  auto decides = [](const Points& p, size_t i) { return p[i].second >= 2 * p[0].second; };
  auto slope = [](const Points& p, size_t i) {
    return std::max(0.0, (p[i].second - p[0].second) / (p[i].first - p[0].first));
  };
  const bool paired = alone.size() == points.size();
  std::vector<BufferBeta> sized;
  for (size_t i = 1; i + 1 < points.size(); ++i) {
    if (!decides(points, i)) continue;
    double beta_alone = line.beta_alone;
    for (size_t j = i; paired && j + 1 < alone.size(); ++j) {
      if (!decides(alone, j)) continue;
      beta_alone = slope(alone, j);
      break;
    }
    sized.push_back({points[i].first, slope(points, i), beta_alone});
  }
  if (points.size() > 1) sized.push_back({points.back().first, line.beta, line.beta_alone});
  return sized;
}

// A level as a list of doubles, and back (from `*at` on, which it moves past it): how
// calibrate() hands rank 0's model to every rank. Every field of LinkCost, by_buffer after
// its length.
void pack(const LinkCost& link, std::vector<double>* values) {
  values->insert(values->end(), {link.alpha, link.beta, link.beta_one_way, link.alpha_alone,
                                 link.beta_alone, static_cast<double>(link.flows), link.gap,
                                 link.bank, static_cast<double>(link.by_buffer.size())});
  for (const BufferBeta& b : link.by_buffer)
    values->insert(values->end(), {b.bytes, b.beta, b.beta_alone});
}

LinkCost unpack(const std::vector<double>& values, size_t* at) {
  auto next = [&] {
    if (*at >= values.size()) throw InternalError("calibration: the model broadcast is short");
    return values[(*at)++];
  };
  LinkCost link;
  link.alpha = next();
  link.beta = next();
  link.beta_one_way = next();
  link.alpha_alone = next();
  link.beta_alone = next();
  link.flows = static_cast<int>(next());
  link.gap = next();
  link.bank = next();
  const size_t sizes = static_cast<size_t>(next());
  for (size_t i = 0; i < sizes; ++i) {
    BufferBeta b;
    b.bytes = next();
    b.beta = next();
    b.beta_alone = next();
    link.by_buffer.push_back(b);
  }
  return link;
}

}  // namespace

double bankFromTrips(const std::vector<std::pair<double, double>>& trips) {
  if (trips.size() != 3) return 0;
  const auto& [small, small_trip] = trips[0];
  const auto& [m, trip] = trips[1];
  const auto& [large, large_trip] = trips[2];
  if (!(small < m && m < large)) return 0;
  const double pace = (large_trip - trip) / (large - m);
  if (!(pace > 0)) return 0;  // the larger message no slower: noise, nothing to read
  const double banked = std::min(m, m - small - (trip - small_trip) / pace);
  return banked > 0.1 * m ? banked : 0;
}

LinkCost calibrateUnderLoad(Backend& backend, Control& control, const Topology& topology,
                            uint64_t message, uint64_t largest, LinkFit* fit) {
  if (backend.size() < 2) return {};
  const int rank = backend.rank();
  const Partners mine =
      topology.nodeCount() > 1 ? interPartners(topology, rank) : intraPartners(topology, rank);
  // One core's worth of arithmetic on every rank, for as long as the probes run (stopped
  // and joined however they end).
  struct BusyCore {
    std::atomic<bool> done{false};
    std::thread thread{[this] {
      volatile double x = 1;
      while (!done.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 4096; ++i) x = x * 1.0000001 + 1e-9;
      }
    }};
    ~BusyCore() {
      done = true;
      thread.join();
    }
  } busy;
  // Three times the exchanges of calibrate()'s probes: a busy core makes each noisier.
  // probeSizes gives every rank the same fit.
  probeSizes(control, largest, fit, [&](uint64_t bytes, int iters) {
    return exchange(backend, control, bytes, 3 * iters, mine);
  });
  int fitted = 0;
  const LinkCost line = fitLineFrom(fit->points, message, &fit->residual, &fitted);
  fit->sizes = fitted;
  return line;
}

Buffer measurementLike(const Backend& backend, DType dtype, int device) {
  Buffer like;
  like.dtype = dtype;
  if (!movesPayload(backend)) {
    like.memory = MemoryKind::kNone;
  } else if (!backend.capabilities().host_memory) {
    like.memory = MemoryKind::kCuda;
    like.device = device;
  }
  return like;
}

LinkCost fitLine(const std::vector<std::pair<double, double>>& points, double* residual) {
  // The line passes through the smallest message (a latency, as a collective's small steps
  // see it); its slope β is the least-squares slope through that point, which the largest
  // messages decide: the bandwidth that large collectives see. (A fit on relative error
  // would follow the small probes, which a lab link's token bucket passes at once.)
  LinkCost link;
  if (points.empty()) return *residual = 0, link;
  const auto [m0, t0] = points.front();
  double num = 0, den = 0;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [m, t] = points[i];
    num += (m - m0) * (t - t0);
    den += (m - m0) * (m - m0);
  }
  link.beta = den > 0 ? std::max(0.0, num / den) : 0;
  link.alpha = std::max(0.0, t0 - link.beta * m0);
  double sum = 0;
  for (const auto& [m, t] : points) sum += std::pow((link.message(m) - t) / t, 2);
  *residual = std::sqrt(sum / static_cast<double>(points.size()));
  return link;
}

Calibration calibrate(Backend& backend, Control& control, const Topology& topology, DType dtype) {
  Calibration c;
  if (backend.size() > 1) {
    const int rank = backend.rank();
    // Each level up to its largest probe (kLargestIntra, kLargestInterProbe): inside a node every
    // rank at once then meets what a large collective's chunks meet, the memory bus shared
    // and the caches outgrown (up to 1 MiB, a loopback ring all-reduce past 4 MiB took
    // twice its prediction); between nodes the probes go past a lab link's token bucket.
    c.model.intra =
        probeLevel(backend, control, intraPartners(topology, rank), kLargestIntra, &c.intra);
    if (c.intra.probed) {
      c.model.intra.gap = probeGap(backend, control, intraPartners(topology, rank));
      // Every rank of a node ran a flow of the exchange, and the slowest node's time is the
      // level's: its flows are those of the node with the most ranks. A pair alone next.
      const LinkCost alone = probeAlone(backend, control, topology, kLargestIntra, &c.intra_alone);
      c.model.intra.alpha_alone = alone.alpha;
      c.model.intra.beta_alone = alone.beta;
      for (int node = 0; node < topology.nodeCount(); ++node) {
        c.model.intra.flows =
            std::max(c.model.intra.flows, static_cast<int>(topology.ranksOnNode(node).size()));
      }
      c.model.intra.by_buffer = byBuffer(c.model.intra, c.intra.points, c.intra_alone.points);
    }
    const Partners across = interPartners(topology, rank);
    c.model.inter = probeLevel(backend, control, across, kLargestInterProbe, &c.inter);
    if (c.inter.probed) {
      c.model.inter.gap = probeGap(backend, control, across);
      c.model.inter.beta_one_way = probeOneWay(backend, control, across, rank, &c.inter_one_way);
      c.model.inter.bank = probeBank(backend, control, across, rank, &c.inter_bank);
    }
    // A level without a pair of ranks (one rank per node; one node) is the other level;
    // inside a node without the one-way β and the bank, which only a flow between nodes meets.
    if (!c.intra.probed) {
      c.model.intra = c.model.inter;
      c.model.intra.beta_one_way = 0;
      c.model.intra.bank = 0;
    }
  }
  c.model.gamma = probeReduction(backend, control, dtype);
  // Each value is equal on every rank already (each comes from a max over the ranks), but
  // schedulers choose by the model (auto) and must choose alike: rank 0's bits make sure.
  std::vector<double> values = {c.model.gamma, c.intra.residual, c.inter.residual,
                                c.inter_one_way.residual, c.intra_alone.residual};
  pack(c.model.intra, &values);
  pack(c.model.inter, &values);
  const std::vector<double> root = control.fromRoot(values);
  c.model.gamma = root[0];
  c.intra.residual = root[1];
  c.inter.residual = root[2];
  c.inter_one_way.residual = root[3];
  c.intra_alone.residual = root[4];
  size_t at = 5;
  c.model.intra = unpack(root, &at);
  c.model.inter = c.inter.probed ? unpack(root, &at) : interOnOneNode(c.model.intra);
  return c;
}

LinkCost interOnOneNode(const LinkCost& intra) {
  LinkCost inter = intra;
  inter.flows = 0;  // cores are shared inside a node; between nodes a flow has its link
  inter.alpha_alone = inter.beta_alone = 0;
  for (BufferBeta& b : inter.by_buffer) b.beta_alone = 0;
  return inter;
}

LinkCost fitLineFrom(const std::vector<std::pair<double, double>>& points, double message,
                     double* residual, int* fitted) {
  size_t first = 0;
  while (first + 3 < points.size() && points[first + 1].first <= message) ++first;
  if (fitted != nullptr) *fitted = static_cast<int>(points.size() - first);
  return fitLine({points.begin() + static_cast<std::ptrdiff_t>(first), points.end()}, residual);
}

}  // namespace collie::measure
