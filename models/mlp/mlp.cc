// The `mlp` model: a small next-token MLP (Bengio et al. 2003 style) on windows of tokens,
// fast enough for multi-rank training tests on two CPU cores.
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "collie/model.h"

namespace collie {
namespace {

struct MlpNetImpl : torch::nn::Module {
  MlpNetImpl(int64_t seq_len, int64_t vocab, int64_t d_embed, int64_t hidden, int64_t layers,
             double dropout, const at::Generator* generator)
      : embed(register_module("embed", torch::nn::Embedding(vocab, d_embed))),
        hidden_layers(register_module("hidden", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(hidden, vocab))),
        p_drop(dropout),
        generator(generator) {
    int64_t in = seq_len * d_embed;
    for (int64_t l = 0; l < layers; ++l) {
      hidden_layers->push_back(torch::nn::Linear(in, hidden));
      in = hidden;
    }
    for (auto& p : named_parameters()) {
      if (p.key().find("bias") != std::string::npos) {
        torch::nn::init::zeros_(p.value());
      } else {
        torch::nn::init::normal_(p.value(), 0.0, 0.02);
      }
    }
  }

  // x: (B, T) int64 -> logits (B, vocab)
  // Stage 3 passes every layer through the gate: unit 0 the embedding, 1..L the hidden
  // layers, L + 1 the head.
  at::Tensor forward(const at::Tensor& x) {
    size_t unit = 0;
    at::Tensor h = enter(unit, x);
    h = leave(unit++, embed->forward(h)).flatten(1);  // (B, T * d_embed)
    for (const auto& layer : *hidden_layers) {
      h = enter(unit, h);
      h = leave(unit++, layer->as<torch::nn::Linear>()->forward(h));
      h = dropout(torch::gelu(h), p_drop, is_training(), *generator);  // (B, hidden)
    }
    h = enter(unit, h);
    return leave(unit, head->forward(h));  // (B, vocab)
  }
  at::Tensor enter(size_t unit, const at::Tensor& x) {
    return gate != nullptr ? gate->enter(unit, x) : x;
  }
  at::Tensor leave(size_t unit, const at::Tensor& y) {
    return gate != nullptr ? gate->leave(unit, y) : y;
  }

  torch::nn::Embedding embed;
  torch::nn::ModuleList hidden_layers;
  torch::nn::Linear head;
  double p_drop;
  const at::Generator* generator;  // the rank's (the model's setGenerator)
  UnitGate* gate = nullptr;
};
TORCH_MODULE(MlpNet);

class MlpModel final : public Model {
 public:
  explicit MlpModel(const PluginContext& ctx)
      : seq_len_(ctx.params->getInt("seq_len", 8, 1, 4096)),
        vocab_(ctx.params->getInt("vocab", 256, 2, 1 << 20)),
        d_embed_(ctx.params->getInt("d_embed", 32, 1, 1 << 16)),
        hidden_(ctx.params->getInt("hidden", 256, 1, 1 << 16)),
        layers_(ctx.params->getInt("layers", 2, 1, 64)),
        net_(seq_len_, vocab_, d_embed_, hidden_, layers_, dropoutParam(ctx), &generator_) {}

  torch::nn::Module& module() override { return *net_; }
  ModelShape shape() const override { return {seq_len_, vocab_}; }
  int64_t targetsPerSample() const override { return 1; }

  // tokens: (B, T + 1); the first T predict the last.
  at::Tensor loss(const at::Tensor& tokens) override {
    if (tokens.dim() != 2 || tokens.size(1) != seq_len_ + 1) {
      throw ConfigError(detail::concat("model 'mlp': expected a batch of shape (B, ", seq_len_ + 1,
                                       "), found ", tokens.sizes()));
    }
    at::Tensor logits = net_->forward(tokens.narrow(1, 0, seq_len_));  // (B, vocab)
    return torch::nn::functional::cross_entropy(logits, tokens.select(1, seq_len_));
  }

  // embed V*E; first layer T*E*H + H; further layers H*H + H; head H*V + V.
  int64_t parameterCount() const override {
    return vocab_ * d_embed_ + (seq_len_ * d_embed_ * hidden_ + hidden_) +
           (layers_ - 1) * (hidden_ * hidden_ + hidden_) + (hidden_ * vocab_ + vocab_);
  }

  // Every layer is a unit (the embedding, each hidden layer, the head), in forward order.
  std::vector<std::vector<std::string>> units() const override {
    std::vector<std::vector<std::string>> units = {{"embed.weight"}};
    for (int64_t l = 0; l < layers_; ++l) {
      const std::string layer = "hidden." + std::to_string(l);
      units.push_back({layer + ".weight", layer + ".bias"});
    }
    units.push_back({"head.weight", "head.bias"});
    return units;
  }
  void setUnitGate(UnitGate* gate) override { net_->gate = gate; }
  void setGenerator(at::Generator generator) override { generator_ = std::move(generator); }

  // 6 FLOPs per multiply-accumulate weight per sample, spread over the T input tokens.
  double flopsPerToken() const override {
    const double weights = static_cast<double>(parameterCount() - vocab_ * d_embed_);
    return 6.0 * weights / static_cast<double>(seq_len_);
  }

 private:
  static double dropoutParam(const PluginContext& ctx) {
    const double p = ctx.params->getDouble("dropout", 0.0);
    if (!(p >= 0.0 && p < 1.0)) {
      throw ConfigError(detail::concat(ctx.params->where("dropout"),
                                       "model 'mlp': param 'dropout': expected a number in [0, 1), "
                                       "found ",
                                       p));
    }
    return p;
  }

  int64_t seq_len_, vocab_, d_embed_, hidden_, layers_;
  at::Generator generator_;  // the rank's, which the net's dropout draws from
  MlpNet net_;
};

}  // namespace
}  // namespace collie

COLLIE_MODEL_PLUGIN("mlp", "1.0.0", "next-token MLP over a window of embedded tokens (tests)",
                    collie::MlpModel);
