// Rendezvous, join, same-experiment check and backend creation for worker processes.
#include "runtime/job.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <thread>

#include "collie/config.h"
#include "collie/error.h"
#include "collie/log.h"
#include "core/strings.h"
#include "runtime/communicator.h"
#include "runtime/tcp_store.h"
#include "util/system.h"

namespace collie {
namespace {

using Clock = std::chrono::steady_clock;

std::string hex(uint64_t value) {
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << value;
  return out.str();
}

std::string hashText(const std::string& text) { return hex(XXH3_64bits(text.data(), text.size())); }

std::string hashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return "unreadable";
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return in.bad() ? "unreadable" : hashText(bytes);
}

// What tells this machine from another that reports the same host name: its machine id
// and its network namespace (two emulated hosts of a lab share the machine id, two
// machines cloned from one image may share the name).
std::string machineKey() {
  std::string id;
  std::ifstream("/etc/machine-id") >> id;
  struct stat ns {};
  const unsigned long long inode = ::stat("/proc/self/ns/net", &ns) == 0 ? ns.st_ino : 0;
  return fmt::format("{}/{}", id, inode);
}

// The topology from every rank's (host name, machine key): ranks with equal pairs share a
// node, named by its host name, with " (2)", " (3)" added when different machines share
// one.
Topology topologyOfHosts(const std::vector<std::string>& names,
                         const std::vector<std::string>& keys) {
  std::vector<std::string> labels;
  for (size_t r = 0; r < names.size(); ++r) labels.push_back(names[r] + "\n" + keys[r]);
  Topology topology = Topology::fromLabels(labels);
  std::map<std::string, int> seen;
  for (auto& label : topology.node_names) {
    const std::string name = label.substr(0, label.find('\n'));
    const int count = ++seen[name];
    label = count == 1 ? name : fmt::format("{} ({})", name, count);
  }
  return topology;
}

// "1, 3 and 5" style list of ranks.
std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

ProcessJob::ProcessJob(const WorkerEnv& env, const std::string& default_addr, uint16_t default_port,
                       std::chrono::milliseconds timeout, const std::string& token_file)
    : env_(env), timeout_(timeout) {
  // Every rank on this host: nothing of the job needs to be reachable from another one.
  const std::string addr = oneHost()                 ? "127.0.0.1"
                           : env.master_addr.empty() ? default_addr
                                                     : env.master_addr;
  const uint16_t port = env.master_port != 0 ? env.master_port : default_port;
  if (port == 0) {
    throw ConfigError(fmt::format(
        "rank {} (started by {}): MASTER_PORT is not set. HINT: export MASTER_PORT (e.g. 29500) "
        "to every rank, or set launch.master_port",
        env.rank, env.source));
  }
  logDebug(fmt::format("rendezvous at {}:{} as rank {} of {} ({})", addr, port, env.rank, env.world,
                       env.source));
  std::string token = jobToken(token_file);
  if (!token.empty() || !oneHost() || env.world == 1) {
    store_ = std::make_unique<TcpStore>(addr, port, env.rank == 0, timeout, token);
    join();
    return;
  }
  // An outside launcher's ranks on one host share no token: without one, any local user
  // could read and forge the job's keys. Rank 0 leaves one where only this user reads it.
  const auto deadline = Clock::now() + timeout;
  const std::string token_path = localJobTokenPath(port);
  if (env.rank == 0) {
    // The file is written once the port is ours: a rank 0 that cannot listen (another job
    // holds the port) must neither replace nor delete that job's file.
    token = drawJobToken();
    store_ = std::make_unique<TcpStore>(addr, port, true, timeout, token);
    writeLocalJobToken(token_path, token);
    try {
      join();
    } catch (...) {
      ::unlink(token_path.c_str());
      throw;
    }
    ::unlink(token_path.c_str());  // every rank has presented it
    return;
  }
  for (;;) {
    token = readLocalJobToken(token_path, deadline);
    if (token.empty()) {
      throw CommError(fmt::format(
          "rank {} (started by {}): rank 0 left no job token in {} within {} ms. HINT: every "
          "rank of a job on one host must run as the same user; is rank 0 running?",
          env.rank, env.source, token_path, timeout.count()));
    }
    try {
      store_ = std::make_unique<TcpStore>(addr, port, false, timeout, token);
      break;
    } catch (const CommError& e) {
      // A file left by an earlier job on this port that died before rank 0 of this one
      // wrote its own: read it again.
      if (std::string(e.what()).find(kWrongTokenRefusal) == std::string::npos ||
          Clock::now() >= deadline) {
        throw;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  join();
}

ProcessJob::~ProcessJob() {
  // A failing rank leaves at once: the others learn of it from their own errors.
  if (!store_ || std::uncaught_exceptions() > 0) return;
  try {
    store_->add("finished", 1);
    if (env_.rank != 0) return;
    auto deadline = Clock::now() + timeout_;
    while (store_->add("finished", 0) < env_.world && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const std::exception&) {
    // A rank that already lost the store has nothing left to tell the others.
  }
}

Store& ProcessJob::store() { return *store_; }

std::string ProcessJob::explainFailure(const std::string& error) {
  // A store that does not answer a request within seconds is as good as gone (its rank is
  // stopped or hangs); the job is ending, so this rank says so instead of waiting out the
  // timeout. On one host a live store answers in milliseconds: 2 s. Across hosts a request
  // may queue behind a second of traffic on a slow link: 3 s, still within the 5 s the
  // launcher gives a rank to report after another failed. The limit stays: nothing after a
  // failure needs the store's patience.
  store_->limitCalls(std::chrono::seconds(oneHost() ? 2 : 3));
  try {
    store_->setString(fmt::format("failure/{}", env_.rank), error);
  } catch (const std::exception&) {
    return "; the rendezvous store on rank 0 is unreachable: rank 0 is the likely cause (the "
           "process died or was stopped)";
  }
  // Every rank looks for 1.5 s, then says it is done looking. Rank 0 hosts the store, so
  // it stays until every rank that reported is done looking (at most 2.5 s): the others
  // may fail a little later than it did.
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(env_.rank == 0 ? 2500 : 1500);
  std::vector<int> reported, silent;
  bool polled = false;
  while (true) {
    std::vector<int> now_reported, now_silent;
    bool all_done_looking = true;
    try {
      for (int r = 0; r < env_.world; ++r) {
        if (r == env_.rank) continue;
        bool failed = store_->check({fmt::format("failure/{}", r)});
        (failed ? now_reported : now_silent).push_back(r);
        if (failed && env_.rank == 0 && !store_->check({fmt::format("looked/{}", r)}))
          all_done_looking = false;
      }
    } catch (const std::exception&) {
      break;  // rank 0 left: keep what the last look saw
    }
    reported = now_reported;
    silent = now_silent;
    polled = true;
    const bool looked_enough =
        silent.empty() || Clock::now() >= start + std::chrono::milliseconds(1500);
    if (env_.rank != 0 && looked_enough) break;
    if (env_.rank == 0 && ((looked_enough && all_done_looking) || Clock::now() >= deadline)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (env_.rank != 0) {
    try {
      store_->setString(fmt::format("looked/{}", env_.rank), "");
    } catch (const std::exception&) {
    }
  }
  if (!polled) return "";
  std::string text;
  if (!reported.empty()) text += "; rank(s) " + rankList(reported) + " failed as well";
  if (!silent.empty()) {
    text += "; rank(s) " + rankList(silent) +
            " reported nothing: the likely cause (the process died, was stopped or hangs)";
  }
  return text;
}

void ProcessJob::join() {
  store_->setString(fmt::format("join/{}", env_.rank), detail::hostName());
  waitForRanks("join/", "arrive at the rendezvous");
}

// Waits until every rank has set key+rank, polling so that the error can name who is missing.
// Rank 0 gives up first and leaves the verdict under key + "failed" for the others.
void ProcessJob::waitForRanks(const std::string& key, const std::string& what) {
  std::vector<int> missing;
  for (int r = 0; r < env_.world; ++r) missing.push_back(r);
  auto verdict = [&](const std::vector<int>& ranks) {
    return fmt::format("{} of {} ranks did not {} within {:g} s: rank(s) {} (store {})",
                       ranks.size(), env_.world, what, timeout_.count() / 1000.0, rankList(ranks),
                       store_->address()) +
           ". HINT: check that every rank was started with the same WORLD_SIZE, MASTER_ADDR "
           "and MASTER_PORT; launch.rendezvous_timeout sets the wait";
  };
  const std::string failed_key = key + "failed";
  auto deadline = Clock::now() + timeout_ +
                  (env_.rank == 0 ? std::chrono::seconds(0) : std::chrono::seconds(2));
  while (true) {
    std::vector<int> still;
    try {
      for (int r : missing) {
        if (!store_->check({key + fmt::format("{}", r)})) still.push_back(r);
      }
      if (env_.rank != 0 && !still.empty() && store_->check({failed_key})) {
        throw CommError(fmt::format("rank {}: {}", env_.rank, store_->getString(failed_key)));
      }
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(fmt::format(
          "rank {}: rank 0 (the store host) left the rendezvous while rank(s) {} had not "
          "arrived: {}",
          env_.rank, rankList(missing), e.what()));
    }
    missing = still;
    if (missing.empty()) return;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(missing.size() > 8 ? 100 : 20));
  }
  if (env_.rank == 0) {
    try {
      store_->setString(failed_key, verdict(missing));
      std::this_thread::sleep_for(std::chrono::seconds(1));  // let the others read it
    } catch (const std::exception&) {
    }
  }
  throw CommError(fmt::format("rank {}: {}", env_.rank, verdict(missing)));
}

std::vector<std::string> ProcessJob::allGather(const std::string& key, const std::string& value) {
  store_->setString(fmt::format("{}/{}", key, env_.rank), value);
  waitForRanks(key + "/", "publish '" + key + "'");
  std::vector<std::string> values;
  for (int r = 0; r < env_.world; ++r)
    values.push_back(store_->getString(fmt::format("{}/{}", key, r)));
  return values;
}

void ProcessJob::checkSame(const std::string& key,
                           const std::vector<std::pair<std::string, std::string>>& facts) {
  std::string mine;
  for (const auto& [name, value] : facts) mine += name + "=" + value + "\n";
  auto all = allGather(key, mine);
  for (size_t f = 0; f < facts.size(); ++f) {
    auto nth = [&](const std::string& text) {
      std::istringstream in(text);
      std::string line;
      for (size_t i = 0; i <= f && std::getline(in, line);) ++i;
      return line.substr(line.find('=') + 1);
    };
    std::vector<int> differ;
    for (int r = 1; r < env_.world; ++r) {
      if (nth(all[r]) != nth(all[0])) differ.push_back(r);
    }
    if (!differ.empty()) {
      throw ConfigError(fmt::format("rank(s) {} loaded a different {} than rank 0: rank 0 has {}, "
                                    "rank {} has {}",
                                    rankList(differ), facts[f].first, nth(all[0]), differ[0],
                                    nth(all[differ[0]])) +
                        ". HINT: every rank must run the same config file, --set overrides, "
                        "plugins and world size");
    }
  }
}

bool runsInProcess(const PluginLoader& loader, const std::string& plugin) {
  return pluginInfo(*loader.open(PluginKind::kBackend, plugin)).in_process;
}

std::vector<PluginUse> pluginsOf(const config::Experiment& e) {
  std::vector<PluginUse> uses;
  auto add = [&](PluginKind kind, const std::string& plugin) {
    for (const auto& u : uses) {
      if (u.kind == kind && u.plugin == plugin) return;
    }
    uses.push_back({kind, plugin});
  };
  auto addScheduler = [&](const config::PluginRef& s) {
    if (s.rules.empty()) add(PluginKind::kScheduler, s.plugin);
    for (const auto& rule : s.rules) add(PluginKind::kScheduler, rule.choice.plugin);
  };
  add(PluginKind::kBackend, e.backend.plugin);
  for (const auto& s : e.bench.schedulers) addScheduler(s);
  if (e.kind == config::Experiment::Kind::kTrain) {
    add(PluginKind::kModel, e.model.plugin);
    addScheduler(e.train.scheduler);
    if (e.train.compresses() && !e.train.choosesCompression())
      add(PluginKind::kCodec, e.train.compression.plugin);
    for (const auto& c : e.train.compression_candidates)
      if (c.plugin != "none") add(PluginKind::kCodec, c.plugin);
  }
  return uses;
}

std::string openedFilesIdentity(const PluginLoader& loader, const config::Experiment& e) {
  for (const auto& use : pluginsOf(e)) loader.open(use.kind, use.plugin);
  // Creating the schedulers opens what they open themselves (hierarchical's intra and
  // inter, auto's candidates) and reads their rules files.
  for (const auto& slot : e.bench.schedulers) createRules(loader, slot);
  if (e.kind == config::Experiment::Kind::kTrain) createRules(loader, e.train.scheduler);
  std::string identity;
  for (const auto& path : loader.openedFiles()) {
    identity +=
        fmt::format("{}:{} ", std::filesystem::path(path).filename().string(), hashFile(path));
  }
  return identity;
}

WorkerRank createBackend(ProcessJob& job, const PluginLoader& loader, const config::PluginRef& ref,
                         const std::string& prefix, std::chrono::milliseconds timeout) {
  WorkerRank w;
  w.store = std::make_unique<PrefixStore>(prefix, job.store());
  BackendContext context;
  context.rank = job.rank();
  context.size = job.world();
  context.job_id = prefix;
  context.timeout = timeout;
  context.store = w.store.get();
  context.one_host = job.oneHost();
  context.local_rank = job.localRank();
  Params params = ref.params;
  w.backend = loader.createBackend(ref.plugin, params, context);
  w.topology = Topology::singleNode(job.world());
  return w;
}

WorkerRank joinRun(ProcessJob& job, const PluginLoader& loader, const config::Experiment& e,
                   int index) {
  const std::string run = fmt::format("run{}/", index);
  YAML::Emitter emitter;
  emitter << config::sharedSettings(e);  // per-host settings (a NIC's name) may differ
  const std::string plugins = openedFilesIdentity(loader, e);
  job.checkSame(run + "identity", {{"world size", fmt::format("{}", job.world())},
                                   {"collie version", COLLIE_VERSION},
                                   {"experiment (config digest)", hashText(emitter.c_str())},
                                   {"plugin and rules files (digests)", hashText(plugins)}});

  Topology topology;
  if (e.explicit_topology) {
    if (e.topology.world_size != job.world()) {
      throw ConfigError(
          fmt::format("launch.node_labels/ranks_per_node describe {} ranks but the job has {}",
                      e.topology.world_size, job.world()));
    }
    topology = e.topology;
  } else {
    topology = topologyOfHosts(job.allGather(run + "host", detail::hostName()),
                               job.allGather(run + "machine", machineKey()));
  }
  WorkerRank w = createBackend(job, loader, e.backend, run, e.rendezvous_timeout);
  w.topology = topology;
  logDebug(fmt::format("rank {} of {}: backend {} connected, {} node(s)", job.rank(), job.world(),
                       e.backend.label, topology.nodeCount()));
  return w;
}

}  // namespace collie
