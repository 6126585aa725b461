// Taking a fault: signals, _exit, a throw, a sleep, a cgroup.
#include "runtime/faults.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "collie/error.h"
#include "collie/log.h"
#include "core/strings.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

// The CFS bandwidth period. The kernel lets a group run its quota and then stops it for the
// rest of the period, so a long period turns "a fifth of a CPU" into 20 ms of work and 80 ms
// of nothing: a step shorter than that is either not slowed at all or held for 80 ms. 10 ms
// slows a rank evenly over a step, as a slower device would; the quota never goes under the
// kernel's 1 ms minimum, so shares under 0.1 get a longer period.
constexpr long kCfsPeriodUs = 10000;
constexpr long kMinQuotaUs = 1000;

// SIGSTOP; with a duration, a one-shot timer of the process's own sends it SIGCONT after
// that (the kernel continues a stopped process on SIGCONT, whoever sends it; none of its
// threads could): a machine that freezes and comes back. The timer is armed just before the
// stop: were this thread held off the CPU for the whole duration in between, the SIGCONT
// would come first and the stop would last until something else continued the rank. The
// config keeps the duration at 100 ms or more, far above such a delay. (A repeating timer
// would not help: since Linux 6.13 a timer whose signal is ignored, as SIGCONT's default
// action counts, is not re-armed.)
void stopFor(std::chrono::milliseconds duration) {
  timer_t timer{};
  const bool timed = duration.count() > 0;
  if (timed) {
    sigevent event{};
    event.sigev_notify = SIGEV_SIGNAL;
    event.sigev_signo = SIGCONT;
    if (::timer_create(CLOCK_MONOTONIC, &event, &timer) != 0)
      throw std::system_error(errno, std::generic_category(), "faults: a timer for SIGCONT");
    itimerspec when{};
    when.it_value.tv_sec = static_cast<time_t>(duration.count() / 1000);
    when.it_value.tv_nsec = static_cast<long>(duration.count() % 1000) * 1000000L;
    if (::timer_settime(timer, 0, &when, nullptr) != 0) {
      const int error = errno;
      ::timer_delete(timer);
      throw std::system_error(error, std::generic_category(), "faults: a timer for SIGCONT");
    }
  }
  ::raise(SIGSTOP);
  if (timed) ::timer_delete(timer);
}

}  // namespace

CpuLimit::CpuLimit(double share, const std::string& who, const std::string& tag,
                   const CgroupFiles& files) {
  const CgroupHierarchy controller = requireHierarchy("cpu", files.mountinfo, who);
  v2_ = controller.v2;
  // Groups of ranks that were killed are left behind empty; the next one removes them.
  group_ = makeGroup(controller, "cpu", "rank-", tag, who);
  previous_ =
      (fs::path(controller.mount) / currentGroup("cpu", v2_, files.membership).substr(1)).string();
  try {
    const long period = std::max(kCfsPeriodUs, static_cast<long>(std::ceil(kMinQuotaUs / share)));
    const long quota = std::max(kMinQuotaUs, static_cast<long>(share * period));
    if (v2_) {
      writeControl(group_ + "/cpu.max", fmt::format("{} {}", quota, period), who);
    } else {
      writeControl(group_ + "/cpu.cfs_period_us", std::to_string(period), who);
      writeControl(group_ + "/cpu.cfs_quota_us", std::to_string(quota), who);
    }
    writeControl(group_ + "/cgroup.procs", std::to_string(::getpid()), who);  // every thread
  } catch (...) {
    ::rmdir(group_.c_str());
    throw;
  }
}

CpuLimit::~CpuLimit() {
  std::ofstream(previous_ + "/cgroup.procs") << ::getpid() << std::flush;
  ::rmdir(group_.c_str());
  ::rmdir(fs::path(group_).parent_path().c_str());  // the last rank out removes collie/
}

CpuLimit::Throttling CpuLimit::throttling() const {
  Throttling t;
  std::ifstream in(group_ + "/cpu.stat");
  std::string name;
  long long value = 0;
  while (in >> name >> value) {
    if (name == "nr_periods") t.periods = static_cast<long>(value);
    if (name == "nr_throttled") t.throttled = static_cast<long>(value);
    if (name == "throttled_time") t.throttled_seconds = static_cast<double>(value) / 1e9;  // v1
    if (name == "throttled_usec") t.throttled_seconds = static_cast<double>(value) / 1e6;  // v2
  }
  return t;
}

Faults::Faults(const std::vector<config::FaultSpec>& all, int rank) : rank_(rank) {
  for (const auto& f : all) {
    if (f.rank == rank) mine_.push_back(f);
  }
  taken_.assign(mine_.size(), false);
}

Faults::~Faults() {
  if (!limit_) return;
  const auto t = limit_->throttling();
  logWarn(
      fmt::format("faults[{}]: rank {}'s CPU share ended: throttled in {} of {} periods "
                  "({:.2f} s)",
                  limit_index_, rank_, t.throttled, t.periods, t.throttled_seconds));
}

void Faults::beforeStep(int64_t step) {
  if (mine_.empty()) return;
  for (size_t i = 0; i < mine_.size(); ++i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (taken_[i] || mine_[i].at_step != step) continue;
      taken_[i] = true;
    }
    take(mine_[i]);
  }
}

void Faults::beforeCollective(uint64_t seq) {
  if (mine_.empty()) return;
  for (size_t i = 0; i < mine_.size(); ++i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (taken_[i] || mine_[i].at_collective != static_cast<int64_t>(seq)) continue;
      taken_[i] = true;
    }
    take(mine_[i]);
  }
}

void Faults::take(const config::FaultSpec& f) {
  const std::string what =
      fmt::format("faults[{}]: rank {} takes {} {}", f.index, rank_, f.describe(), f.when());
  logWarn(what);
  std::fflush(stdout);
  std::fflush(stderr);
  using Action = config::FaultSpec::Action;
  switch (f.action) {
    case Action::kKill:
      ::raise(SIGKILL);
      break;
    case Action::kStop:
      stopFor(f.delay);
      break;
    case Action::kExit:
      std::_Exit(f.exit_code);  // no destructors, no atexit: as abrupt as a crash
    case Action::kThrow:
      // Not a collie error: what a bug in user code throws.
      throw std::runtime_error("injected by " + what);
    case Action::kDelay:
      std::this_thread::sleep_for(f.delay);
      break;
    case Action::kSlow: {
      std::lock_guard<std::mutex> lock(mu_);
      limit_.reset();  // a second slow replaces the first
      limit_ = std::make_unique<CpuLimit>(f.cpu_share, "faults: action slow", "slow");
      limit_index_ = f.index;
      break;
    }
  }
}

double measureCpuShare(std::chrono::milliseconds duration) {
  auto cpu = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = cpu();
  volatile uint64_t x = 1;
  while (std::chrono::steady_clock::now() - start < duration) {
    for (int i = 0; i < 10000; ++i) x = x * 6364136223846793005ULL + 1;
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return (cpu() - cpu_start) / wall;
}

double cpuShareOf(const config::Experiment& e, int rank, int world, bool threads,
                  const std::string& backend) {
  if (e.cpu_share.empty()) return 0;
  if (threads) {
    throw ConfigError(fmt::format(
        "{}: launch.cpu_share limits each rank's process, but backend '{}' runs its ranks as "
        "threads of one process. HINT: use backend gloo or ucx",
        e.file, backend));
  }
  if (e.cpu_share.size() != 1 && static_cast<int>(e.cpu_share.size()) != world) {
    throw ConfigError(fmt::format(
        "{}: launch.cpu_share: expected one share for every rank or {} (one per rank), found {}",
        e.file, world, e.cpu_share.size()));
  }
  return e.cpu_share.size() == 1 ? e.cpu_share[0] : e.cpu_share[static_cast<size_t>(rank)];
}

void checkMemoryLimit(const config::Experiment& e, int world, bool threads, bool outside,
                      bool on_lab, const std::string& backend, const CgroupFiles& files) {
  if (e.memory_limit.empty()) return;
  auto refuse = [&e](const std::string& why) {
    return ConfigError(fmt::format("{}: launch.memory_limit {}", e.file, why));
  };
  if (threads) {
    throw refuse(fmt::format(
        "holds each rank's process, but backend '{}' runs its ranks as threads of one process. "
        "HINT: use backend gloo or ucx",
        backend));
  }
  if (outside) {
    throw refuse(
        "is set by collie's launcher as it starts each rank, and another launcher started "
        "these. HINT: use that launcher's own limit (srun --mem, systemd-run -p MemoryMax=)");
  }
  if (on_lab) {
    throw refuse(
        "is not available on the lab's emulated hosts: each sees the /sys of its own network "
        "namespace, without the cgroup hierarchies. HINT: run it without launch.lab");
  }
  if (e.memory_limit.size() != 1 && static_cast<int>(e.memory_limit.size()) != world) {
    throw refuse(fmt::format("expected one limit for every rank or {} (one per rank), found {}",
                             world, e.memory_limit.size()));
  }
  const bool limits_cpu =
      !e.cpu_share.empty() || std::any_of(e.faults.begin(), e.faults.end(), [](const auto& f) {
        return f.action == config::FaultSpec::Action::kSlow;
      });
  const std::string memory = findHierarchy("memory", files.mountinfo).mount;
  if (limits_cpu && !memory.empty() && memory == findHierarchy("cpu", files.mountinfo).mount) {
    throw refuse(fmt::format(
        "and a CPU limit (launch.cpu_share, a slow fault) cannot both hold a rank here: the "
        "memory and cpu controllers share one cgroup hierarchy ({}), in which a process is in "
        "one group, and the CPU limit would move the rank out of its memory group",
        memory));
  }
}

void checkFaultsFit(const config::Experiment& e, int world, bool threads,
                    const std::string& backend) {
  for (const auto& f : e.faults) {
    if (f.rank >= world) {
      throw ConfigError(
          fmt::format("faults[{}].rank: {} is not a rank of this job of {} rank(s) (0 to {})",
                      f.index, f.rank, world, world - 1));
    }
    if (threads && f.needsOwnProcess()) {
      throw ConfigError(fmt::format(
          "faults[{}]: {} needs ranks that are processes, but backend '{}' runs its ranks as "
          "threads of one process. HINT: use backend gloo or ucx, or action throw or delay",
          f.index, f.describe(), backend));
    }
  }
}

}  // namespace collie
