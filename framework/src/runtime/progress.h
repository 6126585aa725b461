// Where each rank is while a job runs (the step, the collective or control exchange it is
// in and since when), written to a small file every second, and the watch that names the
// ranks a stalled collective waits for long before the backend's timeout ends the job.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "collie/collective.h"

namespace collie {

// One rank's progress, as its file holds it.
struct RankProgress {
  int rank = 0, world = 0;
  int run = -1;  // the run of the file (its matrix index; -1: a file without a matrix)
  int64_t pid = 0;
  std::string host;
  int64_t step = 0;      // the training step it is in (0: none yet, or a bench)
  uint64_t op = 0;       // blocking operations entered so far: collectives and control exchanges
  bool inside = false;   // inside operation `op` now
  std::string what;      // operation `op`: "allreduce seq 57 (4.0 MiB)", "control exchange 12"
  int64_t since_us = 0;  // when it entered `op` (inside) or left it; system clock
  int64_t heartbeat_us = 0;  // when the file was written
  bool finished = false;     // the rank's communicator is gone: it is done with this run
  bool failed = false;       // ... because the rank failed
};

// One blocking operation, kept as numbers: its words are made only when a file is written
// (a collective must not pay for a string).
struct ProgressOp {
  bool control = false;  // a control-plane exchange (its number in `seq`), else a collective
  Collective coll = Collective::kAllReduce;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  std::string describe() const;  // "allreduce seq 57 (4.0 MiB)", "control exchange 12"
};

// A rank's live progress, updated by the threads that communicate and read by the writer.
// Every SPMD rank enters the same operations in the same order, so `op` lines ranks up. Two
// operations at once (the reducer's thread beside the main one) are counted in the order
// they start on each rank, which may differ by one between ranks, and `what` names the
// newer: the line may then call a rank one operation behind or past the others.
class ProgressBoard {
 public:
  ProgressBoard(int rank, int world, int run);
  void enter(const ProgressOp& op);  // a blocking operation starts on this rank
  void leave();                      // ... and ends (completed or failed)
  void setStep(int64_t step);
  RankProgress snapshot() const;

 private:
  mutable std::mutex mu_;
  RankProgress now_;  // its `what` is made from `last_` by snapshot()
  ProgressOp last_;
  int depth_ = 0;  // operations in flight (the reducer's thread beside the main one)
};

// Marks one blocking operation on `board` (null: none) for as long as it lives.
class ProgressScope {
 public:
  ProgressScope(ProgressBoard* board, const ProgressOp& op) : board_(board) {
    if (board_ != nullptr) board_->enter(op);
  }
  ~ProgressScope() {
    if (board_ != nullptr) board_->leave();
  }
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  ProgressBoard* board_;
};

// What the progress files of a run are for, in one place.
struct ProgressSettings {
  std::string dir;                             // OUT/progress ("": no files)
  std::chrono::milliseconds stall_warning{0};  // 0: no watch
  bool watch = false;  // this process speaks for the job (no collie launcher above it)
};

// The folder of a run's progress files, and one rank's file.
std::string progressFolder(const std::string& out_dir);
std::string progressPath(const std::string& dir, int rank);

// Every rank's file under `dir` of run `run` (-2: any run), in rank order; a file that
// cannot be read or parsed is skipped (it is being replaced, or is not collie's).
std::vector<RankProgress> readProgress(const std::string& dir, int run = -2);

// Writes the files of the boards registered in this process once a second from one thread,
// and, for a process that speaks for its job, runs a StallWatch over the folder's files.
// The board stays the caller's; unregister it before it goes (its file then says finished,
// and whether the rank failed).
void publishProgress(const ProgressBoard* board, const std::string& path,
                     const ProgressSettings& settings);
void unpublishProgress(const ProgressBoard* board, bool failed = false);

// How a rank's process is doing, for the stall line: its state from /proc when it runs on
// this host ("stopped (SIGSTOP)", "running", "gone"), and how old its last heartbeat is.
std::string describeLiveness(const RankProgress& rank, int64_t now_us);

// The pure decision of when a stall is worth a line, and the line: once some rank has
// waited `warn_after` inside one operation, it names the ranks that have not reached that
// operation (or that every rank is inside it), then again after 2x, 4x, ... as long as the
// same operation stalls. Unit-tested with made-up progress and clocks.
class StallWatch {
 public:
  using Liveness = std::function<std::string(const RankProgress&, int64_t now_us)>;
  StallWatch(std::chrono::milliseconds warn_after, Liveness liveness);

  // The line to print now ("" : nothing), given the files of ranks 0..world-1 (a rank
  // missing from `ranks` left no file).
  std::string observe(const std::vector<RankProgress>& ranks, int world, int64_t now_us);

 private:
  int64_t warn_after_us_;
  Liveness liveness_;
  uint64_t op_ = 0;       // the stalled operation the last line was about
  int64_t since_us_ = 0;  // when its first rank entered it
  int64_t next_us_ = 0;   // the wait at which the next line is due
};

// Whether a heartbeat this old means the rank's process has stopped writing.
bool heartbeatStale(const RankProgress& rank, int64_t now_us);

// `collie status RUN_DIR`: one line per rank from the progress files. Returns 0, or 2 when
// the folder holds no progress file.
int printStatus(const std::string& run_dir, std::ostream& out);

int64_t progressNowMicros();  // the system clock the files use

}  // namespace collie
