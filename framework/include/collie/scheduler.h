// The collective-algorithm contract (DESIGN §3): a scheduler is written once against the
// Backend interface and runs over every backend.
#pragma once

#include "collie/backend.h"
#include "collie/collective.h"
#include "collie/topology.h"

namespace collie {

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // Cheap check, no communication: can this scheduler run `args` on this group shape?
  // A refusal names the reason ("tree: reduce_scatter is not implemented").
  virtual Decision accepts(const CollectiveArgs& args, const Topology& topology) const = 0;

  // Runs an accepted collective. Every rank of `backend`'s group calls it with the same
  // collective, count, dtype, op, root and seq. Throws CommError (naming the peer, the
  // collective and seq) when a transfer fails or times out; the buffers are then undefined.
  virtual void run(const CollectiveArgs& args, Backend& backend) = 0;
};

}  // namespace collie
