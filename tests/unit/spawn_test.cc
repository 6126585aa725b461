// spawn(): what the child gets (its environment, CPUs, signal mask, output), and every step
// that can fail reported by the parent with the step and the reason, the child reaped.
#include "util/spawn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "collie/error.h"
#include "expect.h"

namespace collie::detail {
namespace {

// Runs `options` with its stdout into a pipe; returns what it printed and its exit code.
std::pair<std::string, int> outputOf(SpawnOptions options) {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  options.stdout_fd = fds[1];
  const pid_t pid = spawn(options);
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  ::close(fds[0]);
  return {out, exitCodeOf(waitFor(pid))};
}

// No child of this process is left unreaped (a failed start must not leave a zombie).
bool noChildLeft() { return ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD; }

std::string refusal(const SpawnOptions& options) {
  try {
    const pid_t pid = spawn(options);
    waitFor(pid);
  } catch (const Error& e) {
    return e.what();
  }
  return "(it started)";
}

TEST(Spawn, TheChildGetsTheEnvironmentItIsGiven) {
  ::setenv("COLLIE_SPAWN_TEST_KEPT", "kept", 1);
  ::setenv("COLLIE_SPAWN_TEST_GONE", "gone", 1);
  ::setenv("COLLIE_SPAWN_TEST_REPLACED", "old", 1);
  SpawnOptions o;
  o.argv = {"env"};  // looked up on PATH
  o.environment = environmentWith({"COLLIE_SPAWN_TEST_REPLACED=new", "COLLIE_SPAWN_TEST_ADDED=1"},
                                  {"COLLIE_SPAWN_TEST_GONE"});
  const auto [out, code] = outputOf(o);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(testing::contains(
      out, {"COLLIE_SPAWN_TEST_KEPT=kept\n", "COLLIE_SPAWN_TEST_REPLACED=new\n"}));
  EXPECT_TRUE(testing::lacks(out, {"COLLIE_SPAWN_TEST_REPLACED=old"}));
  EXPECT_TRUE(testing::contains(out, {"COLLIE_SPAWN_TEST_ADDED=1\n"}));
  EXPECT_TRUE(testing::lacks(out, {"COLLIE_SPAWN_TEST_GONE"}));
  ::unsetenv("COLLIE_SPAWN_TEST_KEPT");
  ::unsetenv("COLLIE_SPAWN_TEST_GONE");
  ::unsetenv("COLLIE_SPAWN_TEST_REPLACED");
}

TEST(Spawn, TheChildRunsOnItsCpusWithItsSignalMask) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) last = c;
  }
  SpawnOptions o;
  o.argv = {"grep", "-E", "^(Cpus_allowed_list|SigBlk):", "/proc/self/status"};
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(last, &one);
  o.cpus = one;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGUSR2);  // 12: bit 11 of SigBlk
  o.signal_mask = mask;
  const auto [out, code] = outputOf(o);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(testing::contains(
      out, {"Cpus_allowed_list:\t" + std::to_string(last) + "\n", "SigBlk:\t0000000000000800\n"}));
}

// A parent that ignores SIGPIPE (the gloo backend does, for its sockets) and SIGUSR1: the
// child gets SIGPIPE's default back, as Python's subprocess gives it, and keeps the rest
// ignored, as across exec.
TEST(Spawn, TheChildGetsSigpipesDefaultBackAndKeepsOtherIgnoredSignals) {
  struct sigaction ignore {
  }, old_pipe{}, old_usr1{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGPIPE, &ignore, &old_pipe), 0);
  ASSERT_EQ(::sigaction(SIGUSR1, &ignore, &old_usr1), 0);
  SpawnOptions o;
  o.argv = {"grep", "^SigIgn:", "/proc/self/status"};
  const auto [out, code] = outputOf(o);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  EXPECT_EQ(code, 0);
  const auto tab = out.find('\t');
  ASSERT_NE(tab, std::string::npos) << out;
  const unsigned long long ignored = std::stoull(out.substr(tab + 1), nullptr, 16);
  EXPECT_EQ(ignored & (1ull << (SIGPIPE - 1)), 0u) << out;
  EXPECT_NE(ignored & (1ull << (SIGUSR1 - 1)), 0u) << out;
}

TEST(Spawn, EveryFailedStepIsNamedAndTheChildReaped) {
  SpawnOptions missing;
  missing.argv = {"collie-no-such-program"};
  EXPECT_EQ(refusal(missing), "cannot run collie-no-such-program: not found on PATH");

  // Executable, but neither a program nor a script: exec itself refuses it in the child.
  std::string script = std::string(COLLIE_TEST_BINARY_DIR) + "/spawn-test-XXXXXX";
  const int fd = ::mkstemp(script.data());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd,
                    "\x7f"
                    "ELF?",
                    5),
            5);
  ::close(fd);
  ::chmod(script.c_str(), 0755);
  SpawnOptions not_a_program;
  not_a_program.argv = {script};
  EXPECT_EQ(refusal(not_a_program), std::string("cannot run ") + script + ": Exec format error");
  ::unlink(script.c_str());
  EXPECT_TRUE(noChildLeft());

  SpawnOptions no_namespace;
  no_namespace.argv = {"/bin/true"};
  no_namespace.namespaces = {{"/run/netns/collie-no-such-host", CLONE_NEWNET}};
  EXPECT_EQ(refusal(no_namespace),
            "cannot run /bin/true: cannot open /run/netns/collie-no-such-host: No such file or "
            "directory");

  // A file that is not a namespace opens, and setns refuses it in the child.
  SpawnOptions wrong_namespace;
  wrong_namespace.argv = {"/bin/true"};
  wrong_namespace.namespaces = {{"/etc/hostname", CLONE_NEWNET}};
  EXPECT_EQ(refusal(wrong_namespace),
            "cannot run /bin/true: cannot enter /etc/hostname: Invalid argument");
  EXPECT_TRUE(noChildLeft());
}

TEST(Spawn, ExitCodesAndSignalsReadAsAShellReportsThem) {
  SpawnOptions exits;
  exits.argv = {"/bin/sh", "-c", "exit 3"};
  EXPECT_EQ(exitCodeOf(waitFor(spawn(exits))), 3);
  SpawnOptions killed;
  killed.argv = {"/bin/sh", "-c", "kill -9 $$"};
  EXPECT_EQ(exitCodeOf(waitFor(spawn(killed))), 128 + SIGKILL);
}

TEST(Spawn, TheChildWorksInItsFolder) {
  SpawnOptions o;
  o.argv = {"pwd"};
  o.working_directory = "/usr";
  EXPECT_EQ(outputOf(o), std::make_pair(std::string("/usr\n"), 0));
  o.working_directory = "/collie-no-such-folder";
  EXPECT_EQ(refusal(o),
            "cannot run pwd: cannot work in /collie-no-such-folder: No such file or "
            "directory");
  EXPECT_TRUE(noChildLeft());
}

}  // namespace
}  // namespace collie::detail
