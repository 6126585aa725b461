// Bucketed, overlapped gradient all-reduce (or reduce-scatter) over buffers the buckets own.
#include "train/reducer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>

#include "collie/error.h"

namespace collie::train {
namespace {
using Clock = std::chrono::steady_clock;

// A float32 tensor's elements as a collective's buffer.
Buffer floats(const at::Tensor& t) {
  Buffer b;
  b.data = t.data_ptr();
  b.count = static_cast<size_t>(t.numel());
  b.dtype = DType::kF32;
  return b;
}

uint64_t bytesOf(const at::Tensor& t) {
  return t.defined() ? static_cast<uint64_t>(t.numel()) * 4 : 0;
}
}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, uint64_t bucket_bytes, Communicator& comm,
                 bool overlap, config::ShardedState sharding)
    : params_(std::move(params)),
      slots_(params_.size()),
      comm_(comm),
      overlap_(overlap),
      sharding_(sharding),
      group_(comm.backend().size()),
      rank_(comm.backend().rank()) {
  // Reverse order: the last layers' gradients arrive first during backward. A parameter
  // larger than bucket_bytes gets a bucket of its own.
  uint64_t used = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    COLLIE_CHECK(p.scalar_type() == at::kFloat, "parameter ", k, " is ", p.scalar_type(),
                 "; the trainer keeps float32 master weights");
    COLLIE_CHECK(p.is_leaf() && p.requires_grad(), "parameter ", k,
                 " is not a leaf that requires grad");
    const uint64_t bytes = static_cast<uint64_t>(p.numel()) * 4;
    if (buckets_.empty() || (used > 0 && used + bytes > bucket_bytes)) {
      buckets_.emplace_back();
      used = 0;
    }
    slots_[k] = {buckets_.size() - 1, static_cast<int64_t>(used / 4), p.numel(), false};
    buckets_.back().params.push_back(k);
    used += bytes;
  }
  at::NoGradGuard no_grad;
  int64_t largest = 0;
  for (auto& b : buckets_) {
    int64_t numel = 0;
    for (size_t k : b.params) numel += slots_[k].numel;
    // Padded to a multiple of the group size, sharded or not: a scheduler's blocks then fall
    // on the same elements in a reduce-scatter as in an all-reduce, so that sharding adds
    // every element in the same order (bit-identical updates). The padding stays zero.
    numel = (numel + group_ - 1) / group_ * group_;
    largest = std::max(largest, numel);
    b.values = at::zeros({numel}, at::kFloat);  // (numel)
    for (size_t k : b.params) {
      at::Tensor view = b.values.narrow(0, slots_[k].offset, slots_[k].numel);
      view.copy_(params_[k].reshape({-1}));
      // The module's parameter now lives in the bucket (same variable, same autograd
      // identity; its old storage is released).
      params_[k].set_data(view.view(params_[k].sizes()));
    }
    if (keepsGradients()) b.grads = at::zeros({numel}, at::kFloat);
    if (sharding_ == config::ShardedState::kGradients)
      b.shard = at::zeros({numel / group_}, at::kFloat);
    b.pending = b.params.size();
  }
  if (sharded()) block_scratch_ = at::empty({largest / group_}, at::kFloat);
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].mutable_grad() = keepsGradients() ? gradView(k) : at::Tensor();
  }
  hooks_.reserve(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(params_[k].register_hook([this, k](const at::Tensor&) {
      beforeAccumulation(k);
      return at::Tensor();  // the gradient unchanged
    }));
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[k]));
    post_hooks_.push_back(accumulators_.back()->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, k](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              afterAccumulation(k);
              return outputs;
            })));
  }
  thread_ = std::thread([this] { communicationLoop(); });
}

Reducer::~Reducer() {
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].remove_hook(hooks_[k]);
    accumulators_[k]->del_post_hook(post_hooks_[k]);
  }
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

at::Tensor Reducer::gradView(size_t param) const {
  const Slot& slot = slots_[param];
  return buckets_[slot.bucket]
      .grads.narrow(0, slot.offset, slot.numel)
      .view(params_[param].sizes());
}

void Reducer::beforeAccumulation(size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& slot = slots_[param];
  if (armed_ && slot.filled && buckets_[slot.bucket].launched) {
    throw CommError(
        fmt::format("parameter {} received a second gradient in one backward after its bucket's "
                    "reduction had started. HINT: set train.overlap: false",
                    param));
  }
}

void Reducer::afterAccumulation(size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  if (keepsGradients() || armed_) collect(param);
  if (!armed_ || slots_[param].filled) return;
  fill(param);
  if (overlap_) launched_in_backward_ += launchReady();
}

void Reducer::collect(size_t param) {
  at::NoGradGuard no_grad;
  at::Tensor& grad = params_[param].mutable_grad();
  Bucket& bucket = buckets_[slots_[param].bucket];
  if (keepsGradients()) {
    // Autograd accumulates into the view in place; it replaces it by a new tensor only when
    // gradients are accumulated with grad mode on. Then the sum moves into the bucket.
    at::Tensor view = gradView(param);
    if (!grad.defined() || grad.data_ptr() == view.data_ptr()) return;
    view.copy_(grad);
    grad = view;
    return;
  }
  if (!grad.defined()) return;
  if (!bucket.grads.defined()) bucket.grads = at::zeros({bucket.values.numel()}, at::kFloat);
  // A second gradient within the last backward adds to what the first one put there.
  at::Tensor view = gradView(param);
  if (slots_[param].filled) {
    view.add_(grad);
  } else {
    view.copy_(grad);
  }
  grad = at::Tensor();  // the bucket holds it now
}

void Reducer::fill(size_t param) {
  Slot& slot = slots_[param];
  Bucket& bucket = buckets_[slot.bucket];
  // Stage 2: a bucket none of whose parameters had a gradient still reduces (zeros).
  if (!bucket.grads.defined()) bucket.grads = at::zeros({bucket.values.numel()}, at::kFloat);
  slot.filled = true;
  --bucket.pending;
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

at::Tensor Reducer::gradShard(size_t b) const {
  const Bucket& bucket = buckets_[b];
  if (sharding_ == config::ShardedState::kGradients) return bucket.shard;
  const int64_t k = bucket.grads.numel() / group_;
  return bucket.grads.narrow(0, rank_ * k, k);
}

std::vector<at::Tensor> Reducer::parameterShards() const {
  std::vector<at::Tensor> shards;
  for (const auto& b : buckets_) {
    const int64_t k = b.values.numel() / group_;
    shards.push_back(b.values.narrow(0, rank_ * k, k));
  }
  return shards;
}

at::Tensor Reducer::allGather(size_t b, const at::Tensor& shard) {
  at::Tensor full = at::empty({buckets_[b].values.numel()}, at::kFloat);
  allGatherInto(b, shard, full);
  return full;
}

void Reducer::allGatherInto(size_t b, const at::Tensor& shard, const at::Tensor& full) {
  Bucket& bucket = buckets_[b];
  COLLIE_CHECK(shard.numel() == bucket.values.numel() / group_, "bucket ", b, ": a block of ",
               shard.numel(), " elements, expected ", bucket.values.numel() / group_);
  CollectiveArgs args;
  args.coll = Collective::kAllGather;
  args.data = floats(shard);
  args.output = floats(full);
  bucket.provenance = comm_.run(args);
}

SyncTiming Reducer::gatherParameters() {
  at::NoGradGuard no_grad;
  const auto start = Clock::now();
  SyncTiming timing;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // The updated block is part of the output: it goes in through the scratch block.
    const int64_t k = shardNumel(b);
    at::Tensor input = block_scratch_.narrow(0, 0, k);
    input.copy_(buckets_[b].values.narrow(0, rank_ * k, k));
    allGatherInto(b, input, buckets_[b].values);
    timing.collectives.push_back(buckets_[b].provenance);
    timing.comm_seconds += buckets_[b].provenance.seconds;
  }
  timing.exposed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return timing;
}

void Reducer::reduce(Bucket& bucket) {
  at::NoGradGuard no_grad;
  CollectiveArgs args;
  args.data = floats(bucket.grads);
  args.op = ReduceOp::kSum;
  if (!sharded()) {
    args.coll = Collective::kAllReduce;
    bucket.provenance = comm_.run(args);
    return;
  }
  args.coll = Collective::kReduceScatter;
  const int64_t k = bucket.grads.numel() / group_;
  if (sharding_ == config::ShardedState::kGradients) {
    args.output = floats(bucket.shard);
    bucket.provenance = comm_.run(args);
    return;
  }
  at::Tensor block = block_scratch_.narrow(0, 0, k);
  args.output = floats(block);
  bucket.provenance = comm_.run(args);
  bucket.grads.narrow(0, rank_ * k, k).copy_(block);
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
        reduce(b);
        b.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      } catch (...) {
        lock.lock();
        failure_ = std::current_exception();
        lock.unlock();
      }
    }
    lock.lock();
    // Stage 2: the full gradient goes as soon as its block is reduced.
    if (!keepsGradients()) b.grads = at::Tensor();
    in_flight_ = false;
    b.done = true;
    cv_.notify_all();
  }
}

SyncTiming Reducer::finish() {
  const auto start = Clock::now();
  SyncTiming timing;
  std::unique_lock<std::mutex> lock(mu_);
  armed_ = false;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (slots_[k].filled) continue;
    collect(k);  // stage 2: what earlier micro-batches accumulated
    fill(k);
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
    timing.bytes += static_cast<uint64_t>(b.values.numel()) * 4;
    timing.collectives.push_back(b.provenance);
    b.launched = b.done = false;
    b.seconds = 0;
    b.pending = b.params.size();
  }
  for (auto& s : slots_) s.filled = false;
  next_launch_ = 0;
  if (failure_) std::rethrow_exception(failure_);
  return timing;
}

void Reducer::clearGradients() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : buckets_) {
    if (keepsGradients()) b.grads.zero_();
  }
}

HeldBytes Reducer::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  HeldBytes held;
  for (const auto& b : buckets_) {
    held.parameters += bytesOf(b.values);
    held.gradients += bytesOf(b.grads) + bytesOf(b.shard);
  }
  // Stage 2 between micro-batches: autograd's own accumulated gradients.
  if (!keepsGradients()) {
    for (const auto& p : params_) held.gradients += bytesOf(p.grad());
  }
  return held;
}

void Reducer::broadcastParameters() {
  at::NoGradGuard no_grad;
  const bool root = comm_.backend().rank() == 0;
  for (auto& b : buckets_) {
    CollectiveArgs args;
    args.coll = Collective::kBroadcast;
    args.data = floats(b.values);
    std::string refusals;
    if (comm_.select(args, comm_.rules(), &refusals) == nullptr) {
      // A scheduler without broadcast: an all-reduce in which every rank but 0 contributes
      // zeros delivers rank 0's values exactly (x + 0 == x).
      if (!root) b.values.zero_();
      args.coll = Collective::kAllReduce;
      args.op = ReduceOp::kSum;
    }
    comm_.run(args);
  }
}

std::vector<std::vector<size_t>> Reducer::bucketLayout() const {
  std::vector<std::vector<size_t>> layout;
  for (const auto& b : buckets_) layout.push_back(b.params);
  return layout;
}

}  // namespace collie::train
