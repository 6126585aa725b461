// The bench experiment: one collective swept over message sizes, every listed
// scheduler on the same ranks in the same run, interleaved; nccl-tests style results.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collie/cost_model.h"
#include "collie/rules.h"
#include "config/experiment.h"
#include "measure/calibrate.h"
#include "plugin/loader.h"
#include "runtime/run.h"

namespace collie::bench {

// What the bench shares with the trainer and plugin-check (measure/calibrate.h).
using measure::calibrate;
using measure::Calibration;
using measure::fitLine;
using measure::LinkFit;
using measure::measurementLike;
using measure::median;

// One (size, scheduler) measurement, aggregated over ranks.
struct Row {
  std::string run;        // the matrix point, "" without a matrix
  std::string scheduler;  // its label in the config
  std::string plugin;     // the plugin behind the label
  std::string ran;        // what ran: the label, or the scheduler auto (or a rule list) chose
  std::string backend;
  std::string collective;
  int ranks = 0;
  uint64_t bytes = 0;
  uint64_t count = 0;  // elements
  std::string dtype;
  std::string op;
  int repeats = 1;         // measurements of this (size, scheduler), interleaved
  int iters = 0;           // the most timed calls one of them made (bench.min_time adds calls)
  double time_us = 0;      // median over repeats of the slowest rank's mean time per call
  double time_min_us = 0;  // the fastest and slowest of those repeats: the spread
  double time_max_us = 0;
  double algbw = 0;         // GB/s: bytes / time
  double busbw = 0;         // GB/s: algbw times the collective's bus factor
  uint64_t wrong = 0;       // elements that differ from the closed form, summed over ranks
  bool checked = true;      // false: not checked (bench.check: false, or no payload)
  double predicted_us = 0;  // the scheduler's α-β-γ prediction (NaN: it has no model)
};

// What shapes a run's numbers, for its header: the hosts, their CPUs and load when the bench
// started, the backend with its params and the link it uses.
struct HostFacts {
  std::string name;  // the node's name in the topology (this machine's when there is one)
  int ranks = 0;
  int cpus = 0;
  double load = 0;   // 1-minute load average at the start (NaN: unknown)
  std::string link;  // "1000 Mbit/s", the lab's cap or the interface's speed ("": unknown)
};
struct Facts {
  std::string cpu_model;         // rank 0's
  std::string backend;           // "gloo {interface: eth0}"
  std::vector<HostFacts> hosts;  // none for a simulation
  // A simulation's platform instead of hosts: "64 simulated hosts in 64 nodes; times are
  // simulated" ("": the ranks ran on real hosts).
  std::string simulated;
};

// One experiment's results: its rows and the cost model the bench calibrated for it.
struct Result {
  Facts facts;
  std::vector<Row> rows;
  CostModel model;
  bool calibrated = false;
  LinkFit fit_intra, fit_inter;  // how each level's probes fit the model
  LinkFit fit_inter_one_way;     // and the one-way stream between nodes
  LinkFit fit_inter_bank;        // and the round trips after a pause between nodes
  LinkFit fit_intra_alone;       // and a pair alone inside a node
};

// Which scheduler is fastest at one size of one run. Measured times are ranges (min–max
// over repeats); the fastest is named only when its range lies wholly below every other
// scheduler's, else `tied` holds every scheduler whose range overlaps the fastest one's.
struct SizeVerdict {
  std::string run;
  uint64_t bytes = 0;
  std::string fastest;            // by median; "" when no comparable row has a time
  std::vector<std::string> tied;  // with `fastest`, in row order; empty: distinguishable
  bool distinguishable() const { return !fastest.empty() && tied.empty(); }
};

// Per run, per size (ascending). Rows with wrong results, `auto` and rule lists (which run
// one of the others) are left out. `predicted`: of the predictions (points, no spread).
std::vector<SizeVerdict> verdicts(const std::vector<Row>& rows, bool predicted);

// Where the distinguishable fastest scheduler changes: `below` is the last size where `from`
// was distinguishably fastest, `above` the first where `to` is (sizes between them, if any,
// are ties).
struct Crossover {
  std::string run;
  uint64_t below = 0, above = 0;
  std::string from, to;
};
std::vector<Crossover> crossovers(const std::vector<Row>& rows, bool predicted);

// A predicted crossover set beside the measurement: `measured` is the measured crossover of
// its run between the same two schedulers in the same direction (none: the measurement
// shows no such change where the spread tells the schedulers apart). They agree when the
// change can lie at the same point for both: each puts it strictly between its `below` and
// `above`, and the measured interval spans the sizes where the two are tied, so a prediction
// that overlaps it is as close as the spread over repeats can judge.
struct CrossoverCheck {
  Crossover predicted;
  std::optional<Crossover> measured;
  bool agrees = false;
};
// Every predicted crossover, checked; and the measured crossovers that no predicted one
// matches (`unpredicted`).
struct CrossoverChecks {
  std::vector<CrossoverCheck> predicted;
  std::vector<Crossover> unpredicted;
};
CrossoverChecks checkCrossovers(const std::vector<Row>& rows);

// How an `auto` entry did at one size of one run: what it ran and, where one scheduler is
// distinguishably fastest (verdicts()), how its median compares with that one's. It is as
// fast when within 5 % of it, or when the two ranges overlap: the spread over repeats then
// cannot tell them apart (auto running the fastest scheduler itself, timed in calls of its
// own, comes out a few per cent either side of it).
struct AutoVerdict {
  std::string run, label;  // the auto entry's label
  uint64_t bytes = 0;
  std::string ran;
  std::string fastest;     // "": no scheduler is distinguishably fastest at this size
  double off_percent = 0;  // auto's median against the fastest's, in per cent
  bool overlaps = false;   // their min-max ranges overlap
  bool judged() const { return !fastest.empty(); }
  bool asFast() const { return off_percent <= 5 || overlaps; }
};
// In row order; auto rows with wrong results, or at sizes without a comparable time, are
// left out.
std::vector<AutoVerdict> autoVerdicts(const std::vector<Row>& rows);

// The measured best scheduler per size range of one run's rows, as rules for `auto`: each
// with the plugin and params of its entry in `schedulers` (bench.schedulers). A size whose
// fastest cannot be told from the previous size's choice keeps that choice.
RulesFile bestRules(const std::vector<Row>& rows, const std::vector<config::PluginRef>& schedulers);

// Median of |predicted - measured| / measured over rows that have a prediction, in percent
// (NaN when none has).
double medianErrorPercent(const std::vector<Row>& rows, const std::string& scheduler);

// The message sizes of a sweep: min, min*factor, ... up to max.
std::vector<uint64_t> sweepSizes(uint64_t min_bytes, uint64_t max_bytes, int factor);

// nccl-tests' bus bandwidth factor for `coll` on n ranks.
double busFactor(Collective coll, int n);

// Runs the experiment's bench with its ranks as threads of this process. A rank that fails
// leaves its flight record under `out_dir`.
Result run(const PluginLoader& loader, const config::Experiment& experiment,
           const std::string& out_dir);
// Runs this rank's part of the bench over `backend` (a worker process). Every rank returns
// the same aggregated rows.
Result runRank(const PluginLoader& loader, const config::Experiment& experiment,
               std::shared_ptr<Backend> backend, const Topology& topology,
               const std::string& out_dir);

// A Result as JSON, for a worker to hand its rows to the launcher (written atomically).
void saveResult(const std::string& path, const Result& result);
Result loadResult(const std::string& path);

// The table, one block per matrix point (with its calibrated model), the average bus
// bandwidth and the prediction error per scheduler, and the crossovers.
void printTable(std::ostream& out, const std::vector<Result>& results);
// Writes busbw.{png,svg} and time.{png,svg} into `dir` with gnuplot; rows of several world
// sizes get a pair per size, busbw-<N>ranks.png and so on. Returns the suffixes written ("",
// or "-<N>ranks" each), or none (and says why in `why`) when gnuplot is missing or fails.
std::vector<std::string> writePlots(const std::string& dir, const std::vector<Row>& rows,
                                    std::string* why);
void writeCsv(const std::string& path, const std::vector<Row>& rows);
void writeJson(const std::string& path, const std::vector<Row>& rows);
// The calibrated model as JSON (alpha, beta per level, gamma, the fits), which `auto` reads
// with params.calibration.
void writeCalibration(const std::string& path, const Result& result);

// The table runtime/run.h drives a file of bench experiments with.
std::unique_ptr<ExperimentKind> makeKind();

}  // namespace collie::bench
