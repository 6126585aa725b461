// Ring all-reduce: a reduce-scatter phase then an all-gather phase around the ring, each
// block cut into chunks so that reducing one chunk overlaps receiving the next.
#include <algorithm>
#include <cmath>

#include "collie/patterns/ring.h"
#include "collie/plugin.h"

namespace collie::ring {
namespace {

using patterns::Range;

enum Phase : uint32_t { kReduceScatter = 1, kAllGather = 2 };

class RingScheduler : public Scheduler {
 public:
  explicit RingScheduler(const PluginContext& context)
      : chunk_bytes_(context.params->getBytes("chunk_bytes", 1 << 20, 1, 1ull << 32)) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    switch (args.coll) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter:
      case Collective::kAllGather:
        return Decision::yes();
      default:
        return Decision::no(std::string("ring: ") + collectiveName(args.coll) +
                            " is not implemented (allreduce, reduce_scatter, allgather are)");
    }
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    const int n = backend.size();
    switch (args.coll) {
      case Collective::kAllReduce: {
        if (n == 1 || args.data.count == 0) return finishAverage(args.data, args.op, n);
        reduceScatter(args.data, args.op, args.seq, backend);
        Range mine = patterns::block(args.data.count, n, backend.rank());
        finishAverage(args.data.slice(mine.offset, mine.count), args.op, n);
        allGather(args.data, args.seq, backend);
        return;
      }
      case Collective::kReduceScatter: {
        // Reduce in a copy so that the input stays intact, then hand out this rank's block.
        ScratchBuffer work(args.data, args.data.count);
        copyInto(work.view(), args.data);
        if (n > 1) reduceScatter(work.view(), args.op, args.seq, backend);
        Range mine = patterns::block(args.data.count, n, backend.rank());
        copyInto(args.output, work.view().slice(mine.offset, mine.count));
        return finishAverage(args.output, args.op, n);
      }
      case Collective::kAllGather: {
        Range mine = patterns::block(args.output.count, n, backend.rank());
        copyInto(args.output.slice(mine.offset, mine.count), args.data);
        if (n > 1) allGather(args.output, args.seq, backend);
        return;
      }
      default:
        throw InternalError("ring: run() called for a collective it declined");
    }
  }

  // α-β-γ (README): 2(n-1) steps, each ⌈block/chunk⌉ messages; 2(n-1)/n of the message on
  // the wire per rank and (n-1)/n of it reduced. Reduce-scatter and all-gather: one phase.
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    const int n = topology.world_size;
    if (n == 1) return 0;
    const LinkCost& link = topology.nodeCount() > 1 ? model.inter : model.intra;
    const double m = static_cast<double>(std::max(args.data.bytes(), args.output.bytes()));
    const double pieces = std::max(1.0, std::ceil(m / n / static_cast<double>(chunk_bytes_)));
    const double phase = (n - 1) * pieces * link.alpha + (n - 1.0) / n * m * link.beta;
    const double reduce = (n - 1.0) / n * m * model.gamma;
    switch (args.coll) {
      case Collective::kAllReduce:
        return 2 * phase + reduce;
      case Collective::kReduceScatter:
        return phase + reduce;
      case Collective::kAllGather:
        return phase;
      default:
        return kNoPrediction;
    }
  }

 private:
  size_t chunkElements(const Buffer& data) const {
    return std::max<size_t>(1, chunk_bytes_ / dtypeSize(data.dtype));
  }

  // After it, block r of `data` on rank r holds the reduction of every rank's block r.
  void reduceScatter(const Buffer& data, ReduceOp op, uint64_t seq, Backend& backend) {
    const int n = backend.size(), rank = backend.rank();
    const int next = patterns::ringNext(rank, n), prev = patterns::ringPrev(rank, n);
    const size_t chunk = chunkElements(data);
    ScratchBuffer incoming(data, patterns::block(data.count, n, 0).count);  // largest block
    std::vector<std::unique_ptr<Request>> sends, recvs;
    for (int step = 0; step < n - 1; ++step) {
      auto s = patterns::ringReduceScatterStep(rank, n, step);
      Range recv_block = patterns::block(data.count, n, s.recv_block);
      auto recv_chunks = patterns::pieces(recv_block, chunk);
      for (const Range& c : recv_chunks) {
        Buffer into = incoming.view().slice(c.offset - recv_block.offset, c.count);
        recvs.push_back(backend.irecv(prev, into, makeTag(seq, kReduceScatter, step)));
      }
      for (const Range& c : patterns::pieces(patterns::block(data.count, n, s.send_block), chunk)) {
        sends.push_back(
            backend.isend(next, data.slice(c.offset, c.count), makeTag(seq, kReduceScatter, step)));
      }
      for (size_t i = 0; i < recv_chunks.size(); ++i) {
        recvs[i]->wait(backend.timeout());
        const Range& c = recv_chunks[i];
        reduceInto(data.slice(c.offset, c.count),
                   incoming.view().slice(c.offset - recv_block.offset, c.count), op);
      }
      recvs.clear();
      waitAll(sends, backend.timeout());  // the next step sends what this one reduced
    }
  }

  // Starting with block r complete on rank r, leaves every block complete on every rank.
  void allGather(const Buffer& data, uint64_t seq, Backend& backend) {
    const int n = backend.size(), rank = backend.rank();
    const int next = patterns::ringNext(rank, n), prev = patterns::ringPrev(rank, n);
    const size_t chunk = chunkElements(data);
    std::vector<std::unique_ptr<Request>> requests;
    for (int step = 0; step < n - 1; ++step) {
      auto s = patterns::ringAllGatherStep(rank, n, step);
      for (const Range& c : patterns::pieces(patterns::block(data.count, n, s.recv_block), chunk)) {
        requests.push_back(
            backend.irecv(prev, data.slice(c.offset, c.count), makeTag(seq, kAllGather, step)));
      }
      for (const Range& c : patterns::pieces(patterns::block(data.count, n, s.send_block), chunk)) {
        requests.push_back(
            backend.isend(next, data.slice(c.offset, c.count), makeTag(seq, kAllGather, step)));
      }
      waitAll(requests, backend.timeout());  // the next step forwards what this one received
    }
  }

  uint64_t chunk_bytes_;
};

}  // namespace
}  // namespace collie::ring

COLLIE_SCHEDULER_PLUGIN(
    "ring", "1.0.0", "ring all-reduce: chunked reduce-scatter then all-gather, bandwidth-optimal",
    collie::ring::RingScheduler);
