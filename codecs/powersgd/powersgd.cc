// powersgd: every matrix of a bucket's gradients sent as two thin factors (PowerSGD, Vogels,
// Karimireddy and Jaggi, 2019; the algorithm of PyTorch DDP's powerSGD_hook). For a
// gradient M (n, m) and a rank r, with Q (m, r) kept from the previous step:
//   P = M Q, all-reduced; P orthogonalised (Gram-Schmidt);
//   Q = Mᵀ P, all-reduced; M is replaced by P Qᵀ, the same on every rank.
// Each rank sends r (n + m) floats instead of n m. What the approximation leaves out of a
// rank's part is added to its next gradient (error feedback): error = M - share × P Qᵀ,
// with M this rank's part (gradient plus its previous error) and share its weight in the
// sum. Vectors, and matrices too small to gain min_compression_rate, are summed whole in
// one float32 all-reduce of their concatenation.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "collie/codec.h"

namespace collie::powersgd {
namespace {

// One parameter's gradient, compressed: its view (n, m) ≈ P Qᵀ.
struct Matrix {
  size_t parameter = 0;  // in CodecBucket::parameters
  int64_t n = 0, m = 0, r = 0;
  int64_t p_at = 0, q_at = 0, error_at = 0;  // offsets into the bucket's P, Q and error
};

// What the codec keeps of one bucket.
struct BucketState {
  std::vector<Matrix> matrices;
  std::vector<size_t> whole;  // parameters summed uncompressed
  int64_t p_numel = 0, q_numel = 0, error_numel = 0, whole_numel = 0;
  at::Tensor q;      // (q_numel) every matrix's Q, kept from step to step (warm start)
  at::Tensor error;  // (error_numel) every matrix's error feedback
};

class PowerSgd final : public Codec {
 public:
  explicit PowerSgd(const PluginContext& ctx)
      : rank_(ctx.params->getInt("rank", 1, 1, 1 << 16)),
        start_step_(ctx.params->getInt("start_step", 0, 0, int64_t{1} << 40)),
        min_rate_(ctx.params->getDouble("min_compression_rate", 2.0)),
        error_feedback_(ctx.params->getBool("error_feedback", true)),
        warm_start_(ctx.params->getBool("warm_start", true)),
        epsilon_(ctx.params->getDouble("orthogonalization_epsilon", 0.0)) {
    if (!(min_rate_ >= 1.0 && min_rate_ <= 1e6)) {
      throw ConfigError(ctx.params->where("min_compression_rate") + ctx.params->owner() +
                        ": params.min_compression_rate: expected a number from 1 to "
                        "1e6, found " +
                        std::to_string(min_rate_));
    }
    if (!(epsilon_ >= 0.0 && epsilon_ <= 1.0)) {
      throw ConfigError(ctx.params->where("orthogonalization_epsilon") + ctx.params->owner() +
                        ": params.orthogonalization_epsilon: expected a number from 0 "
                        "to 1, found " +
                        std::to_string(epsilon_));
    }
  }

  void prepare(const std::vector<CodecBucket>& buckets, const CodecSetup& setup) override {
    seed_ = setup.seed;
    states_.clear();
    for (const CodecBucket& bucket : buckets) {
      BucketState state = layout(bucket);
      const at::TensorOptions options = bucket.gradient.options();
      state.q = at::zeros({state.q_numel}, options);
      if (error_feedback_) state.error = at::zeros({state.error_numel}, options);
      if (warm_start_) draw(bucket, state);
      states_.push_back(std::move(state));
    }
  }

  void synchronize(CodecBucket& bucket, CodecGroup& group) override {
    BucketState& state = states_.at(bucket.index);
    if (bucket.step < start_step_ || state.matrices.empty()) {
      group.allReduce(bucket.gradient, ReduceOp::kSum);  // the warm-up: float32, whole
      return;
    }
    sumWhole(bucket, state, group);
    if (!warm_start_) draw(bucket, state);
    std::vector<at::Tensor> ms;  // (n, m) each: this rank's part, error added
    for (const Matrix& x : state.matrices) {
      at::Tensor m = bucket.parameters[x.parameter].reshape({x.n, x.m});
      if (error_feedback_) m.add_(errorOf(state, x));
      ms.push_back(m);
    }
    at::Tensor p = at::empty({state.p_numel}, bucket.gradient.options());  // every P
    for (size_t i = 0; i < ms.size(); ++i) {
      const Matrix& x = state.matrices[i];
      at::Tensor pi = factor(p, x.p_at, x.n, x.r);
      at::mm_out(pi, ms[i], factor(state.q, x.q_at, x.m, x.r));
    }
    group.allReduce(p, ReduceOp::kSum);
    for (const Matrix& x : state.matrices) orthogonalise(factor(p, x.p_at, x.n, x.r));
    for (size_t i = 0; i < ms.size(); ++i) {
      const Matrix& x = state.matrices[i];
      at::Tensor qi = factor(state.q, x.q_at, x.m, x.r);
      at::mm_out(qi, ms[i].t(), factor(p, x.p_at, x.n, x.r));
    }
    group.allReduce(state.q, ReduceOp::kSum);
    for (size_t i = 0; i < ms.size(); ++i) {
      const Matrix& x = state.matrices[i];
      at::Tensor approx =
          at::mm(factor(p, x.p_at, x.n, x.r), factor(state.q, x.q_at, x.m, x.r).t());  // (n, m)
      if (error_feedback_) errorOf(state, x).copy_(ms[i]).sub_(approx, bucket.share);
      ms[i].copy_(approx);  // into the bucket's gradient, through the view
    }
  }

  std::vector<CodecCall> plan(const CodecBucket& bucket, int, int64_t step) const override {
    const BucketState state = layout(bucket);
    if (step < start_step_ || state.matrices.empty()) {
      return {{Collective::kAllReduce, DType::kF32, bucket.gradient.numel()}};
    }
    std::vector<CodecCall> calls;
    if (state.whole_numel > 0)
      calls.push_back({Collective::kAllReduce, DType::kF32, state.whole_numel});
    calls.push_back({Collective::kAllReduce, DType::kF32, state.p_numel});
    calls.push_back({Collective::kAllReduce, DType::kF32, state.q_numel});
    return calls;
  }

  std::vector<std::pair<std::string, at::Tensor>> state() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t b = 0; b < states_.size(); ++b) {
      if (states_[b].matrices.empty()) continue;
      out.emplace_back("q/" + std::to_string(b), states_[b].q);
      if (error_feedback_) out.emplace_back("error/" + std::to_string(b), states_[b].error);
    }
    return out;
  }

 private:
  // Which of the bucket's parameters are compressed, and where their factors lie (no
  // tensors: prepare() allocates them). A
  // parameter of two or more dimensions is the matrix (its first dimension, the rest); it is
  // compressed when its n m elements are at least min_compression_rate times r (n + m).
  BucketState layout(const CodecBucket& bucket) const {
    BucketState state;
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      const at::Tensor& view = bucket.parameters[k];
      const int64_t n = view.dim() >= 2 ? view.size(0) : 0;
      const int64_t m = n > 0 ? view.numel() / n : 0;
      const int64_t r = std::min({rank_, n, m});
      if (r < 1 || static_cast<double>(n * m) < min_rate_ * static_cast<double>(r * (n + m))) {
        state.whole.push_back(k);
        state.whole_numel += view.numel();
        continue;
      }
      state.matrices.push_back({k, n, m, r, state.p_numel, state.q_numel, state.error_numel});
      state.p_numel += n * r;
      state.q_numel += m * r;
      state.error_numel += n * m;
    }
    return state;
  }

  // The vectors and small matrices: their concatenation summed in one all-reduce.
  void sumWhole(CodecBucket& bucket, const BucketState& state, CodecGroup& group) const {
    if (state.whole_numel == 0) return;
    std::vector<at::Tensor> parts;
    for (size_t k : state.whole) parts.push_back(bucket.parameters[k].reshape({-1}));
    at::Tensor flat = at::cat(parts);  // (whole_numel)
    group.allReduce(flat, ReduceOp::kSum);
    int64_t at = 0;
    for (size_t k : state.whole) {
      at::Tensor& view = bucket.parameters[k];
      view.copy_(flat.narrow(0, at, view.numel()).view(view.sizes()));
      at += view.numel();
    }
  }

  // A random start for every Q of the bucket, the same on every rank: standard normal draws
  // from a generator of the codec's own, seeded by train.seed and the bucket. With a warm
  // start, once (in prepare, so that state() holds the first Q); without, every step (the
  // step in the seed).
  void draw(const CodecBucket& bucket, BucketState& state) const {
    uint64_t seed = seed_ * 0x9E3779B97F4A7C15ull + bucket.index + 1;
    if (!warm_start_) seed += static_cast<uint64_t>(bucket.step) * 0xBF58476D1CE4E5B9ull;
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    state.q.copy_(at::randn({state.q_numel}, generator, at::kFloat));
  }

  static at::Tensor factor(const at::Tensor& flat, int64_t at, int64_t rows, int64_t r) {
    return flat.narrow(0, at, rows * r).view({rows, r});
  }
  static at::Tensor errorOf(const BucketState& state, const Matrix& x) {
    return state.error.narrow(0, x.error_at, x.n * x.m).view({x.n, x.m});
  }

  // Gram-Schmidt on the columns of p (rows, r), in place: each column divided by its norm
  // (plus epsilon, and never by less than the smallest normal float, so that a zero column
  // stays zero rather than NaN), then taken out of the ones after it.
  void orthogonalise(at::Tensor p) const {
    const int64_t r = p.size(1);
    for (int64_t i = 0; i < r; ++i) {
      at::Tensor column = p.narrow(1, i, 1);  // (rows, 1)
      column.div_(column.norm().add_(epsilon_).clamp_min_(std::numeric_limits<float>::min()));
      if (i + 1 == r) break;
      at::Tensor rest = p.narrow(1, i + 1, r - i - 1);  // (rows, r - i - 1)
      rest.sub_(at::mm(column, at::mm(column.t(), rest)));
    }
  }

  int64_t rank_, start_step_;
  double min_rate_;
  bool error_feedback_, warm_start_;
  double epsilon_;
  uint64_t seed_ = 0;
  std::vector<BucketState> states_;
};

}  // namespace
}  // namespace collie::powersgd

COLLIE_CODEC_PLUGIN("powersgd", "1.0.0",
                    "each gradient matrix as two rank-r factors with error feedback (PowerSGD)",
                    collie::powersgd::PowerSgd);
