// The split of a step's all-reduce time and the exposed part predicted (comm_explained.h).
#include "train/comm_explained.h"

#include <algorithm>
#include <numeric>

namespace collie::train {

double predictExposed(const std::vector<BucketTimes>& buckets, double backward_seconds,
                      bool overlap) {
  double total = 0;
  for (const BucketTimes& b : buckets) total += b.elements;
  double ready_share = 0, end = 0;
  for (const BucketTimes& b : buckets) {
    ready_share += b.elements;
    const double ready =
        overlap && total > 0 ? backward_seconds * ready_share / total : backward_seconds;
    end = std::max(end, ready) + (b.predicted_busy > 0 ? b.predicted_busy : b.predicted);
  }
  return std::max(0.0, end - backward_seconds);
}

CommExplained explainComm(const std::vector<BucketTimes>& buckets, double exposed,
                          double backward_seconds, bool overlap) {
  CommExplained e;
  if (buckets.empty()) return e;
  double measured = 0;
  e.explained = true;
  bool busy = true;
  for (const BucketTimes& b : buckets) {
    if (b.seconds.empty()) return {};
    for (const std::vector<double>& step : b.seconds) {
      if (step.empty()) return {};
      const double mean =
          std::accumulate(step.begin(), step.end(), 0.0) / static_cast<double>(step.size());
      const double own = *std::min_element(step.begin(), step.end());
      measured += mean / static_cast<double>(b.seconds.size());
      e.waiting += (mean - own) / static_cast<double>(b.seconds.size());
    }
    e.link += b.predicted;
    e.link_busy += b.predicted_busy > 0 ? b.predicted_busy : b.predicted;
    busy = busy && b.predicted_busy > 0;
    e.latency += b.latency;
    if (b.predicted > 0 && b.latency >= b.predicted - b.latency) ++e.below_knee;
  }
  e.busy_probed = busy;
  e.beyond = measured - e.link - e.waiting;
  e.during_backward = std::max(0.0, measured - exposed);
  e.predicted_exposed = predictExposed(buckets, backward_seconds, overlap);
  return e;
}

}  // namespace collie::train
