// The ring of recent collectives, its JSON dump, and the analysis of a run's dumps.
#include "runtime/flight_recorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "collie/error.h"
#include "collie/log.h"
#include "core/strings.h"
#include "util/files.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

int64_t nowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "12:00:01.234567" (UTC) of a system-clock time in microseconds.
std::string clockText(int64_t us) {
  const std::time_t seconds = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[16];
  std::strftime(text, sizeof(text), "%H:%M:%S", &tm);
  return fmt::format("{}.{:06d}", text, static_cast<int>(us % 1000000));
}

nlohmann::json toJson(const FlightEntry& e) {
  return {{"seq", e.seq},
          {"collective", collectiveName(e.coll)},
          {"bytes", e.bytes},
          {"count", e.count},
          {"dtype", dtypeName(e.dtype)},
          {"op", reduceOpName(e.op)},
          {"root", e.root},
          {"scheduler", e.scheduler},
          {"state", flightStateName(e.state)},
          {"start_us", e.start_us},
          {"end_us", e.end_us}};
}

// One rank's file, as analyze reads it.
struct RankRecord {
  int rank = 0, world = 0;
  std::string host, reason;
  struct Entry {
    uint64_t seq = 0;
    std::string collective, dtype, op, scheduler, state;
    uint64_t bytes = 0, count = 0;
    int root = 0;
    int64_t start_us = 0, end_us = 0;
    // What every rank must agree on for the same seq.
    std::string call() const {
      std::string text = fmt::format("{} of {} x {}", collective, count, dtype);
      if (collective == "allreduce" || collective == "reduce_scatter") text += " (" + op + ")";
      if (collective == "broadcast") text += fmt::format(" (root {})", root);
      if (collective == "barrier") text = "barrier";
      return text;
    }
  };
  std::vector<Entry> entries;  // oldest first
};

RankRecord readRecord(const fs::path& path) {
  std::ifstream in(path);
  RankRecord r;
  try {
    const auto j = nlohmann::json::parse(in);
    r.rank = j.at("rank").get<int>();
    r.world = j.at("world").get<int>();
    r.host = j.value("host", "");
    r.reason = j.value("reason", "");
    for (const auto& e : j.at("entries")) {
      RankRecord::Entry x;
      x.seq = e.at("seq").get<uint64_t>();
      x.collective = e.at("collective").get<std::string>();
      x.bytes = e.at("bytes").get<uint64_t>();
      x.count = e.at("count").get<uint64_t>();
      x.dtype = e.at("dtype").get<std::string>();
      x.op = e.at("op").get<std::string>();
      x.root = e.at("root").get<int>();
      x.scheduler = e.at("scheduler").get<std::string>();
      x.state = e.at("state").get<std::string>();
      x.start_us = e.at("start_us").get<int64_t>();
      x.end_us = e.at("end_us").get<int64_t>();
      r.entries.push_back(std::move(x));
    }
  } catch (const nlohmann::json::exception& x) {
    throw ConfigError(
        fmt::format("{}: not a flight record collie wrote: {}", path.string(), x.what()));
  }
  if (r.rank < 0 || r.world < 1 || r.rank >= r.world) {
    throw ConfigError(fmt::format("{}: rank {} of world {} is not a place in a job", path.string(),
                                  r.rank, r.world));
  }
  return r;
}

std::string ranksText(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

}  // namespace

const char* flightStateName(FlightEntry::State state) {
  // In the enum's order.
  static constexpr const char* kNames[] = {"started", "completed", "failed"};
  static_assert(std::size(kNames) == static_cast<size_t>(FlightEntry::State::kFailed) + 1);
  const auto i = static_cast<size_t>(state);
  return i < std::size(kNames) ? kNames[i] : "?";
}

uint64_t FlightRecorder::begin(FlightEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  entry.start_us = nowMicros();
  entry.end_us = 0;
  entry.state = FlightEntry::State::kStarted;
  const uint64_t id = next_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(entry));
  } else {
    ring_[id % capacity_] = std::move(entry);
  }
  return id;
}

void FlightRecorder::end(uint64_t id, FlightEntry::State state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id + capacity_ < next_) return;  // overwritten meanwhile
  FlightEntry& e = ring_[id % capacity_];
  e.state = state;
  e.end_us = nowMicros();
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  const uint64_t first = next_ > ring_.size() ? next_ - ring_.size() : 0;
  for (uint64_t id = first; id < next_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

void FlightRecorder::dump(const std::string& path, int rank, int world,
                          const std::string& reason) const {
  try {
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& e : this->entries()) entries.push_back(toJson(e));
    const nlohmann::json record = {
        {"rank", rank},      {"world", world},   {"host", detail::hostName()},
        {"pid", ::getpid()}, {"reason", reason}, {"written_us", nowMicros()},
        {"entries", entries}};
    fs::create_directories(fs::path(path).parent_path());
    detail::writeFileAtomically(path, record.dump(1) + "\n");
  } catch (const std::exception& x) {
    logWarn(fmt::format("cannot write the flight record {}: {}", path, x.what()));
  }
}

std::string flightRecordFolder(const std::string& out_dir) {
  return (fs::path(out_dir) / "flight-recorder").string();
}

std::string flightRecordPath(const std::string& out_dir, int rank) {
  return (fs::path(flightRecordFolder(out_dir)) / fmt::format("rank-{}.json", rank)).string();
}

int analyzeRun(const std::string& run_dir, std::ostream& out) {
  const fs::path folder = flightRecordFolder(run_dir);
  std::map<int, RankRecord> records;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (entry.path().extension() != ".json") continue;
    RankRecord r = readRecord(entry.path());
    records[r.rank] = std::move(r);
  }
  if (records.empty()) {
    out << "collie analyze: " << folder.string()
        << " holds no flight record: no rank of this run failed with debug.flight_recorder on "
           "(ranks write one when they fail)\n";
    return 2;
  }
  const int world = records.begin()->second.world;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (records.count(r) == 0) missing.push_back(r);
  }
  out << fmt::format("# flight records of {} of {} ranks in {}\n", records.size(), world,
                     folder.string());
  // Each rank's newest collectives and where it stopped.
  std::map<int, const RankRecord::Entry*> last;  // the newest entry of each rank
  for (const auto& [rank, r] : records) {
    out << fmt::format("rank {} ({}): {}\n", rank, r.host.empty() ? "?" : r.host,
                       r.reason.empty() ? "no reason given" : r.reason);
    const size_t shown = std::min<size_t>(r.entries.size(), 3);
    for (size_t k = r.entries.size() - shown; k < r.entries.size(); ++k) {
      const auto& e = r.entries[k];
      out << fmt::format(
          "  seq {:>6}  {:<40} {:<18} {:<9} started {}{}\n", e.seq, e.call(), e.scheduler, e.state,
          clockText(e.start_us),
          e.end_us > 0 ? fmt::format(", {:.3f} ms", (e.end_us - e.start_us) / 1e3) : "");
    }
    if (!r.entries.empty()) last[rank] = &r.entries.back();
  }
  for (int r : missing) {
    out << fmt::format(
        "rank {}: no record (it died, was killed or stopped before it could "
        "write one)\n",
        r);
  }

  // Disagreement: the same seq called as different collectives.
  std::map<uint64_t, std::map<std::string, std::vector<int>>> calls;
  for (const auto& [rank, r] : records) {
    for (const auto& e : r.entries) calls[e.seq][e.call()].push_back(rank);
  }
  for (const auto& [seq, by_call] : calls) {
    if (by_call.size() < 2) continue;
    std::vector<std::string> parts;
    for (const auto& [call, ranks] : by_call) parts.push_back(ranksText(ranks) + " called " + call);
    out << fmt::format("verdict: the ranks disagree at seq {}: {}\n", seq, fmt::join(parts, "; "));
    return 0;
  }

  // Waiting: ranks whose newest collective is open (started or failed) at seq S, and ranks
  // that never started S.
  uint64_t waited_seq = 0;
  std::vector<int> waiting;
  for (const auto& [rank, e] : last) {
    if (e->state != "completed") waited_seq = std::max(waited_seq, e->seq);
  }
  std::vector<int> behind;
  for (const auto& [rank, e] : last) {
    if (e->state != "completed" && e->seq == waited_seq) waiting.push_back(rank);
    if (waited_seq > 0 && e->seq < waited_seq) behind.push_back(rank);
  }
  for (const auto& [rank, r] : records) {
    if (r.entries.empty() && waited_seq > 0) behind.push_back(rank);
  }
  std::sort(behind.begin(), behind.end());
  if (waited_seq == 0) {
    out << "verdict: every recorded collective completed; the failure was outside them (see "
           "each rank's reason above)"
        << (missing.empty() ? "" : fmt::format("; {} left no record", ranksText(missing))) << "\n";
    return 0;
  }
  const auto& call = last.at(waiting.front())->call();
  // A rank that started the waited-for collective only after another had given up on it
  // came late (a delay, a slow machine): the others waited for it.
  for (int r : waiting) {
    const auto* mine = last.at(r);
    for (int q : waiting) {
      const auto* other = last.at(q);
      if (q == r || other->end_us == 0 || mine->start_us <= other->end_us) continue;
      behind.push_back(r);
      out << fmt::format(
          "rank {} started seq {} at {}, {:.3f} s after rank {}, which had given "
          "up on it at {}\n",
          r, waited_seq, clockText(mine->start_us), (mine->start_us - other->start_us) / 1e6, q,
          clockText(other->end_us));
      break;
    }
  }
  std::sort(behind.begin(), behind.end());
  behind.erase(std::unique(behind.begin(), behind.end()), behind.end());
  std::vector<std::string> culprits;
  for (int r : behind) {
    const auto it = last.find(r);
    culprits.push_back(it == last.end() ? fmt::format("rank {} had not started a collective", r)
                       : it->second->seq == waited_seq
                           ? fmt::format("rank {} started it late", r)
                           : fmt::format("rank {} last started seq {}", r, it->second->seq));
  }
  for (int r : missing) culprits.push_back(fmt::format("rank {} left no record", r));
  if (culprits.empty()) {
    out << fmt::format(
        "verdict: {} failed in seq {} ({}) and no rank was behind: the collective itself "
        "failed (see the reasons above: a transport error, a timeout of a peer that left)\n",
        ranksText(waiting), waited_seq, call);
    return 0;
  }
  waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                               [&](int r) {
                                 return std::find(behind.begin(), behind.end(), r) != behind.end();
                               }),
                waiting.end());
  std::vector<int> suspects = behind;
  suspects.insert(suspects.end(), missing.begin(), missing.end());
  std::sort(suspects.begin(), suspects.end());
  out << fmt::format("verdict: {} waited in seq {} ({}); {}: the others were waiting for {}\n",
                     ranksText(waiting), waited_seq, call, fmt::join(culprits, ", "),
                     ranksText(suspects));
  return 0;
}

}  // namespace collie
