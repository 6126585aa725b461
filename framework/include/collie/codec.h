// The codec contract: a codec plugin synchronises a gradient bucket in fewer bytes than a
// float32 all-reduce (a cast to 16 bits, a low-rank approximation, quantised blocks). The
// trainer hands it each bucket after the step's last backward, on its communication
// thread; the codec reaches the other ranks only through the CodecGroup it is given, whose
// collectives run through the Communicator and train.scheduler's rules like any other.
// Codecs compute on tensors, so they link LibTorch as models do (COLLIE_CODEC_PLUGIN).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collie/plugin.h"

namespace collie {

// The other ranks of the job, as a codec reaches them. Every call is a collective: every
// rank makes the same calls in the same order, with the same dtypes and element counts.
// Tensors are contiguous and on the training device (a GPU's memory, or host memory).
// A call that fails throws (CommError, TimeoutError); the codec lets it through.
class CodecGroup {
 public:
  virtual ~CodecGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Reduces `t` over the group in place: on return every rank holds the same bits.
  //   t: float32, float16, bfloat16, int32 or int64; op: kSum, kMax or kMin.
  virtual void allReduce(const at::Tensor& t, ReduceOp op) = 0;
  // Every rank's `in` into `out` in rank order: out holds size() * in.numel() elements of
  // in's dtype: float32, float64, float16, bfloat16, int32, int64, or one-byte elements
  // (int8, uint8), which travel as 4-byte words, so that their count must be a multiple of 4.
  virtual void allGather(const at::Tensor& in, const at::Tensor& out) = 0;
};

// One bucket of gradients, as the codec sees it.
struct CodecBucket {
  size_t index = 0;  // the bucket's number: the same on every rank and in every step
  // (numel, padded to a multiple of the group size) float32. On entry this rank's part of
  // the sum: its gradient, weighted by its share. On return the sum over the ranks as the
  // codec decodes it, the same bits on every rank (the weight check compares them).
  at::Tensor gradient;
  // Views of `gradient` with the shapes of the bucket's parameters, in the bucket's order
  // (its padding, zeros on entry, in none of them).
  std::vector<at::Tensor> parameters;
  // This rank's weight in the sum: the fraction of the step's predictions it computed (1/N
  // when every rank computes as many). Error feedback that keeps "what this rank should have
  // contributed less what the decoded sum credits it with" credits it share * the sum.
  double share = 0;
  int64_t step = 0;  // the step (0-based) whose gradients these are
};

// What synchronize() makes the group do, as the cost model prices it: one collective.
struct CodecCall {
  Collective coll = Collective::kAllReduce;  // kAllReduce or kAllGather
  DType dtype = DType::kF32;
  int64_t count = 0;  // elements of that dtype each rank hands in
};

// What prepare() is told once, before the first step.
struct CodecSetup {
  uint64_t seed = 0;  // train.seed: draws (a random start) use their own generator from it
  int rank = 0, size = 1;
};

// Besides the instance that trains, the trainer makes one more of the codec before the
// first step (and before it prepares the one that trains), prepares it on fresh buffers of
// the same shapes and times synchronize() on a group whose collectives move nothing (an
// all-reduce leaves the tensor as it is, an all-gather copies this rank's part into every
// place), then destroys it: its arithmetic enters the predicted step, and
// train.compression: auto chooses by it. An exception from this rehearsal on any rank fails
// the run on every rank, naming the codec and a rank where it failed. So instances must
// share no state, and what synchronize() computes must not depend on the values its
// collectives return (only its results may).
class Codec {
 public:
  virtual ~Codec() = default;

  // Before the first step, on every rank, with every bucket of the run (gradients not yet
  // computed): allocates whatever state the codec keeps from step to step, on the buckets'
  // device. Draws nothing from LibTorch's global generators (ranks may be threads).
  virtual void prepare(const std::vector<CodecBucket>& buckets, const CodecSetup& setup) {
    (void)buckets;
    (void)setup;
  }

  // Synchronises one bucket (see CodecBucket::gradient). Buckets arrive in the same order
  // on every rank, one at a time.
  virtual void synchronize(CodecBucket& bucket, CodecGroup& group) = 0;

  // The collectives synchronize() makes for `bucket` (only its shapes are read) on a group
  // of `size` ranks in `step`, in order: what the trainer predicts a step's synchronisation
  // from, before any step runs.
  virtual std::vector<CodecCall> plan(const CodecBucket& bucket, int size, int64_t step) const = 0;

  // The state carried from one step to the next on this rank (error feedback, a warm start),
  // by name: the codec's own contiguous float32 tensors, the same names and shapes on every
  // rank and in every call after prepare(). A checkpoint saves every rank's; a run resumed
  // with the same codec, params and world size overwrites them in place before its first
  // step (otherwise the codec starts from what prepare() made). Empty for a stateless codec.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() { return {}; }
};

}  // namespace collie

// TYPE derives from collie::Codec and has a constructor TYPE(const collie::PluginContext&).
// Codec plugins link LibTorch; include this header instead of collie/plugin.h.
#define COLLIE_CODEC_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                                 \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_CODEC, ::collie::Codec, NAME, VERSION, DESCRIPTION, \
                              TYPE, 0u)
