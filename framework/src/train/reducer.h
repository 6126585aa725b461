// Gradient buckets and their all-reduce on a communication thread (PyTorch DDP's
// Reducer as the reference): parameters are packed into buckets in reverse order; during the
// last backward of a step each bucket is handed to the communication thread as soon as its
// last gradient has been accumulated, so all-reduce overlaps the rest of backward.
//
// The reducer owns the memory: every bucket holds its parameters' values in one flat
// buffer (the module's parameters become views of it) and, unsharded, their gradients in
// another (each .grad is a view of it, as DDP's gradient_as_bucket_view): autograd
// accumulates straight into the bucket, which is reduced in place, and nothing is copied.
//
// Every bucket is padded to a multiple of the group size N. Sharded (ZeRO), it is split into
// N equal blocks; rank r owns block r of every bucket (its shard). The bucket is
// reduce-scattered instead of all-reduced, so that each rank receives the reduced gradient
// of its shard only; after the update, gatherParameters() all-gathers the updated blocks
// back into every rank's parameters.
//   optimizer (stage 1): the bucket's gradient buffer stays; the reduced block lands in it
//     (its other blocks hold what the reduce-scatter left there, read by nothing).
//   gradients (stage 2): a rank keeps only its reduced blocks; a bucket's full gradient
//     buffer exists from its first gradient in the last backward until its reduce-scatter
//     has finished (earlier micro-batches accumulate in autograd's own .grad tensors).
//   parameters (stage 3): as stage 2, and a rank keeps only its block of the values; a
//     bucket's values exist while a unit of the model that uses them computes (gathered on
//     the communication thread, the next unit's ahead of need) and are freed after it, in
//     forward and again in backward. Buckets of the root (parameters of no unit) stay
//     gathered from the step's first forward to its update.
//
// Given the model's units, buckets never mix a unit's parameters with the root's, in every
// stage, so that every stage lays out (and so adds) every element the same way.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collie/codec.h"
#include "collie/model.h"
#include "config/experiment.h"
#include "runtime/communicator.h"
#include "train/memory_ledger.h"
#include "train/step.h"

namespace collie::train {

// Bytes a rank holds for training state, by kind (the ZeRO paper's accounting).
struct HeldBytes {
  uint64_t parameters = 0, gradients = 0;
  // Stage 3: the most bucket values gathered at once during steps (the units and root a
  // rank held whole beside its blocks).
  uint64_t gathered_peak = 0;
  // Stages 2 and 3: the buffers that full gradients and gathered values borrow, kept from
  // step to step (as many as were ever in use at once).
  uint64_t pooled = 0;
};

class Reducer {
 public:
  // `params` (float32 leaves, in the model's order) are bucketed by `bucket_bytes` and
  // moved into the buckets' buffers (their values kept). With `overlap` off, every bucket
  // is reduced after backward instead of during it. The communicator is used from the
  // communication thread only while a step synchronises.
  // `units`: the model's units as parameter indices, in forward order (empty: none).
  Reducer(std::vector<at::Tensor> params, uint64_t bucket_bytes, Communicator& comm, bool overlap,
          config::ShardedState sharding = config::ShardedState::kNone,
          std::vector<std::vector<size_t>> units = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Unsharded only, before the first step: every bucket is synchronised by `codec`
  // (collie/codec.h) instead of a float32 all-reduce; its collectives go through the
  // communicator like the all-reduce's. `name` names it in errors. Calls codec->prepare.
  void useCodec(std::shared_ptr<Codec> codec, const std::string& name, const CodecSetup& setup);
  // Call before the backward whose gradients complete the step (the last micro-batch); the
  // gradient hooks stay idle during earlier backwards (no communication while accumulating).
  // `step` (0-based) and this rank's `share` of the step's sum are what a codec is told.
  void arm(int64_t step, double share);
  // After that backward: launches what is left and waits for every bucket. Unsharded, each
  // parameter's .grad then holds the summed gradient; sharded, gradShard(b) does.
  // Rethrows a communication failure.
  SyncTiming finish();
  // After the update: the next step's gradients start from zero (stage 3: and the values
  // of every bucket are freed, the update having changed the kept blocks).
  void endStep();

  // Stage 3. Before every forward: gathers the root's buckets (once per step).
  void gatherRoot();
  // Waits until unit u's buckets are gathered (forward: before it computes; backward: before
  // its backward) and starts gathering the unit after it in that direction.
  void gatherUnit(size_t unit, bool forward);
  // After unit u's forward: frees the buckets no later unit of this forward uses.
  void leaveUnit(size_t unit);
  // After every backward: frees what it left gathered (parameters that had no gradient).
  void afterBackward();
  // Stage 3, between steps: gathers the buckets in `order` one at a time on the calling thread
  // (every rank takes part), calling fn(b) while bucket b's values are there, then frees them
  // again (a bucket gathered before stays so): what reads every parameter, the weight check,
  // then holds one bucket's values at a time rather than the whole model's.
  void forEachBucketGathered(const std::vector<size_t>& order,
                             const std::function<void(size_t b)>& fn);
  // Stage 3, after the set-up's broadcast, with every bucket's values present: this rank's
  // blocks of them become the blocks it keeps.
  void keepShards();
  bool shardsParameters() const { return sharding_ == config::ShardedState::kParameters; }

  // Sharded only. Bucket b's reduced gradient block on this rank (shardNumel(b)), valid
  // after finish() until the next step's last backward.
  at::Tensor gradShard(size_t b) const;
  // Unsharded and stage 1: block r of bucket b's gradient buffer (the block rank r owns when
  // sharded), so that an unsharded run can add what a sharded one adds, in the same order.
  at::Tensor gradBlock(size_t b, int64_t r) const;
  // This rank's block of every bucket's parameter values: views, which an update of them
  // changes in place (the module's parameters see it after gatherParameters()); stage 3:
  // the kept blocks, which the next gathers deliver.
  std::vector<at::Tensor> parameterShards() const;
  // All-gathers bucket b's blocks (`shard` on this rank) into a new tensor of the bucket's
  // padded size, through the communicator (on the calling thread: between steps).
  at::Tensor allGather(size_t b, const at::Tensor& shard);
  // All-gathers every bucket's block of parameter values (after their update) into the
  // parameters; the time and provenance of those all-gathers (no bytes: the gradient's are
  // the step's figure).
  SyncTiming gatherParameters();
  // The elements of bucket b (padded to a multiple of the group size), of one
  // rank's block of it, and where parameter k lies in it.
  int64_t bucketNumel(size_t b) const { return buckets_[b].values.numel(); }
  int64_t shardNumel(size_t b) const { return buckets_[b].values.numel() / group_; }
  size_t bucketOf(size_t param) const { return slots_[param].bucket; }
  int64_t offsetOf(size_t param) const { return slots_[param].offset; }
  bool sharded() const { return sharding_ != config::ShardedState::kNone; }
  bool isRoot(size_t b) const { return buckets_[b].root; }  // holds parameters of no unit
  // What this rank holds now in parameter values and gradients (buffers, not scratch).
  HeldBytes held() const;

  // Unsharded: bucket b's parameter values, (bucketNumel(b)) float32; the module's
  // parameters are views of it.
  at::Tensor values(size_t b) const { return buckets_[b].values; }

  // Broadcasts rank 0's parameter values to every rank, bucket by bucket.
  void broadcastParameters();

  size_t bucketCount() const { return buckets_.size(); }
  // Parameter indices per bucket, in launch order (for tests and the summary).
  std::vector<std::vector<size_t>> bucketLayout() const;
  // With a codec: bucket b as the codec sees it (views of its gradient buffer), and the
  // codec; nullptr without one.
  const CodecBucket& codecBucket(size_t b) const { return coded_[b]; }
  // Every bucket as a codec sees it (unsharded): views of the gradient buffers, or with
  // `fresh`, views of new zeroed buffers of the same shapes on the same device (a
  // rehearsal's, which must not write the step's gradients).
  std::vector<CodecBucket> codecBuckets(bool fresh = false) const;
  Codec* codec() const { return codec_.get(); }
  const std::string& codecName() const { return codec_name_; }  // useCodec's `name`

 private:
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    int64_t numel = 0;
    bool filled = false;
    bool seen = false;  // stage 3: its gradient was accumulated in this backward
  };
  enum class Held { kFreed, kGathering, kGathered };  // stage 3: the values' state
  struct Bucket {
    std::vector<size_t> params;
    at::Tensor values;  // (numel of its params, padded to a multiple of N) float32
    at::Tensor grads;   // the same layout; stages 2, 3: only while the last backward needs it
                        // (in grads_memory, borrowed from the pool)
    at::DataPtr grads_memory;
    at::Tensor shard;  // stages 2, 3: (values / N) this rank's reduced block
    at::Tensor kept;   // stage 3: (values / N) this rank's block of the values
    size_t pending = 0;
    bool launched = false, done = false;
    double seconds = 0;
    std::vector<Provenance> provenance;  // its collectives in this step
    bool root = false;                   // holds parameters of no unit
    std::vector<size_t> units;           // the units whose parameters it holds, ascending
    Held held = Held::kGathered;
    size_t accumulated = 0;  // its parameters whose gradient this backward accumulated
    bool borrowed = false;   // its values are in a buffer of the pool (else as made)
  };
  struct Work {
    size_t bucket;
    bool gather;  // else reduce
  };

  bool keepsGradients() const {
    return sharding_ == config::ShardedState::kNone ||
           sharding_ == config::ShardedState::kOptimizer;
  }
  at::Tensor gradView(size_t param) const;  // its place in its bucket's gradient buffer
  void beforeAccumulation(size_t param);    // a tensor hook: refuses a late second gradient
  void afterAccumulation(size_t param);     // the accumulator's post hook
  // Puts parameter k's accumulated gradient into its bucket's buffer when it is not there
  // already (stage 2; or autograd replaced the view by a new tensor). Caller holds mu_.
  void collect(size_t param, std::unique_lock<std::mutex>& lock);
  void fill(size_t param, std::unique_lock<std::mutex>& lock);  // marks it ready
  // Stages 2 and 3: a bucket's full gradient, made when its first gradient arrives and freed
  // once its block is reduced. While kFullGradientBuckets of them live and a reduction is
  // under way (which frees one), the backward waits for it, so that the gradients in flight
  // stay two buckets' worth however far the communication falls behind the compute (as
  // DeepSpeed's reduce buckets do); never while none is being reduced, since only a
  // reduction frees room. The wait is exposed communication.
  void makeFullGradient(Bucket& bucket, std::unique_lock<std::mutex>& lock);
  static constexpr int kFullGradientBuckets = 2;
  // Stages 2 and 3: a bucket's full gradient and a gathered bucket's values live in buffers
  // borrowed from a pool and given back when freed; the pool's buffers are never returned to
  // the allocator. Made and freed every step at the buckets' several sizes, they left memory
  // the heap kept beside the step's peak (about 30 MB a rank at stage 2 and 65 MB at stage 3
  // for the 50.6 M-parameter GPT on 4 ranks). The pool makes a buffer only when none is
  // free, so it keeps as many as were ever in use at once (two full gradients with overlap
  // on; with it off, every bucket's full gradient lives at once), each of pool_numel_
  // elements: the largest bucket between half and twice the median bucket by bytes (the one
  // that holds the middle byte), the root's buckets left out of the choice. A bucket outside
  // [pool_numel_ / 2, pool_numel_] (a model's last; gpt's embeddings with a large
  // vocabulary) takes memory of its own size, given back to the allocator when freed. Any
  // thread; takes pool_mu_ (never before mu_).
  at::DataPtr borrowBuffer(int64_t numel);
  void giveBack(at::DataPtr buffer, int64_t numel);
  bool poolable(int64_t numel) const {
    return numel > 0 && numel <= pool_numel_ && 2 * numel >= pool_numel_;
  }
  mutable std::mutex pool_mu_;
  std::vector<at::DataPtr> pool_;  // free buffers
  size_t pooled_ = 0;              // buffers made
  int64_t pool_numel_ = 0;         // a buffer's elements (poolBufferElements)

  // Hands ready buckets to the communication thread strictly in bucket order, so that every
  // rank issues the same collectives in the same order. Caller holds mu_.
  int launchReady();  // queues the buckets that are complete, in order; how many
  void communicationLoop();
  // Its all-reduce or reduce-scatter, or its codec's collectives (communication thread).
  void reduce(size_t b);
  // allGather() of `shard` into `full` (the bucket's padded size).
  Provenance allGatherInto(size_t b, const at::Tensor& shard, const at::Tensor& full);
  // Stage 3; callers hold mu_. Queues bucket b's gather unless it is gathered or on its way.
  void requestGather(size_t b);
  void requestUnit(size_t unit);
  void freeValues(Bucket& bucket);
  void waitGathered(std::unique_lock<std::mutex>& lock, size_t b);
  // Allocates bucket b's values and all-gathers the kept blocks into them (on the
  // communication thread, or between steps); the caller marks it gathered.
  Provenance gatherNow(size_t b);

  std::vector<at::Tensor> params_;
  // The gradient accumulators our post hooks live on (held: autograd keeps only a weak
  // reference between graphs) and the hooks' keys, removed on destruction.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> post_hooks_;
  std::vector<unsigned> hooks_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> unit_buckets_;  // per unit, its buckets
  std::vector<size_t> root_buckets_;
  Communicator& comm_;
  std::shared_ptr<Codec> codec_;
  std::string codec_name_;
  std::vector<CodecBucket> coded_;  // with a codec: per bucket
  // The constructing rank's: its communication thread counts its memory there.
  MemoryLedger* ledger_ = MemoryLedger::current();
  bool overlap_;
  config::ShardedState sharding_;
  int64_t group_ = 1, rank_ = 0;  // the group's size and this rank, for padding and blocks
  at::TensorOptions options_ = at::TensorOptions().dtype(at::kFloat);  // the buckets' device
  // One block of the largest bucket: a collective's output or input may not alias the
  // other buffer, so stage 1's reduced block and every all-gather's input pass through it.
  at::Tensor block_scratch_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, stopping_ = false, in_flight_ = false;
  size_t next_launch_ = 0;
  int launched_in_backward_ = 0;  // this step, by the hooks
  std::deque<Work> queue_;
  // Stage 3, since the last finish(): the gathers' provenance and time, and how long
  // compute waited for them.
  std::vector<Provenance> gathers_;
  double gather_seconds_ = 0, gather_wait_seconds_ = 0;
  double grad_wait_seconds_ = 0;  // the backward waited for room for a full gradient
  uint64_t gathered_bytes_ = 0, gathered_peak_ = 0;  // stage 3: values gathered now, at most
  std::exception_ptr failure_;
  std::thread thread_;
};

// Stage 3: the gate the model calls around its units, over `reducer`'s gathers.
std::unique_ptr<UnitGate> makeUnitGate(Reducer& reducer);

}  // namespace collie::train
