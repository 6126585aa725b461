// CpuLimit on cgroup v2 (cpu.max, subtree_control, the "0::" membership line), against a mount
// table, a membership file and a folder standing for the cgroup2 file system, all made by the
// test: no root, and no cgroup2 cpu controller on the machine needed.
#include "runtime/faults.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "collie/error.h"

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
class CgroupV2 : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("collie-cgroup-v2-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
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
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_, root_;
  CgroupFiles files_;
};

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
  try {
    CpuLimit limit(0.5, "launch.cpu_share", "share", files_);
    FAIL() << "limited through " << limit.path();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("launch.cpu_share needs the cgroup cpu controller"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(root_ / "collie"));
}

}  // namespace
}  // namespace collie
