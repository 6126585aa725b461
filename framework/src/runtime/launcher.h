// collie's local launcher: starts this node's workers as processes (util/spawn.h), prefixes
// their output with the rank, forwards SIGINT/SIGTERM/SIGHUP, and tears the whole group down
// when one worker fails. Workers die with the launcher (PR_SET_PDEATHSIG), so no process
// outlives it. The lab's launcher of emulated hosts is the same loop over other children.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/spawn.h"

namespace collie {

class MemoryGroup;

// How a launch watches its children.
struct Supervision {
  std::string who = "launcher";  // how its log lines begin
  std::string noun = "rank(s)";  // what its children are, in its log lines
  // Prefix each line a child prints with "[rank N] " (false: children write to our output).
  bool relay_output = true;
  // A child that exits 0 while others run has left the job, which is named beside a later
  // failure as its likely cause (false: children may finish at different times).
  bool early_exit_is_suspect = true;
  // After the first child fails, how long the others may take to report their own error
  // before they are sent SIGTERM; then how long before SIGKILL.
  std::chrono::milliseconds failure_grace{5000};
  std::chrono::milliseconds kill_grace{5000};
  // The workers' progress files (runtime/progress.h) for one run: once a collective has
  // waited stall_warning, the launcher names the ranks it waits for ("" or 0: no watch).
  std::string progress_dir;
  std::chrono::milliseconds stall_warning{0};
  int progress_run = -1;  // the run the files must name (their matrix index)
  int world = 0;          // the job's ranks, every node's
};

struct LaunchSpec {
  std::vector<std::string> argv;  // the worker command; argv[0] is a path
  int nproc = 1;                  // workers on this node
  int nnodes = 1, node_rank = 0;  // global rank = node_rank * nproc + local rank
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;
  // collie's own workers (the protocol by which collie runs itself): COLLIE_EXPERIMENT is the
  // run of the file the workers do, COLLIE_RESULT the file where the reporting rank leaves its
  // result as JSON for this launcher to read.
  int experiment = 0;
  std::string result_path;
  int threads_per_rank = 1;            // OMP_NUM_THREADS of each worker
  bool cpu_affinity = false;           // give each worker threads_per_rank CPUs of its own
  std::vector<std::string> extra_env;  // NAME=VALUE for every worker
  // launch.memory_limit in bytes: one for every rank, or one per rank of the job (empty:
  // none). Each worker starts in a memory cgroup of its own (runtime/cgroup.h).
  std::vector<uint64_t> memory_limits;
  Supervision watch;  // its graces and stall watch (`world` is set from above)
};

struct LaunchOutcome {
  int exit_code = 0;  // 0; the failed worker's code; 128+signal when interrupted
  // "rank 2 (pid 812) was killed by signal 9 (SIGKILL)" or "rank 1 (pid 80) exited with
  // code 2: <its last collie error line>"; "" on success.
  std::string failure;
  int failed_rank = -1;   // the first worker that failed (-1: none, or none started)
  int failed_signal = 0;  // the signal that killed it (0: it exited)
  bool interrupted = false;
  // A child could not be started (spawn() refused it: exit code 127, failure "could not be
  // started: rank 1: cannot run ..."): the same every time, so never restarted.
  bool not_started = false;
  // The failed worker was killed by the kernel's OOM killer at its memory limit: the same
  // every time, so never restarted.
  bool out_of_memory = false;
};

// The launcher was interrupted (SIGINT, SIGTERM, SIGHUP) and stopped its workers: collie
// exits 128 + signal, as a shell reports a process killed by it.
struct Interrupted {
  int exit_code;
};

// Runs the workers to completion. Never leaves a child behind.
LaunchOutcome launchWorkers(const LaunchSpec& spec);

// One process a launch starts and watches.
struct ChildProcess {
  detail::SpawnOptions start;  // its output pipes and signal mask are the launch's to set
  int rank = -1;               // the rank it is (-1: not a rank, such as a host's launcher)
  std::string name;            // how messages call it: "rank 2", "host collie-h1, node 1"
  // The memory cgroup it starts in (start.cgroups names it), read when it dies to tell a
  // kill at its memory limit from another SIGKILL. nullptr: none.
  std::shared_ptr<const MemoryGroup> memory;
};

// The children of `spec` (spec.nproc workers, their environments and CPUs).
std::vector<ChildProcess> workersOf(const LaunchSpec& spec);

// Starts `children`, then watches them until every one has exited: signals forwarded, the
// others stopped after one fails, the stall watch when `how` names progress files. Never
// leaves a child behind. launchWorkers is supervise(workersOf(spec), spec.watch).
LaunchOutcome supervise(std::vector<ChildProcess> children, const Supervision& how);

// The path of this executable, for a launcher that starts collie itself as its workers.
std::string selfExecutable();

// A TCP port on `addr` that was free a moment ago (the kernel's choice).
uint16_t pickFreePort(const std::string& addr);

}  // namespace collie
