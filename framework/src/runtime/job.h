// A worker process's membership in a job of processes: the rendezvous store
// (rank 0 hosts it), the join that names ranks that never arrive, the check that every rank
// runs the same experiment, the topology from host names, and the backend.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collie/backend.h"
#include "collie/error.h"
#include "collie/store.h"
#include "collie/topology.h"
#include "config/experiment.h"
#include "plugin/loader.h"
#include "runtime/environment.h"

namespace collie {

class TcpStore;

class ProcessJob {
 public:
  // Hosts (rank 0) or reaches the store at the launcher's MASTER_ADDR/MASTER_PORT (else
  // `default_addr`/`default_port`), then waits until every rank has joined. Throws
  // CommError naming the ranks that did not arrive within `timeout`.
  // On one host (every rank local) the store listens on 127.0.0.1 only. Elsewhere it
  // listens on MASTER_ADDR and needs a job token (jobToken(token_file)).
  ProcessJob(const WorkerEnv& env, const std::string& default_addr, uint16_t default_port,
             std::chrono::milliseconds timeout, const std::string& token_file = "");
  // Rank 0 keeps the store up until every rank is done with it (bounded by the timeout).
  ~ProcessJob();

  int rank() const { return env_.rank; }
  int world() const { return env_.world; }
  // Whether every rank runs on this host (its launcher started them all).
  bool oneHost() const { return env_.local_world == env_.world; }
  // This rank's position among its host's ranks, as its launcher numbered them.
  int localRank() const { return env_.local_rank; }
  const WorkerEnv& env() const { return env_; }
  Store& store();

  // After this rank failed with `error`: publishes it, waits a moment for the others, and
  // returns what the job knows about the cause — the ranks that reported errors too, and
  // the ranks that reported nothing (dead, stopped or stuck: the likely cause), or that the
  // store on rank 0 is gone. Never throws.
  std::string explainFailure(const std::string& error);

  // Runs `body`; an Error it throws comes back with explainFailure() appended.
  template <typename F>
  auto diagnose(F&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const Error& e) {
      throw Error(e.kind(), std::string(e.what()) + explainFailure(e.what()));
    }
  }

  // Every rank's `value` for `key`, in rank order (each key once per job).
  std::vector<std::string> allGather(const std::string& key, const std::string& value);
  // Every rank publishes its (name, value) facts; throws ConfigError naming the first fact
  // and the ranks where it differs from rank 0.
  void checkSame(const std::string& key,
                 const std::vector<std::pair<std::string, std::string>>& facts);

 private:
  void join();
  void waitForRanks(const std::string& key, const std::string& what);

  WorkerEnv env_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStore> store_;
};

// One group's rank in a ProcessJob: its own key space, the backend, the topology.
struct WorkerRank {
  std::unique_ptr<PrefixStore> store;  // outlives the backend, which may hold it
  std::shared_ptr<Backend> backend;
  Topology topology;
};

// A plugin a run loads: its kind and its name or path.
struct PluginUse {
  PluginKind kind;
  std::string plugin;
};
// Every plugin run `e` loads, each once, in the order they are opened: the backend, the
// bench's schedulers (every scheduler of a rule list), the model and the training scheduler.
std::vector<PluginUse> pluginsOf(const config::Experiment& e);

// "file:digest ..." of every plugin and rules file run `e` opens, nested ones included (it
// opens them, and creates the run's schedulers once to make them open theirs): what every
// rank must agree on.
std::string openedFilesIdentity(const PluginLoader& loader, const config::Experiment& e);

// Creates this rank's `ref` backend with its store keys under `prefix` (every rank must use
// the same prefix, and each group its own).
WorkerRank createBackend(ProcessJob& job, const PluginLoader& loader, const config::PluginRef& ref,
                         const std::string& prefix, std::chrono::milliseconds timeout);

// Joins run `index` of the file: checks that every rank loaded the same config, plugins and
// world size, builds the topology (config labels, else host names) and creates the backend.
WorkerRank joinRun(ProcessJob& job, const PluginLoader& loader, const config::Experiment& e,
                   int index);

// Whether `plugin` runs its ranks as threads of one process (the loopback backend).
bool runsInProcess(const PluginLoader& loader, const std::string& plugin);

}  // namespace collie
