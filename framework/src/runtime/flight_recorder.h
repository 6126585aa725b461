// The flight recorder (as NCCL's and PyTorch's): each rank keeps its last N collectives
// (seq, collective, bytes, dtype, scheduler, state, start and end times) and writes them
// when it fails, so that `collie analyze RUNDIR` can name the rank the others waited for.
#pragma once

#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "collie/collective.h"

namespace collie {

struct FlightEntry {
  enum class State { kStarted, kCompleted, kFailed };
  uint64_t seq = 0;
  Collective coll = Collective::kAllReduce;
  uint64_t bytes = 0;
  uint64_t count = 0;  // elements of the input
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::string scheduler;
  State state = State::kStarted;
  int64_t start_us = 0, end_us = 0;  // system clock, microseconds since the epoch; end 0: open
};

const char* flightStateName(FlightEntry::State state);  // "started", "completed", "failed"

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}

  // Records a collective that starts now; the returned id ends it.
  uint64_t begin(FlightEntry entry);
  void end(uint64_t id, FlightEntry::State state);

  // The entries still held, oldest first.
  std::vector<FlightEntry> entries() const;

  // Writes `path` (JSON, atomically): this rank's entries and why it wrote them. Never
  // throws: a rank that fails must not fail a second time here.
  void dump(const std::string& path, int rank, int world, const std::string& reason) const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::vector<FlightEntry> ring_;  // entry k of id k lives at k % capacity_
  uint64_t next_ = 0;              // the id of the next entry
};

// The folder under a run's output where ranks leave their records, and one rank's file.
std::string flightRecordFolder(const std::string& out_dir);
std::string flightRecordPath(const std::string& out_dir, int rank);

// `collie analyze RUNDIR`: reads the ranks' records under RUNDIR, prints each rank's last
// collectives and the verdict — the rank the others were waiting for, ranks that left no
// record, or ranks that disagree about a collective. Returns 0, or 2 when RUNDIR holds no
// record (ConfigError for an unreadable one).
int analyzeRun(const std::string& run_dir, std::ostream& out);

}  // namespace collie
