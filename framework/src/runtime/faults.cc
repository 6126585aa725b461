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

bool hasWord(const std::string& list, const std::string& word) {
  for (const auto& w : detail::split(list, ',')) {
    if (w == word) return true;
  }
  return false;
}

// Where a cgroup hierarchy with the `cpu` controller is mounted ("" when none is): a v1
// hierarchy holding it, else the v2 (unified) hierarchy when its cgroup.controllers lists it.
struct CpuController {
  std::string mount;
  bool v2 = false;
};
CpuController cpuController(const std::string& mountinfo) {
  std::ifstream in(mountinfo);
  std::string unified;
  for (std::string line; std::getline(in, line);) {
    // "36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:14 - cgroup cgroup rw,cpu"
    // "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate"
    const auto fields = detail::split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    if (dash[1] == "cgroup" && hasWord(dash[3], "cpu")) return {fields[4], false};
    if (dash[1] == "cgroup2") unified = fields[4];
  }
  if (!unified.empty()) {
    std::ifstream controllers(unified + "/cgroup.controllers");
    for (std::string word; controllers >> word;) {
      if (word == "cpu") return {unified, true};
    }
  }
  return {};
}

// This process's cgroup in the hierarchy of the `cpu` controller ("/" at its root): v1's
// line naming cpu, v2's "0::" line.
std::string currentCpuGroup(bool v2, const std::string& membership) {
  std::ifstream in(membership);
  for (std::string line; std::getline(in, line);) {
    // "4:cpu:/collie/rank-12", "4:cpu,cpuacct:/", "0::/user.slice"
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    if (v2 ? line.rfind("0::", 0) == 0 : hasWord(controllers, "cpu"))
      return line.substr(second + 1);
  }
  return "/";
}

void writeControl(const std::string& path, const std::string& value, const std::string& who) {
  std::ofstream out(path);
  out << value << std::flush;
  if (!out) {
    throw ConfigError(fmt::format("{}: cannot write '{}' to {}: {}. HINT: it needs root", who,
                                  value, path, std::strerror(errno)));
  }
}

}  // namespace

CpuLimit::CpuLimit(double share, const std::string& who, const std::string& tag,
                   const CgroupFiles& files) {
  const CpuController controller = cpuController(files.mountinfo);
  if (controller.mount.empty()) {
    throw ConfigError(who +
                      " needs the cgroup cpu controller, and this machine has none (no cgroup "
                      "v1 hierarchy with the cpu option in /proc/self/mountinfo, and no cgroup2 "
                      "hierarchy whose cgroup.controllers lists cpu)");
  }
  v2_ = controller.v2;
  const fs::path parent = fs::path(controller.mount) / "collie";
  std::error_code ec;
  // Groups of ranks that were killed are left behind empty. Only those of processes that are
  // gone: another rank's group is empty too between its mkdir and its move into it.
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    long pid = 0;
    if (entry.is_directory() && std::sscanf(name.c_str(), "rank-%ld-", &pid) == 1 && pid > 0 &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::rmdir(entry.path().c_str());
    }
  }
  if (v2_) {
    // cgroup v2 delegates a controller to children only through subtree_control, and only in
    // groups without processes of their own: collie/ holds none.
    std::ofstream(controller.mount + "/cgroup.subtree_control") << "+cpu" << std::flush;
  }
  const fs::path group = parent / fmt::format("rank-{}-{}", ::getpid(), tag);
  // The last rank out of another job removes collie/: make it again when it went between.
  int made = -1;
  for (int attempt = 0; attempt < 5 && made != 0; ++attempt) {
    fs::create_directories(parent, ec);
    if (v2_) writeControl(parent.string() + "/cgroup.subtree_control", "+cpu", who);
    made = ::mkdir(group.c_str(), 0755);
    if (made != 0 && errno == EEXIST) made = 0;
    if (made != 0 && errno != ENOENT) break;
  }
  if (made != 0) {
    throw ConfigError(fmt::format("{}: cannot make the cgroup {}: {}. HINT: it needs root", who,
                                  group.string(), std::strerror(errno)));
  }
  group_ = group.string();
  previous_ =
      (fs::path(controller.mount) / currentCpuGroup(v2_, files.membership).substr(1)).string();
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
