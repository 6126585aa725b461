// Recording, clock offsets, gathering and the Chrome trace-event format.
#include "runtime/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "collie/error.h"
#include "collie/log.h"
#include "config/experiment.h"
#include "util/files.h"

namespace collie {
namespace {

thread_local TraceTrack t_track = TraceTrack::kCompute;
thread_local int t_bucket = -1;

// A rank's events as sent to rank 0: one array per event.
std::string encode(const std::vector<TraceEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const TraceEvent& e : events) {
    out.push_back({std::string(e.name), static_cast<int>(e.track), e.start_ns, e.end_ns, e.step,
                   e.index, e.seq, static_cast<int>(e.coll), static_cast<int>(e.op), e.bytes,
                   e.bucket, std::string(e.scheduler), std::string(e.ran)});
  }
  return out.dump();
}

std::vector<TraceEvent> decode(const std::string& text, int rank) {
  std::vector<TraceEvent> events;
  try {
    for (const auto& a : nlohmann::json::parse(text)) {
      TraceEvent e;
      e.name = internName(a.at(0).get<std::string>());
      e.track = static_cast<TraceTrack>(a.at(1).get<int>());
      e.start_ns = a.at(2).get<int64_t>();
      e.end_ns = a.at(3).get<int64_t>();
      e.step = a.at(4).get<int64_t>();
      e.index = a.at(5).get<int>();
      e.seq = a.at(6).get<uint64_t>();
      e.coll = static_cast<Collective>(a.at(7).get<int>());
      e.op = static_cast<ReduceOp>(a.at(8).get<int>());
      e.bytes = a.at(9).get<uint64_t>();
      e.bucket = a.at(10).get<int>();
      e.scheduler = internName(a.at(11).get<std::string>());
      e.ran = internName(a.at(12).get<std::string>());
      events.push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CommError(
        fmt::format("trace: rank {} sent events that do not parse: {}", rank, e.what()));
  }
  return events;
}

}  // namespace

Tracer::Tracer(Clock clock, size_t capacity) : clock_(std::move(clock)), capacity_(capacity) {
  events_.reserve(std::min<size_t>(capacity_, 4096));
}

int64_t Tracer::steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Tracer::setThreadTrack(TraceTrack track) { t_track = track; }

Tracer::BucketScope::BucketScope(int bucket) : previous_(t_bucket) { t_bucket = bucket; }
Tracer::BucketScope::~BucketScope() { t_bucket = previous_; }

void Tracer::add(TraceEvent e) {
  e.track = t_track;
  e.step = step_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  events_.push_back(e);
}

void Tracer::span(std::string_view name, int64_t start_ns, int64_t end_ns, int index) {
  TraceEvent e;
  e.name = name;
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  e.index = index;
  add(e);
}

void Tracer::collective(const Provenance& p, ReduceOp op, int64_t start_ns, int64_t end_ns) {
  TraceEvent e;
  e.name = collectiveName(p.coll);
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  e.seq = p.seq;
  e.coll = p.coll;
  e.op = op;
  e.bytes = p.bytes;
  e.bucket = t_bucket;
  e.scheduler = p.scheduler;
  e.ran = p.ran;
  add(e);
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

size_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::vector<ClockOffset> estimateClockOffsets(Backend& backend, Control& control,
                                              const Tracer& tracer, int rounds) {
  const int n = backend.size(), rank = backend.rank();
  const Tag tag = control.nextTag();
  int64_t value = 0;
  if (rank != 0) {
    for (int i = 0; i < rounds; ++i) {
      control.wire().recv(0, &value, sizeof value, tag);
      value = tracer.now();
      control.wire().send(0, &value, sizeof value, tag);
    }
    return {};
  }
  std::vector<ClockOffset> offsets(n);
  for (int r = 1; r < n; ++r) {
    double best_rtt = std::numeric_limits<double>::infinity();
    for (int i = 0; i < rounds; ++i) {
      const int64_t t0 = tracer.now();
      value = t0;
      control.wire().send(r, &value, sizeof value, tag);
      control.wire().recv(r, &value, sizeof value, tag);
      const int64_t t1 = tracer.now();
      const double rtt = static_cast<double>(t1 - t0);
      if (rtt < best_rtt) {
        best_rtt = rtt;
        offsets[r].offset_us = (static_cast<double>(value) - (t0 + rtt / 2)) / 1e3;
        offsets[r].uncertainty_us = rtt / 2 / 1e3;
        offsets[r].rtt_us = rtt / 1e3;
      }
    }
  }
  return offsets;
}

size_t writeJobTrace(const Tracer& tracer, Backend& backend, Control& control,
                     const TraceInfo& info, const std::string& path) {
  const std::vector<ClockOffset> offsets = estimateClockOffsets(backend, control, tracer);
  const int n = backend.size(), rank = backend.rank();
  const Tag tag = control.nextTag();
  if (rank != 0) {
    std::string text = encode(tracer.events());
    int64_t header[2] = {static_cast<int64_t>(text.size()), static_cast<int64_t>(tracer.dropped())};
    text.resize((text.size() + 7) / 8 * 8, ' ');
    control.wire().send(0, header, sizeof header, tag);
    control.wire().send(0, text.data(), text.size(), tag);
    return 0;
  }
  std::vector<std::vector<TraceEvent>> ranks(n);
  std::vector<size_t> dropped(n, 0);
  ranks[0] = tracer.events();
  dropped[0] = tracer.dropped();
  for (int r = 1; r < n; ++r) {
    int64_t header[2] = {0, 0};
    control.wire().recv(r, header, sizeof header, tag);
    // A rank keeps at most kDefaultCapacity events of a few hundred bytes each.
    constexpr int64_t kMostBytes = int64_t{1} << 30;
    if (header[0] < 0 || header[0] > kMostBytes || header[1] < 0) {
      throw CommError(
          fmt::format("trace: rank {} announced {} bytes of events ({} dropped), "
                      "more than a trace holds",
                      r, header[0], header[1]));
    }
    std::string text((static_cast<size_t>(header[0]) + 7) / 8 * 8, ' ');
    control.wire().recv(r, text.data(), text.size(), tag);
    text.resize(static_cast<size_t>(header[0]));
    ranks[r] = decode(text, r);
    dropped[r] = static_cast<size_t>(header[1]);
  }
  size_t events = 0;
  for (const auto& r : ranks) events += r.size();
  detail::writeFileAtomically(path, chromeTrace(ranks, offsets, info, dropped));
  size_t lost = 0;
  for (size_t d : dropped) lost += d;
  if (lost > 0) {
    logWarn(fmt::format("trace: {} events past the {} each rank keeps were not recorded", lost,
                        Tracer::kDefaultCapacity));
  }
  return events;
}

void writeExperimentTrace(const Tracer& tracer, Communicator& comm, Control& control,
                          const config::Experiment& e, const std::string& out_dir) {
  TraceInfo info;
  info.experiment = e.name;
  const Topology& t = comm.topology();
  const int n = comm.backend().size();
  for (int r = 0; r < n; ++r) {
    info.hosts.push_back(
        r < static_cast<int>(t.node_of_rank.size()) ? t.node_names[t.node_of_rank[r]] : "?");
  }
  const std::string file = e.matrix_point.empty() || e.matrix_index < 0
                               ? "trace.json"
                               : fmt::format("trace-{}.json", e.matrix_index);
  const std::string path = (std::filesystem::path(out_dir) / file).string();
  const size_t events = writeJobTrace(tracer, comm.backend(), control, info, path);
  if (comm.backend().rank() == 0) {
    logInfo(fmt::format("trace: {} ({} events of {} ranks; open it in ui.perfetto.dev)", path,
                        events, n));
  }
}

std::string chromeTrace(const std::vector<std::vector<TraceEvent>>& ranks,
                        const std::vector<ClockOffset>& offsets, const TraceInfo& info,
                        const std::vector<size_t>& dropped) {
  using nlohmann::json;
  const int n = static_cast<int>(ranks.size());
  // Rank r's time t on rank 0's clock: t - offset_r.
  auto shift = [&](int r) { return static_cast<int64_t>(offsets.at(r).offset_us * 1e3); };
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < n; ++r) {
    for (const TraceEvent& e : ranks[r]) origin = std::min(origin, e.start_ns - shift(r));
  }
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;
  auto us = [&](int r, int64_t t) { return static_cast<double>(t - shift(r) - origin) / 1e3; };
  auto tid = [](TraceTrack t) { return t == TraceTrack::kCompute ? 1 : 2; };

  json events = json::array();
  for (int r = 0; r < n; ++r) {
    const std::string host = r < static_cast<int>(info.hosts.size()) ? info.hosts[r] : "?";
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("rank {} ({})", r, host)}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 0},
                      {"args", {{"sort_index", r}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 1},
                      {"args", {{"name", "compute"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 2},
                      {"args", {{"name", "communication"}}}});
  }
  // seq -> (rank, midpoint in µs, track) of each rank's collective, for the flows.
  std::map<uint64_t, std::vector<std::tuple<int, double, int>>> by_seq;
  for (int r = 0; r < n; ++r) {
    for (const TraceEvent& e : ranks[r]) {
      json args = json::object();
      if (e.step > 0) args["step"] = e.step;
      std::string cat = "compute";
      if (e.seq != 0) {
        cat = "collective";
        args["seq"] = e.seq;
        args["op"] = collectiveName(e.coll);
        if (e.coll == Collective::kAllReduce || e.coll == Collective::kReduceScatter)
          args["reduce"] = reduceOpName(e.op);
        args["scheduler"] = std::string(e.scheduler);
        if (!e.ran.empty() && e.ran != e.scheduler) args["ran"] = std::string(e.ran);
        args["bytes"] = e.bytes;
        if (e.bucket >= 0) args["bucket"] = e.bucket;
        by_seq[e.seq].emplace_back(r, (us(r, e.start_ns) + us(r, e.end_ns)) / 2, tid(e.track));
      } else if (e.index >= 0) {
        args["micro_batch"] = e.index;
      }
      events.push_back({{"name", std::string(e.name)},
                        {"cat", cat},
                        {"ph", "X"},
                        {"pid", r},
                        {"tid", tid(e.track)},
                        {"ts", us(r, e.start_ns)},
                        {"dur", std::max(0.0, static_cast<double>(e.end_ns - e.start_ns) / 1e3)},
                        {"args", args}});
    }
  }
  // One flow per collective, rank 0 -> 1 -> ... -> n-1, each end bound to the rank's slice.
  for (auto& [seq, at] : by_seq) {
    if (at.size() < 2) continue;
    std::sort(at.begin(), at.end());
    for (size_t k = 0; k < at.size(); ++k) {
      const auto& [r, ts, thread] = at[k];
      const char* ph = k == 0 ? "s" : k + 1 == at.size() ? "f" : "t";
      events.push_back({{"name", "collective"},
                        {"cat", "collective"},
                        {"ph", ph},
                        {"id", seq},
                        {"pid", r},
                        {"tid", thread},
                        {"ts", ts},
                        {"bp", "e"}});
    }
  }
  json clock = json::array();
  for (int r = 0; r < n; ++r) {
    clock.push_back({{"rank", r},
                     {"offset_us", offsets.at(r).offset_us},
                     {"uncertainty_us", offsets.at(r).uncertainty_us},
                     {"min_rtt_us", offsets.at(r).rtt_us},
                     {"events_dropped", r < static_cast<int>(dropped.size()) ? dropped[r] : 0}});
  }
  json out = {{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"experiment", info.experiment},
                {"clock", fmt::format("each rank's steady clock moved onto rank 0's by an offset "
                                      "estimated from the shortest of {} round trips over the "
                                      "control plane (Cristian's algorithm); the true offset lies "
                                      "within ± uncertainty_us of offset_us",
                                      kClockRounds)},
                {"ranks", clock}}}};
  return out.dump();
}

}  // namespace collie
