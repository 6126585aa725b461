// Progress boards and their files, the stall watch's decision and line, and `collie status`.
#include "runtime/progress.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "expect.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

constexpr int64_t kSecond = 1000000;

// Rank `rank` of `world` in operation `op` ("inside" it, or left it) since `since`.
RankProgress at(int rank, int world, uint64_t op, bool inside, int64_t since,
                const std::string& what, int64_t step = 5) {
  RankProgress p;
  p.rank = rank;
  p.world = world;
  p.op = op;
  p.inside = inside;
  p.since_us = since;
  p.what = what;
  p.step = step;
  p.pid = 1000 + rank;
  p.host = "h";
  p.heartbeat_us = since;
  return p;
}

StallWatch::Liveness fixedLiveness() {
  return [](const RankProgress& r, int64_t) { return "pid " + std::to_string(r.pid) + " stopped"; };
}

// Ranks 0, 2, 3 entered operation 40 at t = 0; rank 1 left operation 39 at t = 0 and stopped.
std::vector<RankProgress> oneBehind() {
  return {at(0, 4, 40, true, 0, "all_reduce seq 12 (1.0 MiB)"),
          at(1, 4, 39, false, 0, "control exchange 27", 4),
          at(2, 4, 40, true, 100, "all_reduce seq 12 (1.0 MiB)"),
          at(3, 4, 40, true, 200, "all_reduce seq 12 (1.0 MiB)")};
}

TEST(StallWatch, NamesTheRankThatHasNotReachedTheStalledCollective) {
  StallWatch watch(std::chrono::seconds(10), fixedLiveness());
  std::vector<RankProgress> ranks = oneBehind();
  ranks[1].heartbeat_us = 9 * kSecond;  // alive: busy outside any collective
  EXPECT_EQ(watch.observe(ranks, 4, 9 * kSecond), "");
  const std::string line = watch.observe(ranks, 4, 10 * kSecond);
  EXPECT_TRUE(testing::contains(
      line, {"ranks 0, 2, 3 have waited 10.0 s in all_reduce seq 12 (1.0 MiB) (step 5)",
             "rank 1 has not reached it (last in control exchange 27 at step 4, left "
             "10.0 s ago; pid 1001 stopped)"}));
  EXPECT_TRUE(testing::lacks(line, {"every rank is inside it"}));
  // A rank whose file stopped changing is described as its file last said.
  ranks[1].heartbeat_us = 0;
  const std::string stale = watch.observe(ranks, 4, 20 * kSecond);
  EXPECT_TRUE(testing::contains(
      stale, {"rank 1 has not reached it (as of its last heartbeat: last in control "
              "exchange 27 at step 4, left 20.0 s ago;"}));
}

TEST(StallWatch, RepeatsAtGrowingIntervalsAndStartsAgainForAnotherStall) {
  StallWatch watch(std::chrono::seconds(10), fixedLiveness());
  std::vector<int> spoke;
  for (int t = 0; t <= 90; ++t) {
    std::vector<RankProgress> ranks = oneBehind();
    ranks[0].inside = t < 25;  // gives up at 25 s: the same stall goes on for ranks 2 and 3
    if (!watch.observe(ranks, 4, t * kSecond).empty()) spoke.push_back(t);
  }
  EXPECT_EQ(spoke, (std::vector<int>{10, 20, 40, 80}));
  // It resolves, then the next operation stalls: the first line comes after 10 s again.
  auto later = oneBehind();
  for (auto& r : later) r.inside = false;
  EXPECT_EQ(watch.observe(later, 4, 91 * kSecond), "");
  for (auto& r : later) {
    r.op += 2;
    r.inside = r.rank != 1;
    r.since_us = 100 * kSecond;
  }
  EXPECT_EQ(watch.observe(later, 4, 109 * kSecond), "");
  EXPECT_NE(watch.observe(later, 4, 110 * kSecond), "");
}

TEST(StallWatch, SaysSoWhenEveryRankIsInsideAndNamesRanksWithoutAFile) {
  StallWatch watch(std::chrono::seconds(2), fixedLiveness());
  std::vector<RankProgress> all = oneBehind();
  all[1] = at(1, 4, 40, true, 50, "all_reduce seq 12 (1.0 MiB)");
  const std::string inside = watch.observe(all, 4, 3 * kSecond);
  EXPECT_TRUE(
      testing::contains(inside, {"ranks 0, 1, 2, 3 have waited 3.0 s", "every rank is inside it"}));

  StallWatch other(std::chrono::seconds(2), fixedLiveness());
  all.pop_back();  // rank 3 wrote no file
  const std::string missing = other.observe(all, 4, 3 * kSecond);
  EXPECT_TRUE(testing::contains(missing, {"rank 3 wrote no progress file"}));
  EXPECT_TRUE(testing::lacks(missing, {"every rank is inside it"}));
}

TEST(StallWatch, ARankStillInAnEarlierCollectiveIsBehindAndOffIsSilent) {
  StallWatch watch(std::chrono::seconds(10), fixedLiveness());
  std::vector<RankProgress> ranks = oneBehind();
  ranks[1].inside = true;  // in operation 39 still
  ranks[1].heartbeat_us = 11 * kSecond;
  const std::string line = watch.observe(ranks, 4, 12 * kSecond);
  EXPECT_TRUE(testing::contains(
      line, {"rank 1 has not reached it (in control exchange 27 at step 4 for 12.0 s; "}));
  StallWatch off(std::chrono::seconds(0), fixedLiveness());
  EXPECT_EQ(off.observe(ranks, 4, 1000 * kSecond), "");
}

// A board's file follows it once a second and says finished when it is unpublished.
TEST(Progress, ABoardsFileSaysWhereTheRankIsAndThatItFinished) {
  const std::string root = ::testing::TempDir() + "/progress-" + std::to_string(::getpid());
  const std::string dir = root + "/board";
  fs::remove_all(root);
  ProgressBoard board(1, 2, 3);
  ProgressSettings settings;
  settings.dir = dir;
  publishProgress(&board, progressPath(dir, 1), settings);
  board.setStep(7);
  {
    ProgressScope scope(&board, {false, Collective::kBroadcast, 9, 4});
    std::this_thread::sleep_for(std::chrono::milliseconds(2300));
    const auto files = readProgress(dir, 3);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0].rank, 1);
    EXPECT_EQ(files[0].world, 2);
    EXPECT_EQ(files[0].step, 7);
    EXPECT_EQ(files[0].op, 1u);
    EXPECT_TRUE(files[0].inside);
    EXPECT_EQ(files[0].what, "broadcast seq 9 (4 B)");
    EXPECT_EQ(files[0].pid, ::getpid());
    EXPECT_FALSE(heartbeatStale(files[0], progressNowMicros()));
    EXPECT_TRUE(readProgress(dir, 4).empty()) << "a file of another run was read";
  }
  unpublishProgress(&board);
  const auto done = readProgress(dir);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].inside);
  EXPECT_TRUE(done[0].finished);

  std::ostringstream status;
  EXPECT_EQ(printStatus(root + "/no-such-run", status), 2);
  fs::create_directories(root + "/status-run/progress");
  fs::copy_file(progressPath(dir, 1), root + "/status-run/progress/rank-1.json");
  std::ofstream(root + "/status-run/progress/rank-0.json") << "{not json";
  // An earlier run's file in the same folder (a matrix of another world) is not this run's.
  std::ofstream(root + "/status-run/progress/rank-4.json")
      << "{\"rank\":4,\"world\":5,\"run\":0,\"pid\":1,\"host\":\"h\",\"step\":1,\"op\":3,"
         "\"inside\":true,\"what\":\"x\",\"since_us\":0,\"heartbeat_us\":1,"
         "\"finished\":false,\"failed\":false}";
  std::ostringstream text;
  EXPECT_EQ(printStatus(root + "/status-run", text), 0);
  EXPECT_TRUE(testing::contains(
      text.str(), {"1 of 2 rank(s) wrote progress (run 4)", "rank 1: step 7, finished"}));
}

// The liveness the line gives reads the process's state on this host.
TEST(Progress, LivenessTellsAStoppedProcessFromAGoneOne) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  RankProgress p = at(0, 1, 1, false, 0, "x");
  p.pid = child;
  p.host = detail::hostName();
  ::kill(child, SIGSTOP);
  std::string text;
  for (int i = 0; i < 100 && text.find("stopped") == std::string::npos; ++i) {
    const int64_t now = progressNowMicros();
    p.heartbeat_us = now - 12 * kSecond;
    text = describeLiveness(p, now);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(testing::contains(text, {" is stopped (SIGSTOP), last heartbeat 12.0 s ago"}));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(testing::contains(describeLiveness(p, progressNowMicros()), {" is gone"}));
  p.host = "another-host";
  EXPECT_EQ(describeLiveness(p, p.heartbeat_us + 2 * kSecond),
            "pid " + std::to_string(child) + " on another-host, last heartbeat 2.0 s ago");
}

}  // namespace
}  // namespace collie
