// Backend + scheduler rules + topology: picks the scheduler for each collective
// (first rule whose size limit admits it), numbers it, runs it and records its provenance.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collie/backend.h"
#include "collie/rules.h"
#include "collie/scheduler.h"
#include "collie/topology.h"
#include "runtime/progress.h"

namespace collie {

class Faults;
class FlightRecorder;
class HostStaging;
class MessageWire;
class Tracer;
class PluginLoader;
namespace config {
struct Experiment;
struct PluginRef;
}  // namespace config

// The one copy of `name` that the process keeps for as long as it runs: names that every
// collective records (labels, backends, the choices of auto) are kept once, so that
// recording them costs no allocation per collective.
std::string_view internName(std::string_view name);

// Where one collective ran and what it cost. The names are internName()s: they stay valid
// after the Communicator is gone.
struct Provenance {
  std::string_view scheduler;  // the rule's label
  std::string_view backend;
  Collective coll = Collective::kAllReduce;
  uint64_t bytes = 0;
  uint64_t seq = 0;
  double seconds = 0;
  std::string_view ran;  // what ran: the label, or the choice of a delegating scheduler (auto)
  bool staged = false;   // device buffers passed through host memory (runtime/device.h)
};

// What a Communicator does besides running collectives (debug: of the config).
struct CommDebug {
  // Before each collective, every rank compares what it calls (collective, dtype, count, op,
  // root) with every other rank's, and all fail naming the ranks that differ.
  bool consistency = false;
  size_t flight_entries = 0;  // the flight recorder's size (0: off)
  std::string flight_path;    // where it is written when this rank fails
  // Where this rank says, once a second, what it is in (runtime/progress.h); no dir: nowhere.
  ProgressSettings progress;
  int run = -1;  // the run of the file, as the progress files name it
};

class Communicator {
 public:
  // A scheduler under the label the config gave it.
  struct Labeled {
    std::string label;
    std::shared_ptr<Scheduler> scheduler;
  };
  // A scheduler admitted for messages up to max_bytes (0: any size).
  using Rule = SizeRule<Labeled>;

  Communicator(std::shared_ptr<Backend> backend, std::string backend_name, Topology topology);
  // Writes the flight record when it goes while an exception unwinds (the rank failed
  // outside a collective) and none was written yet.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  void setDebug(CommDebug debug);

  // Rules are tried in the order added; max_bytes == 0 admits every size.
  void addRule(std::string label, std::shared_ptr<Scheduler> scheduler, uint64_t max_bytes = 0);

  // Runs `args` (args.seq is assigned here). Throws ConfigError when no rule's scheduler
  // accepts it (naming each refusal), CommError with the collective, seq and scheduler when
  // it fails.
  Provenance run(CollectiveArgs args);
  // The same with explicit rules instead of the ones added (the bench compares rule sets).
  Provenance run(CollectiveArgs args, const std::vector<Rule>& rules);

  // The rule that run(args, rules) would use: the first whose size limit admits the message
  // and whose scheduler accepts it, or null (with each refusal appended to `refusals`).
  // `ran`, when given, receives what will run (the rule's label, or the scheduler a
  // delegating one such as auto chose), as an internName().
  const Rule* select(const CollectiveArgs& args, const std::vector<Rule>& rules,
                     std::string* refusals, std::string_view* ran = nullptr) const;

  // Collectives of device buffers on a backend without device memory pass through pinned
  // host buffers (HostStaging). `always` stages host buffers too: tests, with CPU tensors
  // standing in for device memory.
  void stageAlways(bool always) { stage_always_ = always; }

  // Faults to take before each collective (faults: at_collective); null: none. Not owned.
  void setFaults(Faults* faults) { faults_ = faults; }
  // Records every collective it runs; null: none. Not owned.
  void setTracer(Tracer* tracer) { tracer_ = tracer; }

  // This rank's progress board (its collectives are marked on it), for the trainer's step and
  // the control plane's exchanges; null when debug gave it no progress folder.
  ProgressBoard* progress() { return progress_.get(); }

  const std::vector<Rule>& rules() const { return rules_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  const Topology& topology() const { return topology_; }

 private:
  Provenance runRule(const Rule& rule, CollectiveArgs args, std::string_view ran);
  // debug.consistency: throws CommError on every rank when any rank calls something else.
  void checkConsistent(const CollectiveArgs& args);
  void dumpFlightRecord(const std::string& reason);

  // The scheduler's run, through host staging when the buffers need it; whether they did.
  bool runScheduler(Scheduler& scheduler, const CollectiveArgs& args);

  std::shared_ptr<Backend> backend_;
  std::unique_ptr<HostStaging> staging_;  // made on first need
  std::unique_ptr<MessageWire> wire_;     // the consistency check's messages; on first need
  bool stage_always_ = false;
  std::string backend_name_;
  std::string who_;                    // "rank R", for the shape check's refusals
  std::string_view backend_interned_;  // internName(backend_name_)
  Topology topology_;
  std::vector<Rule> rules_;
  uint64_t next_seq_ = 1;
  Faults* faults_ = nullptr;
  Tracer* tracer_ = nullptr;
  CommDebug debug_;
  std::unique_ptr<FlightRecorder> recorder_;
  std::unique_ptr<ProgressBoard> progress_;
  std::atomic<bool> dumped_{false};
  int uncaught_at_start_ = 0;
};

// The CommDebug of run `e` for a rank writing under `out_dir`.
CommDebug commDebugOf(const config::Experiment& e, const std::string& out_dir, int rank);

// The rules a config slot names: its one scheduler (for any size) or its size rules, each
// created with its own params. Throws PluginError or ConfigError.
std::vector<Communicator::Rule> createRules(const PluginLoader& loader,
                                            const config::PluginRef& ref);

}  // namespace collie
