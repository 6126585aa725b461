// bf16: a bucket's gradients cast to bfloat16, summed in bfloat16 over the ranks and cast
// back: half the bytes of the float32 all-reduce, as PyTorch DDP's bf16_compress_hook.
// bfloat16 keeps float32's exponent range, so nothing needs scaling; it keeps 8 bits of
// the significand, so each sum is rounded to 2 or 3 significant digits.
#include <ATen/ops/empty.h>

#include "collie/codec.h"

namespace collie::bf16 {
namespace {

class Bf16 final : public Codec {
 public:
  explicit Bf16(const PluginContext&) {}

  void synchronize(CodecBucket& bucket, CodecGroup& group) override {
    at::Tensor half = bucket.gradient.to(at::kBFloat16);  // (numel)
    group.allReduce(half, ReduceOp::kSum);
    bucket.gradient.copy_(half);
  }

  std::vector<CodecCall> plan(const CodecBucket& bucket, int, int64_t) const override {
    return {{Collective::kAllReduce, DType::kBF16, bucket.gradient.numel()}};
  }
};

}  // namespace
}  // namespace collie::bf16

COLLIE_CODEC_PLUGIN("bf16", "1.0.0",
                    "gradients summed in bfloat16: half the bytes (DDP's bf16_compress_hook)",
                    collie::bf16::Bf16);
