// Where a worker process finds its place in the job: the variables torchrun and
// collie's launcher set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), Open MPI's (OMPI_COMM_WORLD_*) or Slurm's (SLURM_PROCID, SLURM_NTASKS, ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "collie/topology.h"

namespace collie {

struct WorkerEnv {
  bool present = false;  // false: no launcher started this process
  std::string source;    // "torchrun", "collie", "Open MPI", "Slurm"
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string master_addr;  // empty: the caller's default
  uint16_t master_port = 0;
  int experiment = -1;      // collie's launcher: the index of the run this worker does
  std::string result_path;  // collie's launcher: where the reporting rank leaves its result
};

// The local rank a rank's device is chosen by: the launcher's (collie, torchrun, Open MPI,
// Slurm) where one started this process, else the rank's position among the ranks of its
// node (ranks as threads). The trainer, the bench, plugin-check and the control plane take
// it from here; a backend gets the same number in BackendContext::local_rank (job.cc reads
// the launcher's variables for it; ranks as threads pass their rank, one host's ranks).
int localRankOf(const Topology& topology, int rank);

// Reads the process environment (or `getenv` in tests). Throws ConfigError naming the
// variable when one is malformed or the set is inconsistent (rank >= world, ...).
WorkerEnv detectWorkerEnv(const std::function<const char*(const char*)>& getenv = nullptr);

// The job token this rank presents to the rendezvous store: COLLIE_JOB_TOKEN, else the
// first line of `token_file` ("" : none). Throws ConfigError when `token_file` is given and
// cannot be read.
std::string jobToken(const std::string& token_file);

// For a launcher: makes sure its workers share a token, exported to them as
// COLLIE_JOB_TOKEN. Keeps one already exported; else reads `token_file`, which node 0
// (`may_create`) writes first (mode 0600, 32 random bytes in hex) when it is missing; without
// a token_file, a fresh random token (for a launcher that starts every worker of the job).
// Another node waits up to `patience` for node 0 to write the file (a shared file system).
// Throws ConfigError for a token_file that is still missing then, or cannot be written.
void provideJobToken(const std::string& token_file, bool may_create,
                     std::chrono::milliseconds patience = std::chrono::milliseconds(0));

// A fresh job token: 32 bytes of getrandom(), as hex.
std::string drawJobToken();

// For ranks that an outside launcher (torchrun, mpirun, srun) started all on one host, which
// share no token: rank 0 draws one, makes the store with it, and only then, the port being
// its own, writes it where only this user can read it: localJobTokenPath(port)
// (mode 0600, in $XDG_RUNTIME_DIR/collie when that is this user's existing folder, else
// /tmp/collie-<uid>; a folder of this user's with mode 0700); the others read it there. Every
// rank must see the same folder (one user, one /tmp). Throws ConfigError when the folder is
// not private (another user owns it, or may read it) or the file cannot be written.
std::string localJobTokenPath(uint16_t port);
void writeLocalJobToken(const std::string& path, const std::string& token);
// Waits until `deadline` for rank 0's file at `path`; "" when it never came.
std::string readLocalJobToken(const std::string& path,
                              std::chrono::steady_clock::time_point deadline);

// When a launcher asked for the reason this process fails (torchrun's TORCHELASTIC_ERROR_FILE,
// what PyTorch's @record writes), leaves `message` there, so that the launcher's summary
// names the cause instead of "To enable traceback see ...". Never throws.
void leaveErrorForLauncher(const std::string& message);

}  // namespace collie
