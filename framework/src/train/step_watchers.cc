// What the trainer does between steps (train/step_watchers.h).
#include "train/step_watchers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "collie/log.h"
#include "core/strings.h"
#include "measure/calibrate.h"
#include "train/data.h"

namespace collie::train {

StragglerMonitor::StragglerMonitor(const config::TrainSpec& spec, int rank, int world,
                                   Control& control, const Topology& topology)
    : spec_(spec),
      rank_(rank),
      world_(world),
      control_(control),
      topology_(topology),
      watch_(world, spec.straggler_threshold, spec.straggler_window) {}

void StragglerMonitor::afterStep(int64_t s, int64_t start, const StepStats& st) {
  if (spec_.straggler_every == 0 || world_ == 1) return;
  if (s > start) {
    StragglerSample sample{st.step, st.forward + st.backward, {}};
    for (const auto& c : st.sync.collectives) sample.collectives.push_back(c.seconds);
    pending_.push_back(std::move(sample));
  }
  if (static_cast<int>(pending_.size()) < spec_.straggler_every && s + 1 != spec_.steps) return;
  const auto gathered = control_.allGather(packSamples(pending_));
  pending_.clear();
  std::vector<std::vector<StragglerSample>> per_rank;
  for (const auto& packed : gathered) per_rank.push_back(unpackSamples(packed));
  std::vector<StepAttribution> window;
  for (size_t k = 0; k < per_rank.front().size(); ++k) {
    std::vector<StragglerSample> ranks;
    for (const auto& samples : per_rank) ranks.push_back(samples.at(k));
    window.push_back(attributeStep(ranks));
  }
  if (window.empty()) return;
  attributions_.insert(attributions_.end(), window.begin(), window.end());
  for (const int r : watch_.update(window)) {
    const StragglerReport& report = watch_.recent();
    if (rank_ != 0) continue;
    const Topology& t = topology_;
    const std::string host =
        r < static_cast<int>(t.node_of_rank.size()) ? t.node_names[t.node_of_rank[r]] : "?";
    logWarn(fmt::format(
        "straggler: rank {} (host {}) scored below {} over the last {} steps (step {}): score "
        "{:.2f}, "
        "its compute takes {:.4f} s against the fastest rank's {:.4f} s; the others waited "
        "{:.4f} s per step for it",
        r, host, watch_.threshold(), watch_.window(), s + 1, report.score[r],
        report.median_compute[r],
        *std::min_element(report.median_compute.begin(), report.median_compute.end()),
        report.wait.empty() ? 0.0 : *std::max_element(report.wait.begin(), report.wait.end())));
  }
}

void StragglerMonitor::report(Result* result) const {
  if (attributions_.empty()) return;
  const StragglerReport summary = summarise(attributions_);
  result->straggler_score = summary.score;
  result->straggler_wait_seconds = summary.wait;
  result->arrived_last = summary.last_share;
  result->step_at_fastest_seconds = summary.step_at_fastest;
  result->straggler_steps = summary.steps;
}

Rebalancer::Rebalancer(const config::TrainSpec& spec, int rank, int world, Control& control)
    : spec_(spec), rank_(rank), world_(world), control_(control) {}

bool Rebalancer::afterStep(int64_t s, int64_t start, const StepStats& st, Sharding* sharding) {
  if (!spec_.auto_micro_batch || spec_.rebalance_every == 0 || world_ == 1) return false;
  if (s > start) {  // the first step allocates
    per_sample_.push_back((st.forward + st.backward) /
                          (static_cast<double>(st.micro_batch) * spec_.grad_accum));
  }
  if (static_cast<int>(per_sample_.size()) < spec_.rebalance_every || s + 1 == spec_.steps)
    return false;
  const double mine = measure::median(per_sample_);
  per_sample_.clear();
  std::vector<double> per_sample;
  for (const auto& r : control_.allGather({mine})) per_sample.push_back(r[0]);
  const std::vector<int> now = sharding->micro_batch;
  const Resplit change = resplit(spec_.global_batch, now, per_sample, spec_.rebalance_hysteresis);
  if (rank_ == 0) {
    std::vector<std::string> parts;
    for (int r = 0; r < world_; ++r) {
      parts.push_back(fmt::format(
          "rank {} {:.1f} samples/s {}", r, 1 / per_sample[r],
          change.take ? fmt::format("{} -> {}", now[r], change.split[r]) : std::to_string(now[r])));
    }
    const double accum = spec_.grad_accum;
    const std::string line = fmt::format(
        "micro_batch auto after step {}: {}; the slowest rank's compute {:.4f} s, {:.4f} s "
        "with [{}]",
        s + 1, detail::join(parts, ", "), change.slowest_now * accum, change.slowest_next * accum,
        fmt::join(change.split, ", "));
    if (change.take) {
      logInfo(line);
    } else {
      logDebug(line +
               fmt::format(" (kept: not {:.0f}% shorter)", 100 * spec_.rebalance_hysteresis));
    }
  }
  if (!change.take) return false;
  sharding->micro_batch = change.split;
  taken_.push_back({s + 1, change.split});
  return true;
}

}  // namespace collie::train
