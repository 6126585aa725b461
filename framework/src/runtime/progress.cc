// Progress boards, their files, the process's writer thread, and the stall watch.
#include "runtime/progress.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "collie/log.h"
#include "collie/params.h"
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

std::string ProgressOp::describe() const {
  if (control) return fmt::format("control exchange {}", seq);
  return fmt::format("{} seq {} ({})", collectiveName(coll), seq, formatBytes(bytes));
}

void ProgressBoard::enter(const ProgressOp& op) {
  const int64_t now = progressNowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  ++now_.op;
  ++depth_;
  now_.inside = true;
  last_ = op;
  now_.since_us = now;
}

void ProgressBoard::leave() {
  const int64_t now = progressNowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (depth_ > 0) --depth_;
  now_.inside = depth_ > 0;
  if (!now_.inside) now_.since_us = now;
}

namespace detail {
void pokeProgressWriter();  // below, with the writer
}  // namespace detail

void ProgressBoard::setStep(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    now_.step = step;
  }
  // A new step is worth a file now: a rank may stop before the next round.
  detail::pokeProgressWriter();
}

RankProgress ProgressBoard::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  RankProgress p = now_;
  if (p.op > 0) p.what = last_.describe();
  return p;
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

namespace {

// One rank's file; false when it is missing, being replaced, or not collie's.
bool readProgressFile(const fs::path& path, RankProgress* p) {
  std::ifstream in(path);
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return fromJson(j, p);
}

}  // namespace

std::vector<RankProgress> readProgress(const std::string& dir, int run) {
  std::map<int, RankProgress> by_rank;
  std::error_code ec;
  // increment(ec), not ++: a folder on NFS can fail mid-listing (ESTALE), which must not
  // throw in the writer's thread or the launcher's loop.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path path = it->path();
    const std::string name = path.filename().string();
    if (name.rfind("rank-", 0) != 0 || path.extension() != ".json") continue;
    RankProgress p;
    if (!readProgressFile(path, &p) || (run != -2 && p.run != run)) continue;
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
    switch (detail::processState(rank.pid)) {
      case 0:
        process += " is gone";
        break;
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
  return fmt::format("{}, last heartbeat {} ago", process, seconds(now_us - rank.heartbeat_us));
}

StallWatch::StallWatch(std::chrono::milliseconds warn_after, Liveness liveness)
    : warn_after_us_(std::chrono::duration_cast<std::chrono::microseconds>(warn_after).count()),
      liveness_(std::move(liveness)) {}

namespace {

// Where every rank stands against one stalled operation.
struct Stall {
  const RankProgress* stalled = nullptr;  // a rank inside it the longest-running way
  int64_t since_us = 0;                   // when its first rank entered it
  std::vector<int> waiting, past, missing;
  std::vector<const RankProgress*> behind;
};

// The furthest operation some rank has been inside for `warn_after_us`, and each rank's
// place against it; stalled is null when there is none.
Stall classify(const std::vector<RankProgress>& ranks, int world, int64_t now_us,
               int64_t warn_after_us) {
  Stall s;
  for (const auto& r : ranks) {
    if (!r.inside || r.finished || now_us - r.since_us < warn_after_us) continue;
    if (s.stalled == nullptr || r.op > s.stalled->op) s.stalled = &r;
  }
  if (s.stalled == nullptr) return s;
  const uint64_t op = s.stalled->op;
  s.since_us = s.stalled->since_us;
  std::vector<bool> seen(static_cast<size_t>(std::max(world, 0)), false);
  for (const auto& r : ranks) {
    if (r.rank >= world) continue;
    seen[r.rank] = true;
    if (r.op == op && r.inside) {
      s.waiting.push_back(r.rank);
      s.since_us = std::min(s.since_us, r.since_us);
    } else if (r.op >= op) {
      s.past.push_back(r.rank);
    } else {
      s.behind.push_back(&r);
    }
  }
  for (int r = 0; r < world; ++r)
    if (!seen[r]) s.missing.push_back(r);
  return s;
}

// "rank 1 has not reached it (last in allreduce seq 5 at step 4, left 10.1 s ago; pid ...)".
std::string describeBehind(const RankProgress& r, int64_t now_us,
                           const StallWatch::Liveness& liveness) {
  const std::string step = r.step > 0 ? fmt::format(" at step {}", r.step) : "";
  const std::string age = seconds(now_us - r.since_us);
  std::string state = r.inside    ? fmt::format("in {}{} for {}", r.what, step, age)
                      : r.op == 0 ? fmt::format("in no operation yet{}", step)
                                  : fmt::format("last in {}{}, left {} ago", r.what, step, age);
  // A stale file tells where the rank was when it last wrote it, not where it is.
  if (heartbeatStale(r, now_us)) state = "as of its last heartbeat: " + state;
  return fmt::format("rank {} has not reached it ({}; {})", r.rank, state, liveness(r, now_us));
}

}  // namespace

std::string StallWatch::observe(const std::vector<RankProgress>& ranks, int world, int64_t now_us) {
  const Stall s = warn_after_us_ > 0 ? classify(ranks, world, now_us, warn_after_us_) : Stall{};
  if (s.stalled == nullptr) {
    op_ = 0;
    return "";
  }
  if (s.stalled->op != op_) {  // a new stall; the same one goes on as ranks give up on it
    op_ = s.stalled->op;
    since_us_ = s.since_us;
    next_us_ = warn_after_us_;
  }
  since_us_ = std::min(since_us_, s.since_us);
  const int64_t waited = now_us - since_us_;
  if (waited < next_us_) return "";
  while (next_us_ <= waited) next_us_ *= 2;

  std::vector<std::string> named;
  for (const RankProgress* r : s.behind) named.push_back(describeBehind(*r, now_us, liveness_));
  if (!s.missing.empty()) {
    named.push_back(fmt::format(
        "rank{} {} wrote no progress file (not started, or on a node that does not share this "
        "run folder)",
        s.missing.size() == 1 ? "" : "s", fmt::join(s.missing, ", ")));
  }
  if (!s.past.empty()) named.push_back(fmt::format("past it: {}", fmt::join(s.past, ", ")));
  if (s.behind.empty() && s.missing.empty()) {
    named.push_back(
        "every rank is inside it: the operation itself is slow or stuck (a large message on a "
        "slow link, a link that is down, the backend)");
  }
  return fmt::format(
      "stall: rank{} {} {} waited {} in {}{}; {}. Next report after {} of waiting; the "
      "backend's timeout ends the job",
      s.waiting.size() == 1 ? "" : "s", fmt::join(s.waiting, ", "),
      s.waiting.size() == 1 ? "has" : "have", seconds(waited), s.stalled->what,
      s.stalled->step > 0 ? fmt::format(" (step {})", s.stalled->step) : "", fmt::join(named, "; "),
      seconds(next_us_));
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

  // From a training thread at every step: no lock, so that a step never waits for a round
  // of file writes (a wake-up lost to the race is a round up to 0.8 s later).
  void poke() {
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
    try {
      RankProgress p = e.board->snapshot();
      p.heartbeat_us = progressNowMicros();
      p.finished = finished;
      p.failed = failed;
      std::error_code ec;  // a launcher may have cleared the folder of an earlier attempt
      fs::create_directories(e.settings.dir, ec);
      detail::writeFileAtomically(e.path, toJson(p).dump() + "\n");
    } catch (const std::exception&) {
      // A full disk or a removed folder must not fail the rank: its file just ages.
    }
  }

  // Whether a rank below `me` speaks for the job: the first lower rank whose file is missing
  // (on a node that does not share this folder, or not written yet) or fresh. Read one file
  // at a time from rank 0, so that every process of a large job reads one file a second.
  static bool lowerRankSpeaks(const RankProgress& me, const std::string& dir, int64_t now_us) {
    for (int r = 0; r < me.rank; ++r) {
      RankProgress lower;
      if (!readProgressFile(progressPath(dir, r), &lower) || lower.run != me.run) return true;
      if (!lower.finished && !heartbeatStale(lower, now_us)) return true;
    }
    return false;
  }

  // Speaks for the job when every rank below this process's lowest is stale or finished.
  void watch(int64_t now_us) {
    const Entry* lowest = nullptr;
    int lowest_rank = 0;
    for (const auto& e : entries_) {
      if (!e.settings.watch || e.settings.stall_warning.count() <= 0) continue;
      const int rank = e.board->snapshot().rank;
      if (lowest == nullptr || rank < lowest_rank) {
        lowest = &e;
        lowest_rank = rank;
      }
    }
    if (lowest == nullptr) return;
    const RankProgress me = lowest->board->snapshot();
    if (lowerRankSpeaks(me, lowest->settings.dir, now_us)) return;
    const std::vector<RankProgress> ranks = readProgress(lowest->settings.dir, me.run);
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
      try {
        for (const auto& e : entries_) write(e, false);
        watch(progressNowMicros());
      } catch (const std::exception& e) {
        // Progress is a help, never a reason for a rank to fail (a thread must not throw).
        logDebug(std::string("progress: ") + e.what());
      }
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
  std::atomic<bool> dirty_{false};  // a board changed step: write the files now
  uint64_t generation_ = 0;         // a thread runs while it is the one it started with
  std::unique_ptr<StallWatch> watcher_;
  std::string watched_dir_;
};

}  // namespace

void detail::pokeProgressWriter() { Publisher::instance().poke(); }

void publishProgress(const ProgressBoard* board, const std::string& path,
                     const ProgressSettings& settings) {
  Publisher::instance().add(board, path, settings);
}

void unpublishProgress(const ProgressBoard* board, bool failed) {
  Publisher::instance().remove(board, failed);
}

int printStatus(const std::string& run_dir, std::ostream& out) {
  const std::string dir = progressFolder(run_dir);
  std::vector<RankProgress> ranks = readProgress(dir);
  // The folder may hold files of earlier runs of a matrix (or of an earlier run into the
  // same folder): the run and the world are those of the newest heartbeat.
  if (!ranks.empty()) {
    const RankProgress newest = *std::max_element(
        ranks.begin(), ranks.end(),
        [](const auto& a, const auto& b) { return a.heartbeat_us < b.heartbeat_us; });
    ranks.erase(std::remove_if(ranks.begin(), ranks.end(),
                               [&](const RankProgress& r) {
                                 return r.run != newest.run || r.world != newest.world;
                               }),
                ranks.end());
  }
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
