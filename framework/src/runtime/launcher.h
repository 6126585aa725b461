// collie's local launcher: starts this node's workers as processes (fork + exec
// of a worker command), prefixes their output with the rank, forwards SIGINT/SIGTERM/SIGHUP,
// and tears the whole group down when one worker fails. Workers die with the launcher
// (PR_SET_PDEATHSIG), so no process outlives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace collie {

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
  // After the first worker fails, how long the others may take to report their own error
  // before they are sent SIGTERM; then how long before SIGKILL.
  std::chrono::milliseconds failure_grace{5000};
  std::chrono::milliseconds kill_grace{5000};
  // The workers' progress files (runtime/progress.h) for run `experiment`: once a collective
  // has waited stall_warning, the launcher names the ranks it waits for ("" or 0: no watch).
  std::string progress_dir;
  std::chrono::milliseconds stall_warning{0};
  int progress_run = -1;  // the run the files must name (their matrix index)
};

struct LaunchOutcome {
  int exit_code = 0;  // 0; the failed worker's code; 128+signal when interrupted
  // "rank 2 (pid 812) was killed by signal 9 (SIGKILL)" or "rank 1 (pid 80) exited with
  // code 2: <its last collie error line>"; "" on success.
  std::string failure;
  int failed_rank = -1;   // the first worker that failed (-1: none, or none started)
  int failed_signal = 0;  // the signal that killed it (0: it exited)
  bool interrupted = false;
};

// The launcher was interrupted (SIGINT, SIGTERM, SIGHUP) and stopped its workers: collie
// exits 128 + signal, as a shell reports a process killed by it.
struct Interrupted {
  int exit_code;
};

// Runs the workers to completion. Never leaves a child behind.
LaunchOutcome launchWorkers(const LaunchSpec& spec);

// The path of this executable, for a launcher that starts collie itself as its workers.
std::string selfExecutable();

// A TCP port on `addr` that was free a moment ago (the kernel's choice).
uint16_t pickFreePort(const std::string& addr);

}  // namespace collie
