// The loopback backend against the backend contract.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <numeric>

#include "collie/error.h"
#include "collie/simulation.h"
#include "desync.h"
#include "expect.h"
#include "host_view.h"
#include "loopback_job.h"
#include "runtime/control.h"
#include "soak.h"

namespace collie {
namespace {

using namespace std::chrono_literals;
using testing::runLoopback;

Buffer view(std::vector<int32_t>& v) { return testing::hostView(v); }

// The control plane's folds over 5 ranks: max and sum element-wise, rank 0's values, and the
// whole table, each the same on every rank.
TEST(Control, MaxSumFromRootAndAllGatherAgreeOnEveryRank) {
  runLoopback(5, [](std::shared_ptr<Backend> b) {
    Control control(*b);
    const double r = b->rank();
    EXPECT_EQ(control.max({r, -r, 7}), (std::vector<double>{4, 0, 7}));
    EXPECT_EQ(control.sum({r, 1}), (std::vector<double>{10, 5}));
    EXPECT_EQ(control.fromRoot({r + 3, r * 2}), (std::vector<double>{3, 0}));
    control.barrier();
    const auto all = control.allGather({r, r * r});
    ASSERT_EQ(all.size(), 5u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(all[i], (std::vector<double>{1.0 * i, 1.0 * i * i}));
    EXPECT_TRUE(control.max({}).empty());
  });
}

TEST(Loopback, MessagesMatchByTagInPostedOrder) {
  runLoopback(2, [](std::shared_ptr<Backend> b) {
    if (b->rank() == 0) {
      std::vector<int32_t> x{1, 2}, y{3, 4}, z{5, 6};
      b->send(1, view(x), 7);
      b->send(1, view(y), 9);
      b->send(1, view(z), 7);
    } else {
      std::vector<int32_t> first(2), second(2), tagged9(2);
      auto r9 = b->irecv(0, view(tagged9), 9);  // posted before its message arrives, maybe
      b->recv(0, view(first), 7);
      b->recv(0, view(second), 7);
      r9->wait(5s);
      EXPECT_EQ(first, (std::vector<int32_t>{1, 2}));
      EXPECT_EQ(second, (std::vector<int32_t>{5, 6}));
      EXPECT_EQ(tagged9, (std::vector<int32_t>{3, 4}));
    }
  });
}

TEST(Loopback, ZeroByteMessagesAndLargeMessages) {
  runLoopback(3, [](std::shared_ptr<Backend> b) {
    std::vector<int32_t> empty;
    std::vector<int32_t> big(1 << 20);
    int next = (b->rank() + 1) % 3, prev = (b->rank() + 2) % 3;
    std::iota(big.begin(), big.end(), b->rank());
    std::vector<int32_t> got(big.size());
    auto r = b->irecv(prev, view(got), 1);
    auto e = b->irecv(prev, view(empty), 2);
    b->send(next, view(big), 1);
    b->send(next, view(empty), 2);
    r->wait(5s);
    e->wait(5s);
    EXPECT_EQ(got[10], prev + 10);
  });
}

TEST(Loopback, ReceiveFromSilentPeerTimesOutNamingPeerAndTag) {
  EXPECT_TRUE(testing::failsWithin(
      5s, 2,
      [](std::shared_ptr<Backend> b) {
        if (b->rank() != 1) return;
        std::vector<int32_t> v(4);
        b->recv(0, view(v), makeTag(12, 1, 3));
      },
      "300ms", {"receive from rank 0", "seq 12, phase 1, step 3", "timed out after 300 ms"}));
}

TEST(Loopback, SizeMismatchIsAnErrorNotACorruption) {
  EXPECT_THROW(runLoopback(2,
                           [](std::shared_ptr<Backend> b) {
                             std::vector<int32_t> v(b->rank() == 0 ? 4 : 3);
                             if (b->rank() == 0)
                               b->send(1, view(v), 1);
                             else
                               b->recv(0, view(v), 1);
                           }),
               CommError);
}

TEST(Loopback, AbortUnblocksAPendingReceive) {
  std::atomic<bool> aborted{false};
  try {
    runLoopback(
        2,
        [&](std::shared_ptr<Backend> b) {
          if (b->rank() == 0) throw CommError("rank 0 gives up");  // the runner aborts rank 1
          std::vector<int32_t> v(1);
          try {
            b->recv(0, view(v), 1);
          } catch (const CommError& e) {
            aborted = std::string(e.what()).find("aborted") != std::string::npos;
            throw;
          }
        },
        "60s");
  } catch (const CommError& e) {
    EXPECT_TRUE(testing::contains(std::string(e.what()), {"rank 0 gives up"}));
  }
  EXPECT_TRUE(aborted);
}

TEST(Loopback, ADroppedReceiveGivesItsBufferBack) {
  // A collective that unwinds drops its requests unwaited and frees their buffers; a message
  // that arrives later must go to the next receive posted, never into the freed buffer.
  runLoopback(
      2,
      [](std::shared_ptr<Backend> b) {
        std::vector<int32_t> token{0};
        if (b->rank() == 0) {
          {
            auto stale = std::make_unique<std::vector<int32_t>>(4, -1);
            auto dropped = b->irecv(1, view(*stale), 5);
          }                            // request, then buffer, gone
          b->send(1, view(token), 6);  // now rank 1 sends on tag 5
          std::vector<int32_t> fresh(4, -1);
          b->recv(1, view(fresh), 5);
          EXPECT_EQ(fresh, (std::vector<int32_t>{1, 2, 3, 4}));
        } else {
          b->recv(0, view(token), 6);
          std::vector<int32_t> data{1, 2, 3, 4};
          b->send(0, view(data), 5);
        }
      },
      "2s");
}

TEST(Loopback, ADroppedSendIsNotDeliveredLater) {
  runLoopback(
      2,
      [](std::shared_ptr<Backend> b) {
        std::vector<int32_t> token{0};
        if (b->rank() == 0) {
          {
            std::vector<int32_t> gone{9, 9};
            auto dropped = b->isend(1, view(gone), 5);  // no receive posted yet: it waits
          }
          std::vector<int32_t> real{7, 8};
          auto send = b->isend(1, view(real), 5);
          b->send(1, view(token), 6);
          send->wait(2s);
        } else {
          b->recv(0, view(token), 6);
          std::vector<int32_t> got(2, -1);
          b->recv(0, view(got), 5);
          EXPECT_EQ(got, (std::vector<int32_t>{7, 8}));
        }
      },
      "2s");
}

// Resident memory of this process, in bytes.
size_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(Loopback, MailboxesDoNotGrowWithTheNumberOfMessages) {
  // Every collective has tags of its own (its sequence number): 40,000 of them once left as
  // many empty queues in the mailboxes (~6 KB per collective measured on a ring).
  std::vector<size_t> rss;
  runLoopback(2, [&](std::shared_ptr<Backend> b) {
    std::vector<int32_t> out(1024, b->rank()), in(1024);
    const int peer = 1 - b->rank();
    for (uint64_t seq = 1; seq <= 40000; ++seq) {
      auto recv = b->irecv(peer, view(in), makeTag(seq, 1, 0));
      b->send(peer, view(out), makeTag(seq, 1, 0));
      recv->wait(5s);
      if (b->rank() == 0 && (seq == 4000 || seq == 40000)) rss.push_back(residentBytes());
    }
    EXPECT_EQ(in[0], peer);
  });
  ASSERT_EQ(rss.size(), 2u);
  EXPECT_LT(rss[1], rss[0] + (512u << 10))
      << "resident memory grew by " << (rss[1] - rss[0]) / 1024 << " KiB over 36,000 messages";
}

TEST(Loopback, DesynchronisedCollectivesFailEveryRankNamingWhatDiffers) {
  std::atomic<int> named{0};
  runLoopback(4, [&](std::shared_ptr<Backend> b) {
    if (testing::desyncIsNamedOnEveryRank(b)) ++named;
  });
  EXPECT_EQ(named.load(), 4);
}

TEST(Loopback, TwentyThousandMixedCollectivesKeepMemoryFdsAndThreadsFlat) {
  std::vector<testing::Usage> usage;
  std::atomic<int> right{0};
  runLoopback(2, [&](std::shared_ptr<Backend> b) {
    if (testing::soak(b, 20000, b->rank() == 0 ? &usage : nullptr)) ++right;
  });
  EXPECT_EQ(right.load(), 2);
  EXPECT_TRUE(testing::flat(usage, "loopback"));
}

TEST(Loopback, AThousandCreateUseAbortDestroyCyclesLeaveNothingBehind) {
  std::vector<testing::Usage> usage;
  for (int cycle = 1; cycle <= 1000; ++cycle) {
    runLoopback(2, [&](std::shared_ptr<Backend> b) {
      Communicator comm(b, "loopback", Topology::singleNode(2));
      comm.addRule("ring", testing::loadScheduler("ring"));
      int32_t value = b->rank() + 1;
      CollectiveArgs args;
      args.data.data = &value;
      args.data.count = 1;
      args.data.dtype = DType::kI32;
      comm.run(args);
      EXPECT_EQ(value, 3);
      b->abort("the cycle is over");
    });
    if (cycle == 10 || cycle == 1000) usage.push_back(testing::usageNow());
  }
  EXPECT_TRUE(testing::flat(usage, "loopback", "cycle 10", "cycle 1000", false));
}

// completion: batch, nccl's model of point-to-point (Capabilities::batch_completion).
void runBatched(int world, const std::function<void(std::shared_ptr<Backend>)>& body,
                const std::string& completion = "batch") {
  config::PluginRef ref;
  ref.plugin = "loopback";
  ref.params.set("timeout", "300ms");
  ref.params.set("completion", completion);
  runInProcess(testing::buildTreeLoader(), ref, world, body);
}

// Messages between two ranks match in posting order, whatever their tags.
TEST(Loopback, BatchCompletionMatchesInPostingOrderWhateverTheTags) {
  runBatched(2, [](std::shared_ptr<Backend> b) {
    EXPECT_TRUE(b->capabilities().batch_completion);
    EXPECT_FALSE(concurrentGroups(*b)) << "nccl's model: one group at a time";
    std::vector<int32_t> x{1, 2}, y{3, 4};
    if (b->rank() == 0) {
      auto first = b->isend(1, view(x), 7);
      auto second = b->isend(1, view(y), 9);
      first->wait(5s);
      second->wait(5s);
    } else {
      std::vector<int32_t> tagged9(2), tagged7(2);
      auto first = b->irecv(0, view(tagged9), 9);
      auto second = b->irecv(0, view(tagged7), 7);
      first->wait(5s);
      second->wait(5s);
      EXPECT_EQ(tagged9, x);
      EXPECT_EQ(tagged7, y);
    }
  });
  runLoopback(1, [](std::shared_ptr<Backend> b) {
    EXPECT_FALSE(b->capabilities().batch_completion) << "each request on its own by default";
    EXPECT_TRUE(concurrentGroups(*b));
  });
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [] {
        runBatched(
            1, [](std::shared_ptr<Backend>) {}, "sometimes");
      },
      {"params.completion 'sometimes'", "expected each or batch"}));
}

// A wait returns only once every request posted before it completed: rank 1 receives two
// messages, rank 0 sends the second only after rank 1 answered the first. Completed one by
// one this works; as a batch, rank 1's wait for the first also waits for the second, whose
// sender waits for rank 1: it fails at the timeout, as nccl would hang.
TEST(Loopback, BatchCompletionWaitsForEveryRequestPostedBeforeIt) {
  const auto exchange = [](std::shared_ptr<Backend> b) {
    std::vector<int32_t> a{1}, c{2}, got_a(1), got_b(1);
    if (b->rank() == 0) {  // waits longer than rank 1, whose failure is the one reported
      b->isend(1, view(a), 1)->wait(5s);
      b->irecv(1, view(c), 3)->wait(5s);
      b->isend(1, view(a), 2)->wait(5s);
    } else {
      auto first = b->irecv(0, view(got_a), 1);
      auto second = b->irecv(0, view(got_b), 2);  // posted a step ahead
      first->wait(300ms);
      b->send(0, view(c), 3);
      second->wait(300ms);
    }
  };
  runBatched(2, exchange, "each");
  EXPECT_TRUE(testing::throwsWith<CommError>(
      [&] { runBatched(2, exchange); },
      {"in a batch's wait of 300 ms", "timed out", "completes with its batch"}));
}

// A request given up before its batch was posted is never posted, and the group is aborted:
// matched in posting order, its partner's message would pair with this rank's next one.
TEST(Loopback, BatchCompletionAbortsWhenARequestIsDroppedBeforeItsBatchWasPosted) {
  EXPECT_TRUE(testing::throwsWith<CommError>(
      [] {
        runBatched(2, [](std::shared_ptr<Backend> b) {
          std::vector<int32_t> x{1}, y{2}, got(1);
          if (b->rank() == 0) {
            b->isend(1, view(x), 1);  // dropped at once
            b->isend(1, view(y), 2)->wait(5s);
          } else {
            b->irecv(0, view(got), 2)->wait(5s);
          }
        });
      },
      {"rank 0: send to rank 1 tag 1", "given up before its batch was posted"}));
}

TEST(Loopback, BadPeerIsRejected) {
  EXPECT_THROW(runLoopback(2,
                           [](std::shared_ptr<Backend> b) {
                             std::vector<int32_t> v(1);
                             b->isend(5, view(v), 1);
                           }),
               CommError);
}

TEST(Loopback, SplitMakesIndependentSubgroups) {
  runLoopback(4, [](std::shared_ptr<Backend> b) {
    std::vector<int> mine = b->rank() % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto sub = b->split(mine);
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), b->rank() / 2);
    std::vector<int32_t> out{b->rank()}, in(1);
    auto r = sub->irecv(1 - sub->rank(), view(in), 5);
    sub->send(1 - sub->rank(), view(out), 5);
    r->wait(5s);
    EXPECT_EQ(in[0], mine[1 - sub->rank()]);
  });
}

}  // namespace
}  // namespace collie
