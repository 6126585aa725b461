// A stop with a duration (the process continues itself), then CpuLimit and MemoryGroup on
// cgroup v2 (cpu.max, memory.max, subtree_control, the "0::"
// membership line) and MemoryGroup on v1, against a mount table, a membership file and
// folders standing for the cgroup file systems, all made by the test: no root, and no cgroup
// controller on the machine needed. The kernel's side (a rank really killed at its limit) is
// tests/process/fault_injection_test.cc's, as root.
#include "runtime/faults.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "collie/error.h"
#include "expect.h"
#include "scratch_test.h"

namespace collie {
namespace {

namespace fs = std::filesystem;

std::string readText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeText(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// root_ stands for a cgroup2 mount listing `controllers`; the process sits in
// /user.slice/session-1. A v1 hierarchy with cpuacct (not cpu) comes first in the mount table.
class CgroupV2 : public testing::ScratchTest {
 protected:
  CgroupV2() : ScratchTest("collie-cgroup-v2") {}

  void SetUp() override {
    ScratchTest::SetUp();
    root_ = dir_ / "fs";
    fs::create_directories(root_ / "user.slice" / "session-1");
    fs::create_directories(dir_ / "v1-cpuacct");
    const std::string v1 = "32 30 0:29 / " + (dir_ / "v1-cpuacct").string() +
                           " rw,relatime - cgroup cgroup rw,cpuacct\n";
    const std::string v2 =
        "40 30 0:37 / " + root_.string() + " rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
    writeText(dir_ / "mountinfo", v1 + v2);
    writeText(dir_ / "cgroup", "2:cpuacct:/\n0::/user.slice/session-1\n");
    files_.mountinfo = (dir_ / "mountinfo").string();
    files_.membership = (dir_ / "cgroup").string();
  }
  fs::path root_;
  CgroupFiles files_;
};

// A child process takes a stop of 300 ms before its step 2 and then exits with 7: the
// parent sees it stopped, and exited without sending it SIGCONT, no sooner than 300 ms
// after it stopped. A stop without a duration stays stopped until continued.
TEST(StopFault, AStopWithADurationContinuesItselfAfterIt) {
  config::FaultSpec stop;
  stop.rank = 1;
  stop.at_step = 2;
  stop.action = config::FaultSpec::Action::kStop;
  stop.delay = std::chrono::milliseconds(300);
  auto child = [&](const config::FaultSpec& fault) {
    const pid_t pid = ::fork();
    if (pid == 0) {  // never back into the test runner: a failure is an exit code
      try {
        Faults faults({fault}, 1);
        faults.beforeStep(1);  // not due yet
        faults.beforeStep(2);
      } catch (...) {
        std::_Exit(99);
      }
      std::_Exit(7);
    }
    return pid;
  };
  const pid_t timed = child(stop);
  ASSERT_GT(timed, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(timed, &status, WUNTRACED), timed);
  ASSERT_TRUE(WIFSTOPPED(status)) << status;
  const auto stopped = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  };
  while (::waitpid(timed, &status, WNOHANG) == 0 && since() < 5) ::usleep(10 * 1000);
  const double seconds = since();
  if (seconds >= 5) {
    ::kill(timed, SIGKILL);
    ::waitpid(timed, &status, 0);
    FAIL() << "still stopped after 5 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 7);
  EXPECT_GE(seconds, 0.25);  // the stop was seen a moment after it began
  stop.delay = {};
  const pid_t held = child(stop);
  ASSERT_GT(held, 0);
  ASSERT_EQ(::waitpid(held, &status, WUNTRACED), held);
  ASSERT_TRUE(WIFSTOPPED(status)) << status;
  ::usleep(500 * 1000);
  EXPECT_EQ(::waitpid(held, &status, WNOHANG), 0) << "a stop without a duration ended";
  ::kill(held, SIGKILL);
  ASSERT_EQ(::waitpid(held, &status, 0), held);
}

// cpu.max is "quota period": the period 10 ms, stretched so that the quota is never under the
// kernel's 1 ms minimum (period = max(10 ms, 1 ms / share)), the quota share x period.
TEST_F(CgroupV2, TheProcessMovesIntoAGroupLimitedByCpuMaxAndBack) {
  writeText(root_ / "cgroup.controllers", "cpuset cpu io memory pids\n");
  const std::string pid = std::to_string(::getpid());
  struct Case {
    double share;
    const char* tag;
    std::string cpu_max;
  };
  for (const Case& c : {Case{0.25, "quarter", "2500 10000"}, Case{0.05, "twentieth", "1000 20000"},
                        Case{2.0, "two", "20000 10000"}}) {
    SCOPED_TRACE(c.tag);
    const fs::path group = root_ / "collie" / ("rank-" + pid + "-" + c.tag);
    {
      const CpuLimit limit(c.share, "test", c.tag, files_);
      EXPECT_EQ(limit.path(), group.string());
      EXPECT_EQ(readText(group / "cpu.max"), c.cpu_max);
      EXPECT_EQ(readText(group / "cgroup.procs"), pid);
      EXPECT_FALSE(fs::exists(group / "cpu.cfs_quota_us")) << "a v1 file in a v2 group";
      // v2 hands the controller down only through subtree_control, at each level.
      EXPECT_EQ(readText(root_ / "cgroup.subtree_control"), "+cpu");
      EXPECT_EQ(readText(root_ / "collie" / "cgroup.subtree_control"), "+cpu");
      writeText(group / "cpu.stat",
                "usage_usec 90000\nnr_periods 40\nnr_throttled 10\nthrottled_usec 250000\n");
      const CpuLimit::Throttling t = limit.throttling();
      EXPECT_EQ(t.periods, 40);
      EXPECT_EQ(t.throttled, 10);
      EXPECT_DOUBLE_EQ(t.throttled_seconds, 0.25);
    }
    EXPECT_EQ(readText(root_ / "user.slice" / "session-1" / "cgroup.procs"), pid)
        << "not moved back to the group it came from";
    fs::remove(root_ / "user.slice" / "session-1" / "cgroup.procs");
  }
}

// A cgroup2 hierarchy without the cpu controller (a machine of cgroup v1 with an almost empty
// v2 hierarchy) is refused, saying what is missing.
TEST_F(CgroupV2, AHierarchyWithoutTheCpuControllerIsRefused) {
  writeText(root_ / "cgroup.controllers", "hugetlb\n");
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [&] { CpuLimit limit(0.5, "launch.cpu_share", "share", files_); },
      {"launch.cpu_share needs the cgroup cpu controller"}))
      << "a limit was made without the cpu controller";
  EXPECT_FALSE(fs::exists(root_ / "collie"));
}

// A worker's memory group on v2: memory.max the limit, no swap (memory.swap.max 0), the
// controller handed down at each level; the OOM kills and the peak read from the kernel's
// files; the group gone after.
TEST_F(CgroupV2, AMemoryGroupHoldsItsLimitAndReadsTheOomKills) {
  writeText(root_ / "cgroup.controllers", "cpu memory pids\n");
  const fs::path group = root_ / "collie" / ("job-" + std::to_string(::getpid()) + "-rank-1");
  {
    fs::create_directories(group);  // the kernel makes these files with the group
    writeText(group / "memory.swap.max", "max\n");
    // Counts from before the worker (a group of that name left behind) are not its.
    writeText(group / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n");
    const MemoryGroup memory(96ull << 20, "rank-1", "launch.memory_limit", files_);
    EXPECT_EQ(memory.path(), group.string());
    EXPECT_EQ(memory.procsFile(), (group / "cgroup.procs").string());
    EXPECT_EQ(readText(group / "memory.max"), std::to_string(96ull << 20));
    EXPECT_EQ(readText(group / "memory.swap.max"), "0");
    EXPECT_EQ(readText(root_ / "cgroup.subtree_control"), "+memory");
    EXPECT_EQ(readText(root_ / "collie" / "cgroup.subtree_control"), "+memory");
    EXPECT_EQ(memory.oomKills(), 0) << "counted before the worker";
    EXPECT_FALSE(memory.killedAtLimit());
    EXPECT_TRUE(memory.swapHeld());
    // A kill because the machine ran out raises oom_kill but not oom (the group's own limit).
    writeText(group / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n");
    EXPECT_EQ(memory.oomKills(), 1);
    EXPECT_FALSE(memory.killedAtLimit()) << "the machine's OOM taken for the limit";
    writeText(group / "memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 3\n");
    writeText(group / "memory.peak", "100663296\n");
    EXPECT_EQ(memory.oomKills(), 2);
    EXPECT_TRUE(memory.killedAtLimit());
    EXPECT_EQ(memory.peakBytes(), 100663296u);
    for (const char* file : {"memory.max", "memory.swap.max", "memory.events", "memory.peak",
                             "cgroup.subtree_control"})
      fs::remove(group / file);  // what the kernel's files would not keep: rmdir needs it empty
  }
  EXPECT_FALSE(fs::exists(group)) << "the group was left behind";
}

// v1: the group under the launcher's own, memory.limit_in_bytes, then
// memory.memsw.limit_in_bytes (memory and swap) the same, oom_kill read from
// memory.oom_control, the limit reached when the peak is at it. A hierarchy without the
// controller is refused.
TEST_F(CgroupV2, AMemoryGroupOnV1AndAMachineWithoutTheController) {
  writeText(root_ / "cgroup.controllers", "cpu pids\n");
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [&] { MemoryGroup memory(64ull << 20, "rank-0", "launch.memory_limit", files_); },
      {"launch.memory_limit needs the cgroup memory controller"}))
      << "a memory group was made without the memory controller";
  const fs::path v1 = dir_ / "v1-memory";
  fs::create_directories(v1);
  writeText(dir_ / "mountinfo", readText(dir_ / "mountinfo") + "34 30 0:31 / " + v1.string() +
                                    " rw,relatime - cgroup cgroup rw,memory\n");
  // Under the launcher's own group (a Slurm step's), whose limit then holds the workers too.
  writeText(dir_ / "cgroup", "5:memory:/slurm/step-7\n2:cpuacct:/\n0::/\n");
  const fs::path group =
      v1 / "slurm" / "step-7" / "collie" / ("job-" + std::to_string(::getpid()) + "-rank-0");
  fs::create_directories(group);
  writeText(group / "memory.memsw.limit_in_bytes", "9223372036854771712\n");
  const MemoryGroup memory(64ull << 20, "rank-0", "launch.memory_limit", files_);
  EXPECT_EQ(fs::path(memory.path()), group);
  EXPECT_EQ(readText(group / "memory.limit_in_bytes"), std::to_string(64ull << 20));
  EXPECT_EQ(readText(group / "memory.memsw.limit_in_bytes"), std::to_string(64ull << 20));
  EXPECT_FALSE(fs::exists(group / "memory.max")) << "a v2 file in a v1 group";
  writeText(group / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  writeText(group / "memory.max_usage_in_bytes", "67108864\n");
  EXPECT_EQ(memory.oomKills(), 2);
  EXPECT_EQ(memory.peakBytes(), 67108864u);
  EXPECT_TRUE(memory.killedAtLimit()) << "its peak is its limit";
  writeText(group / "memory.max_usage_in_bytes", "41943040\n");  // 40 of 64 MiB
  EXPECT_FALSE(memory.killedAtLimit()) << "killed, but the group never reached its limit";
}

// On v2 a process is in one group for every controller: a CPU limit, which moves a rank into
// a group of its own, would take it out of its memory group, so the two are refused together
// there, and allowed where cpu and memory are separate v1 hierarchies.
TEST_F(CgroupV2, AMemoryLimitAndACpuLimitInOneHierarchyAreRefused) {
  writeText(root_ / "cgroup.controllers", "cpu memory\n");
  config::Experiment e;
  e.file = "x.yaml";
  e.memory_limit = {1ull << 30};
  EXPECT_NO_THROW(checkMemoryLimit(e, 2, false, false, false, "gloo", files_));
  e.cpu_share = {0.5};
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [&] { checkMemoryLimit(e, 2, false, false, false, "gloo", files_); },
      {"the memory and cpu controllers share one cgroup hierarchy"}))
      << "a CPU limit and a memory limit in one hierarchy were taken";
  const fs::path cpu = dir_ / "v1-cpu", memory = dir_ / "v1-memory";
  fs::create_directories(cpu);
  fs::create_directories(memory);
  writeText(dir_ / "mountinfo", "31 30 0:28 / " + cpu.string() +
                                    " rw - cgroup cgroup rw,cpu\n34 30 0:31 / " + memory.string() +
                                    " rw - cgroup cgroup rw,memory\n");
  EXPECT_NO_THROW(checkMemoryLimit(e, 2, false, false, false, "gloo", files_));
  EXPECT_THROW(checkMemoryLimit(e, 2, false, true, false, "gloo", files_), ConfigError)
      << "under another launcher";
  EXPECT_THROW(checkMemoryLimit(e, 2, false, false, true, "gloo", files_), ConfigError)
      << "on the lab";
}

}  // namespace
}  // namespace collie
