// The collectives collie knows, their arguments, and the status a refusal returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "collie/buffer.h"

namespace collie {

enum class Collective : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

const char* collectiveName(Collective coll);  // "allreduce", ...
bool parseCollective(const std::string& name, Collective* out);

// One collective call. Buffer shapes per collective (n = group size):
//   allreduce:      data (count) in place.
//   reduce_scatter: data (n * k) input, left as it was unless input_is_scratch; output (k)
//                   receives this rank's reduced block.
//   allgather:      data (k) input; output (n * k) receives every rank's block, in rank order.
//   broadcast:      data (count) in place; root's contents end up on every rank.
//   barrier:        data has no elements; its memory kind (and device) is one the backend
//                   moves, and a scheduler's empty messages are views of it (data.slice(0, 0)).
struct CollectiveArgs {
  Collective coll = Collective::kAllReduce;
  Buffer data;
  Buffer output;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  uint64_t seq = 0;  // the collective's sequence number in its group; part of every tag
  // ABI 11.0. The caller needs `data` no more after the call: a reduce_scatter may compute in
  // it rather than in a copy (its contents afterwards are unspecified), which spares a
  // scratch buffer of the input's size (the trainer's sharded stages set it: the full
  // gradient goes once its block is reduced). A permission, not a duty: a scheduler that
  // ignores it is correct.
  bool input_is_scratch = false;

  // The larger of its two buffers: the size rules admit a collective by and the cost model
  // prices its buffers at (CostModel::forBuffer).
  uint64_t bufferBytes() const { return std::max(data.bytes(), output.bytes()); }
};

// The shapes above, checked: throws CommError "<who>: reduce_scatter of 12 x f32 on 4 ranks
// needs an output of 3, found 4" (and the like: an output of another dtype or memory kind, a
// root outside the group, a barrier with elements) naming what the call got and what its
// collective needs. The Communicator checks every collective before a scheduler sees it; a
// backend whose runNative takes collectives of two buffers (nccl's) checks too, since a
// caller may reach it directly.
void checkCollectiveShape(const std::string& who, const CollectiveArgs& args, int size);

// A cheap, normal refusal (statuses where declining is control flow).
struct Decision {
  bool accepted = true;
  // Why not, when !accepted. When accepted by a scheduler that delegates (auto): the
  // scheduler that will run it, recorded in the collective's provenance; else empty.
  std::string reason;
  static Decision yes() { return {}; }
  static Decision yesBy(std::string scheduler) { return {true, std::move(scheduler)}; }
  static Decision no(std::string why) { return {false, std::move(why)}; }
};

}  // namespace collie
