// cgroups, for the limits collie puts on its ranks: where a controller's hierarchy is
// mounted, which group this process is in, writing a control file; and the memory group a
// launcher makes for each worker it starts (launch.memory_limit). The CPU limit of a rank
// (launch.cpu_share, the `slow` fault) is runtime/faults.h's CpuLimit, built on the same.
#pragma once

#include <cstdint>
#include <string>

namespace collie {

// Where the hierarchies are found and this process's place in them: the kernel's files, or a
// mount table and a membership file that a test wrote (with the mount point in it a folder of
// its own, standing for the cgroup file system).
struct CgroupFiles {
  std::string mountinfo = "/proc/self/mountinfo";
  std::string membership = "/proc/self/cgroup";
};

// Where the hierarchy holding `controller` ("cpu", "memory") is mounted: a cgroup v1 hierarchy
// with it among its options, else the v2 (unified) hierarchy when its cgroup.controllers
// lists it. `mount` is "" when there is none.
struct CgroupHierarchy {
  std::string mount;
  bool v2 = false;
};
CgroupHierarchy findHierarchy(const std::string& controller, const std::string& mountinfo);

// findHierarchy's, or ConfigError starting with `who` and naming what is missing.
CgroupHierarchy requireHierarchy(const std::string& controller, const std::string& mountinfo,
                                 const std::string& who);

// This process's group in that hierarchy ("/" at its root): v1's line naming `controller`,
// v2's "0::" line.
std::string currentGroup(const std::string& controller, bool v2, const std::string& membership);

// Writes `value` into the control file `path`. Throws ConfigError, starting with `who`, when
// the kernel refuses it (not root, a value out of range).
void writeControl(const std::string& path, const std::string& value, const std::string& who);

// Removes the empty groups in `parent` named `prefix` PID "-..." whose process PID is gone
// (left behind by a process that was killed). Not those of live processes: a group is empty
// too between its mkdir and its first process.
void removeGroupsOfGoneProcesses(const std::string& parent, const std::string& prefix);

// Makes the group `prefix` PID "-" `tag` (PID: this process's) in the folder collie/ of
// `hierarchy`, handing `controller` down to it on v2; first removes the groups in collie/ with
// that prefix whose processes are gone. Returns its path. Throws ConfigError, starting with
// `who`, when it cannot be made (not root).
std::string makeGroup(const CgroupHierarchy& hierarchy, const std::string& controller,
                      const std::string& prefix, const std::string& tag, const std::string& who);

// A group under the memory controller that a launcher makes for one worker before starting
// it: the worker enters it before exec (SpawnOptions::cgroups), so everything it allocates
// counts against `limit`, and with no swap to escape to where the kernel accounts swap (v1's
// memory.memsw, v2's memory.swap.max). On v1 it is made under the launcher's own group. A worker
// that goes over is killed by the kernel's OOM killer (SIGKILL); the group then says so, which a
// bare SIGKILL does not. The group is named after this process and `tag`, and removed on
// destruction (its worker must be gone by then).
class MemoryGroup {
 public:
  // Throws ConfigError, starting with `who`, when there is no memory controller or the group
  // cannot be made (not root), naming what is missing.
  MemoryGroup(uint64_t limit, const std::string& tag, const std::string& who,
              const CgroupFiles& files = {});
  ~MemoryGroup();
  MemoryGroup(const MemoryGroup&) = delete;
  MemoryGroup& operator=(const MemoryGroup&) = delete;

  const std::string& path() const { return group_; }
  // The file a process writes "0" into to enter the group.
  std::string procsFile() const { return group_ + "/cgroup.procs"; }
  uint64_t limit() const { return limit_; }
  const std::string& who() const { return who_; }
  // How many times the kernel's OOM killer killed a process of the group since it was made
  // (v1: memory.oom_control's oom_kill, v2: memory.events'); 0 when the kernel does not count.
  long oomKills() const;
  // The OOM killer killed a process of the group, and the group had reached its own limit
  // (v1: its peak within 2 % or 4 MiB of it, v2: memory.events' oom): not a kill because the
  // machine ran out.
  bool killedAtLimit() const;
  // Swap is held at 0 (memory.memsw.limit_in_bytes or memory.swap.max exists): without
  // swap accounting a worker over its limit may swap rather than be killed.
  bool swapHeld() const { return swap_held_; }
  // The most memory the group held (v1: memory.max_usage_in_bytes, v2: memory.peak); 0 when
  // the kernel does not say.
  uint64_t peakBytes() const;

 private:
  std::string group_;
  std::string who_;
  long long count(const std::string& file, const std::string& name) const;
  long long limitHits() const;

  uint64_t limit_ = 0;
  bool v2_ = false;
  bool swap_held_ = false;
  long long oom_kills_before_ = 0, at_limit_before_ = 0;
};

}  // namespace collie
