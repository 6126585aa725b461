// The launcher's teardown policy (runtime/teardown.h).
#include "runtime/teardown.h"

#include <signal.h>

#include <algorithm>

namespace collie {

void Teardown::failed(Clock::time_point now, std::chrono::milliseconds grace) {
  term_at_ = std::min(term_at_, now + grace);
}

void Teardown::forwarded(Clock::time_point now) {
  term_sent_ = true;
  kill_at_ = std::min(kill_at_, now + kill_grace_);
}

void Teardown::killNow(Clock::time_point now) { kill_at_ = std::min(kill_at_, now); }

int Teardown::due(Clock::time_point now) {
  if (!term_sent_ && now >= term_at_) {
    term_sent_ = true;
    kill_at_ = std::min(kill_at_, now + kill_grace_);
    return SIGTERM;
  }
  if (!kill_sent_ && now >= kill_at_) {
    kill_sent_ = true;
    return SIGKILL;
  }
  return 0;
}

Teardown::Clock::time_point Teardown::next() const {
  return std::min(term_sent_ ? Clock::time_point::max() : term_at_,
                  kill_sent_ ? Clock::time_point::max() : kill_at_);
}

}  // namespace collie
