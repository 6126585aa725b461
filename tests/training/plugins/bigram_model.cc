// A model for the trainer's refusals, kept out of the plugin search path: a bigram table
// (the last token's row of logits predicts the next) that declares no units, or with
// `units: unknown` one naming a parameter it lacks; with `dropout: global` it draws its
// dropout from LibTorch's global generator, which the model contract forbids.
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>

#include "collie/model.h"

namespace collie {
namespace {

struct BigramNetImpl : torch::nn::Module {
  explicit BigramNetImpl(int64_t vocab)
      : table(register_module("table", torch::nn::Embedding(vocab, vocab))) {}
  torch::nn::Embedding table;
};
TORCH_MODULE(BigramNet);

class BigramModel final : public Model {
 public:
  explicit BigramModel(const PluginContext& ctx)
      : seq_len_(ctx.params->getInt("seq_len", 4, 1, 4096)),
        vocab_(ctx.params->getInt("vocab", 32, 2, 4096)),
        unknown_unit_(ctx.params->getString("units", "none") == "unknown"),
        global_dropout_(ctx.params->getString("dropout", "none") == "global"),
        net_(vocab_) {}

  torch::nn::Module& module() override { return *net_; }
  ModelShape shape() const override { return {seq_len_, vocab_}; }
  int64_t targetsPerSample() const override { return 1; }
  at::Tensor loss(const at::Tensor& tokens) override {
    at::Tensor logits = net_->table->forward(tokens.select(1, seq_len_ - 1));
    if (global_dropout_) {
      logits = torch::nn::functional::dropout(
          logits, torch::nn::functional::DropoutFuncOptions().p(0.5).training(true));
    }
    return torch::nn::functional::cross_entropy(logits, tokens.select(1, seq_len_));
  }
  int64_t parameterCount() const override { return vocab_ * vocab_; }
  double flopsPerToken() const override { return 0; }
  std::vector<std::vector<std::string>> units() const override {
    if (unknown_unit_) return {{"table.weight"}, {"head.weight"}};
    return {};
  }

 private:
  int64_t seq_len_, vocab_;
  bool unknown_unit_, global_dropout_;
  BigramNet net_;
};

}  // namespace
}  // namespace collie

COLLIE_MODEL_PLUGIN("bigram", "1.0.0", "a bigram table without units (tests)", collie::BigramModel);
