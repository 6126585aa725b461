// spawn(): _Fork, a few system calls, exec. The child reports a failed step through a pipe
// that exec closes (O_CLOEXEC): the parent reads end-of-file when the program started, or
// the step and errno when it did not.
#include "util/spawn.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "collie/error.h"

extern char** environ;

namespace collie::detail {
namespace {

// What the child was doing when it failed; `index` is the namespace's, for kEnterNamespace.
enum class Step : int {
  kEnterNamespace,
  kOwnMounts,
  kMountSys,
  kCpus,
  kCgroup,
  kWorkingDirectory,
  kOutput,
  kExec
};

struct ChildFailure {
  Step step;
  int index;
  int error;
};

}  // namespace

std::string findProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  const std::string folders =
      path != nullptr && *path != '\0' ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  for (;;) {
    const size_t end = folders.find(':', begin);
    std::string folder = folders.substr(begin, end == std::string::npos ? end : end - begin);
    if (folder.empty()) folder = ".";
    const std::string candidate = folder + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == std::string::npos) return "";
    begin = end + 1;
  }
}

namespace {

std::vector<char*> pointersTo(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Makes `fd` the child's `target` (dup2 keeps no O_CLOEXEC; a descriptor that already is
// `target` loses it).
bool redirect(int fd, int target) {
  if (fd < 0) return true;
  if (fd != target) return ::dup2(fd, target) == target;
  return ::fcntl(fd, F_SETFD, 0) == 0;
}

// The child's side: only async-signal-safe calls, then exec or _exit.
[[noreturn]] void becomeChild(const SpawnOptions& o, pid_t parent, const sigset_t& parent_mask,
                              int report, const std::vector<int>& namespace_fds,
                              const std::vector<int>& cgroup_fds, const char* program,
                              char* const* argv, char* const* envp) {
  auto fail = [report](Step step, int index) {
    const ChildFailure failure{step, index, errno};
    ssize_t ignored = ::write(report, &failure, sizeof(failure));
    (void)ignored;
    ::_exit(127);
  };
  // Every signal is blocked (the parent blocked them around the fork): no handler of the
  // parent's runs here. Those it caught go back to their default before the mask is opened
  // (exec would do so too); those it ignores stay ignored, as across exec, but for SIGPIPE,
  // which a socket backend of the parent may have ignored for itself: the child gets its
  // default again, as Python's subprocess gives it.
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction action {};
    if (::sigaction(sig, nullptr, &action) != 0) continue;
    if (action.sa_handler == SIG_DFL) continue;
    if (action.sa_handler == SIG_IGN && sig != SIGPIPE) continue;
    action.sa_handler = SIG_DFL;
    action.sa_flags = 0;
    ::sigaction(sig, &action, nullptr);
  }
  if (o.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
  }
  for (size_t i = 0; i < namespace_fds.size(); ++i) {
    if (::setns(namespace_fds[i], o.namespaces[i].type) != 0)
      fail(Step::kEnterNamespace, static_cast<int>(i));
  }
  if (o.own_sysfs) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0)
      fail(Step::kOwnMounts, 0);
    ::umount2("/sys", MNT_DETACH);
    if (::mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) fail(Step::kMountSys, 0);
  }
  if (o.cpus && ::sched_setaffinity(0, sizeof(cpu_set_t), &*o.cpus) != 0) fail(Step::kCpus, 0);
  for (size_t i = 0; i < cgroup_fds.size(); ++i) {
    if (::write(cgroup_fds[i], "0", 1) != 1) fail(Step::kCgroup, static_cast<int>(i));  // 0: me
  }
  if (!o.working_directory.empty() && ::chdir(o.working_directory.c_str()) != 0)
    fail(Step::kWorkingDirectory, 0);
  if (!redirect(o.stdout_fd, STDOUT_FILENO) || !redirect(o.stderr_fd, STDERR_FILENO))
    fail(Step::kOutput, 0);
  ::pthread_sigmask(SIG_SETMASK, o.signal_mask ? &*o.signal_mask : &parent_mask, nullptr);
  ::execve(program, argv, envp);
  fail(Step::kExec, 0);
  ::_exit(127);  // not reached: fail() exits
}

std::string describeFailure(const SpawnOptions& o, const ChildFailure& f) {
  const std::string why = std::strerror(f.error);
  switch (f.step) {
    case Step::kEnterNamespace:
      return fmt::format("cannot enter {}: {}", o.namespaces.at(f.index).path, why);
    case Step::kOwnMounts:
      return "cannot make a mount namespace of its own: " + why;
    case Step::kMountSys:
      return "cannot mount its network namespace's /sys: " + why;
    case Step::kCpus:
      return "cannot run on the CPUs asked for: " + why;
    case Step::kCgroup:
      return fmt::format("cannot enter the cgroup of {}: {}", o.cgroups.at(f.index), why);
    case Step::kWorkingDirectory:
      return fmt::format("cannot work in {}: {}", o.working_directory, why);
    case Step::kOutput:
      return "cannot redirect its output: " + why;
    case Step::kExec:
      break;
  }
  return why;
}

}  // namespace

std::vector<std::string> environmentWith(const std::vector<std::string>& set,
                                         const std::vector<std::string>& unset) {
  auto nameOf = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> names = unset;
  for (const auto& s : set) names.push_back(nameOf(s));
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool dropped = false;
    for (const auto& n : names) dropped = dropped || nameOf(entry) == n;
    if (!dropped) env.push_back(entry);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

pid_t spawn(const SpawnOptions& options) {
  COLLIE_CHECK(!options.argv.empty(), "spawn: an empty command");
  const std::string& name = options.argv.front();
  auto refuse = [&name](const std::string& why) {
    return InternalError(fmt::format("cannot run {}: {}", name, why));
  };
  // Everything the child touches, made now.
  std::string program = findProgram(name);
  if (program.empty()) throw refuse("not found on PATH");
  // The child changes folder before exec: a relative path is made absolute here.
  if (!options.working_directory.empty() && program.front() != '/')
    program = std::filesystem::absolute(program).string();
  std::vector<std::string> args = options.argv;
  std::vector<std::string> env =
      options.environment.empty() ? environmentWith({}) : options.environment;
  const std::vector<char*> argv = pointersTo(args);
  const std::vector<char*> envp = pointersTo(env);
  std::vector<int> namespace_fds, cgroup_fds;
  auto closeAll = [&namespace_fds, &cgroup_fds] {
    for (int fd : namespace_fds) ::close(fd);
    for (int fd : cgroup_fds) ::close(fd);
  };
  for (const auto& ns : options.namespaces) {
    const int fd = ::open(ns.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const std::string why = std::strerror(errno);
      closeAll();
      throw refuse(fmt::format("cannot open {}: {}", ns.path, why));
    }
    namespace_fds.push_back(fd);
  }
  for (const auto& procs : options.cgroups) {
    const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      const std::string why = std::strerror(errno);
      closeAll();
      throw refuse(fmt::format("cannot open {}: {}", procs, why));
    }
    cgroup_fds.push_back(fd);
  }
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    closeAll();
    throw refuse("pipe: " + why);
  }
  const pid_t parent = ::getpid();
  // _Fork runs no pthread_atfork handler (LibTorch's, CUDA's, OpenMP's would run library
  // code in the child), and every signal stays blocked until the child chose its mask.
  sigset_t all, parent_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &parent_mask);
  const pid_t pid = ::_Fork();
  if (pid == 0) {
    becomeChild(options, parent, parent_mask, report[1], namespace_fds, cgroup_fds, program.c_str(),
                argv.data(), envp.data());
  }
  const int fork_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &parent_mask, nullptr);
  ::close(report[1]);
  closeAll();
  if (pid < 0) {
    ::close(report[0]);
    throw refuse(std::string("fork: ") + std::strerror(fork_error));
  }
  ChildFailure failure{};
  ssize_t n;
  while ((n = ::read(report[0], &failure, sizeof(failure))) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  if (n == 0) return pid;           // exec closed the pipe: the program runs
  if (n < 0) ::kill(pid, SIGKILL);  // no word from it: it is not left running unseen
  waitFor(pid);
  if (n != static_cast<ssize_t>(sizeof(failure))) throw refuse("its child failed to start");
  throw refuse(describeFailure(options, failure));
}

int waitFor(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 127 << 8;  // reaped elsewhere: "exited with 127", not success
  }
  return status;
}

int exitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace collie::detail
