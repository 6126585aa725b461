// The lab as a user meets it (root only, as CI runs): hosts in network namespaces with their
// own names, addresses and capped links; nothing left behind; jobs that cross the link.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "expect.h"
#include "lab/lab.h"
#include "measure/interface_bytes.h"
#include "run_command.h"
#include "util/system.h"

namespace collie {
namespace {

using testing::runCollie;
using testing::writeTempFile;

bool privileged() {
  try {
    lab::requirePrivileges();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

#define REQUIRE_LAB()                                                           \
  if (!privileged()) GTEST_SKIP() << "the lab needs root (network namespaces)"; \
  lab::down()

std::string sh(const std::string& command) {
  std::string output;
  detail::runProgram({"sh", "-c", command}, &output);
  return output;
}

// What the lab made that is still there.
std::string leftovers() {
  return sh(
      "ip netns list | grep '^collie-'; ls -d /run/collie-lab 2>/dev/null; "
      "grep ' /run/collie-lab' /proc/mounts");
}

// The counters the summary reports on the lab: every interface's bytes but loopback's, as
// the kernel writes /proc/net/dev (a counter may run into the name's colon); a file in
// another shape is no count at all.
TEST(LabInterfaces, ProcNetDevSumsEveryInterfaceButLoopback) {
  const std::string header =
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
      "drop fifo colls carrier compressed\n";
  const auto sums = measure::readInterfaceBytes(
      writeTempFile("netdev", header + "    lo: 900 9 0 0 0 0 0 0 900 9 0 0 0 0 0 0\n"
                                       "  eth1: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n"
                                       "  eth2:123456789012 10 0 0 0 0 0 0 30 3 0 0 0 0 0 0\n"));
  ASSERT_TRUE(sums.has_value());
  EXPECT_EQ(sums->received, 1000u + 123456789012u);
  EXPECT_EQ(sums->sent, 2030u);
  EXPECT_FALSE(
      measure::readInterfaceBytes(writeTempFile("netdev-short", header + " eth0: 1 2 3\n")));
  EXPECT_FALSE(measure::readInterfaceBytes(writeTempFile("netdev-empty", header)));
  EXPECT_FALSE(measure::readInterfaceBytes("/nonexistent/net/dev"));
}

TEST(Lab, UpIsIdempotentAndDownLeavesNothingBehind) {
  REQUIRE_LAB();
  auto r = runCollie({"lab", "up", "--hosts", "2", "--rate", "100mbit"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"collie-h1  eth1  198.18.0.2/24", "rate 100Mbit"}));
  // Each host has its own name and address; the machine's namespace has no lab address.
  r = runCollie({"lab", "exec", "collie-h1", "--", "sh", "-c",
                 "test \"$(hostname)\" = collie-h1 && ip -brief addr show eth1 | grep -q "
                 "198.18.0.2/24"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(sh("ip -brief addr | grep 198.18."), "");
  EXPECT_NE(sh("hostname"), "collie-h1");
  // The hosts reach each other over the bridge.
  r = runCollie({"lab", "exec", "collie-h0", "--", "bash", "-c", "exec 3<>/dev/tcp/198.18.0.2/1"});
  EXPECT_TRUE(testing::contains(r.output, {"Connection refused"}));  // it answered
  // Up again as asked: kept, not remade (the qdisc handles stay).
  const std::string before = sh("tc -n collie-h0 qdisc show dev eth0");
  r = runCollie({"lab", "up", "--hosts", "2", "--rate", "100mbit"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(sh("tc -n collie-h0 qdisc show dev eth0"), before);
  // Up with another rate: remade as asked.
  r = runCollie({"lab", "up", "--hosts", "3", "--rate", "1gbit"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"collie-h2"}));
  EXPECT_TRUE(testing::contains(sh("tc -n collie-h2 qdisc show dev eth2"), {"rate 1Gbit"}));
  r = runCollie({"lab", "down"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"removed network namespace collie-h2"}));
  EXPECT_EQ(leftovers(), "");
  r = runCollie({"lab", "status"});
  EXPECT_TRUE(testing::contains(r.output, {"no lab is up"}));
}

TEST(Lab, DownCleansUpAfterACrashWithoutItsStateFile) {
  REQUIRE_LAB();
  ASSERT_EQ(runCollie({"lab", "up", "--hosts", "2"}).exit_code, 0);
  std::filesystem::remove("/run/collie-lab/state.json");  // as a crash mid-up leaves it
  // A process left running inside a host (a crashed job's rank) does not keep it alive.
  sh("ip netns exec collie-h1 sleep 600 >/dev/null 2>&1 &");
  auto r = runCollie({"lab", "down"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(leftovers(), "");
  EXPECT_EQ(sh("pgrep -f 'slee[p] 600'"), "");
}

TEST(Lab, BadRequestsAreOneClearLine) {
  REQUIRE_LAB();
  auto r = runCollie({"lab", "up", "--hosts", "2", "--rate", "fast"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"'fast' is not a link rate"}));
  r = runCollie({"lab", "up", "--hosts", "2", "--cpus", "0;99"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"out of range"}));
  r = runCollie({"lab", "exec", "collie-h0", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"no lab is up"}));
  // Without root: refused before anything is made.
  std::string output;
  const int code = detail::runProgram({"setpriv", "--reuid=65534", "--regid=65534",
                                       "--clear-groups", COLLIE_TEST_BINARY, "lab", "up"},
                                      &output);
  EXPECT_EQ(code, 2) << output;
  EXPECT_TRUE(testing::contains(output, {"the lab needs root"}));
  lab::down();
  EXPECT_EQ(leftovers(), "");
}

const char* kCappedBench = R"(name: lab-capped
launch:
  nproc_per_node: 2
  lab: {hosts: 2, rate: 100mbit}
backend: gloo
bench:
  schedulers: [ring, hierarchical]
  min_bytes: 2MiB
  max_bytes: 2MiB
  warmup_iters: 1
  iters: 2
  repeats: 1
  calibrate: false
  plots: false
)";

// The backends the lab's tests run over, both on TCP: gloo, and UCX held to its tcp transport.
const std::vector<std::string> kLabBackends = {"gloo", "{plugin: ucx, params: {transports: tcp}}"};
std::string labBackendName(const ::testing::TestParamInfo<std::string>& info) {
  return info.index == 0 ? "gloo" : "ucx_tcp";
}

// Over gloo, and over UCX's TCP (which lists the host's interfaces in its /sys).
class LabBackends : public ::testing::TestWithParam<std::string> {};

// The run over gloo makes the lab and takes it down when it ends; the one over UCX finds it
// up as asked (`collie lab up` first) and leaves it up.
TEST_P(LabBackends, ACappedAllReduceIsNoFasterThanTheLinkAllows) {
  REQUIRE_LAB();
  const bool found_up = std::string(GetParam()) != "gloo";
  if (found_up)
    ASSERT_EQ(runCollie({"lab", "up", "--hosts", "2", "--rate", "100mbit"}).exit_code, 0);
  auto out = std::filesystem::temp_directory_path() / ("collie-lab-" + std::to_string(::getpid()));
  auto r = runCollie({"run", writeTempFile("capped.yaml", kCappedBench), "--out", out.string(),
                      "--set", std::string("backend=") + GetParam()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Two hosts from the hosts' own names: hierarchical is a two-level schedule.
  EXPECT_TRUE(
      testing::contains(r.output, {"# host collie-h0: 2 rank(s)", "# host collie-h1: 2 rank(s)",
                                   "link 100 Mbit/s (the lab's tbf cap)"}));
  std::ifstream json(out / "results.json");
  const auto rows = nlohmann::json::parse(json);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    // An all-reduce between two hosts moves at least its S bytes out of each host, so on a
    // 100 Mbit/s link algbw <= 12.5 MB/s (5 % for the bucket's burst). Over the uncapped
    // veth it would be hundreds of MB/s.
    EXPECT_LE(row.at("algbw_gbps").get<double>(), 0.0125 * 1.05) << row.dump();
    EXPECT_GT(row.at("algbw_gbps").get<double>(), 0.0);
    EXPECT_EQ(row.at("wrong"), 0);
  }
  if (found_up) {
    EXPECT_TRUE(lab::current().has_value()) << "the run took down a lab it did not make";
  } else {
    EXPECT_EQ(leftovers(), "") << "the run left the lab it made";
  }
  lab::down();
  std::filesystem::remove_all(out);
}

// A job whose ranks are all on one host listens on that host's loopback only: from another
// host, none of its ports (the rendezvous store, Gloo's pairs, UCX's TCP endpoints) takes a
// connection.
TEST_P(LabBackends, NothingOfItIsReachableFromAnotherHost) {
  REQUIRE_LAB();
  ASSERT_EQ(runCollie({"lab", "up", "--hosts", "2"}).exit_code, 0);
  const std::string config = writeTempFile(
      "one-host.yaml", "name: one-host\nlaunch: {nproc_per_node: 2}\nbackend: " + GetParam() +
                           "\nbench: {schedulers: [ring], min_bytes: 64KiB, max_bytes: 64KiB, "
                           "iters: 1000000, warmup_iters: 1, calibrate: false, plots: false}\n");
  const std::string out = "/tmp/collie-lab-one-host-" + std::to_string(::getpid());
  std::thread job([&] {
    runCollie({"lab", "exec", "collie-h0", "--", COLLIE_TEST_BINARY, "run", config, "--out", out});
  });
  // Once the ranks have met (the store's clients and the backend's connections are up), every
  // socket of host 0 is the job's: listening or connected, each must be on the loopback.
  auto sockets = [] { return sh("ip netns exec collie-h0 ss -tanH | awk '{print $1, $4}'"); };
  std::string seen;
  for (int i = 0; i < 300; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    seen = sockets();
    if (std::filesystem::exists(out + "/config.yaml") &&
        std::count(seen.begin(), seen.end(), '\n') >= 5) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      seen = sockets();
      break;
    }
  }
  std::istringstream lines(seen);
  int listening = 0, connected = 0;
  for (std::string state, address; lines >> state >> address;) {
    EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << state << " beyond the loopback: " << address;
    if (state != "LISTEN") {
      ++connected;
      continue;
    }
    ++listening;
    const std::string port = address.substr(address.rfind(':') + 1);
    EXPECT_EQ(sh("ip netns exec collie-h1 timeout 2 bash -c 'exec 3<>/dev/tcp/198.18.0.1/" + port +
                 "' 2>/dev/null && echo reached")
                  .find("reached"),
              std::string::npos)
        << "host 1 reached port " << port << " of host 0";
  }
  EXPECT_GE(listening, 1) << "the store never listened:\n" << seen;
  EXPECT_GE(connected, 4) << "the ranks never met:\n" << seen;
  sh("pkill -f 'collie-lab-one-hos[t]'");
  job.join();
  lab::down();
  std::filesystem::remove_all(out);
}

// Over gloo and UCX's TCP: each fails a transfer whose peer died when its connection closes
// (gloo's peer watch ends the one Gloo itself leaves to the timeout, a message half across).
TEST_P(LabBackends, KillingOneHostsRanksFailsTheJobOnTheOtherNamingThem) {
  REQUIRE_LAB();
  std::string config = writeTempFile("long.yaml", std::string(kCappedBench) + "  \n");
  std::filesystem::remove_all("/tmp/collie-lab-kill");  // no progress file of an earlier try
  testing::CommandResult r;
  std::thread job([&] {
    // A short rendezvous timeout: on a loaded machine the kill may come before every rank
    // has met, and host 0's ranks must still give up (naming the missing ranks) before the
    // lab's launcher stops them.
    r = runCollie({"run", config, "--out", "/tmp/collie-lab-kill", "--set", "bench.iters=2000",
                   "--set", "bench.schedulers=[ring]", "--set", "launch.rendezvous_timeout=5s",
                   "--set", "backend=" + GetParam()});
  });
  // Wait for host 1's ranks, then kill them (not its launcher). A rank is a `collie run`
  // whose parent is host 1's `collie launch` of this job: nothing else in that namespace
  // (a process of an earlier lab that is still ending) is taken for one.
  const std::string host1_ranks =
      "for p in $(ip netns pids collie-h1 2>/dev/null); do "
      "pp=$(cut -d' ' -f4 /proc/$p/stat 2>/dev/null) || continue; "
      "tr '\\0' ' ' </proc/$pp/cmdline 2>/dev/null | grep -q ' launch .*collie-lab-kill' && "
      "tr '\\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q ' run ' && echo $p; done";
  // Both of them: the launcher starts one after the other, and with one of them killed the
  // launcher would stop the other gently.
  std::string ranks;
  auto count = [](const std::string& pids) {
    std::istringstream words(pids);
    return std::distance(std::istream_iterator<std::string>(words),
                         std::istream_iterator<std::string>());
  };
  for (int i = 0; i < 300 && count(ranks) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ranks = sh(host1_ranks);
  }
  if (count(ranks) < 2) {
    ADD_FAILURE() << "host 1's ranks never started";
    sh("pkill -9 -f 'collie-lab-kil[l]'");
  } else {
    // Killed while Gloo still connects its pairs, host 0's ranks would wait out Gloo's own
    // connect timeout, past the lab's 10 s: wait until both of host 1's ranks have entered
    // an operation (their progress files say so), so that the kill lands mid-bench.
    const std::regex entered("\"op\":([1-9][0-9]*)");
    for (int i = 0; i < 300; ++i) {
      int started = 0;
      for (const char* file : {"/tmp/collie-lab-kill/progress/rank-2.json",
                               "/tmp/collie-lab-kill/progress/rank-3.json"}) {
        std::ifstream in(file);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (std::regex_search(text, entered)) ++started;
      }
      if (started == 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::replace(ranks.begin(), ranks.end(), '\n', ' ');  // one line: every rank of host 1
    sh("kill -9 " + ranks);
  }
  job.join();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // Both hosts' launchers fail (whichever exits first is named first) ...
  EXPECT_TRUE(testing::contains(r.output, {"failed on the lab; first failure: host collie-h"}));
  // ... and host 0's ranks name a dead rank of host 1.
  bool named = false;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    const bool host0 = line.rfind("[rank 0] collie: error:", 0) == 0 ||
                       line.rfind("[rank 1] collie: error:", 0) == 0;
    if (host0 &&
        (line.find("rank 2") != std::string::npos || line.find("rank 3") != std::string::npos ||
         line.find("rank(s) 2") != std::string::npos ||
         line.find("rank(s) 3") != std::string::npos)) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << r.output;
  lab::down();
  EXPECT_EQ(sh("pgrep -f 'collie-lab-kil[l]'"), "");
  std::filesystem::remove_all("/tmp/collie-lab-kill");
}

INSTANTIATE_TEST_SUITE_P(Lab, LabBackends, ::testing::ValuesIn(kLabBackends), labBackendName);

// The lab's link is a token bucket (tc's tbf, 128 KB at 1 Gbit/s: lab.cc's tbfArgs): the
// calibration's round trips after a pause read what it banks, which a wire would not. With
// one rank per host, that is the link between the hosts' only.
TEST(Lab, TheCalibrationReadsWhatTheLinksTokenBucketBanks) {
  REQUIRE_LAB();
  auto out = std::filesystem::temp_directory_path() / ("collie-bank-" + std::to_string(::getpid()));
  const std::string config = writeTempFile(
      "bank.yaml",
      "name: bank\nlaunch: {nproc_per_node: 1, lab: {hosts: 2, rate: 1gbit}}\nbackend: gloo\n"
      "bench: {schedulers: [ring], min_bytes: 64KiB, max_bytes: 64KiB, iters: 2, repeats: 1, "
      "calibrate: true, plots: false}\n");
  auto r = runCollie({"run", config, "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out / "calibration.json");
  const auto calibration = nlohmann::json::parse(in);
  EXPECT_EQ(calibration.at("fits").at("inter_bank").at("points").size(), 3u) << calibration;
  const double bank = calibration.at("inter").at("bank").get<double>();
  // (Eight calibrations read 108-136 KB.)
  EXPECT_GT(bank, 0.7 * 128000) << calibration.at("fits").at("inter_bank");
  EXPECT_LT(bank, 1.3 * 128000) << calibration.at("fits").at("inter_bank");
  EXPECT_TRUE(testing::contains(r.output, {"when idle (round trips after a pause)"})) << r.output;
  // One rank per host: the level inside a host is the one between them, less what only a
  // flow between hosts meets (the one-way beta and the bank).
  const auto& intra = calibration.at("intra");
  const auto& inter = calibration.at("inter");
  EXPECT_EQ(intra.at("beta").get<double>(), inter.at("beta").get<double>());
  EXPECT_GT(inter.at("beta_one_way").get<double>(), 0);
  EXPECT_EQ(intra.at("beta_one_way").get<double>(), 0);
  EXPECT_EQ(intra.at("bank").get<double>(), 0);
  lab::down();
  std::filesystem::remove_all(out);
}

TEST(Lab, TheTwoHostsExerciseTrainsOnOneHostAndAcrossTwo) {
  REQUIRE_LAB();
  auto out = std::filesystem::temp_directory_path() / ("collie-2h-" + std::to_string(::getpid()));
  auto r = runCollie({"run", std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/two-hosts.yaml",
                      "--out", out.string(), "--set", "train.steps=3", "--set",
                      "train.warmup_steps=1", "--set", "train.log_every=1", "--set",
                      "model.params.layers=1", "--set", "model.params.d_model=32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Five rows in one table: 1, 2, 4 processes on this machine, 2 x 2 at 1 Gbit/s, 100 Mbit/s.
  for (const char* row :
       {"nproc_per_node=1      1", "nproc_per_node=2      2", "nproc_per_node=4      4",
        "as written                     4", "rate=100mbit                   4"}) {
    EXPECT_TRUE(testing::contains(r.output, {row})) << row << "\n" << r.output;
  }
  // Across the hosts the all-reduce is set against the link between nodes, with what its
  // token bucket banks, and the weights stay identical.
  EXPECT_TRUE(testing::contains(
      r.output, {"[as written] all-reduce per step", "from the measured link between nodes",
                 "KB when idle)", "[rate=100mbit] weights identical"}));
  // On the hosts, their interfaces counted what crossed the link: at least half the
  // gradients a step (the host's sums must reach the other host), and nothing
  // off the lab.
  std::ifstream in(out / "summary.json");
  const auto runs = nlohmann::json::parse(in);  // a run each
  ASSERT_EQ(runs.size(), 5u);
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& run = runs[i];
    const double gradients = run["allreduce_bytes"].get<double>();
    if (i < 3) {
      EXPECT_EQ(run["interface_hosts"], 0) << run;
      continue;
    }
    EXPECT_EQ(run["interface_hosts"], 2) << run;
    EXPECT_GT(run["interface_sent_bytes_per_step"].get<double>(), 0.5 * gradients) << run;
    EXPECT_LT(run["interface_sent_bytes_per_step"].get<double>(), 4 * gradients + 65536) << run;
    EXPECT_GT(run["interface_startup_sent_bytes"].get<double>(), 0.5 * gradients) << run;
  }
  lab::down();
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace collie
