// The pieces of collie's launcher that touch processes: the signals it handles blocked and
// read from a signalfd (RAII), and the set of worker processes it spawns, whose output it
// relays with a rank prefix and whose exits it reaps.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "runtime/launcher.h"

namespace collie {

// Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP for the calling thread and reads them from a
// signalfd; SIGINT, SIGTERM and SIGHUP that the kernel hands to another thread of the process
// are sent on to this one (a handler, for the object's life). The destructor restores the
// old mask and handlers. Throws CommError when no signalfd.
class BlockedSignals {
 public:
  BlockedSignals();
  ~BlockedSignals();
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;

  int fd() const { return fd_; }
  // The mask from before, which children get back.
  const sigset_t& previousMask() const { return old_mask_; }
  // The signals that arrived (SIGCHLD left out), without blocking.
  std::vector<int> read();

 private:
  void restoreHandlers();  // the handlers this object replaced, back

  static constexpr size_t kForwarded = 3;  // SIGINT, SIGTERM, SIGHUP
  sigset_t old_mask_;
  struct sigaction old_actions_[kForwarded] {};
  bool replaced_[kForwarded] = {false, false, false};
  int fd_ = -1;
};

// `spec`, checked to have no memory limits (InternalError otherwise).
const LaunchSpec& withoutMemoryLimits(const LaunchSpec& spec);

struct Worker {
  int rank = -1;     // -1: not a rank (a host's launcher)
  std::string name;  // "rank 2", "host collie-h1, node 1"
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int fds[2] = {-1, -1};  // stdout, stderr pipes (read ends)
  std::string pending[2];
  std::string last_error;  // the last "collie: error: ..." line it printed
};

// The children of one launch (this node's workers). Never leaves a child behind: the
// destructor SIGKILLs and reaps whatever still runs.
class WorkerSet {
 public:
  // Starts every child with `child_mask`; with `relay`, each one's stdout and stderr are
  // pipes that relay() reads. Stops at the first child that cannot be started: startError()
  // says why.
  WorkerSet(std::vector<ChildProcess> children, const sigset_t& child_mask, bool relay);
  // spec's workers (workersOf), relayed. Without memory limits: their groups would go with
  // the children's descriptions here, while the children run (supervise keeps them).
  WorkerSet(const LaunchSpec& spec, const sigset_t& child_mask)
      : WorkerSet(workersOf(withoutMemoryLimits(spec)), child_mask, true) {}
  ~WorkerSet();
  WorkerSet(const WorkerSet&) = delete;
  WorkerSet& operator=(const WorkerSet&) = delete;

  const std::string& startError() const { return start_error_; }
  // The child that could not be started ("" before startError()'s is the pipe's): its rank.
  const Worker* notStarted() const {
    return start_failed_ < 0 ? nullptr : &workers_[start_failed_];
  }
  int running() const { return running_; }
  // Whether some worker still runs and every one that does is stopped by a signal (SIGSTOP,
  // SIGTSTP: /proc's state T): none of them can report anything until it is continued. A
  // worker under a debugger or strace (state t, also each traced system call's) is not.
  bool allStopped() const;
  bool pipesOpen() const;
  void signalAll(int sig);

  // Appends a pollfd for every open output pipe, then relays what poll() found ready in
  // them (from index `first` on) to stdout/stderr, each line prefixed "[rank N] ".
  void addPipes(std::vector<pollfd>* fds);
  void relay(const std::vector<pollfd>& fds, size_t first);
  // Reaps every worker that exited, calling on_exit(worker, wait status) for each.
  void reap(const std::function<void(const Worker&, int status)>& on_exit);

 private:
  std::vector<Worker> workers_;
  std::vector<std::pair<int, int>> polled_;  // (worker, stream) of each pollfd addPipes added
  int running_ = 0;
  std::string start_error_;
  int start_failed_ = -1;  // the child spawn() refused (-1: none)
};

// "exited with code 2", "was killed by signal 9 (SIGKILL)".
std::string describeExit(int status);
std::string signalName(int sig);

}  // namespace collie
