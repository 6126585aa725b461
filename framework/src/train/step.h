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
  // With train.compression: the bytes of the codec's collectives (each an all-reduce's
  // buffer, an all-gather's output), which synchronised those gradient bytes.
  uint64_t coded_bytes = 0;
  int buckets = 0;
  int launched_in_backward = 0;  // buckets handed to the communication thread by backward's
                                 // hooks (overlap), not after it
  std::vector<Provenance> collectives;
};

// One step on one rank.
struct StepStats {
  double step = 0, forward = 0, backward = 0, optimizer = 0;  // seconds
  double loss = 0;  // mean over this rank's samples of the step
  double lr = 0, grad_norm = 0;
  int micro_batch = 0;  // this rank's samples per micro-batch in this step
  SyncTiming sync;
};

}  // namespace collie::train
