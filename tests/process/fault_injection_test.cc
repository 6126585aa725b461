// faults: from YAML: each action is taken by the rank it names, which logs it,
// and the job ends as it must under each launcher (collie's, torchrun, mpirun): non-zero,
// the rank named, nothing left running.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include "expect.h"
#include "processes.h"
#include "run_command.h"
#include "runtime/launcher.h"
#include "runtime/worker_set.h"
#include "util/system.h"

namespace fs = std::filesystem;
using namespace collie::testing;  // NOLINT: the helpers of run_command.h and processes.h

namespace {

// `ranks` ranks train a small MLP over `backend` for `steps` steps, with `faults` (YAML).
std::string trainWith(const std::string& name, const std::string& backend,
                      const std::string& faults, int ranks = 3, int steps = 30,
                      const std::string& timeout = "5s", const std::string& more = "") {
  return writeTempFile(
      name + ".yaml",
      "name: " + name + "\nlaunch: {nproc_per_node: " + std::to_string(ranks) +
          "}\nbackend: {plugin: " + backend + ", params: {timeout: " + timeout + "}}\n" +
          "model: {plugin: mlp, params: {seq_len: 16, vocab: 64, d_embed: 32, hidden: 256, "
          "layers: 2}}\ntrain: {steps: " +
          std::to_string(steps) + ", micro_batch: 8, log_every: 1000}\nfaults: " + faults + "\n" +
          more);
}

struct JobRun {
  int exit_code = -1;  // 128 + signal when one ended it; 124: still running after 2 minutes
  std::string log;     // the launcher's output, then every rank's own (torchrun keeps them)
};

// Runs `config` as a job of `ranks` workers under `launcher`: "collie" (collie run),
// "torchrun" (--no_python) or "mpirun", for two minutes at most.
JobRun runUnder(const std::string& launcher, const std::string& config, const std::string& out,
                int ranks) {
  fs::create_directories(out);
  const std::string collie =
      std::string("'") + COLLIE_TEST_BINARY + "' run '" + config + "' --out '" + out + "'";
  const std::string n = std::to_string(ranks);
  std::string command;
  if (launcher == "collie") {
    command = collie;
  } else if (launcher == "torchrun") {
    // The ranks' stderr goes to torchrun's log_dir.
    command = torchrunCommand(ranks) + " --log_dir '" + out + "/torchrun' " + collie;
  } else {
    command = "mpirun --allow-run-as-root --oversubscribe -np " + n +
              " -x MASTER_PORT=" + std::to_string(collie::pickFreePort("127.0.0.1")) + " " + collie;
  }
  const int status =
      std::system(("timeout -k 5 120 " + command + " > '" + out + "/log' 2>&1").c_str());
  JobRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.log = readText(out + "/log");
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(out + "/torchrun", ec)) {
    if (entry.path().filename() == "stderr.log") run.log += "\n" + readText(entry.path());
  }
  return run;
}

// Success when collie's launcher refuses `config` as bad input (exit code 2) before any rank
// starts, its log saying `says`.
::testing::AssertionResult refused(const std::string& config, const std::string& out,
                                   const std::string& says) {
  const JobRun run = runUnder("collie", config, out, 2);
  if (run.exit_code != 2) {
    return ::testing::AssertionFailure() << "exit code " << run.exit_code << ":\n" << run.log;
  }
  return collie::testing::contains(run.log, {says});
}

using LauncherBackendFault = std::tuple<std::string, std::string, std::string>;
class FaultUnderLauncher : public ::testing::TestWithParam<LauncherBackendFault> {};

// Rank 1 of 3 leaves mid-run, with exit code 0 or killed: the job fails, the rank that left
// is named, and nothing of the job is left running.
TEST_P(FaultUnderLauncher, ARankThatLeavesFailsTheJobAndNothingIsLeft) {
  const auto& [launcher, backend, fault] = GetParam();
  if (launcher != "collie" && !haveProgram(launcher)) GTEST_SKIP() << launcher << " is missing";
  const std::string out = scratch(launcher + "-" + backend + "-" + fault);
  const std::string yaml = fault == "exit0" ? "[{rank: 1, at_step: 3, action: exit, code: 0}]"
                                            : "[{rank: 1, at_collective: 5, action: kill}]";
  const JobRun run =
      runUnder(launcher, trainWith(launcher + "-" + backend + "-" + fault, backend, yaml), out, 3);
  EXPECT_NE(run.exit_code, 0) << run.log;
  EXPECT_NE(run.exit_code, 124) << "the job did not end within 2 minutes\n" << run.log;
  const std::string taken = fault == "exit0"
                                ? "faults[0]: rank 1 takes exit with code 0 before step 3"
                                : "faults[0]: rank 1 takes SIGKILL before collective 5";
  EXPECT_TRUE(collie::testing::contains(run.log, {taken}));
  // The ranks that stayed name the one that left (a launcher sees no failure in an exit with
  // code 0); after a kill, the launcher may have stopped them first, naming it itself.
  const bool survivors_name_it = run.log.find("rank(s) 1 reported nothing") != std::string::npos;
  const bool launcher_names_it =
      run.log.find("rank 1 (pid ") != std::string::npos ||                   // collie
      run.log.find("rank      : 1 (local_rank: 1)") != std::string::npos ||  // torchrun
      run.log.find("process rank 1 with PID") != std::string::npos;          // mpirun
  if (fault == "exit0") {
    EXPECT_TRUE(survivors_name_it) << run.log;
  } else {
    EXPECT_TRUE(survivors_name_it || launcher_names_it) << run.log;
  }
  if (launcher == "collie" && fault == "exit0") {
    EXPECT_TRUE(collie::testing::contains(
        run.log, {"had exited with code 0 while other ranks were still running"}));
  }
  EXPECT_TRUE(noneLeft(out)) << "a rank outlived the job";
}

INSTANTIATE_TEST_SUITE_P(Launchers, FaultUnderLauncher,
                         ::testing::Combine(::testing::Values("collie", "torchrun", "mpirun"),
                                            ::testing::Values("gloo", "ucx"),
                                            ::testing::Values("exit0", "kill")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                                  std::get<2>(info.param);
                         });

class StoppedRank : public ::testing::TestWithParam<std::string> {};

// A stopped rank keeps its connections open: the others time out, every rank that stayed
// writes its flight record, and `collie analyze` names the rank they waited for.
TEST_P(StoppedRank, TheOthersTimeOutAndAnalyzeNamesIt) {
  const std::string out = scratch("stop-" + GetParam());
  const JobRun run = runUnder(
      "collie",
      trainWith("stop-" + GetParam(), GetParam(), "[{rank: 2, at_step: 4, action: stop}]"), out, 3);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_TRUE(collie::testing::contains(
      run.log, {"faults[0]: rank 2 takes SIGSTOP before step 4", "rank(s) 2 reported nothing"}));
  EXPECT_TRUE(noneLeft(out)) << "the stopped rank outlived the job";
  EXPECT_TRUE(fs::exists(out + "/flight-recorder/rank-0.json")) << run.log;
  EXPECT_FALSE(fs::exists(out + "/flight-recorder/rank-2.json"));
  const auto analysis = runCollie({"analyze", out});
  EXPECT_EQ(analysis.exit_code, 0) << analysis.output;
  EXPECT_TRUE(collie::testing::contains(
      analysis.output,
      {"rank 2: no record", "rank 2 left no record: the others were waiting for rank 2"}));
}

INSTANTIATE_TEST_SUITE_P(Backends, StoppedRank, ::testing::Values("gloo", "ucx"),
                         [](const auto& info) { return info.param; });

// The seconds of the first stall line in `log` ("... have waited 10.4 s in ..."), or -1.
double firstStallWait(const std::string& log) {
  const std::string waited = " waited ";
  const auto stall = log.find("stall: ");
  if (stall == std::string::npos) return -1;
  const auto at = log.find(waited, stall);
  return at == std::string::npos ? -1 : std::atof(log.c_str() + at + waited.size());
}

using StallCase = std::tuple<std::string, std::string, int>;  // launcher, backend, stopped rank
class StallLine : public ::testing::TestWithParam<StallCase> {};

// A rank stopped before step 5 of a job with an 8 s timeout: well before it, after the 3 s
// of debug.stall_warning, one line names it as the rank the others wait for, with its
// process stopped, said by collie's launcher, or under torchrun by the lowest rank still
// alive (rank 0 when it is not the one stopped). `collie analyze` agrees once the job has
// failed.
TEST_P(StallLine, NamesAStoppedRankWhileTheJobStillWaits) {
  const auto& [launcher, backend, stopped] = GetParam();
  if (launcher != "collie" && !haveProgram(launcher)) GTEST_SKIP() << launcher << " is missing";
  const std::string name = "stall-" + launcher + "-" + backend + "-" + std::to_string(stopped);
  const std::string out = scratch(name);
  // Under torchrun the stopped rank continues itself after 20 s, long after the others
  // failed at the timeout: torchrun gives each rank 30 s to obey its SIGTERM, which a
  // stopped one cannot.
  const std::string fault = "[{rank: " + std::to_string(stopped) + ", at_step: 5, action: stop" +
                            (launcher == "torchrun" ? ", delay: 20s" : "") + "}]";
  const JobRun run = runUnder(
      launcher, trainWith(name, backend, fault, 3, 30, "8s", "debug: {stall_warning: 3s}\n"), out,
      3);
  EXPECT_NE(run.exit_code, 0) << run.log;
  EXPECT_NE(run.exit_code, 124) << "the job did not end within 2 minutes\n" << run.log;
  const double waited = firstStallWait(run.log);
  EXPECT_GE(waited, 3.0) << run.log;  // debug.stall_warning
  EXPECT_LT(waited, 5.0) << run.log;
  const std::string named = "rank " + std::to_string(stopped) + " has not reached it (";
  const auto line = run.log.find("stall: ");
  ASSERT_NE(line, std::string::npos) << run.log;
  const std::string first = run.log.substr(line, run.log.find('\n', line) - line);
  EXPECT_TRUE(collie::testing::contains(first, {named, "is stopped (SIGSTOP)"}));
  if (launcher == "collie") {
    EXPECT_TRUE(collie::testing::contains(run.log, {"launcher: stall: "}));
    // Said while the job still waited: before any rank gave up at the timeout.
    EXPECT_LT(line, run.log.find("reported nothing")) << run.log;
  } else {
    const std::string speaker = stopped == 0 ? "[r1 " : "[r0 ";  // the log line's rank
    const auto prefix = run.log.rfind('\n', line);
    EXPECT_TRUE(collie::testing::contains(run.log.substr(prefix + 1, line - prefix), {speaker}))
        << run.log.substr(prefix + 1, 200);
  }
  EXPECT_TRUE(noneLeft(out)) << "the stopped rank outlived the job";
  const auto analysis = runCollie({"analyze", out});
  EXPECT_TRUE(collie::testing::contains(
      analysis.output, {"the others were waiting for rank " + std::to_string(stopped)}));
}

INSTANTIATE_TEST_SUITE_P(Jobs, StallLine,
                         // Each backend, rank 0 (the store's host) and another, each
                         // launcher that decides who speaks: about 20 s a job, 25 s under
                         // torchrun.
                         ::testing::Values(StallCase{"collie", "gloo", 0},
                                           StallCase{"collie", "ucx", 1},
                                           StallCase{"torchrun", "gloo", 0}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) +
                                  "_rank" + std::to_string(std::get<2>(info.param));
                         });

// An exception that is not collie's, thrown on the communication thread (the gradient
// all-reduce of step 2 is collective 3), fails its rank with its message, as threads and as
// processes.
TEST(FaultInjection, AThrowOnTheCommunicationThreadFailsTheRankWithItsMessage) {
  for (const std::string backend : {"loopback", "gloo"}) {
    const std::string out = scratch("throw-" + backend);
    const JobRun run = runUnder(
        "collie",
        trainWith("throw-" + backend, backend, "[{rank: 1, at_collective: 3, action: throw}]", 2),
        out, 2);
    EXPECT_EQ(run.exit_code, 1) << run.log;
    EXPECT_TRUE(collie::testing::contains(
        run.log, {"internal error: injected by faults[0]: rank 1 takes an exception "
                  "before collective 3"}));
    EXPECT_TRUE(noneLeft(out));
  }
}

// One rank sleeping before step 3 holds every rank back in that step's all-reduce, and in no
// other step.
TEST(FaultInjection, ADelayHoldsEveryRankBackInThatStepOnly) {
  const std::string out = scratch("delay");
  const JobRun run = runUnder(
      "collie",
      trainWith("delay", "loopback", "[{rank: 1, at_step: 3, action: delay, delay: 800ms}]", 2, 6),
      out, 2);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_TRUE(collie::testing::contains(
      run.log, {"faults[0]: rank 1 takes a delay of 800 ms before step 3"}));
  std::ifstream steps(out + "/rank-0.jsonl");
  int step = 0;
  for (std::string line; std::getline(steps, line);) {
    const auto j = nlohmann::json::parse(line);
    step = j["step"].get<int>();
    if (step == 3) {
      EXPECT_GE(j["step_s"].get<double>(), 0.75) << "rank 0 did not wait for rank 1: " << line;
    } else {
      EXPECT_LT(j["step_s"].get<double>(), 0.75) << "step " << step << " waited: " << line;
    }
  }
  EXPECT_EQ(step, 6);
}

// slow: rank 1 keeps a tenth of one CPU for the rest of the run (cgroup v1 cpu): the kernel
// throttles it (the rank reports the group's cpu.stat when the limit ends), and its group is
// gone after the run. Not a timing test: throttling is counted, not timed.
TEST(FaultInjection, SlowLimitsTheRanksCpuAndRemovesItsCgroupAfter) {
  struct stat st {};
  if (::geteuid() != 0 || ::stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &st) != 0)
    GTEST_SKIP() << "needs root and the cgroup v1 cpu controller at /sys/fs/cgroup/cpu";
  const std::string out = scratch("slow");
  const JobRun run = runUnder(
      "collie",
      trainWith("slow", "gloo", "[{rank: 1, at_step: 1, action: slow, cpu_share: 0.1}]", 2), out,
      2);
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_TRUE(collie::testing::contains(
      run.log, {"faults[0]: rank 1 takes a CPU share of 0.1 for the rest of the run "
                "before step 1"}));
  const std::string ended = "faults[0]: rank 1's CPU share ended: throttled in ";
  const auto at = run.log.find(ended);
  ASSERT_NE(at, std::string::npos) << run.log;
  EXPECT_GT(std::atol(run.log.c_str() + at + ended.size()), 0) << run.log.substr(at, 120);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/fs/cgroup/cpu/collie", ec))
    ADD_FAILURE() << entry.path() << " was left behind";
}

// A share list of another length, or ranks that are threads, are bad input (exit 2).
TEST(CpuShare, ListsOfAnotherLengthAndThreadsAreRefused) {
  const std::string out = scratch("cpu-share-bad");
  auto config = [](const std::string& backend, const std::string& shares) {
    return writeTempFile("cpu-share-bad.yaml",
                         "name: bad\nlaunch: {nproc_per_node: 2, cpu_share: " + shares +
                             "}\nbackend: " + backend +
                             "\nmodel: {plugin: mlp, params: {seq_len: 4, vocab: 16}}\n"
                             "train: {steps: 1, micro_batch: 2}\n");
  };
  EXPECT_TRUE(refused(config("gloo", "[1.0, 0.5, 0.5]"), out,
                      "launch.cpu_share: expected one share for every rank or 2 (one per "
                      "rank), found 3"));
  EXPECT_TRUE(refused(config("loopback", "0.5"), out,
                      "launch.cpu_share limits each rank's process, but backend 'loopback' "
                      "runs its ranks as threads"));
}

// Faults that end, freeze or limit a process are refused on loopback's threads before
// anything runs, and a rank outside the job is named.
TEST(FaultInjection, FaultsThatNeedAProcessAreRefusedOnThreads) {
  const std::string out = scratch("threads");
  for (const std::string action : {"kill", "stop", "exit, code: 0", "slow, cpu_share: 0.5"}) {
    EXPECT_TRUE(refused(
        trainWith("threads", "loopback", "[{rank: 1, at_step: 2, action: " + action + "}]", 2), out,
        "needs ranks that are processes, but backend 'loopback' runs its "
        "ranks as threads"));
  }
  EXPECT_TRUE(refused(trainWith("beyond", "gloo", "[{rank: 3, at_step: 2, action: kill}]", 2), out,
                      "faults[0].rank: 3 is not a rank of this job of 2 rank(s)"));
}

// This process's open descriptors.
std::set<int> openFds() {
  std::set<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    fds.insert(std::stoi(entry.path().filename().string()));
  }
  return fds;
}

// A worker set that cannot make its second output pipe (the descriptor limit leaves room
// for one) reports why and leaves no descriptor open.
TEST(WorkerSet, APipeThatCannotBeMadeLeaksNothing) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const std::set<int> before = openFds();  // includes the listing's own descriptor, then freed
  // The limit is the third free descriptor: the two below it are one pipe's worth.
  int free_seen = 0, limit = 0;
  for (int fd = 0; free_seen < 3; ++fd) {
    if (before.count(fd) == 0 && ++free_seen == 3) limit = fd;
  }
  collie::LaunchSpec spec;
  spec.argv = {"/bin/true"};
  sigset_t mask;
  sigemptyset(&mask);
  std::string error;
  {
    // Restores the limit however this block ends, so no later test runs under it.
    struct Restore {
      rlimit limit;
      ~Restore() { ::setrlimit(RLIMIT_NOFILE, &limit); }
    } restore{saved};
    rlimit tight = saved;
    tight.rlim_cur = static_cast<rlim_t>(limit);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
    collie::WorkerSet workers(spec, mask);
    error = workers.startError();
  }
  EXPECT_TRUE(collie::testing::contains(error, {"pipe:"}));
  EXPECT_EQ(openFds(), before);
}

// The pids of this thread's children, from /proc.
std::vector<pid_t> childrenOfThisThread() {
  std::ifstream in("/proc/self/task/" + std::to_string(::gettid()) + "/children");
  std::vector<pid_t> pids;
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

// Waits up to 5 s for `count` of `pids` to be in `state` (processState's letter).
bool reachState(const std::vector<pid_t>& pids, size_t count, char state) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto in_state = std::count_if(pids.begin(), pids.end(), [&](pid_t p) {
      return collie::detail::processState(p) == state;
    });
    if (static_cast<size_t>(in_state) == count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The launcher gives no grace to workers that are all stopped: allStopped() holds only when
// every worker still running is stopped, not while one of them runs.
TEST(WorkerSet, AllStoppedOnlyWhenEveryRunningWorkerIsStopped) {
  collie::LaunchSpec spec;
  spec.argv = {"/bin/sh", "-c",
               "if [ \"$LOCAL_RANK\" = 1 ]; then kill -STOP $$; fi; exec sleep 30"};
  spec.nproc = 2;
  sigset_t mask;
  sigemptyset(&mask);
  collie::WorkerSet workers(spec, mask);
  ASSERT_EQ(workers.startError(), "");
  const std::vector<pid_t> pids = childrenOfThisThread();
  ASSERT_EQ(pids.size(), 2u);
  // Rank 1 stops itself; rank 0 sleeps.
  ASSERT_TRUE(reachState(pids, 1, 'T'));
  EXPECT_FALSE(workers.allStopped());
  workers.signalAll(SIGSTOP);
  ASSERT_TRUE(reachState(pids, 2, 'T'));
  EXPECT_TRUE(workers.allStopped());
  workers.signalAll(SIGCONT);
  ASSERT_TRUE(reachState(pids, 2, 'S'));
  EXPECT_FALSE(workers.allStopped());
}

// Whether `sig` is in the `field` mask ("SigBlk:", "SigCgt:") of thread `tid` of `pid`.
bool inMask(pid_t pid, pid_t tid, const std::string& field, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) {
      return (std::stoull(line.substr(field.size()), nullptr, 16) >> (sig - 1)) & 1;
    }
  }
  return false;
}

// A signal mask is a thread's own, and a process-directed SIGTERM goes to any thread that
// does not block it. A launcher whose process has another thread (made before the launcher
// blocked its signals, as CUDA's are when train.cuda sets the device up in the launcher) must
// still read SIGTERM, forward it and report the interruption, not die of it.
TEST(Launcher, ASigtermThatAnotherThreadCouldTakeStillReachesTheLauncher) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::thread bystander([] { std::this_thread::sleep_for(std::chrono::seconds(30)); });
    bystander.detach();  // blocks nothing
    collie::LaunchSpec spec;
    spec.argv = {"/bin/sleep", "30"};
    const collie::LaunchOutcome outcome = collie::launchWorkers(spec);
    ::_exit(outcome.interrupted && outcome.exit_code == 128 + SIGTERM ? 0 : 1);
  }
  // The launcher (the child's first thread) catches SIGTERM, then blocks it, once it is in
  // its loop. (Blocked alone is no sign: pthread_create blocks every signal for a moment in
  // the thread that makes the bystander.)
  auto ready = [&] {
    return inMask(child, child, "SigCgt:", SIGTERM) && inMask(child, child, "SigBlk:", SIGTERM);
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ready() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!ready()) {
    ::kill(child, SIGKILL);  // no launcher left running into later tests
    ::waitpid(child, nullptr, 0);
    FAIL() << "the launcher never caught and blocked SIGTERM";
  }
  ::kill(child, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? "the launcher died of signal " + std::to_string(WTERMSIG(status))
                              : "the launcher exited with " + std::to_string(WEXITSTATUS(status)));
}

// The training config of the memory-limit tests: 2 ranks over gloo, launch.memory_limit
// `limits` (YAML), a model whose training needs some hundreds of MB per rank.
std::string limitedTo(const std::string& name, const std::string& limits,
                      const std::string& launch = "") {
  return writeTempFile(
      name + ".yaml",
      "name: " + name + "\nlaunch: {nproc_per_node: 2, memory_limit: " + limits + launch +
          "}\nbackend: {plugin: gloo, params: {timeout: 10s}}\n"
          "model: {plugin: mlp, params: {seq_len: 16, vocab: 64, d_embed: 32, hidden: 1024, "
          "layers: 2}}\ntrain: {steps: 4, micro_batch: 8, log_every: 1000}\n");
}

// Where the launcher (a child of this test, in its memory group) makes the workers' groups on
// cgroup v1: collie/ under this process's own memory group.
std::string workerMemoryGroups() {
  std::ifstream membership("/proc/self/cgroup");
  for (std::string line; std::getline(membership, line);) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (second != std::string::npos && line.substr(first + 1, second - first - 1) == "memory")
      return "/sys/fs/cgroup/memory" + line.substr(second + 1) + "/collie";
  }
  return "/sys/fs/cgroup/memory/collie";
}

bool haveMemoryCgroupV1() {
  struct stat st {};
  return ::geteuid() == 0 && ::stat("/sys/fs/cgroup/memory/memory.limit_in_bytes", &st) == 0;
}

// launch.memory_limit: rank 1 held to 40 MiB (less than a rank needs to start) is killed by
// the kernel's OOM killer, and the launcher says so, naming the rank and its limit, rather
// than a bare SIGKILL; rank 0 (2 GiB) is stopped, error.json says out_of_memory, the run is
// not restarted (it would run out again), and no process or cgroup is left.
TEST(MemoryLimit, ARankOverItsLimitIsReportedAsSuchAndTheOthersStop) {
  if (!haveMemoryCgroupV1())
    GTEST_SKIP() << "needs root and the cgroup v1 memory controller at /sys/fs/cgroup/memory";
  const std::string out = scratch("memory-limit");
  const JobRun run =
      runUnder("collie", limitedTo("memory-limit", "[2GiB, 40MiB]", ", max_restarts: 2"), out, 2);
  EXPECT_EQ(run.exit_code, 1) << run.log;
  EXPECT_TRUE(collie::testing::contains(
      run.log, {"was killed by the kernel's OOM killer at its memory limit "
                "(launch.memory_limit 40.0 MiB",
                "First failure: rank 1 (pid "}));
  EXPECT_EQ(run.log.find("rank 0 (pid"), std::string::npos) << "rank 0 blamed: " << run.log;
  EXPECT_EQ(run.log.find("restarting"), std::string::npos) << run.log;
  const auto error = nlohmann::json::parse(readText(out + "/error.json"));
  EXPECT_EQ(error["failed_rank"], 1);
  EXPECT_EQ(error["out_of_memory"], true);
  EXPECT_EQ(error["signal"], 9);
  EXPECT_TRUE(noneLeft(out));
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(workerMemoryGroups(), ec)) {
    if (entry.is_directory()) ADD_FAILURE() << entry.path() << " was left behind";
  }
}

// A limit the ranks stay under changes nothing: the run trains to the end.
TEST(MemoryLimit, RanksUnderTheirLimitTrainToTheEnd) {
  if (!haveMemoryCgroupV1())
    GTEST_SKIP() << "needs root and the cgroup v1 memory controller at /sys/fs/cgroup/memory";
  const std::string out = scratch("memory-limit-enough");
  const JobRun run = runUnder("collie", limitedTo("memory-limit-enough", "1GiB"), out, 2);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  EXPECT_EQ(run.log.find("OOM killer"), std::string::npos) << run.log;
}

// A list of another length, ranks that are threads, and the lab are refused before anything
// runs (exit 2), each saying why.
TEST(MemoryLimit, WhatCannotHoldARankIsRefused) {
  const std::string out = scratch("memory-limit-bad");
  EXPECT_TRUE(refused(limitedTo("memory-limit-bad", "[1GiB, 1GiB, 1GiB]"), out,
                      "launch.memory_limit expected one limit for every rank or 2 (one per "
                      "rank), found 3"));
  const std::string threads = writeTempFile(
      "memory-limit-threads.yaml",
      "name: t\nlaunch: {nproc_per_node: 2, memory_limit: 1GiB}\nbackend: loopback\n"
      "model: {plugin: mlp, params: {seq_len: 4, vocab: 16}}\ntrain: {steps: 1, micro_batch: 2}\n");
  EXPECT_TRUE(refused(threads, out,
                      "launch.memory_limit holds each rank's process, but backend "
                      "'loopback' runs its ranks as threads"));
  EXPECT_TRUE(refused(limitedTo("memory-limit-small", "1MiB"), out, "launch.memory_limit"));
}

}  // namespace
