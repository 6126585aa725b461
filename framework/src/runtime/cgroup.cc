// Reading the mount table and membership files, making and reading groups.
#include "runtime/cgroup.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "collie/error.h"
#include "core/strings.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

bool hasWord(const std::string& list, const std::string& word) {
  for (const auto& w : detail::split(list, ',')) {
    if (w == word) return true;
  }
  return false;
}

// The number after `name` in a file of "name value" lines (memory.oom_control,
// memory.events); -1 when the file or the line is missing.
long long valueIn(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  std::string key;
  long long value = 0;
  while (in >> key >> value) {
    if (key == name) return value;
  }
  return -1;
}

}  // namespace

CgroupHierarchy findHierarchy(const std::string& controller, const std::string& mountinfo) {
  std::ifstream in(mountinfo);
  std::string unified;
  for (std::string line; std::getline(in, line);) {
    // "36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:14 - cgroup cgroup rw,cpu"
    // "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate"
    const auto fields = detail::split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    if (dash[1] == "cgroup" && hasWord(dash[3], controller)) return {fields[4], false};
    if (dash[1] == "cgroup2") unified = fields[4];
  }
  if (!unified.empty()) {
    std::ifstream controllers(unified + "/cgroup.controllers");
    for (std::string word; controllers >> word;) {
      if (word == controller) return {unified, true};
    }
  }
  return {};
}

CgroupHierarchy requireHierarchy(const std::string& controller, const std::string& mountinfo,
                                 const std::string& who) {
  CgroupHierarchy found = findHierarchy(controller, mountinfo);
  if (found.mount.empty()) {
    throw ConfigError(fmt::format(
        "{} needs the cgroup {} controller, and this machine has none (no cgroup v1 hierarchy "
        "with the {} option in {}, and no cgroup2 hierarchy whose cgroup.controllers lists {})",
        who, controller, controller, mountinfo, controller));
  }
  return found;
}

std::string currentGroup(const std::string& controller, bool v2, const std::string& membership) {
  std::ifstream in(membership);
  for (std::string line; std::getline(in, line);) {
    // "4:cpu:/collie/rank-12", "4:cpu,cpuacct:/", "0::/user.slice"
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    if (v2 ? line.rfind("0::", 0) == 0 : hasWord(controllers, controller))
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

void removeGroupsOfGoneProcesses(const std::string& parent, const std::string& prefix) {
  std::error_code ec;
  const std::string pattern = prefix + "%ld-";
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    long pid = 0;
    if (entry.is_directory() && std::sscanf(name.c_str(), pattern.c_str(), &pid) == 1 && pid > 0 &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::rmdir(entry.path().c_str());
    }
  }
}

std::string makeGroup(const CgroupHierarchy& hierarchy, const std::string& controller,
                      const std::string& prefix, const std::string& tag, const std::string& who) {
  const fs::path parent = fs::path(hierarchy.mount) / "collie";
  removeGroupsOfGoneProcesses(parent.string(), prefix);
  const std::string enable = "+" + controller;
  if (hierarchy.v2) {
    // v2 hands a controller down only through subtree_control, at each level, and only in
    // groups without processes of their own: collie/ holds none. The top may refuse it when
    // it holds processes (a container's cgroup namespace), which root cannot change.
    std::ofstream top(hierarchy.mount + "/cgroup.subtree_control");
    top << enable << std::flush;
    if (!top && errno == EBUSY) {
      throw ConfigError(fmt::format(
          "{}: cannot hand the {} controller down from {}: that group holds processes of its "
          "own (as a container's cgroup namespace does), and cgroup v2 hands controllers down "
          "only from groups without. HINT: run collie from a cgroup without processes, or on "
          "the host",
          who, controller, hierarchy.mount));
    }
  }
  const fs::path group = parent / fmt::format("{}{}-{}", prefix, ::getpid(), tag);
  // The last one out of another job removes collie/: make it again when it went between.
  int made = -1;
  std::error_code ec;
  for (int attempt = 0; attempt < 5 && made != 0; ++attempt) {
    fs::create_directories(parent, ec);
    if (hierarchy.v2) writeControl(parent.string() + "/cgroup.subtree_control", enable, who);
    made = ::mkdir(group.c_str(), 0755);
    if (made != 0 && errno == EEXIST) made = 0;
    if (made != 0 && errno != ENOENT) break;
  }
  if (made != 0) {
    throw ConfigError(fmt::format("{}: cannot make the cgroup {}: {}. HINT: it needs root", who,
                                  group.string(), std::strerror(errno)));
  }
  return group.string();
}

MemoryGroup::MemoryGroup(uint64_t limit, const std::string& tag, const std::string& who,
                         const CgroupFiles& files)
    : who_(who), limit_(limit) {
  CgroupHierarchy hierarchy = requireHierarchy("memory", files.mountinfo, who);
  v2_ = hierarchy.v2;
  // On v1 the groups go under the launcher's own (a Slurm step's, a systemd unit's), whose
  // limit then holds them too; v2 hands controllers down only from groups without processes,
  // which the launcher's is not, so there they go under the top of the hierarchy.
  if (!v2_) hierarchy.mount += currentGroup("memory", false, files.membership);
  // The groups of launchers that were killed (a launcher removes its own).
  group_ = makeGroup(hierarchy, "memory", "job-", tag, who);
  try {
    const std::string bytes = std::to_string(limit);
    if (v2_) {
      writeControl(group_ + "/memory.max", bytes, who);
      swap_held_ = fs::exists(group_ + "/memory.swap.max");
      if (swap_held_) writeControl(group_ + "/memory.swap.max", "0", who);
    } else {
      // memsw (memory and swap together) may not be set below the memory limit: that first.
      writeControl(group_ + "/memory.limit_in_bytes", bytes, who);
      swap_held_ = fs::exists(group_ + "/memory.memsw.limit_in_bytes");
      if (swap_held_) writeControl(group_ + "/memory.memsw.limit_in_bytes", bytes, who);
    }
    // What the group counted before its worker: a group of the same name left behind by an
    // earlier attempt keeps its counts.
    oom_kills_before_ = count(v2_ ? "memory.events" : "memory.oom_control", "oom_kill");
    at_limit_before_ = limitHits();
  } catch (...) {
    ::rmdir(group_.c_str());
    throw;
  }
}

MemoryGroup::~MemoryGroup() {
  ::rmdir(group_.c_str());
  ::rmdir(fs::path(group_).parent_path().c_str());  // the last one out removes collie/
}

long long MemoryGroup::count(const std::string& file, const std::string& name) const {
  if (file.empty()) return 0;
  return std::max(0LL, valueIn(group_ + "/" + file, name));
}

long long MemoryGroup::limitHits() const {
  if (v2_) return count("memory.events", "oom");  // OOMs at this group's own limit
  // v1 has no such count (memory.failcnt stays 0 through an OOM kill on the kernels here):
  // the group's peak within a few pages of its limit says it reached it.
  const uint64_t slack = std::max<uint64_t>(uint64_t{4} << 20, limit_ / 50);
  return peakBytes() + slack >= limit_ ? 1 : 0;
}

long MemoryGroup::oomKills() const {
  return static_cast<long>(count(v2_ ? "memory.events" : "memory.oom_control", "oom_kill") -
                           oom_kills_before_);
}

bool MemoryGroup::killedAtLimit() const {
  // oom_kill counts any OOM kill of the group's processes, a machine-wide one too; the group
  // must also have reached its own limit (a group left behind at its limit, v1, counts as
  // reached again: its oom_kill count still has to rise).
  return oomKills() > 0 && limitHits() > at_limit_before_;
}

uint64_t MemoryGroup::peakBytes() const {
  std::ifstream in(group_ + (v2_ ? "/memory.peak" : "/memory.max_usage_in_bytes"));
  uint64_t bytes = 0;
  return in >> bytes ? bytes : 0;
}

}  // namespace collie
