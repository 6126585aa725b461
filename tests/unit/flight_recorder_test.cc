// The flight recorder's ring and file, and `collie analyze`'s verdicts on records written by
// hand: a rank behind, a rank without a record, a rank that came late, ranks that disagree,
// and hostile files.
#include "runtime/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "collie/error.h"
#include "expect.h"
#include "scratch_test.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

FlightEntry allreduce(uint64_t seq) {
  FlightEntry e;
  e.seq = seq;
  e.coll = Collective::kAllReduce;
  e.count = 1024;
  e.bytes = 4096;
  e.scheduler = "ring";
  return e;
}

TEST(FlightRecorder, KeepsTheNewestEntriesOldestFirst) {
  FlightRecorder recorder(3);
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    const uint64_t id = recorder.begin(allreduce(seq));
    if (seq != 5) recorder.end(id, FlightEntry::State::kCompleted);
  }
  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].seq, 3u);
  EXPECT_EQ(entries[2].seq, 5u);
  EXPECT_EQ(entries[1].state, FlightEntry::State::kCompleted);
  EXPECT_EQ(entries[2].state, FlightEntry::State::kStarted);
  EXPECT_EQ(entries[2].end_us, 0);
  EXPECT_GT(entries[1].end_us, 0);
  recorder.end(0, FlightEntry::State::kFailed);  // long overwritten: nothing changes
  EXPECT_EQ(recorder.entries()[0].state, FlightEntry::State::kCompleted);
}

class Analyze : public testing::ScratchTest {
 protected:
  Analyze() : ScratchTest("collie-analyze") {}

  // Rank `rank` of `world` completed seq 1 .. open-1 and is stuck in `open` (0: none open),
  // starting it at `open_start_us` and giving up at `open_end_us` (0: still waiting).
  void record(int rank, int world, uint64_t completed, uint64_t open, int64_t open_start_us = 0,
              int64_t open_end_us = 0, const std::string& call = "allreduce") {
    FlightRecorder recorder(8);
    for (uint64_t seq = 1; seq <= completed; ++seq)
      recorder.end(recorder.begin(allreduce(seq)), FlightEntry::State::kCompleted);
    std::string path = flightRecordPath(dir_.string(), rank);
    if (open > 0) {
      FlightEntry e = allreduce(open);
      if (call == "broadcast") e.coll = Collective::kBroadcast;
      recorder.begin(e);
    }
    recorder.dump(path, rank, world, "timed out");
    if (open > 0 && open_start_us > 0) {  // set the open entry's times by hand
      std::ifstream in(path);
      auto j = nlohmann::json::parse(in);
      j["entries"].back()["start_us"] = open_start_us;
      j["entries"].back()["end_us"] = open_end_us;
      j["entries"].back()["state"] = open_end_us > 0 ? "failed" : "started";
      std::ofstream(path) << j.dump();
    }
  }

  std::string analyze(int expected_code = 0) {
    std::ostringstream out;
    EXPECT_EQ(analyzeRun(dir_.string(), out), expected_code) << out.str();
    return out.str();
  }
};

TEST_F(Analyze, NamesTheRankThatNeverStartedWhatTheOthersWaitIn) {
  record(0, 3, 6, 7);
  record(1, 3, 6, 0);  // finished seq 6, never started 7
  record(2, 3, 6, 7);
  EXPECT_TRUE(testing::contains(
      analyze(), {"verdict: ranks 0, 2 waited in seq 7 (allreduce of 1024 x f32 (sum)); "
                  "rank 1 last started seq 6: the others were waiting for rank 1"}));
}

TEST_F(Analyze, NamesTheRankWithoutARecord) {
  record(0, 3, 4, 5);
  record(2, 3, 4, 5);
  EXPECT_TRUE(testing::contains(
      analyze(),
      {"rank 1: no record", "rank 1 left no record: the others were waiting for rank 1"}));
}

TEST_F(Analyze, NamesTheRankThatCameAfterTheOthersGaveUp) {
  record(0, 2, 3, 4, 1'000'000'000'000'000, 1'000'000'003'000'000);
  record(1, 2, 3, 4, 1'000'000'005'000'000, 1'000'000'008'000'000);
  EXPECT_TRUE(testing::contains(
      analyze(), {"rank 1 started seq 4 at ", "5.000 s after rank 0, which had given up on it",
                  "verdict: rank 0 waited in seq 4 (allreduce of 1024 x f32 (sum)); rank 1 "
                  "started it late: the others were waiting for rank 1"}));
}

TEST_F(Analyze, SaysWhenEveryRankFailedInTheSameCollective) {
  record(0, 2, 3, 4, 1'000'000'000'000'000, 1'000'000'003'000'000);
  record(1, 2, 3, 4, 1'000'000'000'100'000, 1'000'000'003'100'000);
  EXPECT_TRUE(testing::contains(
      analyze(), {"verdict: ranks 0, 1 failed in seq 4 (allreduce of 1024 x f32 (sum)) and "
                  "no rank was behind"}));
}

TEST_F(Analyze, NamesRanksThatDisagreeAboutACollective) {
  record(0, 2, 3, 4);
  record(1, 2, 3, 4, 0, 0, "broadcast");
  EXPECT_TRUE(testing::contains(
      analyze(), {"verdict: the ranks disagree at seq 4: rank 0 called allreduce of 1024 x "
                  "f32 (sum); rank 1 called broadcast of 1024 x f32 (root 0)"}));
}

TEST_F(Analyze, AFolderWithoutRecordsAndHostileFilesAreClearErrors) {
  EXPECT_TRUE(testing::contains(analyze(2), {"holds no flight record"}));
  fs::create_directories(flightRecordFolder(dir_.string()));
  std::ofstream(flightRecordPath(dir_.string(), 0))
      << "{\"rank\": 0, \"world\": 2, \"entries\": [{\"seq\": \"x\"}]}";
  std::ostringstream out;
  EXPECT_TRUE(testing::throwsWith<ConfigError>([&] { analyzeRun(dir_.string(), out); },
                                               {"rank-0.json: not a flight record collie wrote"}))
      << "a broken record was read";
  std::ofstream(flightRecordPath(dir_.string(), 0))
      << "{\"rank\": 7, \"world\": 2, \"entries\": []}";
  EXPECT_THROW(analyzeRun(dir_.string(), out), ConfigError);
  std::ofstream(flightRecordPath(dir_.string(), 0)) << std::string(100, '[');
  EXPECT_THROW(analyzeRun(dir_.string(), out), ConfigError);
}

}  // namespace
}  // namespace collie
