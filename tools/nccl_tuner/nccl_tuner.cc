// libnccl-tuner-collie.so: NCCL's tuner plugin that runs the choices a collie bench measured.
// `collie run --emit-policy DIR` writes DIR/nccl-tuner.policy; a job started with
// NCCL_TUNER_PLUGIN=<path to this library> and COLLIE_NCCL_POLICY=<that file> then has NCCL,
// for each collective of a communicator of the measured size, run the algorithm collie found
// fastest at that size: every other algorithm's cost is set to "ignore", and NCCL still
// picks the protocol and channels. Where the policy says "-" (no NCCL algorithm runs
// collie's schedule), where the chosen algorithm cannot run, or for another communicator
// size, NCCL decides alone. The library needs nothing but the C++ runtime: NCCL loads it
// into any process.
//
// The policy file: '#' comments, then one line per size range,
//   COLLECTIVE RANKS FROM_BYTES ALGORITHM
// COLLECTIVE allreduce, allgather, reduce_scatter or broadcast; ALGORITHM ring, tree or "-";
// a collective's ranges ascending from 0 bytes.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nccl_tuner_v4.h"

namespace collie::nccl_tuner {
namespace {

struct Range {
  Function collective;
  size_t from_bytes;
  int algorithm;  // -1: NCCL decides
};

struct Context {
  std::vector<Range> ranges;  // this communicator's (its size), each collective ascending
};

bool functionNamed(const std::string& name, Function* out) {
  const struct {
    const char* name;
    Function function;
  } kNames[] = {{"allreduce", kAllReduce},
                {"allgather", kAllGather},
                {"reduce_scatter", kReduceScatter},
                {"broadcast", kBroadcast}};
  for (const auto& n : kNames) {
    if (name == n.name) {
      *out = n.function;
      return true;
    }
  }
  return false;
}

// Reads the policy at `path`, keeping the ranges of communicators of `ranks`. Returns "" or
// what is wrong, with its line.
std::string readPolicy(const std::string& path, size_t ranks, std::vector<Range>* out) {
  std::ifstream in(path);
  if (!in) return "cannot read " + path;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string collective, algorithm, extra;
    long long group = 0, from = 0;
    if (!(fields >> collective)) continue;  // blank or a comment
    Function function;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    if (!functionNamed(collective, &function))
      return where + "'" + collective +
             "' is not allreduce, allgather, reduce_scatter or broadcast";
    if (!(fields >> group >> from >> algorithm) || group < 1 || from < 0 || (fields >> extra))
      return where + "expected COLLECTIVE RANKS FROM_BYTES ALGORITHM";
    int id = -1;
    if (algorithm == "ring") {
      id = kRing;
    } else if (algorithm == "tree") {
      id = kTree;
    } else if (algorithm != "-") {
      return where + "algorithm '" + algorithm + "' is not ring, tree or -";
    }
    if (static_cast<size_t>(group) != ranks) continue;
    const Range* last = nullptr;
    for (const Range& r : *out) {
      if (r.collective == function) last = &r;
    }
    if (last == nullptr ? from != 0 : static_cast<size_t>(from) <= last->from_bytes)
      return where + "a collective's ranges must ascend from 0 bytes";
    out->push_back({function, static_cast<size_t>(from), id});
  }
  return "";
}

Result init(size_t n_ranks, size_t, Logger log, void** context) noexcept try {
  *context = nullptr;
  auto state = std::make_unique<Context>();
  const char* path = std::getenv("COLLIE_NCCL_POLICY");
  if (path == nullptr || *path == '\0') {
    if (log != nullptr)
      log(kLogWarn, kLogTuning, __FILE__, __LINE__,
          "collie tuner: COLLIE_NCCL_POLICY is not set: NCCL decides every collective");
    *context = state.release();
    return kSuccess;
  }
  const std::string why = readPolicy(path, n_ranks, &state->ranges);
  if (!why.empty()) {
    if (log != nullptr)
      log(kLogWarn, kLogTuning, __FILE__, __LINE__, "collie tuner: %s", why.c_str());
    std::fprintf(stderr, "collie tuner: %s\n", why.c_str());
    return kInvalidUsage;
  }
  if (log != nullptr)
    log(kLogInfo, kLogTuning, __FILE__, __LINE__,
        "collie tuner: %zu size range(s) from %s for %zu ranks", state->ranges.size(), path,
        n_ranks);
  *context = state.release();
  return kSuccess;
} catch (...) {  // out of memory: the communicator's set-up fails, and no exception crosses
                 // into NCCL
  return kInternalError;
}

Result getCollInfo(void* context, Function collective, size_t bytes, int, float** cost_table,
                   int algorithms, int protocols, int, int*) noexcept {
  const auto* state = static_cast<const Context*>(context);
  if (state == nullptr || cost_table == nullptr || protocols > kProtocols) return kSuccess;
  const Range* chosen = nullptr;
  for (const Range& r : state->ranges) {
    if (r.collective == collective && r.from_bytes <= bytes) chosen = &r;
  }
  if (chosen == nullptr || chosen->algorithm < 0 || chosen->algorithm >= algorithms)
    return kSuccess;
  // NCCL's table: rows of kProtocols costs, one row per algorithm.
  auto* table = reinterpret_cast<float(*)[kProtocols]>(cost_table);
  bool runnable = false;
  for (int p = 0; p < protocols; ++p) runnable = runnable || table[chosen->algorithm][p] != kIgnore;
  if (!runnable) return kSuccess;  // it cannot run this collective here: NCCL decides
  for (int a = 0; a < algorithms; ++a) {
    if (a == chosen->algorithm) continue;
    for (int p = 0; p < protocols; ++p) table[a][p] = kIgnore;
  }
  return kSuccess;
}

Result destroy(void* context) noexcept {
  delete static_cast<Context*>(context);
  return kSuccess;
}

}  // namespace
}  // namespace collie::nccl_tuner

extern "C" __attribute__((visibility("default")))
const collie::nccl_tuner::TunerV4 ncclTunerPlugin_v4 = {"collie", collie::nccl_tuner::init,
                                                        collie::nccl_tuner::getCollInfo,
                                                        collie::nccl_tuner::destroy};
