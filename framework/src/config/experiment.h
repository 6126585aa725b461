// Loading an experiment file: safe reading, --set overrides, matrix expansion, validation,
// and the typed view of one resolved run.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <string>
#include <vector>

#include "collie/buffer.h"
#include "collie/collective.h"
#include "collie/log.h"
#include "collie/params.h"
#include "collie/rules.h"
#include "collie/topology.h"

namespace collie::config {

// Files larger than this are refused before parsing (a config is a page of text).
constexpr size_t kMaxConfigBytes = 1 << 20;
// A file's matrix makes at most this many runs.
constexpr uint64_t kMaxRuns = 4096;
// launch.nproc_per_node: ranks on one machine as processes or threads, and ranks a simulated
// backend (simgrid) runs as actors in one process.
constexpr int kMostLocalRanks = 1024;
constexpr int kMostSimulatedRanks = 65536;

// A plugin slot of the config: a name or path, its params and a display label. A scheduler
// slot may hold scheduler rules instead (`rules`): the first whose max_bytes admits the
// message runs it, as the Communicator does.
struct PluginRef {
  std::string plugin;
  Params params;
  std::string label;                       // defaults to the plugin name ("rules" for a rule list)
  std::vector<SizeRule<PluginRef>> rules;  // the choice: a scheduler slot
};

// The typed view of a validated file. Every field a key of the file sets is written by
// experimentSchema()'s bindings (experiment.cc), which hold the defaults; the zeros below are
// only what a default-constructed struct holds before that.
struct BenchSpec {
  Collective collective{};
  std::vector<PluginRef> schedulers;
  DType dtype{};
  ReduceOp op{};
  int root = 0;
  uint64_t min_bytes = 0, max_bytes = 0;
  int step_factor = 0;
  int warmup_iters = 0, iters = 0;
  // Timed calls last at least this long: iters grows for messages that take less.
  std::chrono::milliseconds min_time{0};
  int repeats = 0;  // measurements of each (size, scheduler), interleaved
  bool check = false;
  bool calibrate = false;  // fit the α-β-γ model first and print predictions
  std::string emit_rules;  // write the measured best scheduler per size range here
  bool plots = false;      // busbw and time plots (gnuplot) beside the CSV
  bool trace = false;      // the job's timeline, trace.json (runtime/trace.h)
};

// Where training samples come from: each rank's share is a deterministic
// function of the seed, the step and the rank.
struct DataSpec {
  enum class Source { kSynthetic, kTokens, kText };
  Source source{};
  std::string path;  // tokens: a flat uint16 file; text: any text file (bytes are tokens)
  uint64_t seed = 0;
};

// launch.lab: run the job on an emulated cluster of this machine (lab/lab.h).
struct LabSpec {
  static constexpr int kMaxHosts = 64;  // addresses .1 to .64 of the lab's /24
  int hosts = 0;                        // 0: no lab
  std::string rate;
  std::string cpus;  // per host, ';' between hosts ("" : every CPU)
};

// Parses a tc rate ("100mbit", "1gbit", "10gbit", "500kbit", "1000000" bits/s) from 8kbit
// to 100gbit; throws ConfigError naming `what` otherwise.
uint64_t parseRate(const std::string& rate, const std::string& what);

// What of the training state each rank keeps only its shard of (ZeRO's stages):
// nothing (DDP), the optimizer state (stage 1), the reduced gradients too (stage 2), and the
// parameters too (stage 3).
enum class ShardedState { kNone, kOptimizer, kGradients, kParameters };
// train.sharding's values, in the enum's order.
const std::vector<std::string>& shardedStateNames();
const std::string& shardedStateName(ShardedState s);

// How often the ranks' models meet (train.sync). every_step: gradients are all-reduced
// every step (DDP). local_sgd: after warmup_steps such steps, each rank steps on its own
// gradients and the ranks' parameters are averaged every `every` steps (PyTorch's post-local
// SGD). diloco: the same inner steps, and every `every` steps an outer Nesterov SGD step on
// the averaged change of the parameters (DiLoCo).
struct SyncSpec {
  enum class Mode { kEveryStep, kLocalSgd, kDiloco };
  Mode mode = Mode::kEveryStep;
  int every = 0;
  int warmup_steps = 0;
  double outer_lr = 0, outer_momentum = 0;
  bool nesterov = false;
  bool local() const { return mode != Mode::kEveryStep; }
};
const std::string& syncModeName(SyncSpec::Mode mode);

// A synchronous data-parallel training run.
struct TrainSpec {
  PluginRef scheduler;    // the gradient all-reduce (a plugin or rules)
  PluginRef compression;  // a codec plugin for the gradient buckets; plugin "none": none
  // compression {plugin: auto}: the codecs (or none) it chooses among, by predicted step.
  std::vector<PluginRef> compression_candidates;
  SyncSpec sync;
  int steps = 0;
  std::vector<int> micro_batch;   // one entry for every rank, or one per rank (empty: auto)
  bool auto_micro_batch = false;  // split global_batch by each rank's measured speed
  int global_batch = 0;           // samples of one micro-batch over all ranks (auto)
  // auto: every rebalance_every steps (0: only at the start) the split follows the measured
  // per-sample compute time, when the new one predicts the slowest rank's compute at least
  // rebalance_hysteresis shorter.
  int rebalance_every = 20;
  double rebalance_hysteresis = 0.05;
  int grad_accum = 0;
  bool tokens_weighting = false;  // false: uniform 1/world mean (plain DDP)
  bool sgd = false;               // else AdamW
  double lr = 0, min_lr = 0;
  double target_loss = 0;  // the loss whose time the summary reports (0: none)
  bool cosine = false;     // else constant after warmup
  int warmup_steps = 0;
  int linear_scaling_batch = 0;  // 0: off
  double weight_decay = 0, beta1 = 0, beta2 = 0, momentum = 0;
  double grad_clip = 0;  // 0: off
  bool cuda = false;     // train.device: cuda (the local rank's GPU), else the CPU
  bool bf16 = false;
  bool grad_checkpointing = false;
  uint64_t bucket_bytes = 0;
  bool overlap = false;
  ShardedState sharding = ShardedState::kNone;
  int verify_sync_every = 0;  // 0: at the end only
  // Straggler attribution: every straggler_every steps (0: off) the ranks' timings are
  // gathered; a rank whose score over the last straggler_window steps is below
  // straggler_threshold is named in a warning.
  int straggler_every = 10;
  double straggler_threshold = 0.7;
  int straggler_window = 20;
  // Writes the job's timeline, trace.json in the run's folder (runtime/trace.h).
  bool trace = false;
  bool fail_on_divergence = false;
  uint64_t seed = 0;
  int log_every = 0;
  std::string checkpoint_dir;  // "": no checkpoints
  int checkpoint_every = 0;    // 0: after the last step only
  int checkpoint_keep = 0;
  bool resume = false;
  std::vector<double> token_budgets;
  double peak_flops = 0;  // per rank, for MFU; 0: unknown

  bool compresses() const { return compression.plugin != "none"; }
  bool choosesCompression() const { return compression.plugin == "auto"; }
  // This rank's samples per micro-batch (not for auto, which the trainer measures).
  int microBatchOf(int rank) const {
    return micro_batch.size() == 1 ? micro_batch[0] : micro_batch[rank];
  }
};

// One fault of `faults:` (docs/running.md): on `rank`, before its training step
// `at_step` (1-based) or before the collective it numbers `at_collective` (the seq of
// provenance and error messages), take `action`. Exactly one of at_step, at_collective is set.
struct FaultSpec {
  enum class Action { kKill, kStop, kExit, kThrow, kDelay, kSlow };
  int index = 0;  // its place in the list: faults[index]
  int rank = 0;
  int64_t at_step = 0;
  int64_t at_collective = 0;
  Action action{};
  int exit_code = 0;                  // exit
  std::chrono::milliseconds delay{};  // delay: the sleep; stop: until SIGCONT (0: never)
  double cpu_share = 0;               // slow: the fraction of one CPU left to the rank

  // "exit with code 0", "a delay of 500 ms", ...
  std::string describe() const;
  // "before step 3", "before collective 40"
  std::string when() const;
  // Whether it ends or freezes the process (kill, stop, exit) or limits its CPU (slow):
  // what ranks that are threads of one process cannot take.
  bool needsOwnProcess() const;
};

// debug: what a run does to find its own faults (off or cheap by default).
struct DebugSpec {
  bool consistency = false;  // compare every collective's call across ranks first
  int flight_recorder = 0;   // collectives each rank keeps and writes when it fails (0: off)
  // How long a collective waits before the job names the ranks it waits for (0: never).
  std::chrono::milliseconds stall_warning{10000};
};

// One run: a whole file, or one point of its matrix.
struct Experiment {
  enum class Kind { kBench, kTrain };
  Kind kind = Kind::kBench;
  std::string file;
  std::string name;
  std::string matrix_point;  // "bench.dtype=bf16, launch.nproc_per_node=2", or ""
  int matrix_index = -1;     // the point's place in the matrix (config-N.yaml); 0 without one
  YAML::Node resolved;       // defaults filled in, overrides applied: saved with results
  LogLevel log_level{};
  int nproc_per_node = 0;
  int threads_per_rank = 0;
  int ranks_per_node = 0;                // launch.ranks_per_node (0: one node)
  std::vector<std::string> node_labels;  // launch.node_labels (empty: none)
  Topology topology;                     // from ranks_per_node or node_labels; one node otherwise
  bool cpu_affinity = false;
  // launch.cpu_share: each rank's process limited to this share of one CPU (one for every
  // rank, or one per rank; empty: no limit).
  std::vector<double> cpu_share;
  // launch.memory_limit: each rank's process held to this many bytes by collie's launcher
  // (one for every rank, or one per rank; empty: no limit).
  std::vector<uint64_t> memory_limit;
  bool explicit_topology = false;  // labels or ranks_per_node given (else: host names)
  std::string master_addr;
  int master_port = 0;  // 0: the launcher picks a free port
  std::chrono::milliseconds rendezvous_timeout{};
  std::string token_file;  // the job token every rank presents to the store ("": none)
  int max_restarts = 0;    // collie's launcher restarts all workers after a failure
  LabSpec lab;
  PluginRef backend;
  BenchSpec bench;
  PluginRef model;  // train experiments
  DataSpec data;
  TrainSpec train;
  std::vector<FaultSpec> faults;
  DebugSpec debug;
  std::string output_dir;
};

// The keys whose values may differ from host to host in one job: the network interface a
// backend uses and the address it announces (names differ between machines: enp3s0 on one,
// wlp2s0 on another), the GPU a rank drives, where the job token is kept. Everything else every
// rank must agree on.
extern const std::vector<std::string> kPerHostKeys;

// `e.resolved` without the kPerHostKeys: the text every rank of a job checks it shares.
YAML::Node sharedSettings(const Experiment& e);

// Reads, overrides (each "key=value"), expands and validates. Throws ConfigError listing
// every problem, each with file:line:col, the dotted key, expected and found.
std::vector<Experiment> loadExperiments(const std::string& path,
                                        const std::vector<std::string>& sets);

// The runs of a file under a launcher that started a fixed `world` of ranks (torchrun,
// mpirun, srun; `source` names it): throws ConfigError when the matrix varies
// launch.nproc_per_node, and warns when launch.nproc_per_node disagrees with `world`.
void checkFixedWorld(const std::vector<Experiment>& runs, const std::string& source, int world);

// The text of a config file, refused with a clear message when it is missing, a directory,
// unreadable, too large or binary.
// `what` names the file in messages ("config", "rules file").
std::string readConfigFile(const std::string& path, const std::string& what = "config");

}  // namespace collie::config
