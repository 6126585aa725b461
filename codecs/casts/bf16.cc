// bf16: a bucket's gradients cast to bfloat16, summed in bfloat16 over the ranks and cast
// back: half the bytes of the float32 all-reduce, as PyTorch DDP's bf16_compress_hook.
// bfloat16 keeps float32's exponent range, so nothing needs scaling; it keeps 8 bits of
// the significand, so each sum is rounded to 2 or 3 significant digits.
#include <ATen/ops/empty.h>

#include "collie/codec.h"

namespace {

class Bf16 final : public collie::Codec {
 public:
  explicit Bf16(const collie::PluginContext&) {}

  void synchronize(collie::CodecBucket& bucket, collie::CodecGroup& group) override {
    at::Tensor half = bucket.gradient.to(at::kBFloat16);  // (numel)
    group.allReduce(half, collie::ReduceOp::kSum);
    bucket.gradient.copy_(half);
  }

  std::vector<collie::CodecCall> plan(const collie::CodecBucket& bucket, int,
                                      int64_t) const override {
    return {{collie::Collective::kAllReduce, collie::DType::kBF16, bucket.gradient.numel()}};
  }
};

}  // namespace

COLLIE_CODEC_PLUGIN("bf16", "1.0.0",
                    "gradients summed in bfloat16: half the bytes (DDP's bf16_compress_hook)",
                    Bf16);
