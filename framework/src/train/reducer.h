// Gradient buckets and their all-reduce on a communication thread (DESIGN §5, PyTorch DDP's
// Reducer as the reference): parameters are packed into buckets in reverse order; during the
// last backward of a step each bucket is handed to the communication thread as soon as its
// last gradient has arrived, so all-reduce overlaps the rest of backward.
//
// Every bucket is padded to a multiple of the group size N. Sharded (ZeRO stage 1,
// train.sharding: optimizer), it is split into N equal blocks; rank r owns block r of every bucket
// (its shard). The bucket is reduce-scattered instead of all-reduced, so that each rank receives
// the reduced gradient of its shard only; after the update, gatherParameters() all-gathers
// the updated shards back into every rank's parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/communicator.h"
#include "train/step.h"

namespace collie::train {

class Reducer {
 public:
  // `params` (float32, in the model's order) are bucketed by `bucket_bytes`. With `overlap`
  // off, every bucket is all-reduced after backward instead of during it. The communicator
  // is used from the communication thread only while a step synchronises.
  Reducer(std::vector<at::Tensor> params, uint64_t bucket_bytes, Communicator& comm, bool overlap,
          bool sharded = false);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before the backward whose gradients complete the step (the last micro-batch); the
  // gradient hooks stay idle during earlier backwards (no communication while accumulating).
  void arm();
  // After that backward: launches what is left, waits for every bucket, and writes the
  // summed gradients into each parameter's .grad (sharded: into gradShard(b) only).
  // Rethrows a communication failure.
  SyncTiming finish();

  // Sharded only. Bucket b's reduced gradient block on this rank (shardNumel(b)), valid
  // after finish() until the next step's backward.
  at::Tensor gradShard(size_t b) const { return buckets_[b].shard; }
  // This rank's block of every bucket's parameter values, as new tensors.
  std::vector<at::Tensor> parameterShards();
  // All-gathers bucket b's blocks (`shard` on this rank) into a tensor of the bucket's
  // padded size, through the communicator (on the calling thread: between steps).
  at::Tensor allGather(size_t b, const at::Tensor& shard);
  // All-gathers every bucket's updated parameter block into the parameters; the time and
  // provenance of those all-gathers (no bytes: the gradient's are the step's figure).
  SyncTiming gatherParameters(const std::vector<at::Tensor>& shards);
  // The elements of bucket b (padded to a multiple of the group size), of one
  // rank's block of it, and where parameter k lies in it.
  int64_t bucketNumel(size_t b) const { return buckets_[b].flat.numel(); }
  int64_t shardNumel(size_t b) const { return buckets_[b].flat.numel() / group_; }
  size_t bucketOf(size_t param) const { return slots_[param].bucket; }
  int64_t offsetOf(size_t param) const { return slots_[param].offset; }
  bool sharded() const { return sharded_; }

  // Broadcasts rank 0's parameter values to every rank, bucket by bucket.
  void broadcastParameters();

  size_t bucketCount() const { return buckets_.size(); }
  // Parameter indices per bucket, in launch order (for tests and the summary).
  std::vector<std::vector<size_t>> bucketLayout() const;

 private:
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    int64_t numel = 0;
    bool filled = false;
  };
  struct Bucket {
    std::vector<size_t> params;
    at::Tensor flat;   // (numel of its params, padded to a multiple of N) float32
    at::Tensor shard;  // sharded: (flat / N) this rank's reduced block
    size_t pending = 0;
    bool launched = false, done = false;
    double seconds = 0;
    Provenance provenance;
  };

  void onGradient(size_t param, const at::Tensor& grad);
  void fill(size_t param, const at::Tensor* grad);
  // Hands ready buckets to the communication thread strictly in bucket order, so that every
  // rank issues the same collectives in the same order. Caller holds mu_.
  int launchReady();  // queues the buckets that are complete, in order; how many
  void communicationLoop();
  CollectiveArgs argsFor(Bucket& bucket, Collective coll) const;
  // Copies the parameters of `bucket` into its flat buffer, and back from `full` (a tensor
  // in the bucket's layout). Caller holds no_grad.
  void pack(Bucket& bucket);
  void unpack(const Bucket& bucket, const at::Tensor& full);
  // allGather() into `full` (the bucket's padded size); returns it.
  at::Tensor allGatherInto(size_t b, const at::Tensor& shard, at::Tensor full);

  std::vector<at::Tensor> params_;
  std::vector<unsigned> hooks_;  // register_hook handles, removed on destruction
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  bool overlap_;
  bool sharded_;
  int64_t group_ = 1, rank_ = 0;  // the group's size and this rank, for padding and blocks

  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, stopping_ = false, in_flight_ = false;
  size_t next_launch_ = 0;
  int launched_in_backward_ = 0;  // this step, by the hooks
  std::deque<size_t> queue_;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace collie::train
