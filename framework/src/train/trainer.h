// The synchronous data-parallel trainer: every rank runs its micro-batches,
// gradients are all-reduced in buckets during the last backward, and the same optimizer
// update runs everywhere. Free of LibTorch headers: the CLI and the report include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "collie/error.h"
#include "collie/topology.h"
#include "config/experiment.h"
#include "plugin/loader.h"
#include "runtime/run.h"
#include "train/comm_explained.h"

namespace collie::train {

// The weight-sync verdict: every parameter hashed on every rank and compared.
struct SyncCheck {
  int64_t step = 0;
  int parameters = 0;
  bool identical = true;
  double max_spread = 0;        // max over elements of max_r w - min_r w, over differing parameters
  std::string first_parameter;  // the first that differs ("" when identical)
  std::vector<int> ranks;       // ranks whose copy differs from rank 0's
  int differing = 0;            // how many parameters differ
  std::string describe(int world) const;  // one line
  // Takes in the check of more parameters of the same step, which come after these in the
  // model's order (stage 3 checks bucket by bucket).
  void add(const SyncCheck& more);
};

// One run's result, the same on every rank (rank 0's view of the job).
// micro_batch: auto took a new split after a step.
struct Rebalance {
  int64_t after_step = 0;  // 1-based
  std::vector<int> micro_batch;
};

// One rank's memory at its peak during the steps, measured (train/memory_ledger.h): the bytes
// LibTorch's CPU allocator held for each use at the moment their sum was highest, and the
// process's resident peak over the steps (ranks that are threads share one process). All 0
// where the allocator did not hold the tensors (train.device: cuda).
struct StepMemory {
  double resident = 0;
  double resident_at_start = 0;  // when the steps began: the libraries, the set-up's memory
  int process_ranks = 1;         // ranks in the process whose resident peak that is
  double tracked = 0;            // the sum of the uses below
  double tracked_at_start = 0;   // LibTorch's blocks live when the steps began
  double set_up = 0, forward = 0, backward = 0, gathered = 0, gradient_sync = 0, optimizer = 0,
         other = 0;
  // For the largest model that fits (train/memory_fit.h): the most the forward held at any
  // moment of a step (its activations at the end of the forward; at the peak, backward may
  // have freed some); of resident_at_start, the file-backed pages; the resident peak of the
  // set-up (before the steps); and the rank's memory, its launch.memory_limit (limit_given)
  // or else its share of its host's (MemTotal / ranks per host).
  double forward_high = 0;
  double file_backed_at_start = 0;
  double set_up_peak = 0;
  double limit = 0;
  bool limit_given = false;
};

constexpr int kWeightSamples = 4096;
constexpr int kTargetWindow = 8;  // steps the loss is averaged over for train.target_loss

struct Result {
  std::string run;  // the matrix point, "" without a matrix
  std::string name;
  std::string model, scheduler, backend;
  std::string compression = "none";  // train.compression's label (auto: the one it chose)
  // train.compression: auto: each candidate's predicted synchronisation per step, and why
  // the chosen one won ("" otherwise).
  std::string compression_choice;
  int ranks = 0;
  int64_t parameters = 0;
  double flops_per_token = 0;
  int64_t steps = 0, timed_steps = 0;
  int64_t world_batch_samples = 0, world_batch_tokens = 0;
  std::vector<int> micro_batch;  // per rank, at the end (micro_batch: auto rebalances)
  std::vector<Rebalance> rebalances;
  bool tokens_weighting = true;
  double step_seconds = 0;  // mean over timed steps, slowest rank
  double tokens_per_second = 0;
  double comm_seconds = 0, exposed_seconds = 0;  // per step, mean over ranks
  // Sharded: the all-gathers' part of those (the rest is the reduce-scatters').
  double gather_seconds = 0, gather_exposed_seconds = 0;
  std::string device = "cpu";  // train.device as it ran: "cpu", "cuda:0 (LibTorch 2.11.0 ...)"
  // How gradients met the backend: "host memory", "device memory" (a backend that moves it)
  // or "host-staged" (device buckets through pinned host buffers).
  std::string comm_memory = "host memory";
  // What a scheduler that chooses among others (auto, alone or as a rule) ran during the
  // steps, on rank 0, by message size: "auto ran recursive_doubling for 1,024 B; swing for
  // 3,172,352 / 196,608 B" ("": nothing chose; auto inside hierarchical is not seen here).
  std::string schedulers_ran;
  uint64_t allreduce_bytes = 0;  // gradient bytes per step
  // train.sync: the mode, the steps between meetings and the synchronous steps first.
  std::string sync_mode = "every_step";
  int sync_every = 0, sync_warmup_steps = 0;
  // What rank 0 sent per step over every step of the run, on bandwidth-optimal schedules
  // (step.h's sentBytes): the gradients' all-reduce or a codec's collectives, train.sync's
  // meetings, ZeRO's gathers.
  double sent_bytes_per_step = 0;
  // On the lab only (0 elsewhere): what the hosts' interfaces counted sent (bytes that
  // crossed a link, headers included; a host's ranks talk over loopback), per host: before
  // the first step (calibration, the parameters' broadcast, a resume) and per step after.
  int interface_hosts = 0;
  double interface_startup_sent_bytes = 0, interface_sent_bytes_per_step = 0;
  std::string sharding = "none";  // train.sharding
  bool overlap = true;            // train.overlap: buckets reduced during the backward
  // Held by rank 0 between steps: parameter values, gradients, optimizer state.
  uint64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  uint64_t gathered_peak_bytes = 0;  // stage 3: most values gathered at once in a step
  // Stages 2 and 3: the buffers full gradients and gathered values borrow, kept between
  // steps (not in the three above).
  uint64_t pooled_bytes = 0;
  std::vector<double> peak_rss_bytes;   // per rank, at the end (getrusage)
  std::vector<StepMemory> step_memory;  // per rank
  // The model's units (stage 3's, a GPT's layers) and one unit's parameters (0 when the
  // model has none, or units of unequal sizes): the scale of the largest model that fits.
  int units = 0;
  int64_t unit_parameters = 0;
  int buckets = 0;
  double predicted_comm_seconds = 0;  // from the calibrated α-β-γ model (NaN: no model)
  // With a codec or train.sync's local modes: the float32 all-reduce of every step's
  // gradients, predicted the same way (0: no prediction), to set the saving against.
  double predicted_float32_comm_seconds = 0;
  // With a codec: the part of predicted_comm_seconds that is its arithmetic, timed on a
  // rehearsal before the first step (codec_group.h's RehearsalGroup).
  double predicted_codec_arithmetic_seconds = 0;
  // The slowest level: between nodes when there are several; the gap 0 where not measured;
  // β as a bucket's buffers are priced (CostModel::forBuffer at train.bucket_bytes); what the
  // link between nodes banks while idle (LinkCost::bank, bytes; 0 inside a node, on a wire).
  double link_alpha = 0, link_beta = 0, link_gap = 0, link_bank = 0;
  bool between_nodes = false;
  std::vector<double> compute_seconds;  // per rank: forward + backward per step
  // Every step all-reducing every bucket: why the all-reduces took what they took, and the
  // exposed part predicted from the link and the bucket schedule (comm_explained.h).
  CommExplained comm_explained;
  // Straggler attribution over the gathered steps (empty with one rank or straggler_every 0):
  // per rank the score, the seconds per step it waited for the others, the share of
  // collectives it arrived at last; the step at the fastest rank's speed.
  std::vector<double> straggler_score, straggler_wait_seconds, arrived_last;
  double step_at_fastest_seconds = 0;
  int straggler_steps = 0;
  double first_loss = 0, last_loss = 0;
  // The job's mean loss after each step this run took, and rank 0's seconds from the first
  // step's start to that step's end: the loss against wall time. A resumed run's curve
  // starts at its first step (1-based), the seconds from that step's start.
  std::vector<double> loss_curve, loss_curve_seconds;
  int64_t loss_curve_first_step = 1;
  // train.target_loss, and the first step (1-based) whose loss, a mean over the last
  // kTargetWindow steps, reached it, with its time as above (0, 0: not reached).
  double target_loss = 0;
  int64_t steps_to_target = 0;
  double seconds_to_target = 0;
  SyncCheck sync;
  // Rank 0's weights at the end at kWeightSamples evenly spaced positions of all parameters
  // in named order, to compare runs (report.h weightSpread); only between processes, not in
  // summary.json.
  std::vector<double> weight_sample;
  std::vector<double> token_budgets;  // besides Chinchilla's 20 tokens per parameter
  double peak_flops = 0;              // per rank, from the config (0: unknown)
};

// How a field reads as a column of the printed summary's table: its header, its width and
// how a value is written ("0.123", "0.1234", "12,345", "[8,8,6]").
enum class Style { kFixed3, kFixed4, kThousands, kList };
struct Column {
  const char* header;
  int width;
  Style style;
};

// The fields of a Result, one row each: the name in the result file and summary.json, and
// for those the summary's table shows, their column (in this order, after the run's label;
// report.cc's table of columns derived from several fields or runs says which field each
// follows). train/report.cc writes and reads JSON and prints the table by walking the rows,
// so a new number is its member above and its row here (a number of a new kind, another
// Style and its case in report.cc's cell(); a number made from several fields, a derived
// column). `visit(name, member)` or `visit(name, member, column)` is
// called with a const or mutable member as `r` is. Two fields keep a form of their own in
// JSON and are not rows: tokens_weighting ("grad_weighting": "tokens" or "uniform") and
// predicted_comm_seconds (null without a model); weight_sample travels in the result file
// only.
template <typename R, typename Visit>
void forEachField(R& r, Visit&& visit) {
  visit("run", r.run);
  visit("name", r.name);
  visit("model", r.model);
  visit("scheduler", r.scheduler);
  visit("backend", r.backend);
  visit("compression", r.compression);
  visit("compression_choice", r.compression_choice);
  visit("ranks", r.ranks, Column{"ranks", 6, Style::kThousands});
  visit("micro_batch", r.micro_batch, Column{"micro-batch", 12, Style::kList});
  visit("step_s", r.step_seconds, Column{"step (s)", 10, Style::kFixed3});
  visit("world_batch_tokens", r.world_batch_tokens, Column{"world batch", 13, Style::kThousands});
  visit("tokens_per_s", r.tokens_per_second, Column{"tokens/s", 11, Style::kThousands});
  visit("comm_s", r.comm_seconds, Column{"comm (s)", 10, Style::kFixed4});
  visit("exposed_comm_s", r.exposed_seconds, Column{"exposed (s)", 13, Style::kFixed4});
  visit("parameters", r.parameters);
  visit("flops_per_token", r.flops_per_token);
  visit("steps", r.steps);
  visit("timed_steps", r.timed_steps);
  visit("world_batch_samples", r.world_batch_samples);
  visit("rebalances", r.rebalances);
  visit("allgather_s", r.gather_seconds);
  visit("exposed_allgather_s", r.gather_exposed_seconds);
  visit("device", r.device);
  visit("comm_memory", r.comm_memory);
  visit("schedulers_ran", r.schedulers_ran);
  visit("allreduce_bytes", r.allreduce_bytes);
  visit("sync_mode", r.sync_mode);
  visit("sync_every", r.sync_every);
  visit("sync_warmup_steps", r.sync_warmup_steps);
  visit("sent_bytes_per_step", r.sent_bytes_per_step);
  visit("interface_hosts", r.interface_hosts);
  visit("interface_startup_sent_bytes", r.interface_startup_sent_bytes);
  visit("interface_sent_bytes_per_step", r.interface_sent_bytes_per_step);
  visit("sharding", r.sharding);
  visit("overlap", r.overlap);
  visit("parameter_bytes", r.parameter_bytes);
  visit("gradient_bytes", r.gradient_bytes);
  visit("optimizer_bytes", r.optimizer_bytes);
  visit("gathered_peak_bytes", r.gathered_peak_bytes);
  visit("pooled_bytes", r.pooled_bytes);
  visit("peak_rss_bytes", r.peak_rss_bytes);
  visit("step_memory", r.step_memory);
  visit("units", r.units);
  visit("unit_parameters", r.unit_parameters);
  visit("buckets", r.buckets);
  visit("predicted_float32_comm_s", r.predicted_float32_comm_seconds);
  visit("predicted_codec_arithmetic_s", r.predicted_codec_arithmetic_seconds);
  visit("link_alpha_s", r.link_alpha);
  visit("link_beta_s_per_byte", r.link_beta);
  visit("link_gap_s", r.link_gap);
  visit("link_bank_bytes", r.link_bank);
  visit("link_between_nodes", r.between_nodes);
  visit("compute_s", r.compute_seconds);
  visit("comm_explained", r.comm_explained.explained);
  visit("comm_link_s", r.comm_explained.link);
  visit("comm_latency_s", r.comm_explained.latency);
  visit("comm_link_busy_s", r.comm_explained.link_busy);
  visit("comm_busy_probed", r.comm_explained.busy_probed);
  visit("buckets_below_knee", r.comm_explained.below_knee);
  visit("comm_waiting_s", r.comm_explained.waiting);
  visit("comm_beyond_s", r.comm_explained.beyond);
  visit("comm_during_backward_s", r.comm_explained.during_backward);
  visit("explained_exposed_comm_s", r.comm_explained.exposed);
  visit("comm_last_arrival_late_s", r.comm_explained.late);
  visit("predicted_exposed_comm_s", r.comm_explained.predicted_exposed);
  visit("straggler_score", r.straggler_score);
  visit("straggler_wait_s", r.straggler_wait_seconds);
  visit("arrived_last", r.arrived_last);
  visit("step_at_fastest_s", r.step_at_fastest_seconds);
  visit("straggler_steps", r.straggler_steps);
  visit("first_loss", r.first_loss);
  visit("last_loss", r.last_loss);
  visit("target_loss", r.target_loss);
  visit("steps_to_target", r.steps_to_target);
  visit("seconds_to_target", r.seconds_to_target);
  visit("loss_curve", r.loss_curve);
  visit("loss_curve_s", r.loss_curve_seconds);
  visit("loss_curve_first_step", r.loss_curve_first_step);
  visit("sync", r.sync);
  visit("token_budgets", r.token_budgets);
  visit("peak_flops", r.peak_flops);
}

// The same for the parts of a Result that are records of their own.
template <typename S, typename Visit>
void forEachSyncField(S& s, Visit&& visit) {
  visit("step", s.step);
  visit("parameters", s.parameters);
  visit("identical", s.identical);
  visit("max_spread", s.max_spread);
  visit("first_parameter", s.first_parameter);
  visit("ranks", s.ranks);
  visit("differing", s.differing);
}
template <typename M, typename Visit>
void forEachStepMemoryField(M& m, Visit&& visit) {
  visit("resident_bytes", m.resident);
  visit("resident_at_start_bytes", m.resident_at_start);
  visit("process_ranks", m.process_ranks);
  visit("tracked_bytes", m.tracked);
  visit("tracked_at_start_bytes", m.tracked_at_start);
  visit("set_up_bytes", m.set_up);
  visit("forward_bytes", m.forward);
  visit("backward_bytes", m.backward);
  visit("gathered_bytes", m.gathered);
  visit("gradient_sync_bytes", m.gradient_sync);
  visit("optimizer_bytes", m.optimizer);
  visit("other_bytes", m.other);
  visit("forward_high_bytes", m.forward_high);
  visit("file_backed_at_start_bytes", m.file_backed_at_start);
  visit("set_up_peak_bytes", m.set_up_peak);
  visit("limit_bytes", m.limit);
  visit("limit_given", m.limit_given);
}
template <typename C, typename Visit>
void forEachRebalanceField(C& c, Visit&& visit) {
  visit("after_step", c.after_step);
  visit("micro_batch", c.micro_batch);
}

// Runs a train experiment with its ranks as threads of this process (loopback backend).
// `out_dir` receives rank-R.jsonl, one line per step. Throws Error on failure.
Result run(const PluginLoader& loader, const config::Experiment& e, const std::string& out_dir);

// The refusal of train.device: cpu over a backend that moves device memory only (nccl).
ConfigError hostTensorsOnDeviceBackend(const config::Experiment& e);
// This rank's part of a train experiment over `backend` (a worker process).
Result runRank(const PluginLoader& loader, const config::Experiment& e,
               std::shared_ptr<Backend> backend, const Topology& topology,
               const std::string& out_dir);

// The table runtime/run.h drives a file of train experiments with.
std::unique_ptr<ExperimentKind> makeKind();

}  // namespace collie::train
