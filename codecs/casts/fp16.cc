// fp16: a bucket's gradients scaled by a power of two, cast to float16, summed in float16
// over the ranks, cast back and unscaled: half the bytes of the float32 all-reduce, as
// PyTorch DDP's fp16_compress_hook. float16 reaches only 65504 and loses values below
// 6e-8, so the scale is chosen for every bucket from the largest magnitude on any rank
// (one all-reduce of a single float first): the largest the sum can reach lands just below
// 65504, and small gradients keep as many bits as the range allows. A power of two scales
// and unscales exactly.
#include <ATen/ops/exp2.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/log2.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/where.h>

#include "collie/codec.h"

namespace {

constexpr double kHalfMax = 65504.0;

class Fp16 final : public collie::Codec {
 public:
  explicit Fp16(const collie::PluginContext&) {}

  void synchronize(collie::CodecBucket& bucket, collie::CodecGroup& group) override {
    at::Tensor gradient = bucket.gradient;  // (numel) float32
    if (gradient.numel() == 0) return;
    at::Tensor largest = gradient.abs().max().reshape({1});  // (1) on the bucket's device
    group.allReduce(largest, collie::ReduceOp::kMax);
    const at::Tensor scale = scaleFor(largest, group.size());  // (1), never read on the host
    at::Tensor half = gradient.mul(scale).to(at::kHalf);       // (numel)
    group.allReduce(half, collie::ReduceOp::kSum);
    gradient.copy_(half).div_(scale);
  }

  std::vector<collie::CodecCall> plan(const collie::CodecBucket& bucket, int,
                                      int64_t) const override {
    if (bucket.gradient.numel() == 0) return {};
    return {{collie::Collective::kAllReduce, collie::DType::kF32, 1},
            {collie::Collective::kAllReduce, collie::DType::kF16, bucket.gradient.numel()}};
  }

  // The power of two that brings a sum of `ranks` values of at most `largest` to just
  // below float16's largest; 1 when no such scale exists (zeros, or values already
  // infinite or NaN, which the sum keeps as float32's would). Computed where `largest` lies,
  // so that a GPU's stream is not waited for.
  static at::Tensor scaleFor(const at::Tensor& largest, int ranks) {
    const at::Tensor exponent =
        at::floor(at::log2(at::reciprocal(largest.mul(ranks)).mul_(kHalfMax))).clamp_max_(100);
    const at::Tensor usable = at::isfinite(largest).logical_and_(largest.gt(0));
    return at::where(usable, at::exp2(exponent), at::ones_like(largest));
  }
};

}  // namespace

COLLIE_CODEC_PLUGIN("fp16", "1.0.0",
                    "gradients scaled and summed in float16: half the bytes "
                    "(DDP's fp16_compress_hook)",
                    Fp16);
