// int8: a bucket's gradients as 8-bit integers with one float32 scale per block of `block`
// elements (the block's largest magnitude / 127), all-gathered: every rank decodes every
// rank's blocks and adds them in rank order, so every rank computes the same sum. A rank
// hands in about a quarter of its float32 bytes (plus 4 bytes a block); an all-gather
// delivers N - 1 such parts to every rank, against the 2 (N - 1) / N parts of four times
// the size that a float32 ring all-reduce moves: fewer bytes on fewer than 8 ranks. With
// error feedback, what rounding left out of a rank's part is added to its next gradient.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collie/codec.h"

namespace collie::int8 {
namespace {

class Int8 final : public Codec {
 public:
  explicit Int8(const PluginContext& ctx)
      : block_(ctx.params->getInt("block", 256, 4, 1 << 20)),
        error_feedback_(ctx.params->getBool("error_feedback", true)) {
    if (block_ % 4 != 0) {
      throw ConfigError(ctx.params->where("block") + ctx.params->owner() +
                        ": params.block: expected a multiple of 4 (the blocks of int8 "
                        "travel as 4-byte words), found " +
                        std::to_string(block_));
    }
  }

  void prepare(const std::vector<CodecBucket>& buckets, const CodecSetup&) override {
    errors_.clear();
    for (const CodecBucket& bucket : buckets) {
      errors_.push_back(error_feedback_ ? at::zeros_like(bucket.gradient) : at::Tensor());
    }
  }

  void synchronize(CodecBucket& bucket, CodecGroup& group) override {
    at::Tensor gradient = bucket.gradient;  // (numel)
    const int64_t numel = gradient.numel(), blocks = blocksOf(numel);
    if (numel == 0) return;  // nothing to send (plan() says so too)
    const at::Tensor& error = errors_.at(bucket.index);
    if (error_feedback_) gradient.add_(error);  // this rank's part: gradient plus what it owed
    at::Tensor padded = at::zeros({blocks, block_}, gradient.options());  // (blocks, block)
    padded.view({-1}).narrow(0, 0, numel).copy_(gradient);
    at::Tensor scale = padded.abs().amax({1}).div_(127.0);  // (blocks)
    at::Tensor codes =
        padded.div(scale.clamp_min(1e-30).unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar);
    if (error_feedback_) {  // what this rank's codes say, against what it meant
      at::Tensor sent = codes.to(at::kFloat).mul_(scale.unsqueeze(1)).view({-1});
      error.copy_(gradient).sub_(sent.narrow(0, 0, numel));
    }
    const int64_t n = group.size();
    at::Tensor scales = at::empty({n, blocks}, scale.options());       // (N, blocks)
    at::Tensor all = at::empty({n, blocks, block_}, codes.options());  // (N, blocks, block)
    group.allGather(scale, scales);
    group.allGather(codes, all);
    at::Tensor sum = at::zeros({blocks, block_}, gradient.options());  // (blocks, block)
    for (int64_t r = 0; r < n; ++r) {  // in rank order: the same additions on every rank
      sum.add_(all[r].to(at::kFloat).mul_(scales[r].unsqueeze(1)));
    }
    gradient.copy_(sum.view({-1}).narrow(0, 0, numel));
  }

  std::vector<CodecCall> plan(const CodecBucket& bucket, int, int64_t) const override {
    if (bucket.gradient.numel() == 0) return {};
    const int64_t blocks = blocksOf(bucket.gradient.numel());
    return {{Collective::kAllGather, DType::kF32, blocks},
            {Collective::kAllGather, DType::kI32, blocks * block_ / 4}};
  }

  std::vector<std::pair<std::string, at::Tensor>> state() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t b = 0; error_feedback_ && b < errors_.size(); ++b)
      out.emplace_back("error/" + std::to_string(b), errors_[b]);
    return out;
  }

 private:
  int64_t blocksOf(int64_t numel) const { return (numel + block_ - 1) / block_; }

  int64_t block_;
  bool error_feedback_;
  std::vector<at::Tensor> errors_;  // per bucket (numel): what rounding left out
};

}  // namespace
}  // namespace collie::int8

COLLIE_CODEC_PLUGIN("int8", "1.0.0",
                    "gradients as int8 with a scale per block, all-gathered, with error feedback",
                    collie::int8::Int8);
