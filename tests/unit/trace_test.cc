// The job trace (runtime/trace.h) over real loopback ranks: clock offsets recover a skew
// injected into each rank's clock, the job's file passes the trace-event format's checks
// and joins every collective across ranks, and a peer that sends garbage is refused.
#include "runtime/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "collie/error.h"
#include "expect.h"
#include "loopback_job.h"
#include "run_command.h"
#include "trace_schema.h"

namespace collie {
namespace {

using testing::jobTraceErrors;
using testing::loadScheduler;
using testing::runLoopback;

// Rank r's clock runs skew[r] nanoseconds ahead of the steady clock.
Tracer::Clock skewedClock(int64_t skew) {
  return [skew] { return Tracer::steadyNs() + skew; };
}

TEST(ClockOffsets, RecoverAnInjectedSkewWithinTheirUncertainty) {
  const std::vector<int64_t> skew = {0, 37'000'000, -12'500'000};  // ns
  std::vector<ClockOffset> offsets;
  runLoopback(3, [&](std::shared_ptr<Backend> backend) {
    const Tracer tracer(skewedClock(skew[backend->rank()]));
    Control control(*backend);
    auto got = estimateClockOffsets(*backend, control, tracer);
    if (backend->rank() == 0) offsets = got;
  });
  ASSERT_EQ(offsets.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const double truth = static_cast<double>(skew[r]) / 1e3;
    EXPECT_LE(std::abs(offsets[r].offset_us - truth), offsets[r].uncertainty_us + 1e-3)
        << "rank " << r << ": " << offsets[r].offset_us << " us +- " << offsets[r].uncertainty_us
        << ", injected " << truth;
    EXPECT_LT(offsets[r].uncertainty_us, 5000) << "rank " << r;  // a bound that says something
    EXPECT_DOUBLE_EQ(offsets[r].uncertainty_us, offsets[r].rtt_us / 2);
  }
}

std::string tempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(::getpid()) + ".json"))
      .string();
}

// Three ranks whose clocks are seconds apart run five steps (a forward of rank+1 ms, then a
// ring all-reduce of bucket step % 2), meet at a barrier and mark the moment after it; the
// job's trace puts those marks together again and joins every collective by one flow.
TEST(JobTrace, OneFileForTheJobWithAlignedClocksAndFlows) {
  const std::vector<int64_t> skew = {0, 2'000'000'000, -1'500'000'000};
  const std::string path = tempPath("collie-trace");
  size_t written = 0;
  runLoopback(3, [&](std::shared_ptr<Backend> backend) {
    const int rank = backend->rank();
    Tracer tracer(skewedClock(skew[rank]));
    Control control(*backend);
    Communicator comm(backend, "loopback", Topology::singleNode(3));
    comm.addRule("ring", loadScheduler("ring"));
    comm.setTracer(&tracer);
    std::vector<float> grads(1024, 1.0f);
    for (int step = 1; step <= 5; ++step) {
      tracer.setStep(step);
      {
        const TraceSpan forward(&tracer, "forward", 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(rank + 1));
      }
      const Tracer::BucketScope bucket(step % 2);
      CollectiveArgs args;
      args.data.data = grads.data();
      args.data.count = grads.size();
      comm.run(args);
    }
    control.barrier();
    const int64_t now = tracer.now();
    tracer.span("mark", now, now);
    const size_t n =
        writeJobTrace(tracer, *backend, control, {"trace-test", {"a", "b", "c"}}, path);
    if (rank == 0) written = n;
  });
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const auto trace = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  for (const auto& error : jobTraceErrors(trace, 3)) ADD_FAILURE() << error;

  std::map<int, int> forwards, collectives;
  std::map<int, double> mark;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int pid = e["pid"];
    if (e["name"] == "forward") ++forwards[pid];
    if (e["name"] == "mark") mark[pid] = e["ts"];
    if (e["cat"] == "collective") {
      ++collectives[pid];
      const auto& args = e["args"];
      EXPECT_EQ(args["op"], "allreduce");
      EXPECT_EQ(args["reduce"], "sum");
      EXPECT_EQ(args["scheduler"], "ring");
      EXPECT_EQ(args["bytes"], 4096);
      EXPECT_EQ(args["bucket"], args["step"].get<int>() % 2) << e.dump();
    }
  }
  EXPECT_EQ(written, 3u * (5 + 5 + 1));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(forwards[r], 5) << "rank " << r;
    EXPECT_EQ(collectives[r], 5) << "rank " << r;
    // Seconds apart on the ranks' own clocks, together on rank 0's (scheduling aside).
    EXPECT_LT(std::abs(mark[r] - mark[0]), 200e3) << "rank " << r << " mark at " << mark[r];
  }
  const auto& ranks = trace["otherData"]["ranks"];
  ASSERT_EQ(ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LE(std::abs(ranks[r]["offset_us"].get<double>() - skew[r] / 1e3),
              ranks[r]["uncertainty_us"].get<double>() + 1e-3)
        << ranks[r].dump();
  }
  EXPECT_EQ(trace["traceEvents"][0]["args"]["name"], "rank 0 (a)");
}

// Rank 1 answers the clock probe, then sends a header announcing `bytes` and, when that is
// a few, text that is not a list of events: rank 0's error (it writes nothing).
std::string hostilePeer(const std::string& path, int64_t bytes) {
  std::string error;
  runLoopback(2, [&](std::shared_ptr<Backend> backend) {
    Tracer tracer;
    Control control(*backend);
    if (backend->rank() == 0) {
      try {
        writeJobTrace(tracer, *backend, control, {"garbage", {"a", "b"}}, path);
      } catch (const CommError& e) {
        error = e.what();
      }
      return;
    }
    estimateClockOffsets(*backend, control, tracer);
    const Tag tag = control.nextTag();
    int64_t header[2] = {bytes, 0};
    char text[8] = {'[', '[', '"', 'x', ',', ' ', ' ', ' '};
    Buffer b;
    b.dtype = DType::kI64;
    b.data = header;
    b.count = 2;
    backend->send(0, b, tag);
    if (bytes > 8) return;  // rank 0 stops at the header
    b.data = text;
    b.count = 1;
    backend->send(0, b, tag);
  });
  return error;
}

TEST(JobTrace, APeerThatSendsGarbageIsRefused) {
  const std::string path = tempPath("collie-trace-garbage");
  EXPECT_TRUE(
      testing::contains(hostilePeer(path, 5), {"trace: rank 1 sent events that do not parse"}));
  EXPECT_FALSE(std::filesystem::exists(path));
  const std::string error = hostilePeer(path, int64_t{1} << 50);
  EXPECT_TRUE(
      testing::contains(error, {"trace: rank 1 announced 1125899906842624 bytes of events"}));
  EXPECT_FALSE(std::filesystem::exists(path));
}

// bench.trace on a matrix of 2 and 3 loopback ranks: trace-N.json per point, each a job
// trace of its ranks, with one span per timed loop (scheduler and size) and every collective
// inside them.
TEST(BenchTrace, EveryTimedLoopAndCollectiveOfEachMatrixPoint) {
  const auto out =
      std::filesystem::temp_directory_path() / ("collie-bench-trace-" + std::to_string(::getpid()));
  const std::string config = testing::writeTempFile("bench-trace.yaml", R"(backend: loopback
bench: {schedulers: [ring, tree], min_bytes: 1KiB, max_bytes: 4KiB, iters: 3, warmup_iters: 1,
        repeats: 2, trace: true}
matrix:
  launch.nproc_per_node: [2, 3]
)");
  const auto run = testing::runCollie({"run", config, "--out", out.string()});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int point = 0; point < 2; ++point) {
    const int world = point + 2;
    const auto path = out / ("trace-" + std::to_string(point) + ".json");
    EXPECT_TRUE(testing::contains(run.output, {"trace: " + path.string()}));
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const auto trace = nlohmann::json::parse(in);
    for (const auto& error : jobTraceErrors(trace, world)) ADD_FAILURE() << error;
    std::map<int, int> loops, collectives;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const std::string name = e["name"];
      if (name.rfind("ring ", 0) == 0 || name.rfind("tree ", 0) == 0) ++loops[e["pid"]];
      if (e["cat"] == "collective") ++collectives[e["pid"]];
    }
    for (int r = 0; r < world; ++r) {
      // 3 sizes x 2 schedulers x 2 repeats loops of 3 calls, each after a warm-up call, and
      // one checked call per size and scheduler.
      EXPECT_EQ(loops[r], 3 * 2 * 2) << "rank " << r << " of " << world;
      EXPECT_EQ(collectives[r], 3 * 2 * (2 * (3 + 1) + 1)) << "rank " << r << " of " << world;
    }
  }
  std::filesystem::remove_all(out);
}

TEST(Tracer, KeepsItsCapacityAndCountsTheRest) {
  Tracer tracer({}, 3);
  for (int k = 0; k < 5; ++k) tracer.span("forward", k, k + 1, k);
  EXPECT_EQ(tracer.events().size(), 3u);
  EXPECT_EQ(tracer.dropped(), 2u);
  const auto trace = nlohmann::json::parse(
      chromeTrace({tracer.events()}, {ClockOffset{}}, {"capacity", {"a"}}, {tracer.dropped()}));
  EXPECT_EQ(trace["otherData"]["ranks"][0]["events_dropped"], 2);
  EXPECT_TRUE(testing::traceSchemaErrors(trace).empty());
}

}  // namespace
}  // namespace collie
