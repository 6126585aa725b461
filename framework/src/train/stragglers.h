// Straggler attribution: which rank holds a
// synchronous job back, by how much, and what the step would take without it. Free of
// LibTorch and of communication: the trainer gathers every rank's samples over the control
// plane every few steps and every rank computes the same report from them.
//
// Clock-free: every rank times its own collectives from the moment it starts one (its input
// is ready: its arrival) to the moment it completes. All ranks complete a collective at
// about the same time, so the rank that arrived last spent the least time in it, and each
// rank's wait for the others is its time in the collective less that least time (the
// transfer itself). Compute is a rank's forward and backward time, which never includes a
// collective (they run on the communication thread).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace collie::train {

// One rank's figures for one step.
struct StragglerSample {
  double step = 0;                  // seconds of the whole step
  double compute = 0;               // seconds of forward + backward
  std::vector<double> collectives;  // seconds from start to completion of each, in order
};

// Attribution over a set of steps, per rank.
struct StragglerReport {
  std::vector<double> median_compute;  // seconds per step
  // The fastest rank's median compute over this rank's: 1 for the fastest, 0.5 for a rank
  // that computes twice as long (NVIDIA's resiliency tooling's relative score).
  std::vector<double> score;
  std::vector<double> wait;        // seconds per step waiting in collectives for the others
  std::vector<double> last_share;  // the share of collectives it arrived at last
  double step_seconds = 0;         // median step time (the slowest rank's), as measured
  double step_at_fastest = 0;      // the step if every rank computed at the fastest's speed
  int steps = 0;

  int slowest() const;  // the rank with the lowest score
};

// One step attributed: per rank its compute, its wait and whether it arrived last at each
// collective; the step's time (the slowest rank's).
struct StepAttribution {
  std::vector<double> compute, wait, last;
  double collectives = 0, step = 0;
};
// `ranks[r]`: rank r's sample of one step (every rank with the same number of collectives).
StepAttribution attributeStep(const std::vector<StragglerSample>& ranks);
// Over a set of steps (at least one).
StragglerReport summarise(const std::vector<StepAttribution>& steps);

// When to warn: a rank whose score over the last `window` steps (medians over all of them,
// so one noisy check cannot name a rank) is below `threshold`; once per spell (it is named
// again only after its score over a window is back at or above the threshold).
class StragglerWatch {
 public:
  StragglerWatch(int world, double threshold, int window);
  // Feeds the steps attributed since the last call; the ranks to warn about now.
  std::vector<int> update(const std::vector<StepAttribution>& steps);
  // The report over the last window (empty until a window of steps has been fed).
  const StragglerReport& recent() const { return recent_; }
  double threshold() const { return threshold_; }
  int window() const { return window_; }

 private:
  double threshold_;
  int window_;
  std::deque<StepAttribution> steps_;  // the last `window_` steps
  StragglerReport recent_;
  std::vector<bool> warned_;
};

// The samples of one rank for `count` steps as a flat list (for the control plane's
// all-gather of doubles), and back.
std::vector<double> packSamples(const std::vector<StragglerSample>& samples);
std::vector<StragglerSample> unpackSamples(const std::vector<double>& packed);

}  // namespace collie::train
