// NCCL's tuner plugin interface, version 4 (NCCL 2.23 and later look it up as the exported
// symbol ncclTunerPlugin_v4; NCCL 2.28 tries _v5 first, then _v4), declared here from NCCL's
// documentation of the ext-tuner interface, since NCCL ships no tuner header. NCCL calls
// init() once per communicator, getCollInfo() for each collective it plans, and destroy()
// when the communicator ends.
#pragma once

#include <cstddef>

namespace collie::nccl_tuner {

// ncclResult_t: what each call returns (ncclSuccess 0; ncclInvalidUsage 5).
enum Result : int { kSuccess = 0, kInternalError = 3, kInvalidUsage = 5 };

// ncclFunc_t: the collective NCCL asks about.
enum Function : int {
  kBroadcast = 0,
  kReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kAllReduce = 4
};

// NCCL's algorithm and protocol numbers: the rows and columns of the cost table.
enum Algorithm : int {
  kTree = 0,
  kRing = 1,
  kCollNetDirect = 2,
  kCollNetChain = 3,
  kNvls = 4,
  kNvlsTree = 5,
  kPat = 6
};
constexpr int kProtocols = 3;     // LL, LL128, Simple: a cost table row's length
constexpr float kIgnore = -1.0f;  // NCCL_ALGO_PROTO_IGNORE: a combination not to run
enum LogLevel : int { kLogWarn = 2, kLogInfo = 3 };
constexpr unsigned long kLogTuning = 64;  // NCCL_TUNING, the subsystem of the log lines

using Logger = void (*)(LogLevel level, unsigned long flags, const char* file, int line,
                        const char* format, ...);

struct TunerV4 {
  const char* name;
  // A communicator of n_ranks over n_nodes begins; *context is the plugin's state for it.
  Result (*init)(size_t n_ranks, size_t n_nodes, Logger log, void** context);
  // The time NCCL expects each algorithm and protocol to take for this collective
  // (cost_table[algorithm][protocol], kIgnore where it cannot run): the plugin may change
  // them, and NCCL runs the cheapest. n_channels: unchanged keeps NCCL's choice.
  Result (*getCollInfo)(void* context, Function collective, size_t bytes, int pipelined_ops,
                        float** cost_table, int algorithms, int protocols, int registered_buffer,
                        int* n_channels);
  Result (*destroy)(void* context);
};

}  // namespace collie::nccl_tuner
