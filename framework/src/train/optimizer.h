// AdamW and SGD with momentum, written with ATen ops so that their state is collie's to
// checkpoint (named tensors), identical on every rank, and the same on every LibTorch
// version. The update rules are PyTorch's (torch.optim.AdamW, torch.optim.SGD).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/experiment.h"

namespace collie::train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter from its .grad (a parameter without one is left alone).
  virtual void step(double lr) = 0;
  // Every state tensor by a stable name ("exp_avg/3"), for checkpoints; loading copies into
  // these same tensors.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() = 0;
  int64_t steps() const { return steps_; }
  void setSteps(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;
};

// AdamW (spec.sgd false) or SGD over `params`, with the spec's betas, momentum and decay.
std::unique_ptr<Optimizer> makeOptimizer(const config::TrainSpec& spec,
                                         std::vector<at::Tensor> params);

}  // namespace collie::train
