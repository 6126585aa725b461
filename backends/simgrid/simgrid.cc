// The simgrid backend: every rank is a SimGrid actor on a host of a simulated platform, and
// a message costs what SimGrid's network model says it costs on the route between the two
// ranks' hosts, in simulated time. The schedulers, the bench and the conformance checks run
// unchanged; their clock is the simulated one (collie/simulation.h).
//
// Matching is collie's own (as the loopback backend's): messages between two ranks with one
// tag meet in posting order, whichever side arrives second. When they meet, the bytes are
// copied (the payload is real; with payload: false the bench's buffers are size-only and
// only host buffers, the control plane's, carry bytes) and a SimGrid communication of the
// message's size starts
// between the two hosts; both requests complete when it does. The simulation runs its actors
// one at a time on the thread that called run_ranks (SimGrid's default contexts), switching
// only inside SimGrid calls, so the matching state needs no lock: no SimGrid call is made
// while it is half updated.
#include <fmt/format.h>

#include <xbt/log.h>
#include <simgrid/Exception.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "collie/log.h"
#include "collie/plugin.h"
#include "collie/simulation.h"

namespace collie::simgrid_backend {
namespace {

namespace sg4 = simgrid::s4u;

// The params, read the same way by the runner (which builds the platform) and by every
// rank's backend (so that each key is known to both).
struct Settings {
  std::string platform;       // a SimGrid platform file; empty: a one-switch cluster built here
  double link_bandwidth = 0;  // bytes/s of each host's link in the built-in cluster
  double link_latency = 0;    // seconds of each host's link in the built-in cluster
  int ranks_per_node = 1;     // built-in cluster: hosts per node (1: one switch, no nodes)
  double node_bandwidth = 0;  // bytes/s of each node's uplink to the spine (ranks_per_node > 1)
  double node_latency = 0;    // seconds of each node's uplink
  double reduce_rate = 0;     // bytes/s of a local reduction, charged in simulated time; 0: free
  std::string network_model;
  std::string config;  // more SimGrid options, "key:value" separated by spaces
  std::chrono::milliseconds timeout{30000};
  // false: the bench's buffers are size-only (MemoryKind::kNone) and messages carry their
  // size alone; host buffers (the control plane's) still carry their bytes.
  bool payload = true;

  static Settings read(Params& params, std::chrono::milliseconds default_timeout) {
    Settings s;
    s.platform = params.getString("platform", "");
    // A number param: > 0, or >= 0 where `zero` says what 0 means.
    auto number = [&](const char* key, double fallback, const char* zero) {
      const double v = params.getDouble(key, fallback);
      if (zero == nullptr ? !(v > 0) : !(v >= 0)) {
        throw ConfigError(params.where(key) + "simgrid: params." + key + " must be " +
                          (zero == nullptr ? std::string("> 0") : std::string(">= 0") + zero));
      }
      return v;
    };
    const double gbps = number("link_gbps", 10.0, nullptr);
    const double latency_us = number("latency_us", 5.0, "");
    const double reduce_gbps = number("reduce_gbps", 20.0, " (0: reductions are free)");
    s.link_bandwidth = gbps * 1e9 / 8;
    s.link_latency = latency_us * 1e-6;
    s.ranks_per_node = static_cast<int>(params.getInt("ranks_per_node", 1, 1, 1 << 16));
    s.node_bandwidth = number("node_gbps", gbps, nullptr) * 1e9 / 8;
    s.node_latency = number("node_latency_us", latency_us, "") * 1e-6;
    s.reduce_rate = reduce_gbps * 1e9;
    s.network_model = params.getString("network_model", "CM02");
    const std::vector<std::string> models{"CM02", "LV08", "Constant", "SMPI", "IB"};
    if (std::find(models.begin(), models.end(), s.network_model) == models.end()) {
      throw ConfigError(params.where("network_model") + "simgrid: params.network_model '" +
                        s.network_model + "' is not one of SimGrid's: CM02, LV08, Constant, " +
                        "SMPI, IB");
    }
    s.config = params.getString("config", "");
    s.timeout = params.getDuration("timeout", default_timeout);
    s.payload = params.getBool("payload", true);
    return s;
  }
};

// One side of a transfer: its buffer and its half of the SimGrid communication (a put or a
// get on the transfer's mailbox, posted by this side's own actor, so that the message
// crosses the route between the two ranks' hosts and each side waits on its own half).
struct Pending : std::enable_shared_from_this<Pending> {
  Pending(const Buffer& b, int owner_rank) : buffer(b), owner(owner_rank) {}
  Buffer buffer;
  int owner;  // the world rank that posted it
  bool sending = false;
  const void* group = nullptr;  // the Group it was posted in: abort() ends its group's only
  // Where the two halves meet, shared by both sides: the side whose half is posted second
  // gives the mailbox back (SimGrid has paired the halves; it is empty again).
  struct Meeting {
    sg4::Mailbox* mailbox = nullptr;
    int posted = 0;
    bool matched = false;  // the second side found the first: its half is posted or on its way
    bool spoiled = false;  // a half was cancelled there: never reused
  };
  std::shared_ptr<Meeting> meeting;
  sg4::CommPtr comm;         // this side's half
  void* received = nullptr;  // where SimGrid puts the (unused) payload pointer
  std::string error;         // why the transfer failed (a size mismatch, an abort)
  bool failed = false;
  // The receive that releaseHalf posted to end a failed send still alone in its mailbox.
  sg4::CommPtr release;
  void* released = nullptr;
  bool was_released = false;  // releaseHalf ran: never twice
};
using Queue = std::deque<std::shared_ptr<Pending>>;

// The state of one group: a mailbox per member. Members are world ranks.
struct Group {
  using Key = std::pair<int, Tag>;  // (source position in the group, tag)
  struct Mailbox {
    std::map<Key, Queue> sends, recvs;
    AbortFlag aborted;
  };
  explicit Group(std::vector<int> members_) : members(std::move(members_)), boxes(members.size()) {}
  std::vector<int> members;
  std::vector<Mailbox> boxes;
};

// Everything ranks of one job share: the hosts, the groups, the SimGrid mailboxes.
struct World {
  std::vector<sg4::Host*> hosts;    // of each world rank
  std::vector<std::string> labels;  // the node of each world rank
  Settings settings;
  std::map<std::string, std::shared_ptr<Group>> groups;
  // The halves each world rank has posted and not seen finish, so that an abort can cancel
  // what it and its peers wait for.
  std::vector<std::set<Pending*>> in_flight;
  // Halves whose requests were dropped while SimGrid still moved them (a matched half that
  // runs on for its peer): kept until the simulation ends, since SimGrid writes into them
  // when the communication completes.
  std::vector<std::shared_ptr<Pending>> orphans;
  std::map<long, int> rank_of_actor;  // SimGrid actor id -> world rank
  // Empty SimGrid mailboxes for the next transfers: SimGrid never frees a mailbox, so a
  // transfer borrows one from the time its first half is posted until its second is.
  std::vector<sg4::Mailbox*> free_mailboxes;
  size_t mailboxes_made = 0;
  std::string mailbox_prefix;

  sg4::Mailbox* borrowMailbox() {
    if (free_mailboxes.empty()) {
      return sg4::Mailbox::by_name(mailbox_prefix + std::to_string(mailboxes_made++));
    }
    sg4::Mailbox* m = free_mailboxes.back();
    free_mailboxes.pop_back();
    return m;
  }
};

// The job the simulation runs now, by job id (one simulation at a time per process: SimGrid's
// engine is a process-wide singleton).
std::mutex g_registry_mu;
std::map<std::string, World*> g_worlds;

World* g_running = nullptr;  // the world of the simulation that runs now

// The log's rank is kept per thread, and every actor runs on the simulation's one thread:
// each call that may switch to another actor sets it back for the actor that resumes.
void resumeLogRank() {
  if (g_running == nullptr || sg4::Actor::is_maestro()) return;
  auto it = g_running->rank_of_actor.find(static_cast<long>(sg4::this_actor::get_pid()));
  if (it != g_running->rank_of_actor.end()) setLogRank(it->second);
}

World* findWorld(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_worlds.find(job_id);
  return it == g_worlds.end() ? nullptr : it->second;
}

// Host names in natural order ("node2" before "node10"), the order ranks are placed in.
bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
      x.erase(0, std::min(x.find_first_not_of('0'), x.size()));
      y.erase(0, std::min(y.find_first_not_of('0'), y.size()));
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// Hosts `first`..`first + count - 1` in a star zone: each with a full-duplex link of the
// built-in cluster's rate and latency to the zone's centre, and the node property `node`
// when it is not empty.
void addHosts(sg4::NetZone* zone, int first, int count, const Settings& s,
              const std::string& node) {
  for (int r = first; r < first + count; ++r) {
    auto* host = zone->create_host(fmt::format("rank{}", r), 1e9);
    if (!node.empty()) host->set_property("node", node);
    auto* link = zone->create_split_duplex_link(fmt::format("link{}", r), s.link_bandwidth)
                     ->set_latency(s.link_latency);
    zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr,
                    {{link, sg4::LinkInRoute::Direction::UP}}, true);
  }
}

// The built-in platform. With ranks_per_node 1: one switch, every rank on its own host with a
// full-duplex link of link_gbps and latency_us to it, and no other limit (a route is the
// sender's link up and the receiver's link down: 2 latencies, the link's bandwidth). With
// ranks_per_node k > 1, two levels: nodes of k hosts, each node a switch of its own with
// those links, and every node's switch joined to one spine by a full-duplex uplink of
// node_gbps and node_latency_us (a route between nodes: host link, uplink, uplink, host
// link). SimGrid 3.32's XML cannot say this compactly (docs/architecture.md), so it is built
// here.
void buildCluster(int world, const Settings& s) {
  auto* root = sg4::create_star_zone("collie-cluster");
  if (s.ranks_per_node == 1) {
    addHosts(root, 0, world, s, "");
    root->seal();
    return;
  }
  for (int first = 0, n = 0; first < world; first += s.ranks_per_node, ++n) {
    const std::string name = fmt::format("node{}", n);
    auto* node = sg4::create_star_zone(name);
    node->set_parent(root);
    auto* gateway = node->create_router(name + "-switch");
    addHosts(node, first, std::min(s.ranks_per_node, world - first), s, name);
    node->seal();
    auto* uplink = root->create_split_duplex_link(name + "-uplink", s.node_bandwidth)
                       ->set_latency(s.node_latency);
    root->add_route(node->get_netpoint(), nullptr, gateway, nullptr,
                    {{uplink, sg4::LinkInRoute::Direction::UP}}, true);
  }
  root->seal();
}

// Every actor's reduction, priced at reduce_rate in simulated time.
void chargeReduction(size_t bytes, void* user) {
  const auto* world = static_cast<const World*>(user);
  if (world->settings.reduce_rate > 0 && sg4::Actor::is_maestro() == false) {
    sg4::this_actor::sleep_for(static_cast<double>(bytes) / world->settings.reduce_rate);
    resumeLogRank();
  }
}

// SimGrid keeps its options for the life of the process, and refuses to change a model once
// the first simulation has made it: an option is set once, and a later simulation that needs
// another value of it is refused by name.
void applyOptions(sg4::Engine& engine, const std::vector<std::string>& options) {
  static std::map<std::string, std::string> applied;
  for (const auto& option : options) {
    const size_t colon = option.find(':');
    if (colon == std::string::npos || colon == 0) {
      throw ConfigError("simgrid: params.config option '" + option +
                        "' is not key:value (e.g. network/TCP-gamma:4194304)");
    }
    const std::string key = option.substr(0, colon), value = option.substr(colon + 1);
    auto it = applied.find(key);
    if (it != applied.end() && it->second == value) continue;
    try {
      engine.set_config(option);
    } catch (const std::exception& e) {
      if (it != applied.end()) {
        throw ConfigError(fmt::format(
            "simgrid: SimGrid keeps '{}' at '{}' for the life of this process, and this run asks "
            "for '{}'. HINT: run the experiments that need '{}' in a collie run of their own",
            key, it->second, value, value));
      }
      const std::string why = e.what();  // SimGrid lists every key after the first line
      throw ConfigError("simgrid: SimGrid refused option '" + option +
                        "': " + why.substr(0, why.find('\n')) +
                        ". HINT: SimGrid's options are listed in its documentation, "
                        "\"Configuring SimGrid\"");
    }
    applied[key] = value;
  }
}

void runRanks(const PluginContext& context, int world_size, const std::function<void(int)>& body) {
  Params params = *context.params;
  World world;
  world.settings = Settings::read(params, context.backend.timeout);
  const Settings& s = world.settings;
  if (!s.platform.empty() && !std::filesystem::is_regular_file(s.platform)) {
    throw ConfigError(
        "simgrid: params.platform '" + s.platform +
        "' is not a file. HINT: give a SimGrid platform file (backends/simgrid/README.md), or "
        "leave params.platform out for the built-in one-switch cluster");
  }
  std::unique_lock<std::mutex> one_simulation(g_registry_mu, std::try_to_lock);
  if (!one_simulation.owns_lock() || !g_worlds.empty()) {
    throw CommError("simgrid: another simulation runs in this process; SimGrid runs one at a time");
  }
  int argc = 1;
  char name[] = "collie";
  char* argv[] = {name, nullptr};
  xbt_log_control_set("root.thresh:warning");
  xbt_log_control_set("ker_lmm.thresh:error");
  sg4::Engine engine(&argc, argv);
  try {
    std::vector<std::string> options{"network/model:" + s.network_model};
    if (s.network_model == "CM02") {
      // The model as the platform states it: no TCP window bound, no traffic on the way back.
      options.push_back("network/TCP-gamma:0");
      options.push_back("network/crosstraffic:0");
    }
    std::string option;
    for (size_t i = 0; i <= s.config.size(); ++i) {
      if (i == s.config.size() || s.config[i] == ' ') {
        if (!option.empty()) options.push_back(option);
        option.clear();
      } else {
        option += s.config[i];
      }
    }
    applyOptions(engine, options);
    if (s.platform.empty()) {
      buildCluster(world_size, s);
    } else {
      engine.load_platform(s.platform);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(std::string("simgrid: ") + e.what());
  }
  auto hosts = engine.get_all_hosts();
  std::sort(hosts.begin(), hosts.end(), [](const sg4::Host* a, const sg4::Host* b) {
    return naturalLess(a->get_name(), b->get_name());
  });
  if (static_cast<int>(hosts.size()) < world_size) {
    throw ConfigError(fmt::format(
        "simgrid: the platform {} has {} host(s) and the job {} ranks (one host per rank)",
        s.platform.empty() ? "built in" : "'" + s.platform + "'", hosts.size(), world_size));
  }
  hosts.resize(world_size);
  world.hosts = hosts;
  for (auto* host : hosts) {
    const char* node = host->get_property("node");
    world.labels.emplace_back(node != nullptr ? node : host->get_name());
  }
  world.in_flight.resize(world_size);
  world.mailbox_prefix = context.backend.job_id + "/";
  g_worlds[context.backend.job_id] = &world;
  one_simulation.unlock();
  const ReductionHook previous = setReductionHook({&chargeReduction, &world});
  g_running = &world;
  auto finish = [&] {
    setReductionHook(previous);
    world.groups.clear();
    world.orphans.clear();
    g_running = nullptr;
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_worlds.clear();
  };
  try {
    for (int r = 0; r < world_size; ++r) {
      auto actor =
          sg4::Actor::create(fmt::format("rank{}", r), world.hosts[r], [&body, r] { body(r); });
      world.rank_of_actor[static_cast<long>(actor->get_pid())] = r;
    }
    engine.run();
  } catch (...) {
    finish();
    throw;
  }
  finish();
}

class SimgridBackend : public Backend, private Simulation {
 public:
  explicit SimgridBackend(const PluginContext& context)
      : settings_(Settings::read(*context.params, context.backend.timeout)) {
    world_ = findWorld(context.backend.job_id);
    if (world_ == nullptr || sg4::Actor::is_maestro()) {
      throw ConfigError(
          "simgrid: the simgrid backend's ranks live inside its simulation; collie runs them "
          "there for the bench and plugin-check. HINT: training needs a real backend "
          "(gloo, ucx, nccl, loopback)");
    }
    std::vector<int> all(context.backend.size);
    for (int r = 0; r < context.backend.size; ++r) all[r] = r;
    init(world_, "world", all, context.backend.rank);
  }

  SimgridBackend(World* world, const Settings& settings, const std::string& key,
                 const std::vector<int>& members, int rank)
      : settings_(settings) {
    init(world, key, members, rank);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->members.size()); }
  std::chrono::milliseconds timeout() const override { return settings_.timeout; }
  Capabilities capabilities() const override { return Capabilities{}; }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    return post(peer, buf, tag, true);
  }
  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    return post(peer, buf, tag, false);
  }

  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    const int me = splitPosition(ranks, rank_, "simgrid");
    std::vector<int> members;
    for (int r : ranks) members.push_back(group_->members[r]);
    return std::make_unique<SimgridBackend>(world_, settings_,
                                            key_ + "/" + splitName(splits_++, ranks), members, me);
  }

  void abort(const std::string& reason) override;

  const Simulation* simulation() const override { return this; }
  double clockSeconds() const override { return sg4::Engine::get_clock(); }
  void sleepSeconds(double seconds) const override {
    if (seconds <= 0) return;
    sg4::this_actor::sleep_for(seconds);
    resumeLogRank();
  }
  std::vector<std::string> nodeLabels() const override {
    std::vector<std::string> labels;
    for (int member : group_->members) labels.push_back(world_->labels[member]);
    return labels;
  }
  bool payload() const override { return settings_.payload; }

  World* world() const { return world_; }
  Group* group() const { return group_.get(); }
  int worldRank(int position) const { return group_->members[position]; }
  int worldRankOfMe() const { return group_->members[rank_]; }

 private:
  void init(World* world, const std::string& key, const std::vector<int>& members, int rank) {
    world_ = world;
    key_ = key;
    rank_ = rank;
    auto& group = world_->groups[key];
    if (!group) group = std::make_shared<Group>(members);
    if (group->members != members) {
      throw CommError("simgrid: group '" + key + "' was made with other members");
    }
    group_ = group;
  }

  std::unique_ptr<Request> post(int peer, const Buffer& buf, Tag tag, bool sending);

  Settings settings_;
  World* world_ = nullptr;
  std::string key_;
  std::shared_ptr<Group> group_;
  int rank_ = 0;
  int splits_ = 0;
};

// A send or receive: waits for its half of the communication, which SimGrid completes when
// the message has crossed the route (it starts once both halves are posted).
class SimRequest : public Request {
 public:
  SimRequest(World* world, std::shared_ptr<Group> group, std::shared_ptr<Pending> pending,
             std::map<Group::Key, Queue>* queues, Group::Key key, TransferInfo transfer)
      : world_(world),
        group_(std::move(group)),
        pending_(std::move(pending)),
        queues_(queues),
        key_(key),
        transfer_(transfer) {
    world_->in_flight[pending_->owner].insert(pending_.get());
  }

  // A request dropped without a wait (a collective that unwinds): an unmatched half leaves
  // its queue and is cancelled, so that a late partner never finds it; a matched one runs on
  // for its peer (the bytes were copied when the two sides met).
  ~SimRequest() override {
    world_->in_flight[pending_->owner].erase(pending_.get());
    if (withdraw()) {
      cancel(pending_->comm);
    } else if (!finished_) {
      world_->orphans.push_back(pending_);
    }
  }

  void wait(std::chrono::milliseconds timeout) override {
    if (finished_) return;
    try {
      pending_->comm->wait_for(timeout.count() / 1000.0);
    } catch (const simgrid::TimeoutException&) {
      resumeLogRank();
      const bool unmatched = withdraw();
      cancel(pending_->comm);
      finish();
      fail(unmatched
               ? fmt::format("timed out after {} ms. HINT: the peer never matched it; is it "
                             "stuck, dead, or running a different collective?",
                             timeout.count())
               : fmt::format("timed out after {} ms with the message in flight", timeout.count()));
    } catch (const simgrid::Exception&) {
      resumeLogRank();
      withdraw();
      finish();
      if (!pending_->error.empty()) fail(pending_->error);
      fail("the transfer was cancelled");
    }
    resumeLogRank();
    finish();
    if (pending_->failed) {  // ended by releaseHalf: a size mismatch or an abort
      withdraw();
      fail(pending_->error);
    }
  }

  bool test() override {
    if (finished_) return true;
    const bool done = pending_->comm->test();
    resumeLogRank();
    return done;
  }

 private:
  void finish() {
    finished_ = true;
    world_->in_flight[pending_->owner].erase(pending_.get());
  }
  void cancel(const sg4::CommPtr& comm) {
    if (!comm) return;
    pending_->meeting->spoiled = true;
    try {
      comm->cancel();
    } catch (const simgrid::Exception&) {
    }
    resumeLogRank();
  }
  // Takes an unmatched side out of its queue; false when it had met its partner.
  bool withdraw() {
    auto it = queues_->find(key_);
    if (it == queues_->end()) return false;
    Queue& queue = it->second;
    auto at = std::find(queue.begin(), queue.end(), pending_);
    if (at == queue.end()) return false;
    queue.erase(at);
    if (queue.empty()) queues_->erase(it);
    return true;
  }
  [[noreturn]] void fail(const std::string& what) {
    throw CommError("simgrid: " + transfer_.describe() + ": " + what);
  }

  World* world_;
  std::shared_ptr<Group> group_;
  std::shared_ptr<Pending> pending_;
  std::map<Group::Key, Queue>* queues_;  // in the group's mailboxes, which never move
  Group::Key key_;
  TransferInfo transfer_;
  bool finished_ = false;
};

// The bytes of a message of host memory: SimGrid carries only a pointer, and is told the size.
char g_no_payload = 0;

// Ends the wait on a half that failed (an abort, a size mismatch), from whichever actor
// finds out, at once (unless its partner had found it already: then when their transfer
// ends). SimGrid wakes the waiters of a cancelled communication only once both
// halves are posted (cancelling one still alone in its mailbox takes it out and leaves its
// waiter asleep until its timeout). So a half still alone is first matched by a zero-byte
// half posted here, and then the pair is cancelled: both ends wake, nothing is copied, and
// the waiter sees `failed`. A half not posted yet (no `comm`) is cancelled by its post when
// it returns.
void releaseHalf(Pending& p) {
  if (!p.comm || p.was_released) return;
  p.was_released = true;
  Pending::Meeting& m = *p.meeting;
  m.spoiled = true;
  try {
    if (!m.matched && p.sending) {
      p.release = m.mailbox->get_async<void>(&p.released);
    } else if (!m.matched) {
      p.release = m.mailbox->put_async(&g_no_payload, 0);
    }
    if (!m.matched || m.posted == 2) p.comm->cancel();
    // Else the partner's half is on its way (it found this one before the failure): their
    // transfer runs to its end, and the waiter then sees `failed`.
  } catch (const simgrid::Exception&) {
  }
  resumeLogRank();
}

// Posts this side's half (a SimGrid call: other actors may run before it returns). Gives the
// mailbox back when the other half is posted already; cancels the half when the transfer
// failed meanwhile (an abort, a size mismatch).
void postHalf(World& world, Pending& p, bool sending) {
  Pending::Meeting& m = *p.meeting;
  sg4::CommPtr comm = sending ? m.mailbox->put_async(&g_no_payload, p.buffer.bytes())
                              : m.mailbox->get_async<void>(&p.received);
  resumeLogRank();
  p.comm = comm;
  if (++m.posted == 2 && !m.spoiled) world.free_mailboxes.push_back(m.mailbox);
  if (p.failed) {
    m.spoiled = true;
    try {
      comm->cancel();
    } catch (const simgrid::Exception&) {
    }
    resumeLogRank();
  }
}

std::unique_ptr<Request> SimgridBackend::post(int peer, const Buffer& buf, Tag tag, bool sending) {
  const bool size_only = !settings_.payload && buf.memory == MemoryKind::kNone;
  checkTransfer("simgrid", rank_, size(), peer, buf, sending,
                size_only ? MemoryKind::kNone : MemoryKind::kHost);
  const TransferInfo t{rank_, peer, sending, tag};
  // A send waits in the peer's mailbox under (this rank, tag), a receive in ours under
  // (peer, tag), so that both sides look in the same place.
  auto& box = group_->boxes[sending ? peer : rank_];
  const Group::Key key{sending ? rank_ : peer, tag};
  auto& other_side = sending ? box.recvs : box.sends;
  auto& my_side = sending ? box.sends : box.recvs;
  auto mine = std::make_shared<Pending>(buf, worldRankOfMe());
  mine->sending = sending;
  mine->group = group_.get();
  // Everything from the lookup to the queue change runs without a SimGrid call, which could
  // let another rank run in between: the mailbox a first side needs is borrowed before.
  sg4::Mailbox* spare = world_->borrowMailbox();
  resumeLogRank();
  // After the borrowing, which is a SimGrid call: an abort may have come meanwhile.
  for (int r : {rank_, peer}) {
    const auto& aborted = group_->boxes[r].aborted;
    if (aborted.isSet()) {
      world_->free_mailboxes.push_back(spare);
      throw CommError("simgrid: " + t.describe() + ": rank " + std::to_string(r) +
                      " was aborted: " + aborted.reason());
    }
  }
  auto it = other_side.find(key);
  if (it == other_side.end()) {
    // First here: wait for the partner on a mailbox of its own.
    mine->meeting = std::make_shared<Pending::Meeting>();
    mine->meeting->mailbox = spare;
    my_side[key].push_back(mine);
    auto request = std::make_unique<SimRequest>(world_, group_, mine, &my_side, key, t);
    postHalf(*world_, *mine, sending);
    return request;
  }
  world_->free_mailboxes.push_back(spare);
  std::shared_ptr<Pending> other = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) other_side.erase(it);
  const Buffer& from = sending ? buf : other->buffer;
  const Buffer& to = sending ? other->buffer : buf;
  if (from.bytes() != to.bytes() || from.memory != to.memory) {
    other->error = "simgrid: " + t.describe() +
                   (from.memory != to.memory
                        ? ": one side's buffer is size-only and the other's holds bytes"
                        : ": the message has " + std::to_string(from.bytes()) +
                              " bytes, the receive expects " + std::to_string(to.bytes()));
    other->failed = true;
    other->meeting->spoiled = true;
    const std::string error = other->error;
    releaseHalf(*other);
    throw CommError(error);
  }
  if (from.bytes() > 0 && from.memory == MemoryKind::kHost) {
    std::memcpy(to.data, from.data, from.bytes());
  }
  // Second here: post the matching half where the partner's is (or is about to be).
  other->meeting->matched = true;  // from now on only a cancel of the pair ends it early
  mine->meeting = other->meeting;
  auto request = std::make_unique<SimRequest>(world_, group_, mine, &my_side, key, t);
  postHalf(*world_, *mine, sending);
  return request;
}

void SimgridBackend::abort(const std::string& reason) {
  auto& box = group_->boxes[rank_];
  if (!box.aborted.set(reason)) return;  // the first reason stays
  const int me = worldRankOfMe();
  // This rank's halves in this group, and the unmatched halves of peers that wait for this
  // rank in it. A half that failed already (an earlier abort, a size mismatch) keeps its
  // first reason and is released once.
  std::vector<Pending*> victims;
  for (Pending* p : world_->in_flight[me])
    if (p->group == group_.get()) victims.push_back(p);
  for (auto& [key, queue] : box.sends)
    for (auto& p : queue) victims.push_back(p.get());
  for (auto& other : group_->boxes) {
    for (auto& [key, queue] : other.recvs) {
      if (key.first != rank_) continue;
      for (auto& p : queue) victims.push_back(p.get());
    }
  }
  std::sort(victims.begin(), victims.end());
  victims.erase(std::unique(victims.begin(), victims.end()), victims.end());
  victims.erase(
      std::remove_if(victims.begin(), victims.end(), [](Pending* p) { return p->failed; }),
      victims.end());
  for (Pending* p : victims) {
    p->error = "aborted: " + reason;
    p->failed = true;
    p->meeting->spoiled = true;
  }
  // Victims are held by their requests, which stay alive while their owners wait, and
  // releaseHalf makes SimGrid calls (other actors may run meanwhile): hold them here too.
  std::vector<std::shared_ptr<Pending>> held;
  for (Pending* p : victims) held.push_back(p->shared_from_this());
  for (auto& p : held) releaseHalf(*p);
}

}  // namespace
}  // namespace collie::simgrid_backend

COLLIE_SIMULATED_BACKEND_PLUGIN(
    "simgrid", "1.0.0",
    "ranks as SimGrid actors on a simulated platform, in simulated time (bench, plugin-check)",
    collie::simgrid_backend::SimgridBackend, collie::simgrid_backend::runRanks);
