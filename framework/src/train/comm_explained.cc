// The split of a step's all-reduce time and the exposed part predicted (comm_explained.h).
#include "train/comm_explained.h"

#include <algorithm>

namespace collie::train {

double predictExposed(const std::vector<BucketTimes>& buckets, double backward_seconds, double late,
                      bool overlap) {
  double total = 0;
  for (const BucketTimes& b : buckets) total += b.elements;
  const double computed = late + backward_seconds;  // the last rank's backward ends
  double ready_share = 0, end = 0;
  for (const BucketTimes& b : buckets) {
    ready_share += b.elements;
    const double ready =
        late + (overlap && total > 0 ? backward_seconds * ready_share / total : backward_seconds);
    const double start = std::max(end, ready);
    const double busy = b.predicted_busy > 0 ? b.predicted_busy : b.predicted;
    if (start + busy <= computed) {
      end = start + busy;
    } else {  // what is left when every rank has computed goes at the idle pace
      const double done = start < computed ? (computed - start) / busy : 0;
      end = std::max(start, computed) + (1 - done) * b.predicted;
    }
  }
  return std::max(0.0, end - backward_seconds);
}

CommExplained explainComm(const std::vector<BucketTimes>& buckets, double exposed,
                          double backward_seconds, double late, bool overlap) {
  CommExplained e;
  if (buckets.empty()) return e;
  double measured = 0;
  e.explained = true;
  bool busy = true;
  for (const BucketTimes& b : buckets) {
    if (b.mean.empty() || b.mean.size() != b.fastest.size()) return {};
    const double steps = static_cast<double>(b.mean.size());
    for (size_t i = 0; i < b.mean.size(); ++i) {
      measured += b.mean[i] / steps;
      e.waiting += (b.mean[i] - b.fastest[i]) / steps;
    }
    e.link += b.predicted;
    e.link_busy += b.predicted_busy > 0 ? b.predicted_busy : b.predicted;
    busy = busy && b.predicted_busy > 0;
    e.latency += b.latency;
    if (b.predicted > 0 && b.latency >= b.predicted - b.latency) ++e.below_knee;
  }
  e.busy_probed = busy;
  e.beyond = measured - e.link - e.waiting;
  e.exposed = exposed;
  e.during_backward = std::max(0.0, measured - exposed);
  e.late = late;
  e.predicted_exposed = predictExposed(buckets, backward_seconds, late, overlap);
  return e;
}

}  // namespace collie::train
