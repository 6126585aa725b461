// The workers, started by spawn(), their output relayed line by line, their exits reaped.
#include "runtime/worker_set.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "collie/error.h"
#include "collie/log.h"
#include "runtime/cgroup.h"
#include "util/spawn.h"
#include "util/system.h"

namespace collie {
namespace {

constexpr int kHandled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

// The thread that reads the signalfd, and its process. A mask is a thread's own: a
// process-directed SIGINT/SIGTERM/SIGHUP goes to any thread of the launcher that does not
// block it (one made before BlockedSignals: CUDA's, LibTorch's), whose default action would
// end the launcher and leave its workers to PR_SET_PDEATHSIG. A handler (dispositions are
// the process's) sends it on to the reading thread, where it is blocked and read.
std::atomic<pid_t> g_reader_tid{0};  // 0: no reader now (between two launches, or after)
// The launcher's process, never reset: a forked worker (another pid) is told apart from a
// moment of the launcher's own when no reader is live.
std::atomic<pid_t> g_owner_pid{0};
// A signal the reading thread took itself before it blocked them (the handler is installed
// first, so that no moment is left where another thread takes the default action): the
// constructor sends it again once blocked, and the signalfd reads it.
std::atomic<int> g_early_signal{0};

void sendToReader(int sig) {
  const int saved = errno;
  const pid_t pid = ::getpid();
  if (pid == g_owner_pid.load()) {
    const pid_t reader = g_reader_tid.load();
    if (reader == 0) {
      // The launcher's handlers are being put back: the signal comes again once this handler
      // returns (it is blocked here), to whatever handles it then.
      ::raise(sig);
    } else if (static_cast<pid_t>(::syscall(SYS_gettid)) == reader) {
      g_early_signal = sig;
    } else {
      ::syscall(SYS_tgkill, pid, reader, sig);
    }
  } else {
    // A worker between fork and exec: the signal is its own, with its default action.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  errno = saved;
}

// Writes the complete lines of `data` (appended to `pending`) to `fd`, each prefixed, and
// keeps the last collie error line in `last_error`. `flush`: the rest too (the pipe closed).
void emitLines(int fd, const std::string& prefix, std::string& pending, const char* data, size_t n,
               bool flush, std::string* last_error) {
  static const std::string kError = "collie: error: ";
  pending.append(data, n);
  size_t start = 0;
  std::string out;
  while (true) {
    size_t end = pending.find('\n', start);
    if (end == std::string::npos) break;
    out += prefix;
    out.append(pending, start, end - start + 1);
    if (pending.compare(start, kError.size(), kError) == 0)
      *last_error = pending.substr(start + kError.size(), end - start - kError.size());
    start = end + 1;
  }
  pending.erase(0, start);
  if (flush && !pending.empty()) {
    out += prefix + pending + "\n";
    pending.clear();
  }
  for (size_t done = 0; done < out.size();) {
    ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // our own output is gone: nothing better to do than drop it
    done += static_cast<size_t>(w);
  }
}

// The environment of worker `w`: ours, with the launcher's variables set for it (and those
// it leaves unset removed, so that none leaks in from the launcher's own environment).
std::vector<std::string> workerEnvironment(const LaunchSpec& spec, const Worker& w) {
  const int world = spec.nproc * spec.nnodes;
  std::vector<std::string> set = {
      fmt::format("RANK={}", w.rank),
      fmt::format("WORLD_SIZE={}", world),
      fmt::format("LOCAL_RANK={}", w.local_rank),
      fmt::format("LOCAL_WORLD_SIZE={}", spec.nproc),
      fmt::format("GROUP_RANK={}", spec.node_rank),
      "MASTER_ADDR=" + spec.master_addr,
      fmt::format("MASTER_PORT={}", spec.master_port),
      fmt::format("COLLIE_EXPERIMENT={}", spec.experiment),
      fmt::format("OMP_NUM_THREADS={}", spec.threads_per_rank),
  };
  if (!spec.result_path.empty()) set.push_back("COLLIE_RESULT=" + spec.result_path);
  set.insert(set.end(), spec.extra_env.begin(), spec.extra_env.end());
  return detail::environmentWith(set, {"COLLIE_RESULT", "NODE_RANK", "COLLIE_SIMULATION_RUN",
                                       "COLLIE_SIMULATION_DIGEST", "COLLIE_SIMULATION_RESULT"});
}

// With launch.cpu_affinity: CPU sets that give every worker threads_per_rank CPUs of its own,
// or none when the node has too few CPUs. Off by default: a backend's progress thread (Gloo's
// event loop, UCX's) then shares the rank's CPUs with its compute threads, and on this 2-core
// machine a 16 KiB ring all-reduce over gloo took 6.9 ms pinned against 1.05 ms unpinned.
std::vector<cpu_set_t> cpuSets(const LaunchSpec& spec) {
  if (!spec.cpu_affinity) return {};
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  }
  const size_t needed = static_cast<size_t>(spec.nproc) * spec.threads_per_rank;
  if (needed > cpus.size()) {
    logInfo(fmt::format("not pinning workers: {} ranks x {} threads > {} CPUs", spec.nproc,
                        spec.threads_per_rank, cpus.size()));
    return {};
  }
  std::vector<cpu_set_t> sets(spec.nproc);
  for (int w = 0; w < spec.nproc; ++w) {
    CPU_ZERO(&sets[w]);
    for (int t = 0; t < spec.threads_per_rank; ++t)
      CPU_SET(cpus[w * spec.threads_per_rank + t], &sets[w]);
  }
  return sets;
}

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describeExit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return fmt::format("was killed by signal {} ({})", sig, signalName(sig));
  }
  return fmt::format("stopped (status {})", status);
}

BlockedSignals::BlockedSignals() {
  // The handler first, then the mask: a signal between the two reaches the handler on
  // whichever thread takes it, never a default action.
  g_early_signal = 0;
  g_owner_pid = ::getpid();
  g_reader_tid = static_cast<pid_t>(::syscall(SYS_gettid));
  struct sigaction forward {};
  forward.sa_handler = &sendToReader;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  for (size_t i = 0; i < kForwarded; ++i) {
    ::sigaction(kHandled[i + 1], nullptr, &old_actions_[i]);
    // An ignored signal stays ignored (nohup); SIGCHLD (kHandled[0]) only wakes the loop.
    if (old_actions_[i].sa_handler == SIG_IGN) continue;
    replaced_[i] = ::sigaction(kHandled[i + 1], &forward, nullptr) == 0;
  }
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : kHandled) sigaddset(&handled, sig);
  pthread_sigmask(SIG_BLOCK, &handled, &old_mask_);
  fd_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd_ < 0) {
    const int error = errno;
    restoreHandlers();
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    throw CommError(std::string("launcher: signalfd failed: ") + std::strerror(error));
  }
  if (const int sig = g_early_signal.exchange(0)) {
    ::syscall(SYS_tgkill, g_owner_pid.load(), g_reader_tid.load(), sig);  // blocked: queued
  }
}

void BlockedSignals::restoreHandlers() {
  for (size_t i = 0; i < kForwarded; ++i) {
    if (replaced_[i]) ::sigaction(kHandled[i + 1], &old_actions_[i], nullptr);
    replaced_[i] = false;
  }
  g_reader_tid = 0;
}

BlockedSignals::~BlockedSignals() {
  restoreHandlers();
  ::close(fd_);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

std::vector<int> BlockedSignals::read() {
  std::vector<int> signals;
  signalfd_siginfo info;
  while (::read(fd_, &info, sizeof(info)) == sizeof(info)) {
    if (static_cast<int>(info.ssi_signo) != SIGCHLD) signals.push_back(info.ssi_signo);
  }
  return signals;
}

const LaunchSpec& withoutMemoryLimits(const LaunchSpec& spec) {
  COLLIE_CHECK(spec.memory_limits.empty(),
               "WorkerSet(LaunchSpec) takes no memory limits: use supervise(workersOf(spec))");
  return spec;
}

std::vector<ChildProcess> workersOf(const LaunchSpec& spec) {
  const std::vector<cpu_set_t> cpu_sets = cpuSets(spec);
  std::vector<ChildProcess> children(spec.nproc);
  for (int i = 0; i < spec.nproc; ++i) {
    Worker w;
    w.local_rank = i;
    w.rank = spec.node_rank * spec.nproc + i;
    ChildProcess& c = children[i];
    c.rank = w.rank;
    c.name = fmt::format("rank {}", w.rank);
    c.start.argv = spec.argv;
    c.start.environment = workerEnvironment(spec, w);
    if (!cpu_sets.empty()) c.start.cpus = cpu_sets[i];
    if (!spec.memory_limits.empty()) {
      const uint64_t limit = spec.memory_limits.size() == 1
                                 ? spec.memory_limits.front()
                                 : spec.memory_limits.at(static_cast<size_t>(w.rank));
      auto group = std::make_shared<MemoryGroup>(limit, fmt::format("rank-{}", w.rank),
                                                 "launch.memory_limit");
      if (i == 0 && !group->swapHeld()) {
        logWarn(
            "launch.memory_limit: this kernel does not account swap (no "
            "memory.memsw.limit_in_bytes or memory.swap.max), so a rank over its limit may "
            "swap rather than be killed");
      }
      c.start.cgroups = {group->procsFile()};
      c.memory = std::move(group);
    }
  }
  return children;
}

WorkerSet::WorkerSet(std::vector<ChildProcess> children, const sigset_t& child_mask, bool relay)
    : workers_(children.size()) {
  for (size_t i = 0; i < children.size(); ++i) {
    Worker& w = workers_[i];
    w.local_rank = static_cast<int>(i);
    w.rank = children[i].rank;
    w.name = children[i].name;
    detail::SpawnOptions& options = children[i].start;
    options.signal_mask = child_mask;
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    auto closeAll = [&] {
      for (int fd : {out[0], out[1], err[0], err[1]}) {
        if (fd >= 0) ::close(fd);
      }
    };
    if (relay && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) {
      start_error_ = std::string("pipe: ") + std::strerror(errno);
      closeAll();
      return;
    }
    options.stdout_fd = out[1];
    options.stderr_fd = err[1];
    try {
      w.pid = detail::spawn(options);
    } catch (const Error& x) {
      start_error_ = w.name + ": " + x.what();
      start_failed_ = static_cast<int>(i);
      closeAll();
      return;
    }
    for (int fd : {out[1], err[1]}) {
      if (fd >= 0) ::close(fd);
    }
    w.running = true;
    w.fds[0] = out[0];
    w.fds[1] = err[0];
    ++running_;
  }
}

WorkerSet::~WorkerSet() {
  // Whatever is still there (a pipe held open by a grandchild) is closed; no child is left.
  for (auto& w : workers_) {
    if (w.running) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
    }
    for (int s = 0; s < 2; ++s) closeFd(w.fds[s]);
  }
}

bool WorkerSet::allStopped() const {
  if (running_ == 0) return false;
  for (const auto& w : workers_) {
    if (!w.running) continue;
    if (detail::processState(w.pid) != 'T') return false;
  }
  return true;
}

bool WorkerSet::pipesOpen() const {
  for (const auto& w : workers_) {
    if (w.fds[0] >= 0 || w.fds[1] >= 0) return true;
  }
  return false;
}

void WorkerSet::signalAll(int sig) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    ::kill(w.pid, sig);
    // A stopped worker acts on SIGTERM only once it runs again (scancel does the same).
    if (sig == SIGTERM) ::kill(w.pid, SIGCONT);
  }
}

void WorkerSet::addPipes(std::vector<pollfd>* fds) {
  polled_.clear();
  for (size_t i = 0; i < workers_.size(); ++i) {
    for (int s = 0; s < 2; ++s) {
      if (workers_[i].fds[s] < 0) continue;
      fds->push_back({workers_[i].fds[s], POLLIN, 0});
      polled_.push_back({static_cast<int>(i), s});
    }
  }
}

void WorkerSet::relay(const std::vector<pollfd>& fds, size_t first) {
  for (size_t p = 0; p < polled_.size(); ++p) {
    if (!(fds[first + p].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Worker& w = workers_[polled_[p].first];
    const int s = polled_[p].second;
    char buffer[65536];
    ssize_t n = ::read(w.fds[s], buffer, sizeof(buffer));
    const std::string prefix = fmt::format("[rank {}] ", w.rank);
    const int target = s == 0 ? STDOUT_FILENO : STDERR_FILENO;
    if (n > 0) {
      emitLines(target, prefix, w.pending[s], buffer, static_cast<size_t>(n), false, &w.last_error);
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      emitLines(target, prefix, w.pending[s], nullptr, 0, true, &w.last_error);
      closeFd(w.fds[s]);
    }
  }
}

void WorkerSet::reap(const std::function<void(const Worker&, int status)>& on_exit) {
  // Each of ours by its pid: a child another part of the process started is not ours to reap.
  for (auto& w : workers_) {
    int status = 0;
    if (!w.running || ::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.running = false;
    --running_;
    on_exit(w, status);
  }
}

}  // namespace collie
