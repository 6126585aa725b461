// When collie's launcher stops its workers, as a pure policy over time: after
// the first worker fails the others get `failure_grace` to report their own error (the
// launcher shortens it to 0 when every running worker has been stopped for a second), then
// SIGTERM; `kill_grace` after SIGTERM (or after a forwarded SIGINT/SIGTERM/SIGHUP), SIGKILL;
// a second signal means SIGKILL at once. The launcher feeds it events and sends what due()
// returns; tests drive it with a clock of their own.
#pragma once

#include <chrono>

namespace collie {

class Teardown {
 public:
  using Clock = std::chrono::steady_clock;

  Teardown(std::chrono::milliseconds failure_grace, std::chrono::milliseconds kill_grace)
      : failure_grace_(failure_grace), kill_grace_(kill_grace) {}

  // A worker failed (or could not be started, with grace 0): SIGTERM after the grace.
  void failed(Clock::time_point now) { failed(now, failure_grace_); }
  void failed(Clock::time_point now, std::chrono::milliseconds grace);
  // A signal from outside was forwarded to the workers: that was the polite request.
  void forwarded(Clock::time_point now);
  // A second signal from outside: SIGKILL at once.
  void killNow(Clock::time_point now);

  // The signal every running worker must get now (SIGTERM, SIGKILL), or 0. Each is due
  // once; call again until it returns 0.
  int due(Clock::time_point now);
  // When due() next returns a signal (Clock::time_point::max(): no deadline).
  Clock::time_point next() const;
  // Whether the workers were asked to stop: a worker that exits non-zero after this is a
  // consequence, not the failure.
  bool stopping() const { return term_sent_; }

 private:
  std::chrono::milliseconds failure_grace_, kill_grace_;
  Clock::time_point term_at_ = Clock::time_point::max(), kill_at_ = Clock::time_point::max();
  bool term_sent_ = false, kill_sent_ = false;
};

}  // namespace collie
