// The process backends (gloo, ucx) as real processes, forks of this test joined through the
// store: zero-byte messages and barriers that synchronise, the desync check; for ucx, sub-group ids
// that never collide and a worker used from two threads at once.
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "collie/error.h"
#include "desync.h"
#include "forked_job.h"
#include "host_view.h"
#include "loopback_job.h"
#include "runtime/control.h"
#include "runtime/job.h"
#include "runtime/launcher.h"
#include "soak.h"

namespace collie {
namespace {

using namespace std::chrono_literals;
using testing::runJob;
using testing::runJobWith;

Buffer view(int32_t* data, size_t count) { return testing::hostView(data, count); }

class ProcessBackends : public ::testing::TestWithParam<std::string> {};

// How long rank 0 waits for rank 1, which sleeps 300 ms first, in `meet` (a zero-byte
// receive, a barrier): never less than the sleep, or the wait synchronised nothing.
bool waitsForTheLateRank(Backend& b, const std::function<void(Backend&)>& meet, const char* what) {
  if (b.rank() == 1) std::this_thread::sleep_for(300ms);
  const auto start = std::chrono::steady_clock::now();
  meet(b);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (b.rank() == 0 && waited < 0.25) {
    std::fprintf(stderr, "rank 0: %s returned after %.3f s, before rank 1 arrived (0.3 s)\n", what,
                 waited);
    return false;
  }
  return true;
}

TEST_P(ProcessBackends, AZeroByteMessageIsReallySent) {
  auto codes = runJob(GetParam(), [](Backend& b) {
    const Tag tag = makeTag(1, 1, 0);
    return waitsForTheLateRank(
        b,
        [&](Backend& g) {
          int32_t nothing = 0;
          if (g.rank() == 0) {
            g.recv(1, view(&nothing, 0), tag);
          } else {
            g.send(0, view(&nothing, 0), tag);
          }
        },
        "a zero-byte receive");
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_P(ProcessBackends, ZeroByteMessagesKeepTheirOrder) {
  // Between two messages of one tag, a zero-byte one takes its place in the order.
  auto codes = runJob(GetParam(), [](Backend& b) {
    const Tag tag = makeTag(1, 1, 0);
    int32_t first = 1, empty = 0, last = 3;
    if (b.rank() == 1) {
      b.send(0, view(&first, 1), tag);
      b.send(0, view(&empty, 0), tag);
      b.send(0, view(&last, 1), tag);
      return true;
    }
    int32_t a = 0, c = 0;
    b.recv(1, view(&a, 1), tag);
    b.recv(1, view(&empty, 0), tag);
    b.recv(1, view(&c, 1), tag);
    return a == 1 && c == 3;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Messages received in another order than they were sent, and more of them in flight than
// any backend keeps posted ahead (gloo's eager path keeps 4 per peer): each arrives whole in
// its own receive.
TEST_P(ProcessBackends, MessagesReceivedOutOfOrderEachArriveWhole) {
  auto codes = runJob(GetParam(), [](Backend& b) {
    constexpr int kMessages = 12;
    std::vector<std::vector<int32_t>> data(kMessages);
    std::vector<std::unique_ptr<Request>> requests;
    for (int i = 0; i < kMessages; ++i) {
      data[i].assign(static_cast<size_t>(1 + 37 * i), b.rank() == 1 ? 1000 * i : -1);
      const Tag tag = makeTag(1, 1, static_cast<uint32_t>(i));
      if (b.rank() == 1) {
        requests.push_back(b.isend(0, view(data[i].data(), data[i].size()), tag));
      }
    }
    if (b.rank() == 0) {
      for (int i = kMessages - 1; i >= 0; --i) {
        b.recv(1, view(data[i].data(), data[i].size()), makeTag(1, 1, static_cast<uint32_t>(i)));
      }
    }
    waitAll(requests, b.timeout());
    for (int i = 0; b.rank() == 0 && i < kMessages; ++i) {
      for (int32_t v : data[i]) {
        if (v != 1000 * i) {
          std::fprintf(stderr, "rank 0: message %d holds %d\n", i, v);
          return false;
        }
      }
    }
    return true;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// One tag, a small message, a large one (above gloo's eager threshold) and a small one: in
// that order, with their contents.
TEST_P(ProcessBackends, SmallAndLargeMessagesOfOneTagKeepTheirOrder) {
  auto codes = runJob(GetParam(), [](Backend& b) {
    const Tag tag = makeTag(2, 1, 0);
    std::vector<int32_t> small1(3, 1), large(256 * 1024, 2), small2(3, 3);
    if (b.rank() == 1) {
      std::vector<std::unique_ptr<Request>> sends;
      sends.push_back(b.isend(0, view(small1.data(), small1.size()), tag));
      sends.push_back(b.isend(0, view(large.data(), large.size()), tag));
      sends.push_back(b.isend(0, view(small2.data(), small2.size()), tag));
      waitAll(sends, b.timeout());
      return true;
    }
    std::fill(small1.begin(), small1.end(), 0);
    std::fill(large.begin(), large.end(), 0);
    std::fill(small2.begin(), small2.end(), 0);
    std::vector<std::unique_ptr<Request>> recvs;
    recvs.push_back(b.irecv(1, view(small1.data(), small1.size()), tag));
    recvs.push_back(b.irecv(1, view(large.data(), large.size()), tag));
    recvs.push_back(b.irecv(1, view(small2.data(), small2.size()), tag));
    // Waited last first: the first small message arrives before anyone waits for it.
    recvs[2]->wait(b.timeout());
    recvs[1]->wait(b.timeout());
    recvs[0]->wait(b.timeout());
    auto all = [](const std::vector<int32_t>& v, int32_t x) {
      return std::all_of(v.begin(), v.end(), [&](int32_t e) { return e == x; });
    };
    return all(small1, 1) && all(large, 2) && all(small2, 3);
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Two threads of rank 0 receive from rank 1 at once. Rank 1 sends thread B's message, then
// waits for B's answer before it sends thread A's: whichever thread waits in the transport
// must hand B its message, or neither finishes.
TEST_P(ProcessBackends, TwoThreadsReceivingFromOnePeerEachGetTheirMessage) {
  auto codes = runJob(GetParam(), [](Backend& b) {
    const Tag for_a = makeTag(3, 1, 0), for_b = makeTag(3, 1, 1), answer = makeTag(3, 1, 2);
    if (b.rank() == 1) {
      int32_t to_b = 22, got = 0, to_a = 11;
      b.send(0, view(&to_b, 1), for_b);
      b.recv(0, view(&got, 1), answer);
      b.send(0, view(&to_a, 1), for_a);
      return got == 23;
    }
    int32_t a = 0, bvalue = 0;
    std::string failure;
    std::thread thread_a([&] {
      try {
        b.recv(1, view(&a, 1), for_a);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    });
    std::this_thread::sleep_for(50ms);  // thread A is waiting first
    b.recv(1, view(&bvalue, 1), for_b);
    int32_t reply = bvalue + 1;
    b.send(1, view(&reply, 1), answer);
    thread_a.join();
    if (!failure.empty()) std::fprintf(stderr, "rank 0, thread A: %s\n", failure.c_str());
    return failure.empty() && a == 11 && bvalue == 22;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// A receive of another size than the message sent is an error naming the transfer, on the
// receiving rank, and not a corruption.
TEST_P(ProcessBackends, ASizeMismatchIsAnError) {
  auto codes = runJobWith(GetParam(), [](ProcessJob& job, const config::PluginRef& ref) {
    WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
    Backend& b = *w.backend;
    const Tag tag = makeTag(4, 1, 0);
    std::vector<int32_t> data(2, 7);
    bool refused = true;
    if (b.rank() == 1) {
      auto send = b.isend(0, view(data.data(), 2), tag);
      try {
        send->wait(b.timeout());
      } catch (const CommError&) {
        // the receiver's transport may refuse the message at the sender too
      }
    } else {
      refused = false;
      try {
        b.recv(1, view(data.data(), 1), tag);
        std::fprintf(stderr, "rank 0: a 4-byte receive took an 8-byte message\n");
      } catch (const CommError& e) {
        refused = std::string(e.what()).find("rank 1") != std::string::npos;
        if (!refused)
          std::fprintf(stderr, "rank 0: the error does not name rank 1: %s\n", e.what());
      }
    }
    job.allGather("mismatch-done", "");  // neither rank closes its side first
    return refused;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_P(ProcessBackends, TheControlPlaneBarrierWaitsForEveryRank) {
  auto codes = runJob(GetParam(), [](Backend& b) {
    Control control(b);
    return waitsForTheLateRank(
        b, [&](Backend&) { control.barrier(); }, "Control::barrier");
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_P(ProcessBackends, SchedulerBarriersWaitForEveryRank) {
  // The barrier collective of tree and halving_doubling is made of zero-byte messages.
  for (const char* scheduler : {"tree", "halving_doubling"}) {
    auto codes = runJob(GetParam(), [&](Backend& b) {
      auto barrier = testing::loadScheduler(scheduler);
      const Topology topology = Topology::singleNode(b.size());
      CollectiveArgs args;
      args.coll = Collective::kBarrier;
      args.seq = 1;
      return waitsForTheLateRank(
          b, [&](Backend& g) { barrier->run(args, g, topology); }, scheduler);
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0})) << scheduler;
  }
}

TEST_P(ProcessBackends, DesynchronisedCollectivesFailEveryRankNamingWhatDiffers) {
  auto codes = runJob(GetParam(), [](Backend& b) {
    return testing::desyncIsNamedOnEveryRank(std::shared_ptr<Backend>(&b, [](Backend*) {}));
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_P(ProcessBackends, TwentyThousandMixedCollectivesKeepMemoryFdsAndThreadsFlat) {
  const std::string name = GetParam();
  auto codes = runJob(name, [&](Backend& b) {
    std::vector<testing::Usage> usage;
    const bool right = testing::soak(std::shared_ptr<Backend>(&b, [](Backend*) {}), 20000, &usage);
    return testing::flat(usage, name + " rank " + std::to_string(b.rank())) && right;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// The error of a receive from a peer that died is still an intact exception after the backend
// is destroyed and its plugin unloaded: the framework rethrows and destroys such errors long
// after the rank's backend is gone (a failed run explains itself once its backend is closed).
// An exception whose destructor lives in the plugin would crash here.
TEST_P(ProcessBackends, AnErrorFromADeadPeerOutlivesTheBackendAndItsPlugin) {
  auto codes = runJobWith(GetParam(), [](ProcessJob& job, const config::PluginRef& given) {
    config::PluginRef ref = given;
    ref.params.set("timeout", "3s", "test");  // UCX may learn of the death only by timing out
    WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
    int32_t value = 0;
    if (job.rank() == 1) {
      job.allGather("connected", "");
      w.backend.reset();  // closes every connection of rank 1 at once; its job goes on
      return true;
    }
    job.allGather("connected", "");
    std::exception_ptr error;
    try {
      // Small: below either backend's eager threshold, the path a control message takes.
      w.backend->recv(1, view(&value, 1), makeTag(4, 2, 0));
      std::fprintf(stderr, "rank 0: a receive from a dead rank completed\n");
      return false;
    } catch (const CommError&) {
      error = std::current_exception();
    }
    w.backend.reset();  // the last object of the plugin: its library is closed
    const std::string library =
        std::string(COLLIE_TEST_PLUGIN_DIR) + "/libcollie_backend_" + given.plugin + ".so";
    if (void* still = ::dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      ::dlclose(still);  // the test would prove nothing with the library still mapped
      std::fprintf(stderr, "rank 0: %s is still loaded after its backend\n", library.c_str());
      return false;
    }
    try {
      std::rethrow_exception(error);
    } catch (const CommError& e) {
      const std::string what = e.what();
      if (what.find("rank 1") == std::string::npos) {
        std::fprintf(stderr, "rank 0: the error does not name rank 1: %s\n", what.c_str());
        return false;
      }
    }
    error = nullptr;  // destroys the exception
    return true;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// An abort from another thread at any moment of a receive's life (before it is posted, while
// it is posted but not yet registered for abort, while it waits) ends its wait at once, never
// after the backend's timeout. The abort comes after a random delay of up to a post's length,
// so that over the cycles it falls in every part of the post.
TEST_P(ProcessBackends, AnAbortAtAnyMomentOfAReceiveEndsItsWaitAtOnce) {
  auto codes = runJobWith(GetParam(), [](ProcessJob& job, const config::PluginRef& ref) {
    std::mt19937 random(7);
    std::vector<int32_t> data(1 << 18);  // 1 MiB: past the eager threshold, a posted receive
    int slow = 0;
    for (int cycle = 0; cycle < 200; ++cycle) {
      const std::string prefix = "abort" + std::to_string(cycle) + "/";
      WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, prefix, 20s);
      if (job.rank() == 0) {
        double waited = 0;
        std::thread receiver([&] {
          const auto start = std::chrono::steady_clock::now();
          try {
            auto request = w.backend->irecv(1, view(data.data(), data.size()), makeTag(4, 3, 0));
            request->wait(w.backend->timeout());
          } catch (const CommError&) {
          }
          waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        });
        const auto spin =
            std::chrono::steady_clock::now() +
            std::chrono::microseconds(std::uniform_int_distribution<>(0, 150)(random));
        while (std::chrono::steady_clock::now() < spin) {
        }
        w.backend->abort("the cycle is over");
        receiver.join();
        if (waited > 2.0) ++slow;
      }
      job.allGather(prefix + "done", "");  // rank 1 keeps its side open until rank 0 is done
    }
    if (slow > 0) {
      std::fprintf(stderr, "rank 0: %d of 200 aborted receives waited out the timeout\n", slow);
    }
    return slow == 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// A backend made, used, aborted and destroyed a thousand times in one process: after the
// tenth cycle and after the last, the same descriptors, sockets and threads.
TEST_P(ProcessBackends, AThousandCreateUseAbortDestroyCyclesLeaveNothingBehind) {
  const std::string name = GetParam();
  auto codes = runJobWith(name, [&](ProcessJob& job, const config::PluginRef& ref) {
    std::vector<testing::Usage> usage;
    for (int cycle = 1; cycle <= 1000; ++cycle) {
      WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref,
                                   "cycle" + std::to_string(cycle) + "/", 20s);
      int32_t value = job.rank() + 1;
      {
        // The communicator shares the backend: it goes first, so that reset() below closes it.
        Communicator comm(w.backend, name, Topology::singleNode(2));
        comm.addRule("ring", testing::loadScheduler("ring"));
        CollectiveArgs args;
        args.data = view(&value, 1);
        comm.run(args);
      }
      if (value != 3) {
        std::fprintf(stderr, "rank %d: cycle %d summed to %d\n", job.rank(), cycle, value);
        return false;
      }
      w.backend->abort("the cycle is over");
      if (cycle == 10 || cycle == 1000) {
        w.backend.reset();
        // Both ranks have closed their backend before either counts: a socket the peer is
        // still tearing down is not this rank's leak.
        job.allGather("cycle" + std::to_string(cycle) + "/closed", "");
        usage.push_back(testing::usageNow());
        // Nor has either left (closing its store connection) before both counted.
        job.allGather("cycle" + std::to_string(cycle) + "/counted", "");
      }
    }
    // Memory is not compared: rank 0's store keeps every cycle's keys (about 2 KB each).
    return testing::flat(usage, name + " rank " + std::to_string(job.rank()), "cycle 10",
                         "cycle 1000", false);
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Gloo's native all-reduce holds its byte count in an int: an all-reduce of more than 2 GiB is
// refused with the reason (the scheduler then runs it), on a one-rank group too, whose
// all-reduce would touch nothing. The data is never read, so none is allocated.
TEST(GlooBackend, ANativeAllReducePastTwoGiBIsRefused) {
  auto codes = runJob(
      "gloo",
      [](Backend& b) {
        CollectiveArgs args;
        args.coll = Collective::kAllReduce;
        args.op = ReduceOp::kSum;
        static float never_read;
        args.data.data = &never_read;
        args.data.dtype = DType::kF32;
        args.data.count = (size_t{1} << 29);  // exactly 2 GiB: one byte past an int
        const Decision past = b.runNative(args);
        if (past.accepted || past.reason.find("count bytes in an int") == std::string::npos) {
          std::fprintf(stderr, "2 GiB: accepted=%d reason=%s\n", past.accepted,
                       past.reason.c_str());
          return false;
        }
        args.data.count = (size_t{1} << 29) - 1;  // fits: a one-rank group runs it at once
        const Decision within = b.runNative(args);
        if (!within.accepted) std::fprintf(stderr, "2 GiB - 4: %s\n", within.reason.c_str());
        return within.accepted;
      },
      1);
  EXPECT_EQ(codes, (std::vector<int>{0}));
}

// The scheduling policy of every thread of this process, by thread id.
std::map<int, int> threadPolicies() {
  std::map<int, int> policies;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return policies;
  while (dirent* entry = ::readdir(dir)) {
    const int tid = std::atoi(entry->d_name);
    if (tid > 0) policies[tid] = ::sched_getscheduler(tid);
  }
  ::closedir(dir);
  return policies;
}

// Gloo's event-loop thread runs under SCHED_BATCH (params.loop_thread, backends/gloo/README.md)
// and the thread that made the backend keeps its own policy; with loop_thread: normal no
// thread changes.
TEST(GlooBackend, ItsEventLoopThreadRunsUnderSchedBatch) {
  for (const std::string mode : {"batch", "normal"}) {
    auto codes = runJobWith("gloo", [&](ProcessJob& job, const config::PluginRef& plugin) {
      config::PluginRef ref = plugin;
      ref.params.set("loop_thread", mode, "test");
      const auto before = threadPolicies();
      WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
      int batch = 0, others = 0;
      for (const auto& [tid, policy] : threadPolicies()) {
        if (policy == SCHED_BATCH) ++batch;
        if (before.count(tid) && before.at(tid) != policy) ++others;
      }
      const int expected = mode == "batch" ? 1 : 0;
      // Both ranks connected before either leaves (a rank that exits first closes its side).
      Control(*w.backend).barrier();
      if (batch != expected || others != 0 || ::sched_getscheduler(0) != SCHED_OTHER) {
        std::fprintf(stderr,
                     "rank %d, loop_thread %s: %d thread(s) under SCHED_BATCH (expected %d), "
                     "%d earlier thread(s) changed, this thread's policy %d\n",
                     job.rank(), mode.c_str(), batch, expected, others, ::sched_getscheduler(0));
        return false;
      }
      return true;
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0})) << mode;
  }
}

// Over gloo a message up to params.eager_threshold is sent ahead into receives posted in
// advance: after one message has opened the way, 4 sends complete before their receives
// are posted. With eager_threshold 0 every send waits for its receive (Gloo's rendezvous).
TEST(GlooBackend, SmallSendsCompleteBeforeTheirReceivesArePosted) {
  for (const std::string threshold : {"64KiB", "0"}) {
    auto codes = runJobWith("gloo", [&](ProcessJob& job, const config::PluginRef& plugin) {
      config::PluginRef ref = plugin;
      ref.params.set("eager_threshold", threshold, "test");
      ref.params.set("timeout", "2s", "test");
      WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
      Backend& b = *w.backend;
      int32_t first = 1;
      if (b.rank() == 0) b.recv(1, view(&first, 1), makeTag(1, 1, 0));
      if (b.rank() == 1) b.send(0, view(&first, 1), makeTag(1, 1, 0));
      std::vector<int32_t> values{10, 11, 12, 13};
      bool completed = true;
      if (b.rank() == 1) {
        std::vector<std::unique_ptr<Request>> sends;
        for (int i = 0; i < 4; ++i)
          sends.push_back(b.isend(0, view(&values[i], 1), makeTag(2, 1, static_cast<uint32_t>(i))));
        try {
          waitAll(sends, 1s);
        } catch (const CommError&) {
          completed = false;
        }
      }
      // Rank 0 posts its receives only once rank 1's sends completed or gave up.
      job.allGather("sends-done", "");
      if (b.rank() == 0 && threshold != "0") {
        std::vector<int32_t> got(4, 0);
        for (int i = 0; i < 4; ++i)
          b.recv(1, view(&got[i], 1), makeTag(2, 1, static_cast<uint32_t>(i)));
        if (got != values) {
          std::fprintf(stderr, "rank 0: received %d %d %d %d\n", got[0], got[1], got[2], got[3]);
          return false;
        }
      }
      const bool expected = threshold != "0";
      if (b.rank() == 1 && completed != expected) {
        std::fprintf(stderr, "rank %d, eager_threshold %s: the sends %s before their receives\n",
                     job.rank(), threshold.c_str(), completed ? "completed" : "did not complete");
        return false;
      }
      return true;
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0})) << threshold;
  }
}

// A peer killed while its message is half way across: the wait on that message (a receive
// from it, a send to it) fails naming the peer within seconds, never after the backend's
// timeout. Gloo fails the buffers queued on a pair that closes, but not the one whose bytes
// are moving; the backend's watch of its pairs ends that wait. The kill comes 20 ms into a
// 512 MiB message; a try where the message was not moving then (it had arrived whole, or
// had not begun) is tried again.
TEST(GlooBackend, APeerKilledMidMessageFailsTheWaitLongBeforeTheTimeout) {
  for (const bool sending : {false, true}) {
    const std::string verdict =
        ::testing::TempDir() + "/gloo-mid-" + std::to_string(::getpid()) + (sending ? "s" : "r");
    bool checked = false;
    for (int attempt = 0; attempt < 5 && !checked; ++attempt) {
      std::remove(verdict.c_str());
      auto codes = runJobWith("gloo", [&](ProcessJob& job, const config::PluginRef& plugin) {
        config::PluginRef ref = plugin;
        ref.params.set("timeout", "60s", "test");
        WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
        Backend& b = *w.backend;
        constexpr size_t kCount = size_t{128} << 20;  // 512 MiB
        std::vector<int32_t> data(kCount, b.rank() == 0 ? -1 : 0x11111111);
        const Tag tag = makeTag(3, 1, 0);
        // Rank 0 sends (`sending`) or receives; rank 1 does the other and is killed.
        auto request = (b.rank() == 0) == sending
                           ? b.isend(1 - b.rank(), view(data.data(), kCount), tag)
                           : b.irecv(1 - b.rank(), view(data.data(), kCount), tag);
        job.allGather("posted", "");
        if (b.rank() == 1) {
          std::this_thread::sleep_for(20ms);
          ::raise(SIGKILL);
        }
        const auto start = std::chrono::steady_clock::now();
        std::string error;
        try {
          request->wait(b.timeout());
        } catch (const CommError& e) {
          error = e.what();
        }
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const auto arrived = std::count(data.begin(), data.end(), 0x11111111);
        // Moving at the kill: a receive that got part of the message; a send that Gloo did not
        // fail at once itself (it fails a send still queued on the pair when the pair closes).
        const bool moving =
            sending ? waited >= 0.5 : arrived > 0 && arrived < static_cast<long>(kCount);
        bool good = true;
        if (!error.empty() && moving) {
          std::ofstream(verdict) << "checked\n";
          if (waited > 10 || error.find("rank 1") == std::string::npos) {
            std::fprintf(stderr, "rank 0 (%s): the wait failed after %.1f s: %s\n",
                         sending ? "sending" : "receiving", waited, error.c_str());
            good = false;
          }
        }
        // Rank 1 is dead: the job's goodbye on the store would wait for it until its timeout.
        std::fflush(nullptr);
        _exit(good ? 0 : 1);
        return good;
      });
      EXPECT_EQ(codes, (std::vector<int>{0, 128 + SIGKILL})) << (sending ? "send" : "receive");
      checked = static_cast<bool>(std::ifstream(verdict));
      std::remove(verdict.c_str());
    }
    EXPECT_TRUE(checked) << "in 5 tries no kill fell while the " << (sending ? "send" : "receive")
                         << " was moving";
  }
}

// Gloo's native all-reduce keeps the algorithm objects it built, and building one takes slots
// from the group's counter: the object that serves a call must be the same on every rank. A
// buffer's address is not: here rank 0 all-reduces one buffer twice while rank 1 uses another
// buffer of the same size the second time. Every all-reduce must still meet and sum right.
TEST(GlooBackend, NativeAllReducesMeetWhereverEachRankKeepsItsBuffers) {
  auto codes = runJobWith("gloo", [](ProcessJob& job, const config::PluginRef& plugin) {
    config::PluginRef ref = plugin;
    ref.params.set("timeout", "3s", "test");
    WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
    Backend& b = *w.backend;
    std::vector<float> first(4096), second(4096);
    auto allReduce = [&](std::vector<float>& data, float value) {
      std::fill(data.begin(), data.end(), value * static_cast<float>(b.rank() + 1));
      CollectiveArgs args;
      args.coll = Collective::kAllReduce;
      args.op = ReduceOp::kSum;
      args.data.data = data.data();
      args.data.count = data.size();
      args.data.dtype = DType::kF32;
      if (!b.runNative(args).accepted) return false;
      return std::all_of(data.begin(), data.end(), [&](float v) { return v == value * 3; });
    };
    bool right = false;
    try {
      right = allReduce(first, 1) && allReduce(b.rank() == 0 ? first : second, 2) &&
              allReduce(first, 4);
      if (!right) std::fprintf(stderr, "rank %d: a wrong sum\n", b.rank());
    } catch (const CommError& e) {
      std::fprintf(stderr, "rank %d: %s\n", b.rank(), e.what());
    }
    job.allGather("done", "");  // neither rank closes its side first
    return right;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

INSTANTIATE_TEST_SUITE_P(Backends, ProcessBackends, ::testing::Values("gloo", "ucx"),
                         [](const auto& info) { return info.param; });

TEST(Ucx, SubGroupIdsNeverCollide) {
  // Eight splits of the world, then a split of the first of them: the nested group and the
  // eighth sibling have the same members; a message of one must never match in the other
  // (their ids once came from (parent * 7 + k) & 0xFF: 1 * 7 + 1 == 8).
  auto codes = runJob("ucx", [](Backend& world) {
    std::vector<std::unique_ptr<Backend>> siblings;
    for (int i = 0; i < 8; ++i) siblings.push_back(world.split({0, 1}));
    std::unique_ptr<Backend> nested = siblings[0]->split({0, 1});
    const Tag tag = makeTag(1, 1, 0);
    if (world.rank() == 0) {
      int32_t in_nested = 0, in_sibling = 0;
      auto a = nested->irecv(1, view(&in_nested, 1), tag);
      auto b = siblings[7]->irecv(1, view(&in_sibling, 1), tag);
      a->wait(10s);
      b->wait(10s);
      if (in_nested != 1 || in_sibling != 8) {
        std::fprintf(stderr, "rank 0: nested group got %d (expected 1), sibling 8 got %d\n",
                     in_nested, in_sibling);
        return false;
      }
    } else {
      int32_t eight = 8, one = 1;
      siblings[7]->send(0, view(&eight, 1), tag);  // first: it must not reach `nested`
      nested->send(0, view(&one, 1), tag);
    }
    return true;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Ucx, TwoThreadsUseOneWorkerAtOnce) {
  // The trainer's communication thread and its main thread share the worker: two threads
  // ping-pong on two sub-groups at the same time.
  auto codes = runJob("ucx", [](Backend& world) {
    std::unique_ptr<Backend> groups[2] = {world.split({0, 1}), world.split({0, 1})};
    std::atomic<bool> ok{true};
    auto pingPong = [&](Backend& g) {
      try {
        const int peer = 1 - g.rank();
        for (uint64_t i = 1; i <= 2000; ++i) {
          int32_t out = static_cast<int32_t>(i * 2 + g.rank()), in = -1;
          auto recv = g.irecv(peer, view(&in, 1), makeTag(i, 1, 0));
          g.send(peer, view(&out, 1), makeTag(i, 1, 0));
          recv->wait(10s);
          if (in != static_cast<int32_t>(i * 2 + peer)) ok = false;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", g.rank(), e.what());
        ok = false;
      }
    };
    std::thread other(pingPong, std::ref(*groups[1]));
    pingPong(*groups[0]);
    other.join();
    return ok.load();
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// A receive whose message is under way when it fails (it times out while the sender has
// stopped mid-message) cannot be cancelled: UCX writes the rest of the message into its buffer
// whenever the worker is progressed again, after the caller has freed or reused the buffer.
// Once its receive has failed, the buffer is never written again, whatever the backend does next.
TEST(Ucx, AReceiveThatFailedMidMessageIsNeverWrittenAfterwards) {
  // The case needs a receive that times out mid-message; when the transport moved the whole
  // message without the sender (it pulls some of them itself), it is tried again.
  const std::string whole = ::testing::TempDir() + "/ucx-whole-" + std::to_string(::getpid());
  constexpr int kTries = 5;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    std::remove(whole.c_str());
    auto codes = runJobWith("ucx", [&whole](ProcessJob& job, const config::PluginRef& plugin) {
      config::PluginRef ref = plugin;
      // Shared memory, eager fragments: the receive matches the first fragment, and the rest
      // comes in whenever the receiver progresses its worker.
      ref.params.set("transports", "posix", "test");
      ref.params.set("rendezvous_threshold", "never", "test");
      ref.params.set("timeout", "3s", "test");
      WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "test/", 20s);
      Backend& b = *w.backend;
      constexpr size_t kCount = size_t{16} << 20;  // 64 MiB
      std::vector<int32_t> data(kCount, b.rank() == 1 ? 0x11111111 : 0);
      const Tag tag = makeTag(5, 1, 0);
      if (b.rank() == 1) {
        job.allGather("posted", "");
        auto send = b.isend(0, view(data.data(), kCount), tag);
        // A few rounds of progress move the first fragments only (64 MiB took 20 ms of them
        // on a quiet machine: a time bound let the whole message through).
        for (int i = 0; i < 8 && !send->test(); ++i) {
        }
        std::this_thread::sleep_for(3s);  // stopped mid-message; resumes after rank 0 gave up
        try {
          send->wait(b.timeout());
        } catch (const CommError&) {
          // rank 0 no longer takes it
        }
        job.allGather("done", "");
        return true;
      }
      auto recv = b.irecv(1, view(data.data(), kCount), tag);
      job.allGather("posted", "");
      try {
        recv->wait(300ms);
        std::ofstream(whole) << "the message arrived whole before the timeout\n";
        job.allGather("done", "");
        return true;
      } catch (const CommError&) {
      }
      recv.reset();
      std::fill(data.begin(), data.end(), -1);  // the caller's memory again: reused
      // The backend goes on: another receive (which progresses the worker) while rank 1
      // resumes, then the backend is closed (closing progresses it too).
      const auto start = std::chrono::steady_clock::now();
      int32_t other = 0;
      try {
        b.recv(1, view(&other, 1), makeTag(5, 2, 0));
      } catch (const CommError&) {
      }
      std::this_thread::sleep_until(start + 4s);
      w.backend.reset();
      const auto written =
          std::count_if(data.begin(), data.end(), [](int32_t v) { return v != -1; });
      job.allGather("done", "");
      if (written != 0) {
        std::fprintf(stderr,
                     "rank 0: %zu values written into the buffer after its receive failed\n",
                     static_cast<size_t>(written));
      }
      return written == 0;
    });
    if (std::ifstream(whole)) continue;  // no receive failed mid-message: nothing was checked
    EXPECT_EQ(codes, (std::vector<int>{0, 0}));
    return;
  }
  GTEST_SKIP() << "in " << kTries << " tries the 64 MiB message arrived whole within the "
               << "receive's 300 ms: no receive failed mid-message to check";
}

}  // namespace
}  // namespace collie
