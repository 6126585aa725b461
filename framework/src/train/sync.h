// Weight-sync verification: every rank hashes every parameter, the hashes travel
// over the control plane (not the scheduler under test), and parameters that differ are
// measured with a max/min all-reduce to report the spread.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/control.h"
#include "train/trainer.h"

namespace collie::train {

// Collective: every rank calls it with its parameters in the same order and gets the same
// verdict. `names` names them in messages.
SyncCheck verifyWeights(Communicator& comm, Control& control, const std::vector<at::Tensor>& params,
                        const std::vector<std::string>& names, int64_t step);

}  // namespace collie::train
