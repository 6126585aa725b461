// The loopback backend against the backend contract (DESIGN §3).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>

#include "collie/error.h"
#include "loopback_job.h"

namespace collie {
namespace {

using namespace std::chrono_literals;
using testing::runLoopback;

Buffer view(std::vector<int32_t>& v) {
  Buffer b;
  b.data = v.data();
  b.count = v.size();
  b.dtype = DType::kI32;
  return b;
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
  auto start = std::chrono::steady_clock::now();
  try {
    runLoopback(
        2,
        [](std::shared_ptr<Backend> b) {
          if (b->rank() != 1) return;
          std::vector<int32_t> v(4);
          b->recv(0, view(v), makeTag(12, 1, 3));
        },
        "300ms");
    FAIL() << "no timeout";
  } catch (const CommError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("receive from rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("seq 12, phase 1, step 3"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 300 ms"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
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
    EXPECT_NE(std::string(e.what()).find("rank 0 gives up"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(aborted);
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
