// Test helpers for jobs of processes: start collie with its own environment and log, wait
// for it with a deadline, start the workers of a job as an outside launcher would, find
// processes that outlived a test, and kill them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace collie::testing {

using Clock = std::chrono::steady_clock;

// A process started with extra environment, its output going to a file.
struct Spawned {
  pid_t pid = -1;
  std::string log;
  int status = 0;
  bool exited = false;
  double seconds = 0;  // from the moment the test started waiting

  std::string output() const;
};

// Starts COLLIE_TEST_BINARY with `args`, "K=V" entries of `env` added, stdout and stderr to
// `log`, in `cwd` when given. The child dies with the test (PR_SET_PDEATHSIG).
Spawned spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
              const std::string& log, const std::string& cwd = "");

// Waits for `s` until `deadline`; false when it is still running then.
bool waitFor(Spawned& s, Clock::time_point start, Clock::time_point deadline);

// SIGCONT and SIGKILL, then reaps (nothing when it has exited).
void killAndReap(Spawned& s);

// The exit code, or 128 + the signal that killed it.
int exitCode(const Spawned& s);

// Running (not zombie) processes whose command line mentions `marker` (a unique --out
// folder).
std::vector<pid_t> processesWith(const std::string& marker);

// Waits up to `patience` until no process mentions `marker`; true when none does.
bool noneLeft(const std::string& marker,
              std::chrono::milliseconds patience = std::chrono::seconds(5));

// A fresh folder for this test process: TMP/collie-proc-PID/NAME.
std::string scratch(const std::string& name);

// Kills and reaps every rank still running when a test ends, also when an ASSERT returns
// early: a test never leaves a process behind.
struct Reaper {
  std::vector<Spawned>* ranks;
  ~Reaper();
};

// Starts `world` workers of `config` directly (as mpirun would, with no teardown of its
// own), leaving out the ranks in `skip`.
std::vector<Spawned> startWorkers(const std::string& config, int world, const std::string& out,
                                  const std::vector<std::string>& sets = {},
                                  const std::vector<int>& skip = {});

// Waits (up to a minute: a loaded machine starts LibTorch slowly) until the logs hold
// `count` "connected" lines, then a second more, so that the ranks are inside the sweep.
bool waitUntilConnected(const std::vector<std::string>& logs, size_t count);

// The start of a torchrun command line for `nproc` workers of collie on this host. Not
// --standalone: Debian's torchrun (1.13) then always serves its rendezvous on port 29400, so
// two such tests running at once (ctest -j2) collide; this one serves it on a free port.
// Debian's torchrun needs --redirects/--tee and spells --no_python this way.
std::string torchrunCommand(int nproc);

// Whether `name` is a program on PATH.
bool haveProgram(const std::string& name);

// The text of a file ("" when it cannot be read).
std::string readText(const std::string& path);

}  // namespace collie::testing
