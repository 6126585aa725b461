// Every scheduler × world size × element count × op × dtype, against closed-form values,
// with identical bytes on every rank. Ranks are loopback threads; plugins are the real .so.
#include <gtest/gtest.h>

#include <mutex>
#include <tuple>

#include "bench/pattern.h"
#include "collie/error.h"
#include "loopback_job.h"
#include "runtime/communicator.h"

namespace collie {
namespace {

using testing::loadScheduler;
using testing::runLoopback;

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProd};

}  // namespace

// gtest prints parameters through this (found by argument-dependent lookup).
void PrintTo(DType dtype, std::ostream* os) { *os << dtypeName(dtype); }

namespace {

uint64_t fingerprint(const Buffer& b) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the raw bytes
  const auto* p = static_cast<const unsigned char*>(b.data);
  for (size_t i = 0; i < b.bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Case {
  std::string scheduler;
  Params params;  // tiny chunk sizes reach the multi-segment paths
  int world;
  DType dtype;
};

// Runs `coll` for every count and op on `c.world` ranks; checks values and cross-rank bytes.
void checkCollective(const Case& c, Collective coll, const std::vector<size_t>& counts,
                     const std::vector<int>& roots = {0}) {
  std::mutex mu;
  std::map<std::string, std::vector<uint64_t>> digests;  // case -> per-rank digest
  runLoopback(c.world, [&](std::shared_ptr<Backend> backend) {
    Communicator comm(backend, "loopback", Topology::singleNode(c.world));
    comm.addRule(c.scheduler, loadScheduler(c.scheduler, c.params));
    const int n = c.world, rank = backend->rank();
    for (size_t count : counts) {
      for (ReduceOp op : kOps) {
        for (int root : roots) {
          Buffer like;
          like.dtype = c.dtype;
          size_t in = coll == Collective::kAllGather
                          ? count
                          : count * (coll == Collective::kReduceScatter ? n : 1);
          size_t out = coll == Collective::kAllGather
                           ? count * n
                           : (coll == Collective::kReduceScatter ? count : 0);
          ScratchBuffer data(like, in), output(like, out);
          CollectiveArgs args;
          args.coll = coll;
          args.data = data.view();
          args.output = output.view();
          args.op = op;
          args.root = root;
          pattern::fillInput(args, rank, n);
          comm.run(args);
          std::string label = std::string(collectiveName(coll)) + " count " +
                              std::to_string(count) + " op " + reduceOpName(op) + " root " +
                              std::to_string(root);
          EXPECT_EQ(pattern::countWrong(args, rank, n), 0u) << label << " rank " << rank;
          const Buffer& result = coll == Collective::kReduceScatter ? args.output
                                 : coll == Collective::kAllGather   ? args.output
                                                                    : args.data;
          std::lock_guard<std::mutex> lock(mu);
          digests[label].resize(n);
          digests[label][rank] = fingerprint(result);
        }
      }
    }
  });
  if (coll == Collective::kReduceScatter) return;  // each rank holds a different block
  for (const auto& [label, per_rank] : digests) {
    for (int r = 1; r < c.world; ++r) EXPECT_EQ(per_rank[r], per_rank[0]) << label << " rank " << r;
  }
}

std::vector<size_t> issueCounts(int world) {
  return {0, 1, 7, static_cast<size_t>(world - 1), 1000, 1000003};
}

class AllReduce : public ::testing::TestWithParam<std::tuple<std::string, int, DType>> {};

TEST_P(AllReduce, MatchesClosedFormOnEveryRank) {
  auto [scheduler, world, dtype] = GetParam();
  checkCollective({scheduler, Params(), world, dtype}, Collective::kAllReduce, issueCounts(world));
}

TEST_P(AllReduce, TinyChunksReachEveryMultiSegmentPath) {
  auto [scheduler, world, dtype] = GetParam();
  Params params;
  params.set(scheduler == "ring" ? "chunk_bytes" : "segment_bytes", "8");
  checkCollective({scheduler, params, world, dtype}, Collective::kAllReduce,
                  {0, 1, 7, static_cast<size_t>(world - 1), 1000});
}

std::string caseName(const ::testing::TestParamInfo<AllReduce::ParamType>& info) {
  return std::get<0>(info.param) + "_w" + std::to_string(std::get<1>(info.param)) + "_" +
         dtypeName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Schedulers, AllReduce,
                         ::testing::Combine(::testing::Values("ring", "tree"),
                                            ::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values(DType::kF32, DType::kF64, DType::kF16,
                                                              DType::kBF16, DType::kI32,
                                                              DType::kI64)),
                         caseName);

TEST(RingCollectives, ReduceScatterAndAllGather) {
  for (int world : {1, 2, 3, 5}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
      Params tiny;
      tiny.set("chunk_bytes", "16");
      checkCollective({"ring", tiny, world, dtype}, Collective::kReduceScatter, {0, 1, 7, 1000});
      checkCollective({"ring", Params(), world, dtype}, Collective::kAllGather, {0, 1, 7, 1000});
    }
  }
}

TEST(TreeCollectives, BroadcastFromEveryRootAndBarrier) {
  for (int world : {1, 2, 3, 5, 8}) {
    std::vector<int> roots(world);
    for (int r = 0; r < world; ++r) roots[r] = r;
    Params tiny;
    tiny.set("segment_bytes", "12");
    checkCollective({"tree", tiny, world, DType::kF32}, Collective::kBroadcast, {0, 1, 7, 1000},
                    roots);
    checkCollective({"tree", Params(), world, DType::kF32}, Collective::kBarrier, {0});
  }
}

TEST(Schedulers, DeclineWhatTheyDoNotImplement) {
  CollectiveArgs args;
  args.coll = Collective::kBroadcast;
  Decision d = loadScheduler("ring")->accepts(args, Topology::singleNode(4));
  EXPECT_FALSE(d.accepted);
  EXPECT_NE(d.reason.find("ring: broadcast is not implemented"), std::string::npos) << d.reason;
  args.coll = Collective::kReduceScatter;
  EXPECT_FALSE(loadScheduler("tree")->accepts(args, Topology::singleNode(4)).accepted);
}

TEST(Schedulers, CommunicatorNamesTheRefusals) {
  runLoopback(2, [](std::shared_ptr<Backend> backend) {
    Communicator comm(backend, "loopback", Topology::singleNode(2));
    comm.addRule("tree", loadScheduler("tree"));
    CollectiveArgs args;
    args.coll = Collective::kAllGather;
    try {
      comm.run(args);
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("tree: tree: allgather is not implemented"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(Schedulers, DeadPeerMidCollectiveIsANamedErrorNotAHang) {
  auto start = std::chrono::steady_clock::now();
  try {
    runLoopback(
        2,
        [](std::shared_ptr<Backend> backend) {
          if (backend->rank() == 1) return;  // never joins the all-reduce
          Communicator comm(backend, "loopback", Topology::singleNode(2));
          comm.addRule("ring", loadScheduler("ring"));
          std::vector<float> v(300, 1.0f);
          CollectiveArgs args;
          args.data.data = v.data();
          args.data.count = v.size();
          comm.run(args);
        },
        "500ms");
    FAIL() << "no error";
  } catch (const CommError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("allreduce seq 1"), std::string::npos) << m;
    EXPECT_NE(m.find("scheduler ring"), std::string::npos) << m;
    EXPECT_NE(m.find("receive from rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 500 ms"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace collie
