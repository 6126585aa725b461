// Bucketed, overlapped gradient all-reduce (or reduce-scatter) over buffers the buckets own.
#include "train/reducer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>

#include "collie/error.h"
#include "runtime/device.h"
#include "runtime/trace.h"
#include "train/codec_group.h"

namespace collie::train {
namespace {
using Clock = std::chrono::steady_clock;

// A float32 tensor's elements (host or device memory) as a collective's buffer.
Buffer floats(const at::Tensor& t) {
  COLLIE_CHECK(t.scalar_type() == at::kFloat, "a bucket tensor of ", t.scalar_type());
  return bufferOf(t);
}

uint64_t bytesOf(const at::Tensor& t) {
  return t.defined() ? static_cast<uint64_t>(t.numel()) * 4 : 0;
}

// A tensor's memory replaced in place by `memory` (a null DataPtr: none) of `bytes`: its
// views (the module's parameters, and what autograd saved of them) see the new memory. The
// content is not kept: a freed bucket is gathered again before use. Returns the memory it
// held.
at::DataPtr swapStorage(const at::Tensor& t, at::DataPtr memory, size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (!memory) memory = at::DataPtr(nullptr, storage->device());
  at::DataPtr held = storage->set_data_ptr(std::move(memory));
  storage->set_nbytes(bytes);
  return held;
}

// The elements of a buffer of the pool for buckets of `sizes`: the largest bucket near the
// median size by bytes (the size of the bucket that holds the middle byte), within half to
// twice it. A bucket far larger (a large vocabulary's embedding) or far smaller takes its
// own memory, or every buffer would be an outlier's size, or few bytes would go through the
// pool. 0 for no bucket.
int64_t poolBufferElements(std::vector<int64_t> sizes) {
  std::sort(sizes.begin(), sizes.end());
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  int64_t below = 0, median = 0;
  for (int64_t n : sizes) {
    below += n;
    if (2 * below >= total) {
      median = n;
      break;
    }
  }
  int64_t largest = 0;
  for (int64_t n : sizes) {
    if (2 * n >= median && n <= 2 * median) largest = std::max(largest, n);
  }
  return largest;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, uint64_t bucket_bytes, Communicator& comm,
                 bool overlap, config::ShardedState sharding,
                 std::vector<std::vector<size_t>> units)
    : params_(std::move(params)),
      slots_(params_.size()),
      comm_(comm),
      overlap_(overlap),
      sharding_(sharding),
      group_(comm.backend().size()),
      rank_(comm.backend().rank()) {
  // Buckets live where the parameters do (train.device), float32.
  if (!params_.empty()) options_ = params_.front().options().dtype(at::kFloat);
  constexpr size_t kRoot = SIZE_MAX;
  std::vector<size_t> unit_of(params_.size(), units.empty() ? 0 : kRoot);
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t k : units[u]) {
      COLLIE_CHECK(k < params_.size() && unit_of[k] == kRoot, "unit ", u, ": parameter ", k,
                   " is not a parameter of no other unit");
      unit_of[k] = u;
    }
  }
  unit_buckets_.resize(units.size());
  // Reverse order: the last layers' gradients arrive first during backward. A parameter
  // larger than bucket_bytes gets a bucket of its own; the root's parameters get buckets of
  // their own.
  uint64_t used = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    COLLIE_CHECK(p.scalar_type() == at::kFloat, "parameter ", k, " is ", p.scalar_type(),
                 "; the trainer keeps float32 master weights");
    COLLIE_CHECK(p.is_leaf() && p.requires_grad(), "parameter ", k,
                 " is not a leaf that requires grad");
    COLLIE_CHECK(p.device() == options_.device(), "parameter ", k, " is on ", p.device(),
                 ", the first on ", options_.device());
    const uint64_t bytes = static_cast<uint64_t>(p.numel()) * 4;
    const bool root = unit_of[k] == kRoot;
    if (buckets_.empty() || (used > 0 && used + bytes > bucket_bytes) ||
        buckets_.back().root != root) {
      buckets_.emplace_back();
      buckets_.back().root = root;
      used = 0;
    }
    slots_[k] = {buckets_.size() - 1, static_cast<int64_t>(used / 4), p.numel()};
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    if (!root && !units.empty() && (b.units.empty() || b.units.front() != unit_of[k])) {
      b.units.insert(b.units.begin(), unit_of[k]);  // reverse order: ascending at the front
      unit_buckets_[unit_of[k]].push_back(buckets_.size() - 1);
    }
    used += bytes;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].root) root_buckets_.push_back(b);
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
    b.values = at::zeros({numel}, options_);  // (numel)
    gathered_bytes_ += bytesOf(b.values);
    for (size_t k : b.params) {
      at::Tensor view = b.values.narrow(0, slots_[k].offset, slots_[k].numel);
      view.copy_(params_[k].reshape({-1}));
      // The module's parameter now lives in the bucket (same variable, same autograd
      // identity; its old storage is released).
      params_[k].set_data(view.view(params_[k].sizes()));
    }
    if (keepsGradients()) b.grads = at::zeros({numel}, options_);
    if (!keepsGradients()) b.shard = at::zeros({numel / group_}, options_);
    if (shardsParameters()) b.kept = at::zeros({numel / group_}, options_);
    b.pending = b.params.size();
  }
  if (sharded() && !shardsParameters()) block_scratch_ = at::empty({largest / group_}, options_);
  std::vector<int64_t> sizes;  // the root's buckets left out of the pool's size
  for (const auto& b : buckets_) {
    if (!b.root) sizes.push_back(b.values.numel());
  }
  pool_numel_ = poolBufferElements(std::move(sizes));
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

void Reducer::useCodec(std::shared_ptr<Codec> codec, const std::string& name,
                       const CodecSetup& setup) {
  codec_ = std::move(codec);
  codec_name_ = name;
  coded_ = codecBuckets();
  codec_->prepare(coded_, setup);
}

std::vector<CodecBucket> Reducer::codecBuckets(bool fresh) const {
  COLLIE_CHECK(!sharded(), "a codec synchronises whole buckets; sharding reduce-scatters them");
  std::vector<CodecBucket> out(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    CodecBucket& coded = out[b];
    coded.index = b;
    coded.gradient = fresh ? at::zeros_like(buckets_[b].grads) : buckets_[b].grads;
    for (size_t k : buckets_[b].params) {
      const Slot& slot = slots_[k];
      coded.parameters.push_back(
          coded.gradient.narrow(0, slot.offset, slot.numel).view(params_[k].sizes()));
    }
  }
  return out;
}

void Reducer::arm(int64_t step, double share) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  for (auto& coded : coded_) {
    coded.step = step;
    coded.share = share;
  }
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
  std::unique_lock<std::mutex> lock(mu_);
  Slot& slot = slots_[param];
  if (shardsParameters() && !slot.seen) {
    // Autograd accumulates a parameter's gradient after every use of it has been
    // differentiated: once all of a bucket's have been, backward needs its values no more
    // (freed before collect() may wait for room for a full gradient).
    slot.seen = true;
    Bucket& bucket = buckets_[slot.bucket];
    if (++bucket.accumulated == bucket.params.size() && !bucket.root) freeValues(bucket);
  }
  if (keepsGradients() || armed_) collect(param, lock);
  if (!armed_ || slot.filled) return;
  fill(param, lock);
  if (overlap_) launched_in_backward_ += launchReady();
}

void Reducer::makeFullGradient(Bucket& bucket, std::unique_lock<std::mutex>& lock) {
  if (bucket.grads.defined()) return;
  auto full = [&] {
    int live = 0;
    for (const auto& b : buckets_) live += b.grads.defined() ? 1 : 0;
    return live;
  };
  auto reducing = [&] {
    for (const auto& b : buckets_) {
      if (b.launched && !b.done) return true;
    }
    return false;
  };
  if (full() >= kFullGradientBuckets && reducing()) {
    const auto start = Clock::now();
    cv_.wait(lock,
             [&] { return full() < kFullGradientBuckets || !reducing() || failure_ != nullptr; });
    grad_wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const int64_t numel = bucket.values.numel();
  at::DataPtr buffer = borrowBuffer(numel);
  at::Tensor grads = at::from_blob(buffer.get(), {numel}, options_);
  grads.zero_();
  bucket.grads_memory = std::move(buffer);
  bucket.grads = std::move(grads);
}

at::DataPtr Reducer::borrowBuffer(int64_t numel) {
  const bool pooled = poolable(numel);
  if (pooled) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      at::DataPtr buffer = std::move(pool_.back());
      pool_.pop_back();
      return buffer;
    }
  }
  const at::Tensor like = at::empty({0}, options_);
  at::DataPtr made =
      like.storage().allocator()->allocate(static_cast<size_t>(pooled ? pool_numel_ : numel) * 4);
  if (pooled) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    ++pooled_;
  }
  return made;
}

void Reducer::giveBack(at::DataPtr buffer, int64_t numel) {
  if (!buffer || !poolable(numel)) return;  // one of its own size goes back to the allocator
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.push_back(std::move(buffer));
}

void Reducer::collect(size_t param, std::unique_lock<std::mutex>& lock) {
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
  makeFullGradient(bucket, lock);
  // A second gradient within the last backward adds to what the first one put there.
  at::Tensor view = gradView(param);
  if (slots_[param].filled) {
    view.add_(grad);
  } else {
    view.copy_(grad);
  }
  grad = at::Tensor();  // the bucket holds it now
}

void Reducer::fill(size_t param, std::unique_lock<std::mutex>& lock) {
  Slot& slot = slots_[param];
  Bucket& bucket = buckets_[slot.bucket];
  // Stages 2 and 3: a bucket none of whose parameters had a gradient still reduces (zeros).
  makeFullGradient(bucket, lock);
  slot.filled = true;
  --bucket.pending;
}

int Reducer::launchReady() {
  int launched = 0;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    buckets_[next_launch_].launched = true;
    queue_.push_back({next_launch_++, false});
    ++launched;
  }
  if (launched > 0) cv_.notify_all();
  return launched;
}

at::Tensor Reducer::gradShard(size_t b) const {
  if (!keepsGradients()) return buckets_[b].shard;
  return gradBlock(b, rank_);
}

at::Tensor Reducer::gradBlock(size_t b, int64_t r) const {
  const Bucket& bucket = buckets_[b];
  if (!keepsGradients()) {
    throw std::logic_error("Reducer::gradBlock: this stage keeps no whole gradient buffer");
  }
  const int64_t k = bucket.grads.numel() / group_;
  return bucket.grads.narrow(0, r * k, k);
}

std::vector<at::Tensor> Reducer::parameterShards() const {
  std::vector<at::Tensor> shards;
  for (const auto& b : buckets_) {
    if (shardsParameters()) {
      shards.push_back(b.kept);
      continue;
    }
    const int64_t k = b.values.numel() / group_;
    shards.push_back(b.values.narrow(0, rank_ * k, k));
  }
  return shards;
}

at::Tensor Reducer::allGather(size_t b, const at::Tensor& shard) {
  at::Tensor full = at::empty({buckets_[b].values.numel()}, options_);
  allGatherInto(b, shard, full);
  return full;
}

Provenance Reducer::allGatherInto(size_t b, const at::Tensor& shard, const at::Tensor& full) {
  const Tracer::BucketScope traced(static_cast<int>(b));
  const Bucket& bucket = buckets_[b];
  COLLIE_CHECK(shard.numel() == bucket.values.numel() / group_, "bucket ", b, ": a block of ",
               shard.numel(), " elements, expected ", bucket.values.numel() / group_);
  CollectiveArgs args;
  args.coll = Collective::kAllGather;
  args.data = floats(shard);
  args.output = floats(full);
  return comm_.run(args);
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
    const Provenance gathered = allGatherInto(b, input, buckets_[b].values);
    timing.collectives.push_back(gathered);
    timing.comm_seconds += gathered.seconds;
  }
  timing.exposed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  timing.gather_seconds = timing.comm_seconds;
  timing.gather_exposed_seconds = timing.exposed_seconds;
  return timing;
}

void Reducer::reduce(size_t b) {
  at::NoGradGuard no_grad;
  Bucket& bucket = buckets_[b];
  bucket.provenance.clear();
  if (codec_) {
    CommunicatorGroup group(comm_, codec_name_, options_.device(), &bucket.provenance);
    codec_->synchronize(coded_[b], group);
    return;
  }
  CollectiveArgs args;
  args.data = floats(bucket.grads);
  args.op = ReduceOp::kSum;
  if (!sharded()) {
    args.coll = Collective::kAllReduce;
    bucket.provenance.push_back(comm_.run(args));
    return;
  }
  args.coll = Collective::kReduceScatter;
  // Only this rank's reduced block is used from here on: the scheduler may reduce in the
  // bucket itself rather than in a copy of it (stage 1 keeps the buffer, but reads only its
  // own block; stages 2 and 3 free it).
  args.input_is_scratch = true;
  const int64_t k = bucket.grads.numel() / group_;
  if (!keepsGradients()) {  // into the kept reduced block
    args.output = floats(bucket.shard);
    bucket.provenance.push_back(comm_.run(args));
    return;
  }
  at::Tensor block = block_scratch_.narrow(0, 0, k);
  args.output = floats(block);
  bucket.provenance.push_back(comm_.run(args));
  bucket.grads.narrow(0, rank_ * k, k).copy_(block);
}

void Reducer::communicationLoop() {
  Tracer::setThreadTrack(TraceTrack::kCommunication);
  const MemoryLedger::Bind counted(ledger_, MemoryUse::kGradientSync);
  useDevice(options_.device());  // the thread's current device: where its copies queue
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    const Work work = queue_.front();
    Bucket& b = buckets_[work.bucket];
    queue_.pop_front();
    const bool skip = failure_ != nullptr;
    bool failed = false;
    in_flight_ = !skip;
    lock.unlock();
    if (!skip) {
      try {
        const Tracer::BucketScope traced(static_cast<int>(work.bucket));
        const auto start = Clock::now();
        if (work.gather) {
          const Provenance gathered = gatherNow(work.bucket);
          lock.lock();
          b.held = Held::kGathered;
          gathered_bytes_ += bytesOf(b.values);
          gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
          gathers_.push_back(gathered);
          gather_seconds_ += gathered.seconds;
          lock.unlock();
        } else {
          reduce(work.bucket);
          b.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        }
      } catch (...) {
        lock.lock();
        failure_ = std::current_exception();
        failed = true;
        lock.unlock();
      }
    }
    lock.lock();
    if (work.gather) {
      in_flight_ = false;
      cv_.notify_all();
      continue;
    }
    // Stages 2 and 3: the full gradient goes as soon as its block is reduced; one whose
    // reduction failed stays with its bucket, as a failed gather's buffer does (the backend
    // may still receive into it).
    if (!keepsGradients() && !failed) {
      b.grads = at::Tensor();
      giveBack(std::move(b.grads_memory), b.values.numel());
    }
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
    collect(k, lock);  // stage 2: what earlier micro-batches accumulated
    fill(k, lock);
  }
  launchReady();
  cv_.wait(lock, [&] {
    for (const auto& b : buckets_) {
      if (!b.done) return false;
    }
    return true;
  });
  timing.exposed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Stage 3: the step's gathers, and the time compute waited for them.
  timing.comm_seconds += gather_seconds_;
  timing.exposed_seconds += gather_wait_seconds_ + grad_wait_seconds_;
  grad_wait_seconds_ = 0;
  timing.gather_seconds = gather_seconds_;
  timing.gather_exposed_seconds = gather_wait_seconds_;
  timing.collectives = std::move(gathers_);
  gathers_.clear();
  gather_seconds_ = gather_wait_seconds_ = 0;
  timing.buckets = static_cast<int>(buckets_.size());
  timing.launched_in_backward = launched_in_backward_;
  launched_in_backward_ = 0;
  for (auto& b : buckets_) {
    timing.comm_seconds += b.seconds;
    timing.bytes += static_cast<uint64_t>(b.values.numel()) * 4;
    timing.collectives.insert(timing.collectives.end(), b.provenance.begin(), b.provenance.end());
    b.launched = b.done = false;
    b.seconds = 0;
    b.pending = b.params.size();
  }
  for (auto& s : slots_) s.filled = false;
  next_launch_ = 0;
  if (failure_) std::rethrow_exception(failure_);
  return timing;
}

void Reducer::endStep() {
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (keepsGradients()) buckets_[b].grads.zero_();
    if (!shardsParameters()) continue;
    waitGathered(lock, b);  // a prefetch nobody waited for
    freeValues(buckets_[b]);
  }
}

void Reducer::requestGather(size_t b) {
  Bucket& bucket = buckets_[b];
  if (bucket.held != Held::kFreed) return;
  bucket.held = Held::kGathering;
  queue_.push_back({b, true});
  cv_.notify_all();
}

void Reducer::requestUnit(size_t unit) {
  for (size_t b : unit_buckets_[unit]) requestGather(b);
}

void Reducer::waitGathered(std::unique_lock<std::mutex>& lock, size_t b) {
  if (buckets_[b].held != Held::kGathering) return;
  const auto start = Clock::now();
  cv_.wait(lock, [&] { return buckets_[b].held != Held::kGathering || failure_ != nullptr; });
  gather_wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  if (buckets_[b].held == Held::kGathering) std::rethrow_exception(failure_);
}

void Reducer::freeValues(Bucket& bucket) {
  if (bucket.held != Held::kGathered) return;
  at::DataPtr held = swapStorage(bucket.values, at::DataPtr(), 0);
  // The set-up's memory (not borrowed) goes back to the allocator.
  if (bucket.borrowed) giveBack(std::move(held), bucket.values.numel());
  bucket.borrowed = false;
  bucket.held = Held::kFreed;
  gathered_bytes_ -= bytesOf(bucket.values);
}

Provenance Reducer::gatherNow(size_t b) {
  const MemoryLedger::Use counted(MemoryUse::kGathered);
  Bucket& bucket = buckets_[b];
  const int64_t numel = bucket.values.numel();
  // A gather that throws leaves the buffer with the bucket: a receive the backend may still
  // have posted into it must not land in memory another bucket has borrowed meanwhile. A
  // gather tried again goes into that buffer.
  if (!bucket.borrowed) {
    swapStorage(bucket.values, borrowBuffer(numel), static_cast<size_t>(numel) * 4);
    bucket.borrowed = true;
  }
  return allGatherInto(b, bucket.kept, bucket.values);
}

void Reducer::gatherRoot() {
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t b : root_buckets_) requestGather(b);
  if (!unit_buckets_.empty()) requestUnit(0);  // ahead of the first unit's need
  for (size_t b : root_buckets_) waitGathered(lock, b);
}

void Reducer::gatherUnit(size_t unit, bool forward) {
  std::unique_lock<std::mutex> lock(mu_);
  COLLIE_CHECK(unit < unit_buckets_.size(), "unit ", unit, " of ", unit_buckets_.size());
  requestUnit(unit);
  if (forward && unit + 1 < unit_buckets_.size()) requestUnit(unit + 1);
  if (!forward && unit > 0) requestUnit(unit - 1);
  for (size_t b : unit_buckets_[unit]) waitGathered(lock, b);
}

void Reducer::leaveUnit(size_t unit) {
  std::lock_guard<std::mutex> lock(mu_);
  COLLIE_CHECK(unit < unit_buckets_.size(), "unit ", unit, " of ", unit_buckets_.size());
  for (size_t b : unit_buckets_[unit]) {
    // A bucket that a later unit of this forward uses too stays.
    if (buckets_[b].units.back() <= unit) freeValues(buckets_[b]);
  }
}

void Reducer::afterBackward() {
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.accumulated = 0;
    if (bucket.root) continue;
    waitGathered(lock, b);
    freeValues(bucket);
  }
  for (auto& slot : slots_) slot.seen = false;
}

void Reducer::forEachBucketGathered(const std::vector<size_t>& order,
                                    const std::function<void(size_t b)>& fn) {
  for (size_t b : order) {
    bool gathered_here = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Bucket& bucket = buckets_[b];
      if (bucket.held != Held::kGathered) {
        COLLIE_CHECK(bucket.held == Held::kFreed, "bucket ", b, " is being gathered");
        gatherNow(b);
        bucket.held = Held::kGathered;
        gathered_bytes_ += bytesOf(bucket.values);  // between steps: not a step's peak
        gathered_here = true;
      }
    }
    const auto free_here = [&] {
      if (!gathered_here) return;
      std::lock_guard<std::mutex> lock(mu_);
      freeValues(buckets_[b]);
    };
    try {
      fn(b);
    } catch (...) {
      free_here();
      throw;
    }
    free_here();
  }
}

void Reducer::keepShards() {
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : buckets_) {
    COLLIE_CHECK(b.held == Held::kGathered, "keepShards() of a bucket not gathered");
    const int64_t k = b.kept.numel();
    b.kept.copy_(b.values.narrow(0, rank_ * k, k));
  }
}

HeldBytes Reducer::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  HeldBytes held;
  held.gathered_peak = gathered_peak_;
  {
    std::lock_guard<std::mutex> pool(pool_mu_);
    held.pooled = pooled_ * static_cast<uint64_t>(pool_numel_) * 4;
  }
  for (const auto& b : buckets_) {
    // Stage 3: the values only while gathered, and the kept block always.
    held.parameters += b.values.storage().nbytes() + bytesOf(b.kept);
    held.gradients += bytesOf(b.grads) + bytesOf(b.shard);
  }
  // Stages 2 and 3 between micro-batches: autograd's own accumulated gradients.
  if (!keepsGradients()) {
    for (const auto& p : params_) held.gradients += bytesOf(p.grad());
  }
  return held;
}

void Reducer::broadcastParameters() {
  at::NoGradGuard no_grad;
  const bool root = comm_.backend().rank() == 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    const Tracer::BucketScope traced(static_cast<int>(k));
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

namespace {

// The identity, whose backward gathers a unit's parameters before the unit's own backward
// runs (it sits on the unit's output, so autograd reaches it first).
class GatherInBackward : public torch::autograd::Function<GatherInBackward> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y,
                            int64_t reducer, int64_t unit) {
    ctx->saved_data["reducer"] = reducer;
    ctx->saved_data["unit"] = unit;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* reducer = reinterpret_cast<Reducer*>(ctx->saved_data["reducer"].toInt());
    reducer->gatherUnit(static_cast<size_t>(ctx->saved_data["unit"].toInt()), false);
    return {grad[0], at::Tensor(), at::Tensor()};
  }
};

class ReducerGate final : public UnitGate {
 public:
  explicit ReducerGate(Reducer& reducer) : reducer_(reducer) {}
  at::Tensor enter(size_t unit, const at::Tensor& x) override {
    reducer_.gatherUnit(unit, true);
    return x;
  }
  at::Tensor leave(size_t unit, const at::Tensor& y) override {
    reducer_.leaveUnit(unit);
    if (!y.requires_grad()) return y;
    return GatherInBackward::apply(y, reinterpret_cast<int64_t>(&reducer_),
                                   static_cast<int64_t>(unit));
  }

 private:
  Reducer& reducer_;
};

}  // namespace

std::unique_ptr<UnitGate> makeUnitGate(Reducer& reducer) {
  return std::make_unique<ReducerGate>(reducer);
}

}  // namespace collie::train
