// The launcher's teardown policy, driven by a clock of the test's own (no process forked).
#include "runtime/teardown.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace collie {
namespace {

using Clock = Teardown::Clock;
using std::chrono::milliseconds;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);

TEST(Teardown, NothingIsDueUntilSomethingHappens) {
  Teardown t(milliseconds(5000), milliseconds(5000));
  EXPECT_EQ(t.due(kT0), 0);
  EXPECT_EQ(t.next(), Clock::time_point::max());
  EXPECT_FALSE(t.stopping());
}

TEST(Teardown, AFailureGivesTheOthersTheGraceThenTermThenKill) {
  Teardown t(milliseconds(5000), milliseconds(2000));
  t.failed(kT0);
  EXPECT_EQ(t.next(), kT0 + milliseconds(5000));
  EXPECT_EQ(t.due(kT0 + milliseconds(4999)), 0);
  EXPECT_FALSE(t.stopping());  // a rank that exits now still reports its own error
  EXPECT_EQ(t.due(kT0 + milliseconds(5000)), SIGTERM);
  EXPECT_TRUE(t.stopping());
  EXPECT_EQ(t.due(kT0 + milliseconds(5000)), 0);  // each signal once
  EXPECT_EQ(t.next(), kT0 + milliseconds(7000));
  EXPECT_EQ(t.due(kT0 + milliseconds(6999)), 0);
  EXPECT_EQ(t.due(kT0 + milliseconds(7000)), SIGKILL);
  EXPECT_EQ(t.due(kT0 + milliseconds(9000)), 0);
  EXPECT_EQ(t.next(), Clock::time_point::max());
}

TEST(Teardown, ASecondFailureDoesNotPostponeTheFirst) {
  Teardown t(milliseconds(5000), milliseconds(5000));
  t.failed(kT0);
  t.failed(kT0 + milliseconds(3000));
  EXPECT_EQ(t.next(), kT0 + milliseconds(5000));
}

TEST(Teardown, AWorkerThatCouldNotStartStopsTheOthersAtOnce) {
  Teardown t(milliseconds(5000), milliseconds(5000));
  t.failed(kT0, milliseconds(0));
  EXPECT_EQ(t.due(kT0), SIGTERM);
}

TEST(Teardown, LateDeadlinesFireInOrderWhenBothArePast) {
  Teardown t(milliseconds(10), milliseconds(0));
  t.failed(kT0);
  EXPECT_EQ(t.due(kT0 + milliseconds(100)), SIGTERM);
  EXPECT_EQ(t.due(kT0 + milliseconds(100)), SIGKILL);
  EXPECT_EQ(t.due(kT0 + milliseconds(100)), 0);
}

TEST(Teardown, AForwardedSignalIsThePoliteRequestThenKillAfterTheGrace) {
  Teardown t(milliseconds(5000), milliseconds(3000));
  t.forwarded(kT0);
  EXPECT_TRUE(t.stopping());
  EXPECT_EQ(t.due(kT0), 0);  // no SIGTERM on top of the forwarded signal
  EXPECT_EQ(t.next(), kT0 + milliseconds(3000));
  EXPECT_EQ(t.due(kT0 + milliseconds(3000)), SIGKILL);
}

TEST(Teardown, ASecondSignalKillsAtOnce) {
  Teardown t(milliseconds(5000), milliseconds(5000));
  t.forwarded(kT0);
  t.killNow(kT0 + milliseconds(10));
  EXPECT_EQ(t.due(kT0 + milliseconds(10)), SIGKILL);
  EXPECT_EQ(t.due(kT0 + milliseconds(20)), 0);
}

}  // namespace
}  // namespace collie
