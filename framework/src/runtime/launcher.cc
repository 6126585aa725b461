// supervise: one short loop over the children's pipes and the signalfd, with the teardown
// policy deciding when to stop them; launchWorkers runs it over a run's workers.
#include "runtime/launcher.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "collie/error.h"
#include "collie/log.h"
#include "core/strings.h"
#include "runtime/cgroup.h"
#include "runtime/progress.h"
#include "runtime/teardown.h"
#include "runtime/worker_set.h"

namespace collie {

std::string selfExecutable() {
  char path[4096];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) {
    throw Error(ErrorKind::kInternal,
                std::string("cannot find the collie executable: ") + std::strerror(errno));
  }
  return std::string(path, static_cast<size_t>(n));
}

uint16_t pickFreePort(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw CommError(std::string("cannot open a socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = INADDR_ANY;
  socklen_t len = sizeof(sa);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw CommError("cannot find a free port on " + addr + ": " + std::strerror(err));
  }
  ::close(fd);
  return ntohs(sa.sin_port);
}

LaunchOutcome launchWorkers(const LaunchSpec& spec) {
  COLLIE_CHECK(!spec.argv.empty() && spec.nproc >= 1, "launchWorkers: empty command");
  Supervision how = spec.watch;
  how.world = spec.nproc * spec.nnodes;
  return supervise(workersOf(spec), how);
}

namespace {

// How a worker killed by the kernel's OOM killer at its memory limit died: "was killed by
// the kernel's OOM killer at its memory limit (...)"; "" for any other end.
std::string killedAtMemoryLimit(const MemoryGroup* group, int status) {
  if (group == nullptr || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL ||
      !group->killedAtLimit())
    return "";
  const uint64_t peak = group->peakBytes();
  return fmt::format("was killed by the kernel's OOM killer at its memory limit ({} {:.1f} MiB{})",
                     group->who(), static_cast<double>(group->limit()) / (1 << 20),
                     peak == 0 ? ""
                               : fmt::format(", its cgroup's peak {:.1f} MiB",
                                             static_cast<double>(peak) / (1 << 20)));
}

}  // namespace

LaunchOutcome supervise(std::vector<ChildProcess> children, const Supervision& how) {
  using Clock = Teardown::Clock;
  std::vector<std::shared_ptr<const MemoryGroup>> memory;  // each worker's, by its index
  for (const auto& c : children) memory.push_back(c.memory);
  BlockedSignals signals;  // they arrive through its fd; children get the old mask back
  WorkerSet workers(std::move(children), signals.previousMask(), how.relay_output);
  Teardown teardown(how.failure_grace, how.kill_grace);
  LaunchOutcome outcome;
  const Worker* failed = nullptr;  // the first child that failed
  if (!workers.startError().empty()) {
    outcome.exit_code = 1;  // out of a resource (a pipe): it may go better another time
    outcome.failure = "could not be started: " + workers.startError();
    if (const Worker* w = workers.notStarted()) {
      // spawn() refused it: as a shell reports a command it cannot run, and never restarted.
      outcome.exit_code = 127;
      outcome.not_started = true;
      outcome.failed_rank = w->rank;
    }
    teardown.failed(Clock::now(), std::chrono::milliseconds(0));
  }
  std::string left_early;  // the children that exited with 0 while others still ran
  // Workers killed at their memory limit, described, in the order they were reaped.
  std::vector<std::pair<const Worker*, std::string>> out_of_memory;
  auto onExit = [&](const Worker& w, int status) {
    const std::string oom = killedAtMemoryLimit(memory.at(w.local_rank).get(), status);
    if (!oom.empty())
      out_of_memory.emplace_back(&w, fmt::format("{} (pid {}) {}", w.name, w.pid, oom));
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok && how.early_exit_is_suspect && outcome.failure.empty() && !teardown.stopping() &&
        workers.running() > 0) {
      left_early += fmt::format("{}{} (pid {})", left_early.empty() ? "" : ", ", w.name, w.pid);
    }
    if (ok || !outcome.failure.empty() || outcome.interrupted || teardown.stopping()) return;
    outcome.failure = oom.empty()
                          ? fmt::format("{} (pid {}) {}", w.name, w.pid, describeExit(status))
                          : out_of_memory.back().second;
    outcome.out_of_memory = !oom.empty();
    outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    outcome.failed_rank = w.rank;
    outcome.failed_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    failed = &w;
    if (workers.running() > 0) {
      logError(fmt::format("{}: {}; stopping the other {} {}", how.who, outcome.failure,
                           workers.running(), how.noun));
    }
    teardown.failed(Clock::now());
  };

  // The stall watch reads the workers' progress files once a second while none has failed.
  const bool watching = !how.progress_dir.empty() && how.stall_warning.count() > 0;
  StallWatch stalls(how.stall_warning, describeLiveness);
  Clock::time_point next_watch = Clock::now();

  Clock::time_point drain_until = Clock::time_point::max();  // a grandchild may hold a pipe
  // Since when every worker still running has been stopped, after a failure (max: not).
  Clock::time_point all_stopped_since = Clock::time_point::max();
  constexpr std::chrono::seconds kStoppedForGood{1};
  while (workers.running() > 0 || (workers.pipesOpen() && Clock::now() < drain_until)) {
    if (watching && !teardown.stopping() && outcome.failure.empty() && workers.running() > 0 &&
        Clock::now() >= next_watch) {
      next_watch = Clock::now() + std::chrono::seconds(1);
      try {
        const std::string line = stalls.observe(readProgress(how.progress_dir, how.progress_run),
                                                how.world, progressNowMicros());
        if (!line.empty()) logWarn(how.who + ": " + line);
      } catch (const std::exception& e) {  // the watch helps; it never stops the launcher
        logDebug(how.who + ": stall watch: " + e.what());
      }
    }
    if (workers.running() == 0 && drain_until == Clock::time_point::max())
      drain_until = Clock::now() + std::chrono::seconds(1);
    // The grace lets the others report their own error; a stopped worker cannot. Workers
    // all stopped for a second get none (a timed `stop` of under a second continues first).
    if (!outcome.failure.empty() && !teardown.stopping() && workers.allStopped()) {
      if (all_stopped_since == Clock::time_point::max()) all_stopped_since = Clock::now();
      if (Clock::now() >= all_stopped_since + kStoppedForGood)
        teardown.failed(Clock::now(), std::chrono::milliseconds(0));
    } else {
      all_stopped_since = Clock::time_point::max();
    }
    while (int sig = teardown.due(Clock::now())) workers.signalAll(sig);

    Clock::time_point next = std::min(teardown.next(), drain_until);
    if (all_stopped_since != Clock::time_point::max())
      next = std::min(next, all_stopped_since + kStoppedForGood);
    if (watching) next = std::min(next, next_watch);
    // Without relayed pipes a child's exit wakes the poll through SIGCHLD on the signalfd,
    // which another thread of the process may take instead: look at least every 100 ms.
    int timeout_ms = how.relay_output ? 1000 : 100;
    if (next != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<long>(left.count() + 1, 0, timeout_ms));
    }
    std::vector<pollfd> fds{{signals.fd(), POLLIN, 0}};
    workers.addPipes(&fds);
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;

    for (int sig : signals.read()) {
      if (outcome.interrupted) {  // a second signal: stop at once
        teardown.killNow(Clock::now());
        continue;
      }
      outcome.interrupted = true;
      outcome.exit_code = 128 + sig;
      logWarn(fmt::format("{}: {} received; forwarding it to {} {}", how.who, signalName(sig),
                          workers.running(), how.noun));
      workers.signalAll(sig);
      teardown.forwarded(Clock::now());
    }
    while (int sig = teardown.due(Clock::now())) workers.signalAll(sig);
    workers.relay(fds, 1);
    workers.reap(onExit);
  }
  if (failed != nullptr && !failed->last_error.empty() && !outcome.out_of_memory) {
    outcome.failure += ": " + failed->last_error;  // its own words, read to the end
  }
  if (!out_of_memory.empty() && !outcome.interrupted) {
    // A worker killed at its memory limit is the cause, even when another's failure (its
    // peer gone) was reaped first.
    const std::string first_seen = outcome.out_of_memory ? "" : outcome.failure;
    outcome.failure = out_of_memory.front().second;
    outcome.failed_rank = out_of_memory.front().first->rank;
    outcome.failed_signal = SIGKILL;
    outcome.exit_code = 1;  // as for any worker a signal ended
    outcome.out_of_memory = true;
    if (out_of_memory.size() > 1) {
      std::vector<std::string> others;
      for (size_t i = 1; i < out_of_memory.size(); ++i)
        others.push_back(out_of_memory[i].first->name);
      outcome.failure += fmt::format("; {} too", detail::join(others, ", "));
    }
    if (!first_seen.empty())
      outcome.failure += fmt::format(" (first seen to fail: {})", first_seen);
    failed = nullptr;
  }
  if (failed != nullptr && !left_early.empty()) {
    // A rank that returns 0 before the others finish has left the job: that is a failure
    // too, and most likely the cause of this one.
    outcome.failure += fmt::format(
        " (before it, {} had exited with code 0 while other ranks were still running)", left_early);
  }
  return outcome;
}

}  // namespace collie
