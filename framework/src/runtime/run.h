// Running the runs of an experiment file (`collie run`, `collie launch`) in whichever role
// this process has: the launcher of a job, a worker collie's launcher started, or one rank
// of a job that torchrun, mpirun or srun started. The role is detected once; what differs
// between a bench and a train experiment is one ExperimentKind table.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "plugin/loader.h"
#include "runtime/environment.h"
#include "runtime/job.h"

namespace collie {

// What `collie run` or `collie launch` was asked to do.
struct RunRequest {
  std::string config;             // the experiment file
  std::vector<std::string> sets;  // --set KEY=VALUE, in order
  std::string out;                // --out ("": output.dir/NAME-TIMESTAMP)
  std::string log_level;          // --log-level, handed on to the workers
  std::string emit_rules;         // --emit-rules
  std::string emit_policy;        // --emit-policy: a folder for other libraries' policy files
  // collie launch: this node's place among several (collie run: one node).
  int nnodes = 1, node_rank = 0;
  std::string master_addr;  // "": launch.master_addr
  int master_port = 0;      // 0: launch.master_port, else a free port
  // The lab's launcher on each emulated host (collie launch --only-run N): run only run N of
  // the file and leave node 0's result for the launcher that started the hosts (-1: all).
  int only_run = -1;
};

// One experiment kind's table: how a run of it goes in each role, how rank 0 hands its
// result to the launcher, and how the results of a file are reported. An object keeps the
// results of the runs it did or loaded, in run order.
class ExperimentKind {
 public:
  virtual ~ExperimentKind() = default;

  // Refuses, before anything runs, what the request asks that this kind cannot do.
  virtual void checkRequest(const RunRequest& request, const std::vector<config::Experiment>& runs,
                            const PluginLoader& loader) const = 0;
  // Refuses run `e` over a backend that simulates its ranks (SimGrid), when this kind needs a
  // real one; says nothing otherwise. ConfigError naming the backend.
  virtual void checkSimulated(const config::Experiment& e) const = 0;
  // Where a restart of run `e` (launch.max_restarts) takes up: " from the newest checkpoint
  // in DIR", or "" from the start; and a warning for the user when that loses work ("").
  struct Restart {
    std::string from;
    std::string warning;
  };
  virtual Restart restartOf(const config::Experiment& e) const = 0;
  // Runs `e` with its ranks as threads of this process (an in-process backend).
  virtual void runInThreads(const PluginLoader& loader, const config::Experiment& e,
                            const std::filesystem::path& out) = 0;
  // Runs this process's rank of `e` over the backend the job created for it.
  virtual void runAsRank(const PluginLoader& loader, const config::Experiment& e,
                         const WorkerRank& rank, const std::filesystem::path& out) = 0;
  // The newest result as JSON (atomically), and one read back from such a file.
  virtual void saveLast(const std::string& path) const = 0;
  virtual void load(const std::string& path) = 0;
  // Prints the table of every result and writes the result files into `out`; returns the
  // exit code (1 when a result shows a failure, such as wrong elements).
  virtual int report(const RunRequest& request, const std::vector<config::Experiment>& runs,
                     const std::filesystem::path& out) = 0;
};

// The part of a kind's table that every kind fills the same way: one result per run, made
// by the kind's run (ranks as threads) or runRank (this process's rank), handed over by its
// save and load functions, and kept in run order for report().
template <typename Result, auto kRun, auto kRunRank, auto kSave, auto kLoad>
class KindOfResults : public ExperimentKind {
 public:
  void runInThreads(const PluginLoader& loader, const config::Experiment& e,
                    const std::filesystem::path& out) override {
    results_.push_back(kRun(loader, e, out.string()));
  }
  void runAsRank(const PluginLoader& loader, const config::Experiment& e, const WorkerRank& rank,
                 const std::filesystem::path& out) override {
    results_.push_back(kRunRank(loader, e, rank.backend, rank.topology, out.string()));
  }
  void saveLast(const std::string& path) const override { kSave(path, results_.back()); }
  void load(const std::string& path) override { results_.push_back(kLoad(path)); }

 protected:
  std::vector<Result> results_;
};

// What the runtime is handed from above it (the command line), so that it includes neither
// the kinds nor the lab: the table of the experiments' kind (bench or train), and the
// launcher of runs on the lab's emulated hosts (launch.lab).
struct RunParts {
  std::unique_ptr<ExperimentKind> (*kind)(config::Experiment::Kind) = nullptr;
  // Whether this process should run `e` across the lab's hosts (it asks for a lab, and this
  // process is not already the launcher of one of them). Null: no lab.
  bool (*wants_lab)(const config::Experiment& e) = nullptr;
  // Runs run `index` of the file across the lab's hosts; returns once node 0 has left the
  // run's result in `out`.
  void (*run_on_lab)(const RunRequest& request, const config::Experiment& e, size_t index,
                     const std::filesystem::path& out) = nullptr;
};

// Runs every run of the file in this process's role and reports on the process that
// reports (the launcher on node 0, or rank 0 under an outside launcher). Returns the exit
// code; throws Error on failure and Interrupted when a signal stopped the workers.
int runExperiments(const RunRequest& request, const std::vector<config::Experiment>& runs,
                   const RunParts& parts);

}  // namespace collie
