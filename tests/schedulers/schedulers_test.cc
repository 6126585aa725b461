// Scheduler behaviour beyond the conformance matrix: refusals, how the Communicator reports
// them, and a dead peer in the middle of a collective.
#include <gtest/gtest.h>

#include "collie/error.h"
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
      EXPECT_NE(std::string(e.what()).find("tree: allgather is not implemented"), std::string::npos)
          << e.what();
      // The refusal names its plugin; a label equal to it is not said twice.
      EXPECT_EQ(std::string(e.what()).find("tree: tree:"), std::string::npos) << e.what();
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
