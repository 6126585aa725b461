// The desync check of debug.consistency, as every backend's tests run it: the ranks of a job
// call one matching all-reduce, then the last rank calls one of another count, then one with
// another reduce op; every rank must fail in each of those two, naming the ranks and what
// differs, and the job must go on after them.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "collie/error.h"
#include "loopback_job.h"
#include "runtime/communicator.h"

namespace collie::testing {

// Rank b.rank()'s part; true when it saw what it must (it prints what it saw otherwise).
inline bool desyncIsNamedOnEveryRank(std::shared_ptr<Backend> backend) {
  const int n = backend->size(), rank = backend->rank();
  Communicator comm(backend, "test", Topology::singleNode(n));
  CommDebug debug;
  debug.consistency = true;
  comm.setDebug(debug);
  comm.addRule("ring", loadScheduler("ring"));
  auto call = [&](size_t count, ReduceOp op) {
    std::vector<int32_t> data(count, rank + 1);
    CollectiveArgs args;
    args.data.data = data.data();
    args.data.count = count;
    args.data.dtype = DType::kI32;
    args.op = op;
    comm.run(args);
    return data;
  };
  const bool last = rank == n - 1;
  auto expectFailure = [&](size_t count, ReduceOp op, const std::string& expected) {
    try {
      call(count, op);
    } catch (const CommError& e) {
      if (std::string(e.what()).find(expected) != std::string::npos) return true;
      std::fprintf(stderr, "rank %d: expected '%s' in: %s\n", rank, expected.c_str(), e.what());
      return false;
    }
    std::fprintf(stderr, "rank %d: a desynchronised all-reduce ran\n", rank);
    return false;
  };
  const auto sum = call(8, ReduceOp::kSum);
  if (sum[0] != n * (n + 1) / 2) {
    std::fprintf(stderr, "rank %d: the matching all-reduce gave %d\n", rank, sum[0]);
    return false;
  }
  std::string ranks_before;
  for (int r = 0; r + 1 < n; ++r) ranks_before += (r ? ", " : "") + std::to_string(r);
  const std::string who =
      fmt::format("rank{} {} call{}", n == 2 ? "" : "s", ranks_before, n == 2 ? "s" : "");
  bool ok = expectFailure(
      last ? 6 : 8, ReduceOp::kSum,
      fmt::format("debug.consistency: the ranks call different collectives as seq 2: {} "
                  "allreduce of 8 x i32 (sum); rank {} calls allreduce of 6 x i32 (sum) (the "
                  "count differs)",
                  who, n - 1));
  ok = expectFailure(8, last ? ReduceOp::kMax : ReduceOp::kSum,
                     fmt::format("as seq 3: {} allreduce of 8 x i32 (sum); rank {} calls "
                                 "allreduce of 8 x i32 (max) (the reduce op differs)",
                                 who, n - 1)) &&
       ok;
  return ok;
}

}  // namespace collie::testing
