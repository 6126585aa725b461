// What one training step cost on one rank: the figures the reducer, the trainer and the
// step log share. Free of LibTorch headers.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/communicator.h"

namespace collie::train {

// What the last step's gradient synchronisation cost.
struct SyncTiming {
  double comm_seconds = 0;     // sum of the buckets' all-reduce times
  double exposed_seconds = 0;  // how long the step waited for them after backward
  // Sharded: the all-gathers' part of those two (the rest is the reduce-scatters).
  double gather_seconds = 0, gather_exposed_seconds = 0;
  uint64_t bytes = 0;  // gradient bytes all-reduced (float32, the buckets' size)
  // What this rank sent in the step's collectives (the gradients' or a codec's, train.sync's
  // meetings, ZeRO's gathers) on bandwidth-optimal schedules (sentBytes).
  double sent_bytes = 0;
  int buckets = 0;
  int launched_in_backward = 0;  // buckets handed to the communication thread by backward's
                                 // hooks (overlap), not after it
  std::vector<Provenance> collectives;
};

// What a rank sends of a collective over `group` ranks on a bandwidth-optimal schedule, the
// least any schedule sends: an all-reduce of B bytes 2(N-1)/N B (a ring's), a
// reduce-scatter of B bytes or an all-gather into B bytes (N-1)/N B, a broadcast B (its
// root's). Comparable across codecs, whose collectives differ, as a scheduler's own count
// would not be.
inline double sentBytes(const Provenance& p, int group) {
  const double n = group, bytes = static_cast<double>(p.bytes);
  if (group <= 1) return 0;
  switch (p.coll) {
    case Collective::kAllReduce:
      return 2 * (n - 1) / n * bytes;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      return (n - 1) / n * bytes;
    case Collective::kBroadcast:
      return bytes;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

// One step on one rank.
struct StepStats {
  double step = 0, forward = 0, backward = 0, optimizer = 0;  // seconds
  double loss = 0;  // mean over this rank's samples of the step
  double lr = 0, grad_norm = 0;
  int micro_batch = 0;  // this rank's samples per micro-batch in this step
  SyncTiming sync;
};

}  // namespace collie::train
