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
  for (const BucketTimes& b : buckets) {
    if (b.seconds.empty()) return {};
    const double mean = std::accumulate(b.seconds.begin(), b.seconds.end(), 0.0) /
                        static_cast<double>(b.seconds.size());
    // The rank that arrived last waited for nobody: its time is the collective's own.
    const double own = *std::min_element(b.seconds.begin(), b.seconds.end());
    measured += mean;
    e.waiting += mean - own;
    e.link += b.predicted;
    e.link_busy += b.predicted_busy > 0 ? b.predicted_busy : b.predicted;
    e.latency += b.latency;
    if (b.latency >= b.predicted - b.latency) ++e.below_knee;
  }
  e.beyond = measured - e.link - e.waiting;
  e.during_backward = std::max(0.0, measured - exposed);
  e.predicted_exposed = predictExposed(buckets, backward_seconds, overlap);
  return e;
}

}  // namespace collie::train
