// Bucketed, overlapped gradient all-reduce.
#include "train/reducer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

#include <chrono>

#include "collie/error.h"

namespace collie::train {
namespace {
using Clock = std::chrono::steady_clock;
}

Reducer::Reducer(std::vector<at::Tensor> params, uint64_t bucket_bytes, Communicator& comm,
                 bool overlap, bool sharded)
    : params_(std::move(params)),
      slots_(params_.size()),
      comm_(comm),
      overlap_(overlap),
      sharded_(sharded),
      group_(comm.backend().size()),
      rank_(comm.backend().rank()) {
  // Reverse order: the last layers' gradients arrive first during backward. A parameter
  // larger than bucket_bytes gets a bucket of its own.
  uint64_t used = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    COLLIE_CHECK(p.scalar_type() == at::kFloat, "parameter ", k, " is ", p.scalar_type(),
                 "; the trainer keeps float32 master weights");
    const uint64_t bytes = static_cast<uint64_t>(p.numel()) * 4;
    if (buckets_.empty() || (used > 0 && used + bytes > bucket_bytes)) {
      buckets_.emplace_back();
      used = 0;
    }
    slots_[k] = {buckets_.size() - 1, static_cast<int64_t>(used / 4), p.numel(), false};
    buckets_.back().params.push_back(k);
    used += bytes;
  }
  for (auto& b : buckets_) {
    int64_t numel = 0;
    for (size_t k : b.params) numel += slots_[k].numel;
    // Padded to a multiple of the group size, sharded or not: a scheduler's blocks then fall
    // on the same elements in a reduce-scatter as in an all-reduce, so that sharding adds
    // every element in the same order (bit-identical updates). The padding stays zero.
    numel = (numel + group_ - 1) / group_ * group_;
    b.flat = at::zeros({numel}, at::kFloat);  // (numel)
    if (sharded_) b.shard = at::zeros({numel / group_}, at::kFloat);
    b.pending = b.params.size();
  }
  hooks_.reserve(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(params_[k].register_hook([this, k](at::Tensor grad) { onGradient(k, grad); }));
  }
  thread_ = std::thread([this] { communicationLoop(); });
}

Reducer::~Reducer() {
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_hook(hooks_[k]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
    // The step failed on this rank while a bucket was on the wire: unblock it now instead
    // of waiting for the backend's timeout.
    if (in_flight_) comm_.backend().abort("the training step failed on this rank");
  }
  cv_.notify_all();
  thread_.join();
}

void Reducer::arm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
}

void Reducer::onGradient(size_t param, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;
  Slot& slot = slots_[param];
  if (slot.filled) {
    Bucket& b = buckets_[slot.bucket];
    if (b.launched) {
      throw CommError(
          fmt::format("parameter {} received a second gradient in one backward after its bucket's "
                      "all-reduce had started. HINT: set train.overlap: false",
                      param));
    }
    b.flat.narrow(0, slot.offset, slot.numel).add_(grad.reshape({-1}));
    return;
  }
  fill(param, &grad);
  if (overlap_) launched_in_backward_ += launchReady();
}

void Reducer::fill(size_t param, const at::Tensor* grad) {
  Slot& slot = slots_[param];
  at::Tensor view = buckets_[slot.bucket].flat.narrow(0, slot.offset, slot.numel);
  // .grad holds the earlier micro-batches' sum; `grad` is this backward's contribution.
  const at::Tensor& accumulated = params_[param].grad();
  if (grad != nullptr) {
    view.copy_(grad->reshape({-1}));
    if (accumulated.defined()) view.add_(accumulated.reshape({-1}));
  } else if (accumulated.defined()) {
    view.copy_(accumulated.reshape({-1}));
  } else {
    view.zero_();  // a parameter the loss did not use this step
  }
  slot.filled = true;
  --buckets_[slot.bucket].pending;
}

int Reducer::launchReady() {
  int launched = 0;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    buckets_[next_launch_].launched = true;
    queue_.push_back(next_launch_++);
    ++launched;
  }
  if (launched > 0) cv_.notify_all();
  return launched;
}

namespace {
// A float32 tensor's elements as a collective's buffer.
Buffer floats(const at::Tensor& t) {
  Buffer b;
  b.data = t.data_ptr();
  b.count = static_cast<size_t>(t.numel());
  b.dtype = DType::kF32;
  return b;
}
}  // namespace

CollectiveArgs Reducer::argsFor(Bucket& bucket, Collective coll) const {
  CollectiveArgs args;
  args.coll = coll;
  args.data = floats(bucket.flat);
  args.op = ReduceOp::kSum;
  if (coll == Collective::kReduceScatter) args.output = floats(bucket.shard);
  return args;
}

void Reducer::pack(Bucket& bucket) {
  for (size_t k : bucket.params) {
    bucket.flat.narrow(0, slots_[k].offset, slots_[k].numel).copy_(params_[k].reshape({-1}));
  }
}

void Reducer::unpack(const Bucket& bucket, const at::Tensor& full) {
  for (size_t k : bucket.params) {
    params_[k].copy_(full.narrow(0, slots_[k].offset, slots_[k].numel).view(params_[k].sizes()));
  }
}

std::vector<at::Tensor> Reducer::parameterShards() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> shards;
  for (auto& b : buckets_) {
    b.flat.zero_();
    pack(b);
    const int64_t k = b.flat.numel() / group_;
    shards.push_back(b.flat.narrow(0, rank_ * k, k).clone());
  }
  return shards;
}

at::Tensor Reducer::allGather(size_t b, const at::Tensor& shard) {
  return allGatherInto(b, shard, at::empty({buckets_[b].flat.numel()}, at::kFloat));
}

at::Tensor Reducer::allGatherInto(size_t b, const at::Tensor& shard, at::Tensor full) {
  Bucket& bucket = buckets_[b];
  COLLIE_CHECK(shard.numel() == bucket.flat.numel() / group_, "bucket ", b, ": a block of ",
               shard.numel(), " elements, expected ", bucket.flat.numel() / group_);
  CollectiveArgs args;
  args.coll = Collective::kAllGather;
  args.data = floats(shard);
  args.output = floats(full);
  bucket.provenance = comm_.run(args);
  return full;
}

SyncTiming Reducer::gatherParameters(const std::vector<at::Tensor>& shards) {
  at::NoGradGuard no_grad;
  const auto start = Clock::now();
  SyncTiming timing;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // Into the bucket's own buffer: its gradients were reduce-scattered already.
    unpack(buckets_[b], allGatherInto(b, shards[b], buckets_[b].flat));
    timing.collectives.push_back(buckets_[b].provenance);
    timing.comm_seconds += buckets_[b].provenance.seconds;
  }
  timing.exposed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return timing;
}

void Reducer::communicationLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    Bucket& b = buckets_[queue_.front()];
    queue_.pop_front();
    const bool skip = failure_ != nullptr;
    in_flight_ = !skip;
    lock.unlock();
    if (!skip) {
      try {
        const auto start = Clock::now();
        b.provenance =
            comm_.run(argsFor(b, sharded_ ? Collective::kReduceScatter : Collective::kAllReduce));
        b.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      } catch (...) {
        lock.lock();
        failure_ = std::current_exception();
        lock.unlock();
      }
    }
    lock.lock();
    in_flight_ = false;
    b.done = true;
    cv_.notify_all();
  }
}

SyncTiming Reducer::finish() {
  const auto start = Clock::now();
  SyncTiming timing;
  {
    std::unique_lock<std::mutex> lock(mu_);
    armed_ = false;
    for (size_t k = 0; k < params_.size(); ++k) {
      if (!slots_[k].filled) fill(k, nullptr);
    }
    launchReady();
    cv_.wait(lock, [&] {
      for (const auto& b : buckets_) {
        if (!b.done) return false;
      }
      return true;
    });
    timing.exposed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    timing.buckets = static_cast<int>(buckets_.size());
    timing.launched_in_backward = launched_in_backward_;
    launched_in_backward_ = 0;
    for (auto& b : buckets_) {
      timing.comm_seconds += b.seconds;
      timing.bytes += static_cast<uint64_t>(b.flat.numel()) * 4;
      timing.collectives.push_back(b.provenance);
      b.launched = b.done = false;
      b.seconds = 0;
      b.pending = b.params.size();
    }
    for (auto& s : slots_) s.filled = false;
    next_launch_ = 0;
    if (failure_) std::rethrow_exception(failure_);
  }
  if (sharded_) return timing;  // the reduced blocks wait in gradShard()
  for (size_t k = 0; k < params_.size(); ++k) {
    const Slot& slot = slots_[k];
    at::Tensor reduced = buckets_[slot.bucket].flat.narrow(0, slot.offset, slot.numel);
    at::Tensor& grad = params_[k].mutable_grad();
    if (!grad.defined()) grad = at::zeros_like(params_[k]);
    grad.copy_(reduced.view(params_[k].sizes()));
  }
  return timing;
}

void Reducer::broadcastParameters() {
  at::NoGradGuard no_grad;
  const bool root = comm_.backend().rank() == 0;
  for (auto& b : buckets_) {
    pack(b);
    CollectiveArgs args = argsFor(b, Collective::kBroadcast);
    std::string refusals;
    if (comm_.select(args, comm_.rules(), &refusals) == nullptr) {
      // A scheduler without broadcast: an all-reduce in which every rank but 0 contributes
      // zeros delivers rank 0's values exactly (x + 0 == x).
      if (!root) b.flat.zero_();
      args = argsFor(b, Collective::kAllReduce);
    }
    comm_.run(args);
    unpack(b, b.flat);
  }
}

std::vector<std::vector<size_t>> Reducer::bucketLayout() const {
  std::vector<std::vector<size_t>> layout;
  for (const auto& b : buckets_) layout.push_back(b.params);
  return layout;
}

}  // namespace collie::train
