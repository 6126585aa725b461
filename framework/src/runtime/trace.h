// The job's timeline: every rank records spans (forward, backward,
// optimizer, each collective) on a compute and a communication track; at the end rank 0
// gathers them over the backend, moves every rank's times onto its own clock with offsets
// estimated over the control plane, and writes one Chrome trace-event JSON for the job
// (ui.perfetto.dev, chrome://tracing). Free of LibTorch.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "collie/backend.h"
#include "collie/topology.h"
#include "runtime/communicator.h"
#include "runtime/control.h"

namespace collie {

// The timeline of a rank an event is drawn on.
enum class TraceTrack : uint8_t { kCompute, kCommunication };

// One span. Names are string literals or internName()s.
struct TraceEvent {
  std::string_view name;
  TraceTrack track = TraceTrack::kCompute;
  int64_t start_ns = 0, end_ns = 0;  // of the recording rank's clock
  int64_t step = 0;                  // 1-based; 0: outside a step
  int index = -1;                    // the micro-batch of a forward or backward
  // A collective's (seq 0: not a collective).
  uint64_t seq = 0;
  Collective coll = Collective::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  uint64_t bytes = 0;
  int bucket = -1;
  std::string_view scheduler, ran;
};

class Tracer {
 public:
  // Now, in nanoseconds of this rank's clock (steady_clock unless a test gives another).
  using Clock = std::function<int64_t()>;
  static constexpr size_t kDefaultCapacity = 200000;

  explicit Tracer(Clock clock = {}, size_t capacity = kDefaultCapacity);

  int64_t now() const { return clock_ ? clock_() : steadyNs(); }
  static int64_t steadyNs();

  // A span of the calling thread's track; `index`: the micro-batch, or -1.
  void span(std::string_view name, int64_t start_ns, int64_t end_ns, int index = -1);
  // A collective the calling thread ran (Communicator::run records them).
  void collective(const Provenance& p, ReduceOp op, int64_t start_ns, int64_t end_ns);

  // The step that spans and collectives recorded from now on belong to (1-based).
  void setStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  // The calling thread's track from now on (compute until set).
  static void setThreadTrack(TraceTrack track);
  // Collectives the calling thread runs while it lives are bucket `b`'s.
  class BucketScope {
   public:
    explicit BucketScope(int bucket);
    ~BucketScope();
    BucketScope(const BucketScope&) = delete;
    BucketScope& operator=(const BucketScope&) = delete;

   private:
    int previous_;
  };

  std::vector<TraceEvent> events() const;
  size_t dropped() const;  // events past the capacity, not kept

 private:
  void add(TraceEvent e);

  Clock clock_;
  size_t capacity_;
  std::atomic<int64_t> step_{0};
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  size_t dropped_ = 0;
};

// A span of the calling thread's track from construction to destruction; nothing without a
// tracer.
class TraceSpan {
 public:
  TraceSpan(Tracer* tracer, std::string_view name, int index = -1)
      : tracer_(tracer), name_(name), index_(index), start_(tracer ? tracer->now() : 0) {}
  ~TraceSpan() {
    if (tracer_ != nullptr) tracer_->span(name_, start_, tracer_->now(), index_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  std::string_view name_;
  int index_;
  int64_t start_;
};

// Rank r's clock minus rank 0's, as rank 0 estimated it (Cristian's algorithm): rank 0 sends
// its time t0, rank r answers with its time tr, rank 0 receives at t1; over `rounds` round
// trips the one with the shortest round trip gives offset = tr - (t0 + t1) / 2, and the true
// offset lies within ± (t1 - t0) / 2 of it (tr was read between t0 and t1).
constexpr int kClockRounds = 32;
struct ClockOffset {
  double offset_us = 0;       // 0 for rank 0
  double uncertainty_us = 0;  // half the shortest round trip
  double rtt_us = 0;          // the shortest round trip
};
// Every rank calls it (it draws one control-plane tag); rank 0 gets every rank's offset,
// the others an empty list. `tracer` is the clock.
std::vector<ClockOffset> estimateClockOffsets(Backend& backend, Control& control,
                                              const Tracer& tracer, int rounds = kClockRounds);

// What the trace's metadata says about the job.
struct TraceInfo {
  std::string experiment;          // the experiment's name
  std::vector<std::string> hosts;  // per rank: its node's name
};

// Every rank calls it: the offsets are estimated, every rank's events gathered to rank 0 over
// `backend`, and rank 0 writes `path` (atomically). Returns the number of events written
// (0 on the other ranks).
size_t writeJobTrace(const Tracer& tracer, Backend& backend, Control& control,
                     const TraceInfo& info, const std::string& path);

// train.trace / bench.trace: writeJobTrace to OUT/trace.json (OUT/trace-N.json for matrix
// point N, beside its config-N.yaml) with the ranks' hosts from `comm`'s topology; rank 0
// logs where. Every rank calls it.
void writeExperimentTrace(const Tracer& tracer, Communicator& comm, Control& control,
                          const config::Experiment& e, const std::string& out_dir);

// The Chrome trace-event JSON of the job from every rank's events and offsets, with
// timestamps in microseconds of rank 0's clock from the job's first event. `offsets` and
// `ranks` are indexed by rank. Flow events join the same collective (seq) across ranks.
std::string chromeTrace(const std::vector<std::vector<TraceEvent>>& ranks,
                        const std::vector<ClockOffset>& offsets, const TraceInfo& info,
                        const std::vector<size_t>& dropped);

}  // namespace collie
