// Local SGD and DiLoCo's meetings (train/local_sync.h).
#include "train/local_sync.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>

#include "runtime/device.h"

namespace collie::train {

PeriodicSync::PeriodicSync(const config::SyncSpec& spec, int64_t steps, Reducer& reducer,
                           Communicator& comm)
    : spec_(spec), steps_(steps), reducer_(reducer), comm_(comm) {
  COLLIE_CHECK(!local() || (!reducer.sharded() && spec.every >= 1), "train.sync ",
               config::syncModeName(spec.mode), " every ", spec.every,
               " (sharded: ", reducer.sharded(), ")");
  if (spec_.mode != config::SyncSpec::Mode::kDiloco) return;
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < reducer.bucketCount(); ++b) {
    outer_.push_back(reducer.values(b).clone());
    momentum_.push_back(at::zeros_like(reducer.values(b)));
  }
}

int64_t PeriodicSync::meetings() const {
  // One every `every` steps after the warm-up, and one after the last step if that is not one.
  const int64_t local = steps_ - spec_.warmup_steps;
  return !this->local() || local <= 0 ? 0 : (local + spec_.every - 1) / spec_.every;
}

bool PeriodicSync::meetsAfter(int64_t s) const {
  if (!local() || s < spec_.warmup_steps) return false;
  return (s + 1 - spec_.warmup_steps) % spec_.every == 0 || s + 1 == steps_;
}

SyncTiming PeriodicSync::afterStep(int64_t s, double share) {
  at::NoGradGuard no_grad;
  if (gradientsSynchronised(s)) {  // the warm-up: DiLoCo starts from where it ends
    for (size_t b = 0; b < outer_.size(); ++b) outer_[b].copy_(reducer_.values(b));
    return {};
  }
  if (!meetsAfter(s)) return {};
  SyncTiming timing =
      spec_.mode == config::SyncSpec::Mode::kDiloco ? outerStep(share) : average(share);
  for (const Provenance& p : timing.collectives) timing.comm_seconds += p.seconds;
  timing.exposed_seconds = timing.comm_seconds;  // between steps: nothing overlaps it
  timing.buckets = static_cast<int>(timing.collectives.size());
  return timing;
}

SyncTiming PeriodicSync::average(double share) {
  SyncTiming timing;
  for (size_t b = 0; b < reducer_.bucketCount(); ++b) {
    const at::Tensor values = reducer_.values(b);  // (bucket numel) the module's parameters
    values.mul_(share);
    timing.collectives.push_back(sum(values));
    timing.bytes += static_cast<uint64_t>(values.numel()) * 4;
  }
  return timing;
}

// The outer gradient is how far the ranks moved away from the last meeting's parameters,
// averaged; the outer step is PyTorch's SGD with momentum (dampening 0) on it.
SyncTiming PeriodicSync::outerStep(double share) {
  SyncTiming timing;
  for (size_t b = 0; b < reducer_.bucketCount(); ++b) {
    const at::Tensor values = reducer_.values(b);
    at::Tensor gradient = outer_[b].sub(values).mul_(share);  // (bucket numel)
    timing.collectives.push_back(sum(gradient));
    timing.bytes += static_cast<uint64_t>(values.numel()) * 4;
    momentum_[b].mul_(spec_.outer_momentum).add_(gradient);
    if (spec_.nesterov) {
      gradient.add_(momentum_[b], spec_.outer_momentum);
    } else {
      gradient.copy_(momentum_[b]);
    }
    outer_[b].sub_(gradient, spec_.outer_lr);
    values.copy_(outer_[b]);
  }
  return timing;
}

Provenance PeriodicSync::sum(const at::Tensor& t) {
  CollectiveArgs args;
  args.coll = Collective::kAllReduce;
  args.op = ReduceOp::kSum;
  args.data = bufferOf(t);
  return comm_.run(args);
}

}  // namespace collie::train
