// Fault injection (`faults:` in docs/config.md): the faults of an experiment that
// one rank takes, each once, at its training step or collective, logged by that rank before
// it acts. Tests and demos use the same mechanism; `slow` emulates a slower machine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "runtime/cgroup.h"

namespace collie {

// This process in a cgroup of its own under the `cpu` controller (cgroup v1's cfs quota, or
// v2's cpu.max), limited to `share` of one CPU; back in the cgroup it came from on
// destruction. Used by launch.cpu_share and the `slow` fault (`tag` tells their groups
// apart: a slow fault moves a rank already limited by its share into a second group).
class CpuLimit {
 public:
  // Throws ConfigError, starting with `who`, when no controller is available or the cgroup
  // cannot be made (not root), naming what is missing.
  CpuLimit(double share, const std::string& who, const std::string& tag,
           const CgroupFiles& files = {});
  ~CpuLimit();
  CpuLimit(const CpuLimit&) = delete;
  CpuLimit& operator=(const CpuLimit&) = delete;

  const std::string& path() const { return group_; }

  // The cfs statistics of the group so far (cpu.stat): periods with runnable threads, those
  // in which the quota ran out, and the time throttled.
  struct Throttling {
    long periods = 0, throttled = 0;
    double throttled_seconds = 0;
  };
  Throttling throttling() const;

 private:
  std::string group_;     // the cgroup made for this process
  std::string previous_;  // the cgroup it was in
  bool v2_ = false;
};

class Faults {
 public:
  Faults() = default;
  // The faults of `all` that `rank` takes.
  Faults(const std::vector<config::FaultSpec>& all, int rank);
  // Ends a CPU limit, logging how often it throttled the rank.
  ~Faults();

  // Before training step `step` (1-based) and before the collective numbered `seq`; a fault
  // due here is taken: the process is killed, stopped or exits, an exception is thrown, the
  // call sleeps, or the process's CPU is limited from now on. Safe from two threads.
  void beforeStep(int64_t step);
  void beforeCollective(uint64_t seq);

 private:
  void take(const config::FaultSpec& fault);

  int rank_ = 0;
  std::vector<config::FaultSpec> mine_;
  std::vector<bool> taken_;
  std::mutex mu_;
  std::unique_ptr<CpuLimit> limit_;
  int limit_index_ = 0;  // the fault that set it
};

// How much of one CPU this thread gets while it spins for `duration` (CPU time over wall
// time): what a cpu_share leaves it, less what other processes take.
double measureCpuShare(std::chrono::milliseconds duration);

// launch.cpu_share for `rank` of `world`: its share (one for every rank, or one per rank), or
// 0 for none. Throws ConfigError for a list of another length, or ranks that are threads.
double cpuShareOf(const config::Experiment& e, int rank, int world, bool threads,
                  const std::string& backend);

// Throws ConfigError for a launch.memory_limit this job cannot take: a list of another length
// than 1 or `world`, ranks that are threads, ranks another launcher started (`outside`: the
// limit is one collie's launcher sets as it starts them), the lab's hosts, or a CPU limit in
// the same cgroup hierarchy (cgroup v2, or v1 with cpu and memory mounted together: a process
// is in one group of a hierarchy, and the CPU limit moves it out of its memory group).
void checkMemoryLimit(const config::Experiment& e, int world, bool threads, bool outside,
                      bool on_lab, const std::string& backend, const CgroupFiles& files = {});

// Throws ConfigError for a fault this job cannot take: a rank outside its `world`, or one
// that ends, freezes or limits a process (kill, stop, exit, slow) when the ranks are threads
// of one process (`backend` names the backend that runs them so).
void checkFaultsFit(const config::Experiment& e, int world, bool threads,
                    const std::string& backend);

}  // namespace collie
