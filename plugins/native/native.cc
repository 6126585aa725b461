// "native": hands each collective to the backend's own implementation (NCCL's ring/tree,
// Gloo's algorithms, ...) when capabilities() lists it, so the bench can put the backend's
// native collectives beside collie's schedulers on the same ranks.
#include "collie/plugin.h"

namespace collie::native {
namespace {

class NativeScheduler : public Scheduler {
 public:
  explicit NativeScheduler(const PluginContext&) {}

  Decision accepts(const CollectiveArgs& args, const Topology& topology) const override {
    const Capabilities& caps = topology.capabilities;
    if (!has(caps, args.coll)) {
      return Decision::no(std::string("native: the backend has no native ") +
                          collectiveName(args.coll) +
                          " (use ring, tree or halving_doubling, or a backend with native "
                          "collectives)");
    }
    if (args.coll != Collective::kBarrier && !caps.nativeHandles(args.data.dtype)) {
      return Decision::no(std::string("native: the backend's native collectives have no ") +
                          dtypeName(args.data.dtype));
    }
    const bool cuda = args.data.memory == MemoryKind::kCuda;
    if (args.coll != Collective::kBarrier && (cuda ? !caps.cuda_memory : !caps.host_memory)) {
      return Decision::no(std::string("native: the backend does not move ") +
                          (cuda ? "device" : "host") + " memory");
    }
    return Decision::yes();
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology&) override {
    Decision done = backend.runNative(args);
    if (!done.accepted) throw CommError("native: the backend declined: " + done.reason);
  }

 private:
  static bool has(const Capabilities& caps, Collective coll) {
    switch (coll) {
      case Collective::kAllReduce:
        return caps.native_allreduce;
      case Collective::kReduceScatter:
        return caps.native_reduce_scatter;
      case Collective::kAllGather:
        return caps.native_allgather;
      case Collective::kBroadcast:
        return caps.native_broadcast;
      case Collective::kBarrier:
        return caps.native_barrier;
    }
    return false;
  }
};

}  // namespace
}  // namespace collie::native

COLLIE_SCHEDULER_PLUGIN("native", "1.0.0",
                        "the backend's own collectives, where capabilities() lists them",
                        collie::native::NativeScheduler);
