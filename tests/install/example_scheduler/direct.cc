// "direct" all-reduce: every rank sends its whole buffer to every other rank and reduces
// what it receives, in rank order. n-1 messages of the full size per rank: simple, latency-
// friendly for tiny messages, bandwidth-hungry for large ones. An example plugin.
#include <collie/plugin.h>

#include <vector>

namespace {

class DirectScheduler : public collie::Scheduler {
 public:
  explicit DirectScheduler(const collie::PluginContext&) {}

  collie::Decision accepts(const collie::CollectiveArgs& args,
                           const collie::Topology&) const override {
    if (args.coll != collie::Collective::kAllReduce)
      return collie::Decision::no("direct: allreduce only");
    return collie::Decision::yes();
  }

  void run(const collie::CollectiveArgs& args, collie::Backend& backend,
           const collie::Topology&) override {
    const int n = backend.size(), rank = backend.rank();
    const collie::Tag tag = collie::makeTag(args.seq, 1, 0);
    std::vector<std::unique_ptr<collie::ScratchBuffer>> incoming;
    std::vector<std::unique_ptr<collie::Request>> recvs, sends;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      incoming.push_back(std::make_unique<collie::ScratchBuffer>(args.data, args.data.count));
      recvs.push_back(backend.irecv(peer, incoming.back()->view(), tag));
      sends.push_back(backend.isend(peer, args.data, tag));
    }
    collie::waitAll(sends, backend.timeout());
    // Reduce in rank order on every rank, so that every rank gets identical bytes.
    collie::ScratchBuffer result(args.data, args.data.count);
    size_t next_incoming = 0;
    for (int peer = 0; peer < n; ++peer) {
      collie::Buffer contribution = args.data;
      if (peer != rank) {
        recvs[next_incoming]->wait(backend.timeout());
        contribution = incoming[next_incoming++]->view();
      }
      if (peer == 0) {
        collie::copyInto(result.view(), contribution);
      } else {
        collie::reduceInto(result.view(), contribution, args.op);
      }
    }
    collie::copyInto(args.data, result.view());
    collie::finishAverage(args.data, args.op, n);
  }
};

}  // namespace

COLLIE_SCHEDULER_PLUGIN("direct", "0.1.0", "example: every rank sends to every rank (out of tree)",
                        DirectScheduler);
