// Conformance runs: one in-process job per group size, every case between control-plane
// exchanges so that a wrong result on one rank is reported with the case that produced it.
#include "check/conformance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <xxhash.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/simulation.h"
#include "measure/calibrate.h"
#include "measure/pattern.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/environment.h"
#include "runtime/in_process.h"
#include "util/files.h"
#include "util/json_file.h"

namespace collie::check {
namespace {

// Adds `name` to the report's sorted list of accepted collectives, once.
void addAccepted(Report* report, const std::string& name) {
  auto& accepted = report->accepted;
  auto it = std::lower_bound(accepted.begin(), accepted.end(), name);
  if (it == accepted.end() || *it != name) accepted.insert(it, name);
}

// XXH3 of the raw bytes (a byte-wise hash took seconds of a full matrix's minute).
// Device memory is hashed from a host copy.
uint64_t digest(const Buffer& b) {
  if (b.memory == MemoryKind::kHost || b.count == 0) return XXH3_64bits(b.data, b.bytes());
  Buffer host_like = b;
  host_like.memory = MemoryKind::kHost;
  ScratchBuffer host(host_like, b.count);
  copyInto(host.view(), b);
  return XXH3_64bits(host.view().data, b.bytes());
}

Topology topologyFor(int world, bool emulate_nodes) {
  int per_node = world;
  for (int d = 2; emulate_nodes && d < world; ++d) {
    if (world % d == 0) {
      per_node = d;
      break;
    }
  }
  std::vector<std::string> labels;
  for (int r = 0; r < world; ++r) labels.push_back(fmt::format("node{}", r / per_node));
  return Topology::fromLabels(labels);
}

struct Case {
  Collective coll;
  DType dtype;
  ReduceOp op;
  size_t count;  // elements per rank block (data for allreduce/broadcast)
  int root;
  bool rounding = false;  // pattern::fillRounding's inputs rather than small integers
  std::string describe(int world) const {
    std::ostringstream out;
    out << collectiveName(coll) << ", " << world << " ranks, " << dtypeName(dtype) << " "
        << reduceOpName(op) << ", " << count << " elements";
    if (rounding) out << " that round";
    if (coll == Collective::kBroadcast) out << ", root " << root;
    return out.str();
  }
};

std::vector<Case> casesFor(int world, const Options& o) {
  std::vector<size_t> counts = {0, 1, 7, static_cast<size_t>(world - 1), 1000};
  if (o.large_count > 0) counts.push_back(o.large_count);
  std::vector<Case> cases;
  for (Collective coll : o.collectives) {
    for (DType dtype : o.dtypes) {
      if (coll == Collective::kBarrier) {
        cases.push_back({coll, dtype, ReduceOp::kSum, 0, 0});
        break;
      }
      for (size_t count : counts) {
        for (ReduceOp op : o.ops) {
          if (coll == Collective::kBroadcast || coll == Collective::kAllGather) {
            if (op != ReduceOp::kSum) continue;  // no reduction: one op is enough
          }
          // The large count is the total of the gathered/scattered buffer, not each block.
          size_t block = count;
          if (count == o.large_count &&
              (coll == Collective::kReduceScatter || coll == Collective::kAllGather)) {
            block = std::max<size_t>(1, count / world);
          }
          if (coll == Collective::kBroadcast) {
            for (int root : std::set<int>{0, world - 1})
              cases.push_back({coll, dtype, op, block, root});
          } else {
            cases.push_back({coll, dtype, op, block, 0});
          }
        }
      }
    }
  }
  // Sums whose bits depend on the order of the additions: every rank must still get the same.
  const bool allreduce =
      std::count(o.collectives.begin(), o.collectives.end(), Collective::kAllReduce) > 0;
  for (DType dtype : o.dtypes) {
    const bool is_float = dtype != DType::kI32 && dtype != DType::kI64;
    for (ReduceOp op : o.ops) {
      if (allreduce && is_float && (op == ReduceOp::kSum || op == ReduceOp::kAvg)) {
        cases.push_back({Collective::kAllReduce, dtype, op, 1000, 0, true});
      }
    }
  }
  return cases;
}

// What one rank learned about one case, exchanged through the control plane.
struct Outcome {
  double wrong = 0;
  double digest_high = 0, digest_low = 0;
  double unstable = 0;  // 1 when a second run gave other bytes
};

class RankChecker {
 public:
  RankChecker(const PluginLoader& loader, const config::PluginRef& scheduler,
              std::shared_ptr<Backend> backend, const std::string& backend_name,
              const Topology& topology)
      : comm_(backend, backend_name, topology),
        control_(*backend, deviceOfLocalRank(localRankOf(topology, backend->rank()))),
        label_(scheduler.label) {
    Params params = scheduler.params;
    scheduler_ = loader.createScheduler(scheduler.plugin, params);
    comm_.addRule(scheduler.label, scheduler_);
  }

  // Runs every case; rank 0 fills `report`.
  void run(const std::vector<Case>& cases, Report* report, std::mutex* mu) {
    const int n = comm_.backend().size(), rank = comm_.backend().rank();
    for (const Case& c : cases) {
      // In the memory the case will run in: a scheduler may decline a kind (native does).
      const Buffer like = measure::measurementLike(comm_.backend(), c.dtype, control_.device());
      CollectiveArgs probe = argsFor(c, like, like);
      Decision d = scheduler_->accepts(probe, comm_.topology());
      if (!d.accepted) {
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(*mu);
          ++report->declined;
          std::string line = std::string(collectiveName(c.coll)) + ": " + d.reason;
          auto it = std::find_if(report->declines.begin(), report->declines.end(),
                                 [&](const auto& entry) { return entry.first == line; });
          if (it == report->declines.end()) {
            report->declines.push_back({line, {n}});
          } else if (it->second.back() != n) {
            it->second.push_back(n);
          }
        }
        continue;
      }
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(*mu);
        addAccepted(report, collectiveName(c.coll));
      }
      Outcome mine = runCase(c, n, rank);
      auto all = control_.allGather({mine.wrong, mine.digest_high, mine.digest_low, mine.unstable});
      if (rank == 0) record(c, n, all, report, mu);
    }
  }

 private:
  static CollectiveArgs argsFor(const Case& c, const Buffer& data, const Buffer& output) {
    CollectiveArgs args;
    args.coll = c.coll;
    args.data = data;
    args.output = output;
    args.data.dtype = args.output.dtype = c.dtype;
    args.op = c.op;
    args.root = c.root;
    return args;
  }

  Outcome runCase(const Case& c, int n, int rank) {
    const Buffer like = measure::measurementLike(comm_.backend(), c.dtype, control_.device());
    const size_t in = c.coll == Collective::kBarrier         ? 0
                      : c.coll == Collective::kReduceScatter ? c.count * n
                                                             : c.count;
    const size_t out = c.coll == Collective::kReduceScatter ? c.count
                       : c.coll == Collective::kAllGather   ? c.count * n
                                                            : 0;
    CollectiveArgs args = argsFor(c, reusable(&data_, like, in), reusable(&output_, like, out));
    auto fill = [&] {
      if (c.rounding) return pattern::fillRounding(args, rank);
      pattern::fillInput(args, rank, n);
    };
    fill();
    comm_.run(args);
    const Buffer& result = out > 0 ? args.output : args.data;
    Outcome outcome;
    outcome.wrong = static_cast<double>(c.rounding ? pattern::countWrongRounding(args, n)
                                                   : pattern::countWrong(args, rank, n));
    uint64_t h = digest(result);
    outcome.digest_high = static_cast<double>(h >> 32);
    outcome.digest_low = static_cast<double>(h & 0xFFFFFFFFu);
    if (c.count <= 1000 && c.coll != Collective::kBarrier) {  // run to run: the same bytes
      fill();
      comm_.run(args);
      outcome.unstable = digest(result) != h ? 1 : 0;
    }
    return outcome;
  }

  void record(const Case& c, int n, const std::vector<std::vector<double>>& all, Report* report,
              std::mutex* mu) {
    std::vector<std::string> problems;
    double wrong = 0;
    std::vector<int> wrong_ranks, unstable_ranks;
    for (int r = 0; r < n; ++r) {
      wrong += all[r][0];
      if (all[r][0] > 0) wrong_ranks.push_back(r);
      if (all[r][3] > 0) unstable_ranks.push_back(r);
    }
    if (wrong > 0) {
      problems.push_back(fmt::format("{} wrong elements (ranks {})", static_cast<uint64_t>(wrong),
                                     fmt::join(wrong_ranks, ", ")));
    }
    if (c.coll != Collective::kReduceScatter) {  // every other result is the same everywhere
      for (int r = 1; r < n; ++r) {
        if (all[r][1] != all[0][1] || all[r][2] != all[0][2]) {
          problems.push_back(fmt::format("bytes differ between rank 0 and rank {}", r));
          break;
        }
      }
    }
    if (!unstable_ranks.empty()) {
      problems.push_back(
          fmt::format("a second run gave other bytes (ranks {})", fmt::join(unstable_ranks, ", ")));
    }
    std::lock_guard<std::mutex> lock(*mu);
    if (problems.empty()) {
      ++report->passed;
      return;
    }
    std::string line = label_ + ": " + c.describe(n) + ": ";
    for (size_t i = 0; i < problems.size(); ++i) line += (i ? "; " : "") + problems[i];
    report->failures.push_back(line);
  }

  // A view of `count` elements of `like`'s dtype from a buffer kept across cases (large
  // allocations per case cost more than the collectives they feed).
  static Buffer reusable(std::unique_ptr<ScratchBuffer>* pool, const Buffer& like, size_t count) {
    const size_t bytes = count * dtypeSize(like.dtype);
    if (!*pool || (*pool)->view().bytes() < bytes) {
      Buffer raw = like;
      raw.dtype = DType::kF64;  // allocate in 8-byte units, view in any dtype
      pool->reset(new ScratchBuffer(raw, (bytes + 7) / 8));
    }
    Buffer view = (*pool)->view();
    view.dtype = like.dtype;
    view.count = count;
    return view;
  }

  std::unique_ptr<ScratchBuffer> data_, output_;
  std::shared_ptr<Scheduler> scheduler_;
  Communicator comm_;
  Control control_;
  std::string label_;
};

}  // namespace

Report checkSchedulerOnRank(const PluginLoader& loader, const config::PluginRef& scheduler,
                            std::shared_ptr<Backend> backend, const std::string& backend_name,
                            const Options& options) {
  Report report;
  std::mutex mu;
  const int world = backend->size();
  RankChecker(loader, scheduler, std::move(backend), backend_name,
              topologyFor(world, options.emulate_nodes))
      .run(casesFor(world, options), &report, &mu);
  return report;
}

Report checkScheduler(const PluginLoader& loader, const config::PluginRef& scheduler,
                      const config::PluginRef& backend, const Options& options) {
  Report report;
  std::mutex mu;
  for (int world : options.worlds) {
    Topology topology = topologyFor(world, options.emulate_nodes);
    auto cases = casesFor(world, options);
    config::PluginRef backend_ref = backend;
    if (!backend_ref.params.has("timeout")) backend_ref.params.set("timeout", options.timeout);
    try {
      runInProcess(loader, backend_ref, world, [&](std::shared_ptr<Backend> b) {
        RankChecker(loader, scheduler, b, backend_ref.label, topologyOf(*b, topology))
            .run(cases, &report, &mu);
      });
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      report.failures.push_back(
          fmt::format("{}: {} ranks: stopped: {}", scheduler.label, world, e.what()));
    }
  }
  return report;
}

namespace {

// int32 values as a message in memory `b` moves: the host vector itself, or a copy of it in
// device memory where `b` moves no host memory (on the rank's device: plugin-check's ranks
// share one host). value() reads an element back after a receive.
class ContractMessage {
 public:
  ContractMessage(const Backend& b, std::vector<int32_t> values) : host_(std::move(values)) {
    const int local_rank = localRankOf(Topology::singleNode(b.size()), b.rank());
    Buffer like = measure::measurementLike(b, DType::kI32, deviceOfLocalRank(local_rank));
    if (like.memory != MemoryKind::kCuda) return;
    device_ = std::make_unique<ScratchBuffer>(like, host_.size());
    copyInto(device_->view(), hostView());
  }
  Buffer view() { return device_ ? device_->view() : hostView(); }
  int32_t value(size_t i) {
    if (device_) copyInto(hostView(), device_->view());
    return host_.at(i);
  }

 private:
  Buffer hostView() { return Buffer{host_.data(), host_.size(), DType::kI32}; }
  std::vector<int32_t> host_;
  std::unique_ptr<ScratchBuffer> device_;
};

// Two messages with one tag arrive in order, and a zero-byte message between them takes its
// place; a zero-byte message is really sent: a receive of one posted before its sender
// gets there waits for it (barriers are made of them). Rank 1 records.
void contractOrder(Backend& b, const std::function<void(bool, const std::string&)>& expect) {
  constexpr auto kLate = std::chrono::milliseconds(200);
  if (b.rank() == 0) {
    ContractMessage first(b, {1}), second(b, {2}), empty(b, {});
    b.send(1, first.view(), 5);
    b.send(1, empty.view(), 5);
    b.send(1, second.view(), 5);
    sleepSeconds(b, std::chrono::duration<double>(kLate).count());  // simulated on a simulator
    b.send(1, empty.view(), 6);
  } else {
    ContractMessage x(b, {0}), y(b, {0}), empty(b, {});
    b.recv(0, x.view(), 5);
    b.recv(0, empty.view(), 5);
    b.recv(0, y.view(), 5);
    expect(x.value(0) == 1 && y.value(0) == 2,
           "messages with one tag arrive in the order they were sent, a zero-byte one included");
    const double start = clockSeconds(b);
    b.recv(0, empty.view(), 6);
    expect(clockSeconds(b) - start >= std::chrono::duration<double>(kLate).count() * 3 / 4,
           "a zero-byte receive waits for its message (it returned before the sender sent it)");
  }
}

// Rank 1 receives from rank 0, which sends nothing: the receive must fail with a CommError
// naming rank 0, after the 700 ms timeout and not long after it.
void contractSilentPeer(Backend& b, const std::string& label, Report* report) {
  if (b.rank() != 1) return;
  auto expect = [&](bool ok, const std::string& what) {
    if (ok) {
      ++report->passed;
    } else {
      report->failures.push_back(label + ": " + what);
    }
  };
  const double start = clockSeconds(b);
  try {
    ContractMessage v(b, {0});
    b.recv(0, v.view(), makeTag(7, 1, 0));
    report->failures.push_back(label +
                               ": a receive from a silent peer returned instead of "
                               "timing out");
  } catch (const CommError& e) {
    const double took = clockSeconds(b) - start;
    std::string m = e.what();
    expect(m.find("rank 0") != std::string::npos,
           "the timeout error names the silent peer (rank 0): " + m);
    expect(took >= 0.65 && took < 5.7,
           fmt::format("the receive times out after params.timeout (700 ms), took {:.3f} s", took));
  }
}

// The abort and lifetime rules of collie/backend.h, checked on rank 1 of two. Rank 0 takes
// part through `meet` (both ranks call it at the same points: a barrier) and, where ranks are
// threads or actors of one process, by aborting rank 1's group itself.
constexpr char kAbortReason[] = "plugin-check aborts rank 1";
constexpr double kAbortAfter = 0.1;  // seconds after the receive was posted

struct ContractRank {
  Backend& b;
  std::function<void()> meet;
  std::function<void(bool, const std::string&)> expect;
};

// Rank 1 posts a receive that nothing will match on a group with a 20 s timeout and hands
// it to `abort_soon`, which aborts the group about 100 ms later from another thread (or
// actor). The wait must end at once with the abort's reason; a second abort changes nothing;
// posts after it fail with the first reason.
void contractAbort(const ContractRank& r, const std::function<void()>& abort_soon) {
  if (r.b.rank() != 1) return;
  ContractMessage v(r.b, {0});
  auto request = r.b.irecv(0, v.view(), makeTag(8, 1, 0));
  abort_soon();
  const double posted = clockSeconds(r.b);  // the abort comes kAbortAfter after this
  try {
    request->wait(r.b.timeout());
    r.expect(false, "a receive that nothing matched completed although its group was aborted");
  } catch (const CommError& e) {
    const std::string m = e.what();
    const double took = clockSeconds(r.b) - posted;
    r.expect(m.find(std::string("aborted: ") + kAbortReason) != std::string::npos,
             "a wait ended by abort() says \"aborted: <reason>\": " + m);
    r.expect(took < kAbortAfter + 3,
             fmt::format("abort() ends a pending wait at once (took {:.1f} s of a {} ms timeout)",
                         took, r.b.timeout().count()));
  }
  r.b.abort("a second abort");  // no effect: the first reason stays
  for (bool sending : {true, false}) {
    const std::string what = sending ? "send" : "receive";
    try {
      auto late = sending ? r.b.isend(0, v.view(), makeTag(8, 2, 0))
                          : r.b.irecv(0, v.view(), makeTag(8, 2, 0));
      late->wait(r.b.timeout());
      r.expect(false, "a " + what + " posted after abort() completed");
    } catch (const CommError& e) {
      const std::string m = e.what();
      r.expect(m.find(kAbortReason) != std::string::npos &&
                   m.find("a second abort") == std::string::npos,
               "a " + what + " posted after abort() fails with the first abort's reason: " + m);
    }
  }
}

// A request outlives its group: rank 1 posts a receive on a sub-group and destroys the
// sub-group; rank 0 then sends to it. The request must still end, with the bytes sent or
// a CommError, and touch no freed memory (a crash or a hang fails the check).
void contractLifetime(const ContractRank& r) {
  std::unique_ptr<Backend> sub = r.b.split({0, 1});
  const auto wait = std::chrono::milliseconds(2000);
  const Tag tag = makeTag(9, 1, 0);
  if (r.b.rank() == 1) {
    ContractMessage v(r.b, {0});
    auto request = sub->irecv(0, v.view(), tag);
    sub.reset();
    r.meet();  // the group is gone; rank 0 sends now
    try {
      request->wait(wait);
      r.expect(v.value(0) == 42, fmt::format("a receive that outlived its group completed with "
                                             "{} where 42 was sent",
                                             v.value(0)));
    } catch (const CommError&) {  // failing is allowed too: the group is gone
    }
  } else {
    r.meet();
    ContractMessage v(r.b, {42});
    try {
      sub->isend(1, v.view(), tag)->wait(wait);
    } catch (const CommError&) {  // the receiving group is gone: either outcome is the rule's
    }
  }
  r.meet();  // rank 0 keeps its side until rank 1 is done
}

// A barrier of two ranks that are threads or actors of one process, waiting in the
// backend's time (a simulator's actors switch only inside its calls).
class PollingMeet {
 public:
  void meet(const Backend& b) {
    const int round = rounds_[b.rank()]++ + 1;
    arrived_.fetch_add(1);
    const double start = clockSeconds(b);
    while (arrived_.load() < 2 * round) {
      if (clockSeconds(b) - start > 30)
        throw CommError(
            fmt::format("rank {}: the other rank never reached the contract "
                        "check's meeting point {}",
                        b.rank(), round));
      sleepSeconds(b, 0.002);
    }
  }

 private:
  std::atomic<int> arrived_{0};
  std::array<int, 2> rounds_{};  // each rank touches only its own
};

}  // namespace

Report checkBackendContract(const PluginLoader& loader, const config::PluginRef& backend) {
  Report report;
  config::PluginRef ref = backend;
  ref.params.set("timeout", "700ms");
  std::mutex mu;
  auto expect = [&](bool ok, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (ok) {
      ++report.passed;
    } else {
      report.failures.push_back(ref.label + ": " + what);
    }
  };
  try {
    runInProcess(loader, ref, 2, [&](std::shared_ptr<Backend> b) { contractOrder(*b, expect); });
  } catch (const Error& e) {
    report.failures.push_back(ref.label + ": ordered and zero-byte messages: " + e.what());
  }
  try {
    runInProcess(loader, ref, 2,
                 [&](std::shared_ptr<Backend> b) { contractSilentPeer(*b, ref.label, &report); });
  } catch (const Error& e) {
    report.failures.push_back(ref.label +
                              ": a silent peer gave a non-communication error: " + e.what());
  }
  // Rank 0 aborts rank 1's group: from another thread, or another actor of a simulator.
  ref.params.set("timeout", "20s");
  try {
    PollingMeet meeting;
    std::shared_ptr<Backend> victim;  // rank 1's group, set before the first meeting
    runInProcess(loader, ref, 2, [&](std::shared_ptr<Backend> b) {
      const ContractRank r{*b, [&] { meeting.meet(*b); }, expect};
      if (b->rank() == 1) {
        contractAbort(r, [&] {
          std::atomic_store(&victim, b);
          r.meet();
        });
      } else {
        r.meet();
        sleepSeconds(*b, kAbortAfter);
        std::atomic_load(&victim)->abort(kAbortReason);
      }
      r.meet();  // rank 1 keeps its group until rank 0 has aborted it
    });
  } catch (const Error& e) {
    report.failures.push_back(ref.label + ": abort: " + e.what());
  }
  try {
    PollingMeet meeting;
    runInProcess(loader, ref, 2, [&](std::shared_ptr<Backend> b) {
      contractLifetime({*b, [&] { meeting.meet(*b); }, expect});
    });
  } catch (const Error& e) {
    report.failures.push_back(ref.label + ": a request that outlives its group: " + e.what());
  }
  return report;
}

Report checkBackendContractOnRank(
    const std::string& label,
    const std::function<std::shared_ptr<Backend>(const std::string& timeout)>& make,
    const std::function<void()>& barrier) {
  Report report;
  auto expect = [&](bool ok, const std::string& what) {
    if (ok) {
      ++report.passed;
    } else {
      report.failures.push_back(label + ": " + what);
    }
  };
  try {
    auto b = make("700ms");
    contractOrder(*b, expect);
    barrier();
  } catch (const Error& e) {
    report.failures.push_back(label + ": ordered and zero-byte messages: " + e.what());
    return report;
  }
  auto b = make("700ms");
  try {
    contractSilentPeer(*b, label, &report);
  } catch (const Error& e) {
    report.failures.push_back(label +
                              ": a silent peer gave a non-communication error: " + e.what());
  }
  barrier();  // rank 0 stays connected until rank 1 has timed out
  try {
    auto aborted = make("20s");
    struct Joined {  // joined before `aborted` goes, whatever the check throws
      std::thread thread;
      ~Joined() {
        if (thread.joinable()) thread.join();
      }
    } aborter;
    contractAbort({*aborted, barrier, expect}, [&] {
      aborter.thread = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::duration<double>(kAbortAfter));
        aborted->abort(kAbortReason);
      });
    });
  } catch (const Error& e) {
    report.failures.push_back(label + ": abort: " + e.what());
  }
  barrier();  // on every path: rank 0 waits here for rank 1's check
  try {
    contractLifetime({*make("20s"), barrier, expect});
  } catch (const Error& e) {
    report.failures.push_back(label + ": a request that outlives its group: " + e.what());
  }
  return report;
}

void merge(Report& into, const Report& from) {
  for (const auto& name : from.accepted) addAccepted(&into, name);
  into.passed += from.passed;
  into.declined += from.declined;
  into.failures.insert(into.failures.end(), from.failures.begin(), from.failures.end());
  for (const auto& d : from.declines) {
    auto it = std::find_if(into.declines.begin(), into.declines.end(),
                           [&](const auto& e) { return e.first == d.first; });
    if (it == into.declines.end()) {
      into.declines.push_back(d);
    } else {
      for (int w : d.second) {
        if (std::find(it->second.begin(), it->second.end(), w) == it->second.end())
          it->second.push_back(w);
      }
    }
  }
}

void saveReport(const std::string& path, const Report& report) {
  nlohmann::json declines = nlohmann::json::array();
  for (const auto& d : report.declines)
    declines.push_back({{"reason", d.first}, {"worlds", d.second}});
  nlohmann::json doc = {{"passed", report.passed},
                        {"declined", report.declined},
                        {"failures", report.failures},
                        {"declines", declines},
                        {"accepted", report.accepted}};
  detail::writeFileAtomically(path, doc.dump() + "\n");
}

Report loadReport(const std::string& path) {
  return detail::readRankFile(path, "report", [](const nlohmann::json& doc) {
    Report report;
    report.passed = doc.at("passed").get<size_t>();
    report.declined = doc.at("declined").get<size_t>();
    report.failures = doc.at("failures").get<std::vector<std::string>>();
    report.accepted = doc.at("accepted").get<std::vector<std::string>>();
    for (const auto& d : doc.at("declines")) {
      report.declines.push_back(
          {d.at("reason").get<std::string>(), d.at("worlds").get<std::vector<int>>()});
    }
    return report;
  });
}

std::string describe(const std::string& what, const Report& report, size_t max_lines) {
  std::ostringstream out;
  out << (report.ok() ? "PASS " : "FAIL ") << what << ": " << report.passed << " cases passed, "
      << report.failures.size() << " failed, " << report.declined << " declined\n";
  for (size_t i = 0; i < report.failures.size() && i < max_lines; ++i) {
    out << "  FAIL " << report.failures[i] << "\n";
  }
  if (report.failures.size() > max_lines) {
    out << "  ... and " << report.failures.size() - max_lines << " more\n";
  }
  for (const auto& [reason, worlds] : report.declines) {
    out << "  declined " << reason << " (on";
    for (size_t i = 0; i < worlds.size(); ++i) out << (i ? ", " : " ") << worlds[i];
    out << " ranks)\n";
  }
  return out.str();
}

}  // namespace collie::check
