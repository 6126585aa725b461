// Progress boards, their files, the process's writer thread, and the stall watch.
#include "runtime/progress.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "collie/log.h"
#include "util/files.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {

int64_t progressNowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ProgressBoard::ProgressBoard(int rank, int world, int run) {
  now_.rank = rank;
  now_.world = world;
  now_.run = run;
  now_.pid = ::getpid();
  now_.host = detail::hostName();
  now_.since_us = progressNowMicros();
}

void ProgressBoard::enter(std::string what) {
  const int64_t now = progressNowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  ++now_.op;
  ++depth_;
  now_.inside = true;
  now_.what = std::move(what);
  now_.since_us = now;
}

void ProgressBoard::leave() {
  const int64_t now = progressNowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (depth_ > 0) --depth_;
  now_.inside = depth_ > 0;
  if (!now_.inside) now_.since_us = now;
}

void pokeProgressWriter();

void ProgressBoard::setStep(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    now_.step = step;
  }
  pokeProgressWriter();  // a new step is worth a file now: a rank may stop before the next round
}

RankProgress ProgressBoard::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

std::string progressFolder(const std::string& out_dir) {
  return (fs::path(out_dir) / "progress").string();
}

std::string progressPath(const std::string& dir, int rank) {
  return (fs::path(dir) / fmt::format("rank-{}.json", rank)).string();
}

namespace {

nlohmann::json toJson(const RankProgress& p) {
  return {{"rank", p.rank},
          {"world", p.world},
          {"run", p.run},
          {"pid", p.pid},
          {"host", p.host},
          {"step", p.step},
          {"op", p.op},
          {"inside", p.inside},
          {"what", p.what},
          {"since_us", p.since_us},
          {"heartbeat_us", p.heartbeat_us},
          {"finished", p.finished},
          {"failed", p.failed}};
}

bool fromJson(const nlohmann::json& j, RankProgress* p) {
  if (!j.is_object()) return false;
  try {
    p->rank = j.at("rank").get<int>();
    p->world = j.at("world").get<int>();
    p->run = j.at("run").get<int>();
    p->pid = j.at("pid").get<int64_t>();
    p->host = j.at("host").get<std::string>();
    p->step = j.at("step").get<int64_t>();
    p->op = j.at("op").get<uint64_t>();
    p->inside = j.at("inside").get<bool>();
    p->what = j.at("what").get<std::string>();
    p->since_us = j.at("since_us").get<int64_t>();
    p->heartbeat_us = j.at("heartbeat_us").get<int64_t>();
    p->finished = j.at("finished").get<bool>();
    p->failed = j.at("failed").get<bool>();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return p->rank >= 0 && p->world > 0 && p->rank < p->world;
}

std::string seconds(int64_t us) { return fmt::format("{:.1f} s", static_cast<double>(us) / 1e6); }

}  // namespace

std::vector<RankProgress> readProgress(const std::string& dir, int run) {
  std::map<int, RankProgress> by_rank;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    if (!in) continue;
    RankProgress p;
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!fromJson(j, &p) || (run != -2 && p.run != run)) continue;
    by_rank[p.rank] = p;
  }
  std::vector<RankProgress> out;
  for (auto& [rank, p] : by_rank) out.push_back(std::move(p));
  return out;
}

bool heartbeatStale(const RankProgress& rank, int64_t now_us) {
  return now_us - rank.heartbeat_us > 3500000;  // the files are written every second
}

std::string describeLiveness(const RankProgress& rank, int64_t now_us) {
  std::string process = fmt::format("pid {} on {}", rank.pid, rank.host);
  if (rank.host == detail::hostName()) {
    std::ifstream stat(fmt::format("/proc/{}/stat", rank.pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (!stat || paren == std::string::npos || paren + 2 >= text.size()) {
      process += " is gone";
    } else {
      switch (text[paren + 2]) {
        case 'T':
          process += " is stopped (SIGSTOP)";
          break;
        case 't':
          process += " is stopped by a debugger";
          break;
        case 'Z':
          process += " has exited (not reaped)";
          break;
        case 'D':
          process += " is blocked in the kernel (D)";
          break;
        case 'R':
          process += " is running";
          break;
        default:
          process += " is alive (sleeping)";
          break;
      }
    }
  }
  return fmt::format("{}, last heartbeat {} ago", process, seconds(now_us - rank.heartbeat_us));
}

StallWatch::StallWatch(std::chrono::milliseconds warn_after, Liveness liveness)
    : warn_after_us_(std::chrono::duration_cast<std::chrono::microseconds>(warn_after).count()),
      liveness_(std::move(liveness)) {}

std::string StallWatch::observe(const std::vector<RankProgress>& ranks, int world, int64_t now_us) {
  // The stalled operation: the furthest one that a rank has been inside for warn_after.
  const RankProgress* stalled = nullptr;
  for (const auto& r : ranks) {
    if (!r.inside || r.finished || now_us - r.since_us < warn_after_us_) continue;
    if (stalled == nullptr || r.op > stalled->op) stalled = &r;
  }
  if (stalled == nullptr || warn_after_us_ <= 0) {
    op_ = 0;
    return "";
  }
  const uint64_t op = stalled->op;
  int64_t since = stalled->since_us;
  std::vector<int> waiting, past, missing;
  std::vector<const RankProgress*> behind;
  std::vector<bool> seen(static_cast<size_t>(std::max(world, 0)), false);
  for (const auto& r : ranks) {
    if (r.rank >= world) continue;
    seen[r.rank] = true;
    if (r.op == op && r.inside) {
      waiting.push_back(r.rank);
      since = std::min(since, r.since_us);
    } else if (r.op >= op) {
      past.push_back(r.rank);
    } else {
      behind.push_back(&r);
    }
  }
  for (int r = 0; r < world; ++r)
    if (!seen[r]) missing.push_back(r);
  if (op != op_) {  // a new stall; the same one goes on as ranks give up on it
    op_ = op;
    since_us_ = since;
    next_us_ = warn_after_us_;
  }
  since_us_ = std::min(since_us_, since);
  const int64_t waited = now_us - since_us_;
  if (waited < next_us_) return "";
  while (next_us_ <= waited) next_us_ *= 2;

  std::string line =
      fmt::format("stall: rank{} {} {} waited {} in {}{}", waiting.size() == 1 ? "" : "s",
                  fmt::join(waiting, ", "), waiting.size() == 1 ? "has" : "have", seconds(waited),
                  stalled->what, stalled->step > 0 ? fmt::format(" (step {})", stalled->step) : "");
  std::vector<std::string> named;
  for (const RankProgress* r : behind) {
    const std::string step = r->step > 0 ? fmt::format(" at step {}", r->step) : "";
    const std::string age = seconds(now_us - r->since_us);
    std::string state = r->inside    ? fmt::format("in {}{} for {}", r->what, step, age)
                        : r->op == 0 ? fmt::format("in no operation yet{}", step)
                                     : fmt::format("last in {}{}, left {} ago", r->what, step, age);
    // A stale file tells where the rank was when it last wrote it, not where it is.
    if (heartbeatStale(*r, now_us)) state = "as of its last heartbeat: " + state;
    named.push_back(
        fmt::format("rank {} has not reached it ({}; {})", r->rank, state, liveness_(*r, now_us)));
  }
  if (!missing.empty()) {
    named.push_back(
        fmt::format("rank{} {} wrote no progress file (not started, or on a node "
                    "that does not share this run folder)",
                    missing.size() == 1 ? "" : "s", fmt::join(missing, ", ")));
  }
  if (!past.empty()) named.push_back(fmt::format("past it: {}", fmt::join(past, ", ")));
  if (behind.empty() && missing.empty()) {
    named.push_back(
        "every rank has entered it: the operation itself is stuck (a link, the network or the "
        "backend)");
  }
  line += "; " + fmt::format("{}", fmt::join(named, "; "));
  line += fmt::format(". Next report after {} of waiting; the backend's timeout ends the job",
                      seconds(next_us_));
  return line;
}

// --- the process's writer ----------------------------------------------------------------

namespace {

class Publisher {
 public:
  static Publisher& instance() {
    static Publisher* p = new Publisher();  // never destroyed: its thread ends with the last board
    return *p;
  }

  void add(const ProgressBoard* board, std::string path, ProgressSettings settings) {
    std::unique_lock<std::mutex> lock(mu_);
    std::error_code ec;
    fs::create_directories(settings.dir, ec);
    entries_.push_back({board, std::move(path), std::move(settings)});
    if (!thread_.joinable()) thread_ = std::thread([this, g = generation_] { loop(g); });
  }

  void poke() {
    std::lock_guard<std::mutex> lock(mu_);
    dirty_ = true;
    wake_.notify_all();
  }

  void remove(const ProgressBoard* board, bool failed) {
    std::thread ending;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto it = std::find_if(entries_.begin(), entries_.end(),
                             [&](const Entry& e) { return e.board == board; });
      if (it == entries_.end()) return;
      write(*it, /*finished=*/true, failed);
      entries_.erase(it);
      if (entries_.empty() && thread_.joinable()) {
        ++generation_;  // that thread's last round; a board added meanwhile starts another
        watcher_.reset();
        wake_.notify_all();
        ending = std::move(thread_);
      }
    }
    if (ending.joinable()) ending.join();
  }

 private:
  struct Entry {
    const ProgressBoard* board;
    std::string path;
    ProgressSettings settings;
  };

  static void write(const Entry& e, bool finished, bool failed = false) {
    RankProgress p = e.board->snapshot();
    p.heartbeat_us = progressNowMicros();
    p.finished = finished;
    p.failed = failed;
    try {
      std::error_code ec;  // a launcher may have cleared the folder of an earlier attempt
      fs::create_directories(e.settings.dir, ec);
      detail::writeFileAtomically(e.path, toJson(p).dump() + "\n");
    } catch (const std::exception&) {
      // A full disk or a removed folder must not fail the rank: its file just ages.
    }
  }

  // Speaks for the job when no rank below this process's lowest has a fresh heartbeat.
  void watch(int64_t now_us) {
    const Entry* lowest = nullptr;
    for (const auto& e : entries_) {
      if (!e.settings.watch || e.settings.stall_warning.count() <= 0) continue;
      if (lowest == nullptr || e.board->snapshot().rank < lowest->board->snapshot().rank)
        lowest = &e;
    }
    if (lowest == nullptr) return;
    const RankProgress me = lowest->board->snapshot();
    const std::vector<RankProgress> ranks = readProgress(lowest->settings.dir, me.run);
    for (const auto& r : ranks) {
      if (r.rank < me.rank && !r.finished && !heartbeatStale(r, now_us)) return;
    }
    if (!watcher_ || watched_dir_ != lowest->settings.dir) {
      watcher_ = std::make_unique<StallWatch>(lowest->settings.stall_warning, describeLiveness);
      watched_dir_ = lowest->settings.dir;
    }
    const std::string line = watcher_->observe(ranks, me.world, now_us);
    if (!line.empty()) logWarn(line);
  }

  void loop(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mu_);
    while (generation_ == generation) {
      dirty_ = false;
      for (const auto& e : entries_) write(e, false);
      watch(progressNowMicros());
      // At most five rounds a second however often steps change, at least one.
      auto ended = [&] { return generation_ != generation; };
      if (wake_.wait_for(lock, std::chrono::milliseconds(200), ended)) break;
      wake_.wait_for(lock, std::chrono::milliseconds(800), [&] { return ended() || dirty_; });
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Entry> entries_;
  std::thread thread_;
  bool dirty_ = false;       // a board changed step: write the files now
  uint64_t generation_ = 0;  // a thread runs while it is the one it started with
  std::unique_ptr<StallWatch> watcher_;
  std::string watched_dir_;
};

}  // namespace

void pokeProgressWriter() { Publisher::instance().poke(); }

void publishProgress(const ProgressBoard* board, const std::string& path,
                     const ProgressSettings& settings) {
  Publisher::instance().add(board, path, settings);
}

void unpublishProgress(const ProgressBoard* board, bool failed) {
  Publisher::instance().remove(board, failed);
}

int printStatus(const std::string& run_dir, std::ostream& out) {
  const std::string dir = progressFolder(run_dir);
  const std::vector<RankProgress> ranks = readProgress(dir);
  if (ranks.empty()) {
    out << "collie status: no progress files in " << dir
        << " (a run writes them while it runs: is this a run's output folder?)\n";
    return 2;
  }
  const int64_t now = progressNowMicros();
  const int world = ranks.front().world;
  out << fmt::format("{}: {} of {} rank(s) wrote progress{}\n", run_dir, ranks.size(), world,
                     ranks.front().run >= 0 ? fmt::format(" (run {})", ranks.front().run + 1) : "");
  for (const auto& r : ranks) {
    std::string where;
    if (r.finished) {
      where = r.failed ? "failed (its error is in the run's log)" : "finished";
    } else if (r.inside) {
      where = fmt::format("in {} for {}", r.what, seconds(now - r.since_us));
    } else if (r.op == 0) {
      where = "has not communicated yet";
    } else {
      where = fmt::format("between operations (last: {}, left {} ago)", r.what,
                          seconds(now - r.since_us));
    }
    out << fmt::format("rank {}: {}{}; {}\n", r.rank,
                       r.step > 0 ? fmt::format("step {}, ", r.step) : "", where,
                       describeLiveness(r, now));
  }
  return 0;
}

}  // namespace collie
