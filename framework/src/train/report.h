// What training reports: one JSON line per step and rank, the progress line, each rank's
// means over the timed steps and their combination into a Result, the summary table, and
// the JSON that carries a Result between processes. Free of LibTorch headers.
#pragma once

#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "train/step.h"
#include "train/trainer.h"

namespace collie::train {

// nlohmann's converters for the records inside a Result (found by argument-dependent
// lookup), walking the field tables of trainer.h.
void to_json(nlohmann::json& j, const SyncCheck& s);
void from_json(const nlohmann::json& j, SyncCheck& s);
void to_json(nlohmann::json& j, const Rebalance& c);
void from_json(const nlohmann::json& j, Rebalance& c);
void to_json(nlohmann::json& j, const StepMemory& m);
void from_json(const nlohmann::json& j, StepMemory& m);

// DIR/rank-R.jsonl (a matrix's run I: DIR/run-I-rank-R.jsonl): step, rank, the times of
// StepStats, samples, tokens, tokens/s, loss, lr, grad norm and every collective's
// provenance. A resumed run appends.
class StepLog {
 public:
  // `run`: the run's place in its matrix, or -1. Throws ConfigError.
  StepLog(const std::string& out_dir, int rank, int run, bool append);
  // `step`: the 0-based index of the step; `samples`, `tokens`: this rank's in the step.
  void write(int64_t step, int64_t samples, int64_t tokens, const StepStats& stats);

 private:
  int rank_;
  std::string path_;
  std::ofstream out_;
};

// "step 25/150  loss 2.2894  lr 2.93e-03  8,349 tok/s  step 0.245 s (comm 0.015, exposed
// 0.005)  ETA 28 s": `step` is 1-based, `loss` the job's mean, `world_tokens` the job's
// tokens per step, `seconds_per_step` the mean so far.
std::string progressLine(int64_t step, int64_t steps, double loss, const StepStats& last,
                         double world_tokens, double seconds_per_step);

// One rank's means over the timed steps (every step but the first, which pays for
// allocation; the one step when there is only one), as the control plane carries them.
struct RankSummary {
  double step = 0, compute = 0, comm = 0, exposed = 0;
  double gather = 0, gather_exposed = 0;         // sharded: the all-gathers' part of comm, exposed
  double first_loss_sum = 0, last_loss_sum = 0;  // loss x this rank's samples per micro-batch
  int64_t timed_steps = 0;
  int64_t steps_run = 0;  // every step, the first included
  // On the lab, the first rank of each host: the bytes its host's interfaces counted sent
  // before the first step and during the steps (-1: not read).
  double interface_startup_sent = -1, interface_steps_sent = -1;

  // Every field, in the order pack() carries them: a new one is its member and its line.
  template <typename S, typename Visit>
  static void forEachValue(S& s, Visit&& visit) {
    visit(s.step);
    visit(s.compute);
    visit(s.comm);
    visit(s.exposed);
    visit(s.gather);
    visit(s.gather_exposed);
    visit(s.first_loss_sum);
    visit(s.last_loss_sum);
    visit(s.timed_steps);
    visit(s.steps_run);
    visit(s.interface_startup_sent);
    visit(s.interface_steps_sent);
  }
  std::vector<double> pack() const;
  static RankSummary unpack(const std::vector<double>& values);
};
RankSummary summariseSteps(const std::vector<StepStats>& stats);

// Fills the timing and loss fields of `r` from every rank's summary (in rank order):
// step time of the slowest rank, compute per rank, communication as the mean over ranks,
// losses as the job's mean over `world_micro_batch` samples.
void combineRanks(const std::vector<RankSummary>& ranks, int64_t world_micro_batch, Result* r);

// The summary: one row per run (speed-up and efficiency against the 1-rank run of a matrix),
// then per run the straggler line, the all-reduce against its prediction, the weight-sync
// verdict and the time to each token budget.
void printSummary(std::ostream& out, const std::vector<Result>& results);

// How far a run's weights ended from those of the first run in `results` that took the same
// steps exactly (tokens weighting, the same model, steps and samples per step: one process on
// the concatenated batch would take them too), over the runs' weight samples. No reference:
// null (a reference run is its own, at 0).
struct WeightSpread {
  const Result* reference = nullptr;
  double max_abs_diff = 0;
};
WeightSpread weightSpread(const std::vector<Result>& results, const Result& r);
void writeSummaryJson(const std::string& path, const std::vector<Result>& results);

// A Result as JSON, for rank 0's worker to hand to the launcher (written atomically).
void saveResult(const std::string& path, const Result& result);
Result loadResult(const std::string& path);

}  // namespace collie::train
