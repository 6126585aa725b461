// A codec for the trainer's refusals, kept out of the plugin search path: the float32
// all-reduce as a codec, whose prepare() throws on the rank its `fail_rank` names (-1: none),
// as a codec whose state does not fit one rank's memory would.
#include <string>
#include <vector>

#include "collie/codec.h"

namespace collie {
namespace {

class RefusingCodec final : public Codec {
 public:
  explicit RefusingCodec(const PluginContext& ctx)
      : fail_rank_(static_cast<int>(ctx.params->getInt("fail_rank", -1, -1, 1 << 20))) {}

  void prepare(const std::vector<CodecBucket>&, const CodecSetup& setup) override {
    if (setup.rank == fail_rank_) {
      throw PluginError("codec refusing: rank " + std::to_string(setup.rank) +
                        " refuses to prepare (params.fail_rank)");
    }
  }
  void synchronize(CodecBucket& bucket, CodecGroup& group) override {
    group.allReduce(bucket.gradient, ReduceOp::kSum);
  }
  std::vector<CodecCall> plan(const CodecBucket& bucket, int, int64_t) const override {
    return {{Collective::kAllReduce, DType::kF32, bucket.gradient.numel()}};
  }

 private:
  const int fail_rank_;
};

}  // namespace
}  // namespace collie

COLLIE_CODEC_PLUGIN("refusing", "1.0.0", "a test codec whose prepare() fails on one rank",
                    collie::RefusingCodec);
