// Gradient buckets and their all-reduce on a communication thread (DESIGN §5, PyTorch DDP's
// Reducer as the reference): parameters are packed into buckets in reverse order; during the
// last backward of a step each bucket is handed to the communication thread as soon as its
// last gradient has arrived, so all-reduce overlaps the rest of backward.
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
  Reducer(std::vector<at::Tensor> params, uint64_t bucket_bytes, Communicator& comm, bool overlap);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before the backward whose gradients complete the step (the last micro-batch); the
  // gradient hooks stay idle during earlier backwards (no communication while accumulating).
  void arm();
  // After that backward: launches what is left, waits for every bucket, and writes the
  // summed gradients into each parameter's .grad. Rethrows a communication failure.
  SyncTiming finish();

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
    at::Tensor flat;  // (numel of its params) float32
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

  std::vector<at::Tensor> params_;
  std::vector<unsigned> hooks_;  // register_hook handles, removed on destruction
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  bool overlap_;

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
