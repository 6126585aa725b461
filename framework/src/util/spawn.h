// The one way collie starts a process (its workers, the lab's host launchers, a simulation's
// child, a helper program such as `ip` or gnuplot): everything the child needs is made in the
// parent before the fork, and between fork and exec the child makes only async-signal-safe
// system calls. The fork is _Fork() (no pthread_atfork handler runs) with every signal
// blocked, so no library's code and no signal handler runs in the child either. A parent
// with threads (a backend's progress thread, LibTorch's pools) can therefore start processes
// safely; the child ends in exec or _exit, never in collie's code. No shell: a file that is
// not a program (a script without "#!") is refused with "Exec format error".
#pragma once

#include <sched.h>
#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace collie::detail {

// A namespace the child enters before exec, by the file that names it (/run/netns/NAME,
// /proc/PID/ns/uts) and its CLONE_NEW* type.
struct NamespaceFile {
  std::string path;
  int type = 0;
};

struct SpawnOptions {
  // The program and its arguments: argv[0] is a path, or a name looked up on PATH (in the
  // parent, before fork). No shell.
  std::vector<std::string> argv;
  // The child's whole environment, NAME=VALUE each; environmentWith() makes one from this
  // process's. Empty: this process's environment as it is.
  std::vector<std::string> environment;
  // The child's working directory ("": this process's).
  std::string working_directory;
  // Made the child's stdout and stderr (-1: this process's).
  int stdout_fd = -1;
  int stderr_fd = -1;
  // The child's signal mask (none: this thread's), and the CPUs it may run on (none: any).
  // Handlers do not cross exec: what this process catches is the default in the child, what
  // it ignores stays ignored.
  std::optional<sigset_t> signal_mask;
  std::optional<cpu_set_t> cpus;
  // The child is killed (SIGKILL) when the thread that started it ends, and does not start
  // when this process is already gone.
  bool die_with_parent = true;
  // Entered in order before exec.
  std::vector<NamespaceFile> namespaces;
  // With a network namespace above: a mount namespace of the child's own in which /sys is
  // that network namespace's, as `ip netns exec` does (tools and libraries list interfaces
  // in /sys/class/net).
  bool own_sysfs = false;
  // cgroup.procs files of groups the child enters before exec (a launcher's memory limit of
  // a worker): opened here, so that everything the program allocates is counted there.
  std::vector<std::string> cgroups;
};

// The path exec would run for `name`: itself when it has a '/', else the first executable
// file of that name in PATH's folders. "" when there is none.
std::string findProgram(const std::string& name);

// This process's environment with `set` (NAME=VALUE each) replacing or adding those names,
// and every name in `unset` removed.
std::vector<std::string> environmentWith(const std::vector<std::string>& set,
                                         const std::vector<std::string>& unset = {});

// Starts the process and returns its pid once it has exec'd the program. When any step
// fails (the program is not found, a namespace cannot be entered, exec fails, fork fails)
// the child is reaped and spawn throws Error (kInternal) naming the program, the step and
// the system's reason: "cannot run ip: No such file or directory".
pid_t spawn(const SpawnOptions& options);

// Waits for `pid` (retrying when a signal interrupts) and returns its wait status; one that
// says "exited with 127" when there is no such child to wait for.
int waitFor(pid_t pid);

// A wait status as an exit code: the code, or 128 + the signal that killed it.
int exitCodeOf(int status);

}  // namespace collie::detail
