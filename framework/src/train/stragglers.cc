// Straggler attribution from per-rank compute and collective times.
#include "train/stragglers.h"

#include <algorithm>
#include <limits>

#include "collie/error.h"

namespace collie::train {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int StragglerReport::slowest() const {
  return static_cast<int>(std::min_element(score.begin(), score.end()) - score.begin());
}

StepAttribution attributeStep(const std::vector<StragglerSample>& ranks) {
  const size_t world = ranks.size();
  COLLIE_CHECK(world > 0, "straggler attribution of a step without ranks");
  StepAttribution a;
  a.compute.assign(world, 0);
  a.wait.assign(world, 0);
  a.last.assign(world, 0);
  const size_t n = ranks.front().collectives.size();
  for (size_t rank = 0; rank < world; ++rank) {
    COLLIE_CHECK(ranks[rank].collectives.size() == n,
                 "ranks report different numbers of collectives");
    a.compute[rank] = ranks[rank].compute;
    a.step = std::max(a.step, ranks[rank].step);
  }
  for (size_t c = 0; c < n; ++c) {
    size_t last = 0;
    for (size_t rank = 1; rank < world; ++rank) {
      if (ranks[rank].collectives[c] < ranks[last].collectives[c]) last = rank;
    }
    for (size_t rank = 0; rank < world; ++rank)
      a.wait[rank] += ranks[rank].collectives[c] - ranks[last].collectives[c];
    a.last[last] += 1;
  }
  a.collectives = static_cast<double>(n);
  return a;
}

StragglerReport summarise(const std::vector<StepAttribution>& steps) {
  COLLIE_CHECK(!steps.empty(), "straggler attribution needs a step");
  const size_t world = steps.front().compute.size();
  StragglerReport r;
  r.steps = static_cast<int>(steps.size());
  r.median_compute.assign(world, 0);
  r.wait.assign(world, 0);
  r.last_share.assign(world, 0);
  std::vector<std::vector<double>> compute(world);
  std::vector<double> step_seconds;
  double collectives = 0;
  for (const auto& step : steps) {
    COLLIE_CHECK(step.compute.size() == world, "a straggler step has ", step.compute.size(),
                 " ranks, not ", world);
    for (size_t rank = 0; rank < world; ++rank) {
      compute[rank].push_back(step.compute[rank]);
      r.wait[rank] += step.wait[rank];
      r.last_share[rank] += step.last[rank];
    }
    collectives += step.collectives;
    step_seconds.push_back(step.step);
  }
  double fastest = std::numeric_limits<double>::infinity(), slowest = 0;
  for (size_t rank = 0; rank < world; ++rank) {
    r.median_compute[rank] = median(compute[rank]);
    fastest = std::min(fastest, r.median_compute[rank]);
    slowest = std::max(slowest, r.median_compute[rank]);
    r.wait[rank] /= static_cast<double>(steps.size());
    if (collectives > 0) r.last_share[rank] /= collectives;
  }
  r.score.assign(world, 1);
  for (size_t rank = 0; rank < world; ++rank) {
    if (r.median_compute[rank] > 0) r.score[rank] = fastest / r.median_compute[rank];
  }
  r.step_seconds = median(step_seconds);
  // A synchronous step waits for the slowest rank's compute: at the fastest's speed it would
  // be shorter by their difference.
  r.step_at_fastest = std::max(0.0, r.step_seconds - (slowest - fastest));
  return r;
}

StragglerWatch::StragglerWatch(int world, double threshold, int window)
    : threshold_(threshold), window_(window), warned_(world, false) {}

std::vector<int> StragglerWatch::update(const std::vector<StepAttribution>& steps) {
  for (const auto& step : steps) {
    steps_.push_back(step);
    if (static_cast<int>(steps_.size()) > window_) steps_.pop_front();
  }
  std::vector<int> warn;
  if (static_cast<int>(steps_.size()) < window_) return warn;
  recent_ = summarise({steps_.begin(), steps_.end()});
  for (size_t rank = 0; rank < warned_.size() && rank < recent_.score.size(); ++rank) {
    if (recent_.score[rank] >= threshold_) {
      warned_[rank] = false;
    } else if (!warned_[rank]) {
      warned_[rank] = true;
      warn.push_back(static_cast<int>(rank));
    }
  }
  return warn;
}

std::vector<double> packSamples(const std::vector<StragglerSample>& samples) {
  std::vector<double> out = {static_cast<double>(samples.size())};
  for (const auto& s : samples) {
    out.push_back(s.step);
    out.push_back(s.compute);
    out.push_back(static_cast<double>(s.collectives.size()));
    out.insert(out.end(), s.collectives.begin(), s.collectives.end());
  }
  return out;
}

std::vector<StragglerSample> unpackSamples(const std::vector<double>& packed) {
  std::vector<StragglerSample> out;
  size_t at = 0;
  auto next = [&] {
    COLLIE_CHECK(at < packed.size(), "straggler samples cut short");
    return packed[at++];
  };
  const auto count = static_cast<size_t>(next());
  for (size_t k = 0; k < count; ++k) {
    StragglerSample s;
    s.step = next();
    s.compute = next();
    const auto n = static_cast<size_t>(next());
    for (size_t c = 0; c < n; ++c) s.collectives.push_back(next());
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace collie::train
