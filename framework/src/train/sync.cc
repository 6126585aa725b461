// Parameter hashes compared across ranks, and the spread of those that differ.
#include "train/sync.h"

#include <ATen/ops/clone.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <xxhash.h>

#include <algorithm>

#include "core/strings.h"
#include "runtime/device.h"

namespace collie::train {
namespace {

// Of the parameter's bytes, copied to host memory once when it lives on a GPU.
uint64_t hashOf(const at::Tensor& param) {
  at::Tensor contiguous = param.detach().to(at::kCPU).contiguous();
  return XXH3_64bits(contiguous.data_ptr(), contiguous.nbytes());
}

// max over elements of (max over ranks - min over ranks), collectively.
double spreadOf(Communicator& comm, const at::Tensor& param) {
  at::Tensor high = param.detach().to(at::kFloat).contiguous().clone().reshape({-1});
  at::Tensor low = high.clone();
  for (auto [tensor, op] :
       {std::make_pair(high, ReduceOp::kMax), std::make_pair(low, ReduceOp::kMin)}) {
    CollectiveArgs args;
    args.data = bufferOf(tensor);
    args.op = op;
    comm.run(args);
  }
  return high.sub(low).abs().max().item().toDouble();
}

}  // namespace

void SyncCheck::add(const SyncCheck& more) {
  parameters += more.parameters;
  differing += more.differing;
  identical = identical && more.identical;
  max_spread = std::max(max_spread, more.max_spread);
  // The ranks named are those of the first parameter that differs, as verifyWeights names.
  if (first_parameter.empty() && !more.first_parameter.empty()) {
    first_parameter = more.first_parameter;
    ranks = more.ranks;
  }
}

std::string SyncCheck::describe(int world) const {
  if (identical && world == 1) {
    return fmt::format("weights at step {}: a single rank, nothing to compare", step);
  }
  if (identical) {
    return fmt::format(
        "weights identical at step {}: {} parameters hash the same (xxh3) on all {} ranks, max "
        "|dw| 0",
        step, parameters, world);
  }
  return fmt::format(
      "weights diverged at step {}: parameter '{}' differs between rank 0 and rank(s) {}; {} of "
      "{} parameters differ, max |dw| {:.3g}",
      step, first_parameter, fmt::join(ranks, ", "), differing, parameters, max_spread);
}

SyncCheck verifyWeights(Communicator& comm, Control& control, const std::vector<at::Tensor>& params,
                        const std::vector<std::string>& names, int64_t step) {
  std::vector<double> mine;  // each hash as two exact 32-bit halves
  for (const auto& p : params) {
    const uint64_t h = hashOf(p);
    mine.push_back(static_cast<double>(h >> 32));
    mine.push_back(static_cast<double>(h & 0xFFFFFFFFull));
  }
  const auto all = control.allGather(mine);
  SyncCheck check;
  check.step = step;
  check.parameters = static_cast<int>(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    bool differs = false;
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r][2 * k] != all[0][2 * k] || all[r][2 * k + 1] != all[0][2 * k + 1]) {
        differs = true;
        if (check.first_parameter.empty() && std::find(check.ranks.begin(), check.ranks.end(),
                                                       static_cast<int>(r)) == check.ranks.end()) {
          check.ranks.push_back(static_cast<int>(r));
        }
      }
    }
    if (!differs) continue;
    if (check.first_parameter.empty()) check.first_parameter = names[k];
    check.identical = false;
    ++check.differing;
    check.max_spread = std::max(check.max_spread, spreadOf(comm, params[k]));
  }
  return check;
}

}  // namespace collie::train
