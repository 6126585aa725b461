// A tiny control plane over any backend (barrier, gather of a few numbers to every rank),
// kept apart from the schedulers under test so that a broken scheduler cannot corrupt
// the measurements that judge it.
#pragma once

#include <vector>

#include "collie/backend.h"

namespace collie {

class Control {
 public:
  explicit Control(Backend& backend) : backend_(backend) {}
  // Every rank returns once every rank has called it.
  void barrier();
  // Every rank's `values` (the same length on every rank), indexed [rank][i], on every rank.
  std::vector<std::vector<double>> allGather(const std::vector<double>& values);
  // A fresh control-plane tag, for probes that exchange their own messages (every rank
  // must draw the same number of tags).
  Tag nextTag();

 private:
  Backend& backend_;
  uint64_t seq_ = 0;
};

}  // namespace collie
