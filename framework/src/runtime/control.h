// A tiny control plane over any backend (barrier, gather of a few numbers to every rank),
// kept apart from the schedulers under test so that a broken scheduler cannot corrupt
// the measurements that judge it.
#pragma once

#include <functional>
#include <vector>

#include "collie/backend.h"

namespace collie {

class Control {
 public:
  explicit Control(Backend& backend) : backend_(backend) {}
  // Every rank returns once every rank has called it.
  void barrier();
  // Every rank's `values` (the same length on every rank), indexed [rank][i], on every rank.
  // It builds a table of every rank's values on every rank: for what needs them all; a max,
  // a sum or rank 0's values cost less (below), which matters at thousands of simulated ranks.
  std::vector<std::vector<double>> allGather(const std::vector<double>& values);
  // The element-wise maximum, or sum, of every rank's `values`, on every rank.
  std::vector<double> max(const std::vector<double>& values);
  std::vector<double> sum(const std::vector<double>& values);
  // Rank 0's `values` on every rank (the same length on every rank).
  std::vector<double> fromRoot(const std::vector<double>& values);
  // A fresh control-plane tag, for probes that exchange their own messages (every rank
  // must draw the same number of tags).
  Tag nextTag();

 private:
  enum class Fold { kMax, kSum, kRoot };
  // Rank 0 folds every rank's values as they arrive and sends the result back.
  std::vector<double> combine(const std::vector<double>& values, Fold fold);
  // Rank 0 hands every other rank's `mine` to take(rank, values) in rank order, then sends
  // `back` to every rank; the others send `mine` and receive `back` (its size on every rank).
  void gatherThenSend(const std::vector<double>& mine, std::vector<double>& back,
                      const std::function<void(int, const double*)>& take);

  Backend& backend_;
  uint64_t seq_ = 0;
};

}  // namespace collie
