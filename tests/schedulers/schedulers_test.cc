// Scheduler behaviour beyond the conformance matrix: refusals, how the Communicator reports
// them, and a dead peer in the middle of a collective.
#include <gtest/gtest.h>

#include "collie/error.h"
#include "expect.h"
#include "host_view.h"
#include "loopback_job.h"
#include "runtime/communicator.h"

namespace collie {
namespace {

using testing::loadScheduler;
using testing::runLoopback;

TEST(Schedulers, DeclineWhatTheyDoNotImplement) {
  CollectiveArgs args;
  args.coll = Collective::kBroadcast;
  Decision d = loadScheduler("ring")->accepts(args, Topology::singleNode(4));
  EXPECT_FALSE(d.accepted);
  EXPECT_TRUE(testing::contains(d.reason, {"ring: broadcast is not implemented"}));
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
      EXPECT_TRUE(testing::contains(std::string(e.what()), {"tree: allgather is not implemented"}));
      // The refusal names its plugin; a label equal to it is not said twice.
      EXPECT_EQ(std::string(e.what()).find("tree: tree:"), std::string::npos) << e.what();
    }
  });
}

// hierarchical where one level is all there is (one node; one rank a node) runs that
// level's all-reduce and sums right. tree on both levels: it has no reduce-scatter or
// all-gather, which the two-level steps would need, so hierarchical of two levels declines.
TEST(Schedulers, HierarchicalOfOneLevelSums) {
  Params params;
  params.set("intra", "tree");
  params.set("inter", "tree");
  CollectiveArgs probe;
  probe.data.count = 1001;
  probe.data.dtype = DType::kF32;
  EXPECT_FALSE(loadScheduler("hierarchical", params)
                   ->accepts(probe, Topology::fromLabels({"a", "a", "b", "b"}))
                   .accepted);
  for (const auto& labels : {std::vector<std::string>{"a", "a", "a", "a"},
                             std::vector<std::string>{"a", "b", "c", "d"}}) {
    runLoopback(4, [&](std::shared_ptr<Backend> backend) {
      Communicator comm(backend, "loopback", Topology::fromLabels(labels));
      comm.addRule("hierarchical", loadScheduler("hierarchical", params));
      std::vector<float> data(1001);
      for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<float>((backend->rank() + 1) * (i % 7 + 1));
      CollectiveArgs args;
      args.data = {data.data(), data.size(), DType::kF32};
      comm.run(args);
      for (size_t i = 0; i < data.size(); ++i)
        ASSERT_EQ(data[i], static_cast<float>(10 * (i % 7 + 1))) << labels[1] << " at " << i;
      args.op = ReduceOp::kAvg;  // the sum, divided once by the 4 ranks
      comm.run(args);
      for (size_t i = 0; i < data.size(); ++i)
        ASSERT_EQ(data[i], static_cast<float>(10 * (i % 7 + 1))) << labels[1] << " at " << i;
    });
  }
}

// A call whose buffers do not fit its collective is refused before any scheduler runs it,
// naming what it got and what it needs: a scheduler would read or write past a buffer.
TEST(Schedulers, CommunicatorRefusesACallOfTheWrongShape) {
  runLoopback(2, [](std::shared_ptr<Backend> backend) {
    Communicator comm(backend, "loopback", Topology::singleNode(2));
    comm.addRule("ring", loadScheduler("ring"));
    std::vector<float> in(12, 1.0f), out(24, 0.0f);
    std::vector<double> wide(24, 0.0);
    auto call = [&](Collective coll, size_t in_count, void* out_data, size_t out_count,
                    DType out_dtype) {
      CollectiveArgs args;
      args.coll = coll;
      args.data = {in.data(), in_count, DType::kF32};
      args.output = {out_data, out_count, out_dtype};
      return args;
    };
    auto refusal = [&](const CollectiveArgs& args) -> std::string {
      try {
        comm.run(args);
      } catch (const CommError& e) {
        return e.what();
      }
      return "accepted";
    };
    const std::string me = "rank " + std::to_string(backend->rank()) + ": ";
    EXPECT_EQ(refusal(call(Collective::kReduceScatter, 12, out.data(), 4, DType::kF32)),
              me + "reduce_scatter of 12 x f32 on 2 ranks needs an output of 6, found 4");
    EXPECT_EQ(refusal(call(Collective::kReduceScatter, 11, out.data(), 5, DType::kF32)),
              me + "reduce_scatter of 11 x f32 on 2 ranks needs an input whose count is a "
                   "multiple of 2");
    EXPECT_EQ(refusal(call(Collective::kAllGather, 12, out.data(), 23, DType::kF32)),
              me + "allgather of 12 x f32 on 2 ranks needs an output of 24, found 23");
    EXPECT_EQ(refusal(call(Collective::kAllGather, 12, wide.data(), 24, DType::kF64)),
              me + "allgather of 12 x f32 on 2 ranks needs an output of the same dtype and "
                   "memory kind, found f64");
    CollectiveArgs broadcast = call(Collective::kBroadcast, 12, nullptr, 0, DType::kF32);
    broadcast.root = 2;
    EXPECT_EQ(refusal(broadcast), me + "broadcast of 12 x f32 on 2 ranks has root 2, not a rank "
                                       "of the group");
    // The same calls of the right shape run.
    EXPECT_EQ(refusal(call(Collective::kReduceScatter, 12, out.data(), 6, DType::kF32)),
              "accepted");
    EXPECT_EQ(out[0], 2.0f);
    EXPECT_EQ(refusal(call(Collective::kAllGather, 12, out.data(), 24, DType::kF32)), "accepted");
  });
}

// reduce_scatter leaves its input as it was, unless the caller says it needs it no more
// (input_is_scratch): then ring reduces in it instead of in a copy of it (the trainer's
// sharded stages spare a bucket-sized scratch buffer so), and the output is the same.
TEST(Schedulers, RingReducesScatterInTheInputOnlyWhenItIsScratch) {
  runLoopback(3, [](std::shared_ptr<Backend> backend) {
    Communicator comm(backend, "loopback", Topology::singleNode(3));
    comm.addRule("ring", loadScheduler("ring"));
    const int r = backend->rank();
    for (const bool scratch : {false, true}) {
      std::vector<float> input(12), output(4, -1.0f);
      for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(10 * r + i);
      const std::vector<float> before = input;
      CollectiveArgs args;
      args.coll = Collective::kReduceScatter;
      args.data.data = input.data();
      args.data.count = input.size();
      args.output.data = output.data();
      args.output.count = output.size();
      args.input_is_scratch = scratch;
      comm.run(args);
      for (size_t i = 0; i < output.size(); ++i) {
        // Every rank's element 4r + i: 10 x (0 + 1 + 2) + 3 x (4r + i).
        EXPECT_EQ(output[i], static_cast<float>(30 + 3 * (4 * r + i))) << "scratch " << scratch;
      }
      if (scratch) {
        EXPECT_NE(input, before) << "ring copied an input the caller gave it as scratch";
      } else {
        EXPECT_EQ(input, before) << "ring changed an input the caller still needs";
      }
    }
  });
}

TEST(Schedulers, DeadPeerMidCollectiveIsANamedErrorNotAHang) {
  EXPECT_TRUE(testing::failsWithin(
      std::chrono::seconds(10), 2,
      [](std::shared_ptr<Backend> backend) {
        if (backend->rank() == 1) return;  // never joins the all-reduce
        Communicator comm(backend, "loopback", Topology::singleNode(2));
        comm.addRule("ring", loadScheduler("ring"));
        std::vector<float> v(300, 1.0f);
        CollectiveArgs args;
        args.data = testing::hostView(v);
        comm.run(args);
      },
      "500ms",
      {"allreduce seq 1", "scheduler ring", "receive from rank 1", "timed out after 500 ms"}));
}

}  // namespace
}  // namespace collie
