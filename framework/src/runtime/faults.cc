// Taking a fault: signals, _exit, a throw, a sleep, a cgroup.
#include "runtime/faults.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "collie/error.h"
#include "collie/log.h"
#include "core/strings.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

constexpr long kCfsPeriodUs = 100000;

bool hasWord(const std::string& list, const std::string& word) {
  for (const auto& w : detail::split(list, ',')) {
    if (w == word) return true;
  }
  return false;
}

// Where the cgroup v1 hierarchy holding the `cpu` controller is mounted ("" when none is).
std::string cpuControllerMount() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // "36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:14 - cgroup cgroup rw,cpu"
    const auto fields = detail::split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    if (dash[1] == "cgroup" && hasWord(dash[3], "cpu")) return fields[4];
  }
  return "";
}

// This process's cgroup in the hierarchy of the `cpu` controller ("/" at its root).
std::string currentCpuGroup() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "4:cpu:/collie/rank-12" or "4:cpu,cpuacct:/"
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    if (hasWord(line.substr(first + 1, second - first - 1), "cpu")) return line.substr(second + 1);
  }
  return "/";
}

void writeControl(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value << std::flush;
  if (!out) {
    throw ConfigError(fmt::format("cannot write '{}' to {}: {}. HINT: action slow needs root",
                                  value, path, std::strerror(errno)));
  }
}

}  // namespace

CpuLimit::CpuLimit(double share) {
  const std::string mount = cpuControllerMount();
  if (mount.empty()) {
    throw ConfigError(
        "faults: action slow needs the cgroup v1 cpu controller, and this machine has none "
        "mounted (/proc/self/mountinfo lists no 'cgroup' file system with the cpu option; a "
        "cgroup2-only machine cannot take it yet). HINT: action delay slows a rank without it");
  }
  const fs::path parent = fs::path(mount) / "collie";
  std::error_code ec;
  // Groups of ranks that were killed are left behind empty; a busy one refuses rmdir.
  for (const auto& entry : fs::directory_iterator(parent, ec)) ::rmdir(entry.path().c_str());
  fs::create_directories(parent, ec);
  const fs::path group = parent / fmt::format("rank-{}", ::getpid());
  if (::mkdir(group.c_str(), 0755) != 0 && errno != EEXIST) {
    throw ConfigError(
        fmt::format("faults: cannot make the cgroup {}: {}. HINT: action slow needs "
                    "root",
                    group.string(), std::strerror(errno)));
  }
  group_ = group.string();
  previous_ = (fs::path(mount) / currentCpuGroup().substr(1)).string();
  try {
    writeControl(group_ + "/cpu.cfs_period_us", std::to_string(kCfsPeriodUs));
    const long quota = std::max(1000L, static_cast<long>(share * kCfsPeriodUs));
    writeControl(group_ + "/cpu.cfs_quota_us", std::to_string(quota));
    writeControl(group_ + "/cgroup.procs", std::to_string(::getpid()));  // every thread
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

Faults::Faults(const std::vector<config::FaultSpec>& all, int rank) : rank_(rank) {
  for (const auto& f : all) {
    if (f.rank == rank) mine_.push_back(f);
  }
  taken_.assign(mine_.size(), false);
}

CpuLimit::Throttling CpuLimit::throttling() const {
  Throttling t;
  std::ifstream in(group_ + "/cpu.stat");
  std::string name;
  long long value = 0;
  while (in >> name >> value) {
    if (name == "nr_periods") t.periods = static_cast<long>(value);
    if (name == "nr_throttled") t.throttled = static_cast<long>(value);
    if (name == "throttled_time") t.throttled_seconds = static_cast<double>(value) / 1e9;
  }
  return t;
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
      ::raise(SIGSTOP);
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
      limit_ = std::make_unique<CpuLimit>(f.cpu_share);
      limit_index_ = f.index;
      break;
    }
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
