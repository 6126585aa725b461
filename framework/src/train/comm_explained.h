// Why a step's gradient all-reduces took what they took: the measured time of the buckets'
// all-reduces split, from measured quantities, into the calibrated link's time (and of it,
// the per-message latency, with the buckets below the link's knee), the time ranks waited for a
// slower rank to arrive, and what is left beyond both (the link slower than when it was
// calibrated, or cores that the all-reduce shares with backward); and the exposed part
// predicted from the link and the bucket schedule, beside the measured one.
//
// For a run whose every step all-reduces every bucket once (no codec, no sharding, no
// train.sync local mode): the buckets' collectives are then one per bucket, in launch order.
#pragma once

#include <vector>

namespace collie::train {

struct CommExplained {
  // The buckets' all-reduce seconds per step, mean over ranks, are link + waiting + beyond.
  bool explained = false;  // false: the run is not of the kind above, or no model
  double link = 0;         // their time on the idle calibrated link
  double latency = 0;      // of `link`, the α terms of every bucket: per-message latency
  // Their time on the link probed while every rank kept a core busy (busy_probed), else
  // on the idle link.
  double link_busy = 0;
  int below_knee = 0;  // buckets whose latency is at least the rest of their prediction
                       // (their bytes' time, less what a link's bank saves)
  // Per step, mean over ranks of the time a rank waited for the one that arrived last.
  double waiting = 0;
  bool busy_probed = false;
  double beyond = 0;           // the measured time less link and waiting
  double during_backward = 0;  // the measured time less the exposed: while backward computed
  double exposed = 0;          // measured, over the same steps (the last 256 timed ones)
  // How much later the last rank reached the end of its backward than the ranks did on
  // average, mean over the steps. No bucket's all-reduce ends before that rank has readied
  // it.
  double late = 0;
  double predicted_exposed = 0;  // the step's wait for them after backward, predicted
};

// One bucket, as the explanation needs it.
struct BucketTimes {
  // Per timed step, over the ranks: its all-reduce's mean seconds, and the least (the
  // rank that arrived last, which waited for nobody).
  std::vector<double> mean, fastest;
  double predicted = 0;       // on the idle calibrated link
  double predicted_busy = 0;  // on the link as probed while every rank keeps a core busy
  double latency = 0;         // of that, the α terms
  double elements = 0;        // the bucket's gradient elements (readiness order, below)
};

// The exposed time a step's buckets leave after backward, predicted, as the ranks' mean: the
// last rank to get there readies the buckets `late` seconds after the mean rank would (its
// whole backward shifted by that: a rank late because its backward is slower readies its
// first buckets earlier than this says), in launch order, each when the share of the gradient
// elements up to and including it has been computed (backward's `backward_seconds`, measured), or
// all at its end without overlap; one communication thread runs them one after the other, each
// taking `predicted_busy` (`predicted` where that is 0) while any rank computes, and at the
// `predicted` pace for what is left once the last rank's backward has ended. (The busy
// pace holds until then: where ranks share cores, a rank's end frees none while the others
// still compute theirs.)
double predictExposed(const std::vector<BucketTimes>& buckets, double backward_seconds, double late,
                      bool overlap);

// The split above, from every bucket's times and predictions, the measured exposed seconds
// per step over the same steps (mean over ranks), and the last rank's mean lateness (the
// predicted wait moves with the lateness one for one, every ready time shifted by it, so
// the mean lateness gives the mean wait). In each step a bucket's time on the rank that
// arrived last is the collective's own; the others waited the rest.
CommExplained explainComm(const std::vector<BucketTimes>& buckets, double exposed,
                          double backward_seconds, double late, bool overlap);

}  // namespace collie::train
