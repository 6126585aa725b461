// Which collectives host staging serves (runtime/staging.h).
#include "runtime/staging.h"

namespace collie {

bool HostStaging::needed(const CollectiveArgs& args, const Capabilities& caps, bool force) {
  if (args.coll == Collective::kBarrier) return false;
  auto device = [&](const Buffer& b) {
    return b.memory == MemoryKind::kCuda || (force && b.memory == MemoryKind::kHost);
  };
  return !caps.cuda_memory && (device(args.data) || device(args.output));
}

CollectiveArgs HostStaging::asStaged(const CollectiveArgs& args) {
  CollectiveArgs staged = args;
  staged.data.memory = staged.output.memory = MemoryKind::kHost;
  staged.data.device = staged.output.device = 0;
  return staged;
}

}  // namespace collie
