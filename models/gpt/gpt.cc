// The `gpt` model: a decoder-only transformer (GPT-2 layout, the MicroPLLM family) with
// pre-norm blocks, causal multi-head self-attention, a GELU MLP and an output head tied to
// the token embedding. Written against the LibTorch API common to 1.13 and 2.x.
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "collie/autocast.h"
#include "collie/model.h"

namespace collie {
namespace {

struct GptShape {
  int64_t layers, d_model, heads, seq_len, vocab, mlp_ratio;
  double dropout;
};

// Dropout with the probability of the shape, drawing from the rank's generator (the model's
// setGenerator), which every module of the net shares.
struct Dropout {
  double p;
  const at::Generator* generator;
  at::Tensor operator()(const at::Tensor& x, bool training) const {
    return dropout(x, p, training, *generator);
  }
};

// Causal multi-head self-attention.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const GptShape& s, const at::Generator* generator)
      : heads(s.heads),
        qkv(register_module("qkv", torch::nn::Linear(s.d_model, 3 * s.d_model))),
        proj(register_module("proj", torch::nn::Linear(s.d_model, s.d_model))),
        drop{s.dropout, generator} {
    // (S, S): true above the diagonal, where a position would see the future.
    future = register_buffer("future", torch::ones({s.seq_len, s.seq_len}, torch::kBool).triu(1));
  }

  // x: (B, T, C) -> (B, T, C)
  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads;
    at::Tensor qkv_heads = qkv->forward(x).view({B, T, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    at::Tensor q = qkv_heads[0], k = qkv_heads[1], v = qkv_heads[2];  // (B, H, T, hd)
    at::Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = att.masked_fill(future.narrow(0, 0, T).narrow(1, 0, T),
                          -std::numeric_limits<float>::infinity());  // (B, H, T, T)
    att = drop(torch::softmax(att, -1), is_training());
    at::Tensor y = att.matmul(v).transpose(1, 2).contiguous().view({B, T, C});  // (B, T, C)
    return drop(proj->forward(y), is_training());
  }

  int64_t heads;
  torch::nn::Linear qkv, proj;
  Dropout drop;
  at::Tensor future;
};
TORCH_MODULE(Attention);

// One pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl(const GptShape& s, const at::Generator* generator)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        attn(register_module("attn", Attention(s, generator))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))),
        fc(register_module("fc", torch::nn::Linear(s.d_model, s.mlp_ratio * s.d_model))),
        fc_out(register_module("fc_out", torch::nn::Linear(s.mlp_ratio * s.d_model, s.d_model))),
        drop{s.dropout, generator} {}

  // x: (B, T, C) -> (B, T, C)
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + attn->forward(ln1->forward(x));
    return h + drop(fc_out->forward(torch::gelu(fc->forward(ln2->forward(h)))), is_training());
  }

  torch::nn::LayerNorm ln1;
  Attention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, fc_out;
  Dropout drop;
};
TORCH_MODULE(Block);

// The autocast state of the forward on the block's device type, put back while backward
// replays it (as PyTorch's torch.utils.checkpoint does): a replay in another precision
// computes another function.
class ReplayAutocast {
 public:
  ReplayAutocast(at::DeviceType type, bool enabled, at::ScalarType dtype)
      : type_(type),
        was_enabled_(autocast::enabled(type)),
        was_dtype_(autocast::dtype(type)),
        enabled_(enabled) {
    autocast::set(type_, enabled, dtype);
  }
  ~ReplayAutocast() {
    autocast::set(type_, was_enabled_, was_dtype_);
    // Casts cached during the replay are of this step's weights: never reuse them later.
    if (enabled_ && !was_enabled_) at::autocast::clear_cache();
  }
  ReplayAutocast(const ReplayAutocast&) = delete;
  ReplayAutocast& operator=(const ReplayAutocast&) = delete;

 private:
  at::DeviceType type_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
  bool enabled_;
};

// Activation checkpointing of one block: forward keeps only the block's input; backward
// replays the forward (with the same dropout randomness and autocast state) and
// backpropagates through it.
class CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                            int64_t block_address) {
    ctx->saved_data["block"] = block_address;
    const at::DeviceType type = x.device().type();
    BlockImpl* block = blockAt(block_address);
    ctx->saved_data["rng"] = generatorState(*block->drop.generator);
    ctx->saved_data["autocast"] = autocast::enabled(type);
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(autocast::dtype(type));
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return block->forward(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    BlockImpl* block = blockAt(ctx->saved_data["block"].toInt());
    const at::Generator generator = *block->drop.generator;
    const at::Tensor resume = generatorState(generator);
    setGeneratorState(generator, ctx->saved_data["rng"].toTensor());
    at::Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      ReplayAutocast replay(x.device().type(), ctx->saved_data["autocast"].toBool(),
                            static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt()));
      y = block->forward(x);
    }
    setGeneratorState(generator, resume);
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), at::Tensor()};
  }

 private:
  static BlockImpl* blockAt(int64_t address) { return reinterpret_cast<BlockImpl*>(address); }
  // The state of the rank's generator, which dropout draws from. Undefined (no generator
  // yet, so no dropout can draw): an empty state, restored as nothing.
  static at::Tensor generatorState(at::Generator generator) {  // a handle: shares the state
    if (!generator.defined()) return at::Tensor();
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }
  static void setGeneratorState(at::Generator generator, const at::Tensor& state) {
    if (!generator.defined()) return;
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
};

struct GptNetImpl : torch::nn::Module {
  GptNetImpl(const GptShape& s, const at::Generator* generator)
      : wte(register_module("wte", torch::nn::Embedding(s.vocab, s.d_model))),
        wpe(register_module("wpe", torch::nn::Embedding(s.seq_len, s.d_model))),
        drop{s.dropout, generator},
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})))) {
    for (int64_t l = 0; l < s.layers; ++l) blocks->push_back(Block(s, generator));
    // GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(s.layers));
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      if (name.find("ln") != std::string::npos) continue;  // LayerNorm keeps 1 and 0
      if (name.size() > 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
        torch::nn::init::zeros_(p.value());
      } else if (name.find("proj.weight") != std::string::npos ||
                 name.find("fc_out.weight") != std::string::npos) {
        torch::nn::init::normal_(p.value(), 0.0, residual_std);
      } else {
        torch::nn::init::normal_(p.value(), 0.0, 0.02);
      }
    }
  }

  // idx: (B, T) int64 -> logits (B, T, vocab)
  at::Tensor forward(const at::Tensor& idx) {
    const int64_t T = idx.size(1);
    at::Tensor positions = torch::arange(T, idx.options());                     // (T)
    at::Tensor x = drop(wte->forward(idx) + wpe->forward(positions), is_training());  // (B, T, C)
    size_t unit = 0;
    for (const auto& module : *blocks) {
      BlockImpl* block = module->as<BlockImpl>();
      if (gate != nullptr) x = gate->enter(unit, x);
      if (checkpointing && x.requires_grad()) {
        x = CheckpointedBlock::apply(x, reinterpret_cast<int64_t>(block));
      } else {
        x = block->forward(x);
      }
      if (gate != nullptr) x = gate->leave(unit, x);
      ++unit;
    }
    x = ln_f->forward(x);
    return x.matmul(wte->weight.t());  // tied head: (B, T, vocab)
  }

  torch::nn::Embedding wte, wpe;
  Dropout drop;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  bool checkpointing = false;
  UnitGate* gate = nullptr;  // stage 3: around every block
};
TORCH_MODULE(GptNet);

class GptModel final : public Model {
 public:
  explicit GptModel(const PluginContext& ctx)
      : s_(readShape(*ctx.params)), net_(s_, &generator_) {}

  torch::nn::Module& module() override { return *net_; }
  ModelShape shape() const override { return {s_.seq_len, s_.vocab}; }
  int64_t targetsPerSample() const override { return s_.seq_len; }

  // tokens: (B, T + 1); positions 0..T-1 predict positions 1..T.
  at::Tensor loss(const at::Tensor& tokens) override {
    if (tokens.dim() != 2 || tokens.size(1) != s_.seq_len + 1) {
      throw ConfigError(detail::concat("model 'gpt': expected a batch of shape (B, ",
                                       s_.seq_len + 1, "), found ", tokens.sizes()));
    }
    at::Tensor logits = net_->forward(tokens.narrow(1, 0, s_.seq_len));  // (B, T, V)
    at::Tensor targets = tokens.narrow(1, 1, s_.seq_len);                // (B, T)
    return torch::nn::functional::cross_entropy(logits.reshape({-1, s_.vocab}),
                                                targets.reshape({-1}));
  }

  // N = V d + S d + L ((4 + 2 r) d^2 + (9 + r) d) + 2 d   (tied head, biases, LayerNorms)
  int64_t parameterCount() const override {
    const int64_t d = s_.d_model, r = s_.mlp_ratio;
    return s_.vocab * d + s_.seq_len * d + s_.layers * ((4 + 2 * r) * d * d + (9 + r) * d) + 2 * d;
  }

  // 6 per weight of every matrix multiply (blocks and the tied head) plus attention's
  // 12 L S d (scores and weighted values, forward and backward, full S as in PaLM's MFU).
  double flopsPerToken() const override {
    const double d = static_cast<double>(s_.d_model), L = static_cast<double>(s_.layers);
    const double matmul_weights = L * (4.0 + 2.0 * static_cast<double>(s_.mlp_ratio)) * d * d +
                                  static_cast<double>(s_.vocab) * d;
    return 6.0 * matmul_weights + 12.0 * L * static_cast<double>(s_.seq_len) * d;
  }

  bool setGradCheckpointing(bool on) override {
    net_->checkpointing = on;
    return true;
  }

  // Every block is a unit; the embeddings (the token embedding is the tied head too) and
  // the final LayerNorm are the root.
  std::vector<std::vector<std::string>> units() const override {
    std::vector<std::vector<std::string>> units;
    for (const auto& block : net_->blocks->named_children()) {
      units.emplace_back();
      for (const auto& p : block.value()->named_parameters()) {
        units.back().push_back("blocks." + block.key() + "." + p.key());
      }
    }
    return units;
  }
  void setUnitGate(UnitGate* gate) override { net_->gate = gate; }
  void setGenerator(at::Generator generator) override { generator_ = std::move(generator); }

 private:
  static GptShape readShape(const Params& p) {
    GptShape s{};
    s.layers = p.getInt("layers", 4, 1, 1024);
    s.d_model = p.getInt("d_model", 256, 1, 1 << 16);
    s.heads = p.getInt("heads", 4, 1, 1024);
    s.seq_len = p.getInt("seq_len", 256, 1, 1 << 20);
    s.vocab = p.getInt("vocab", 8192, 2, 1 << 24);
    s.mlp_ratio = p.getInt("mlp_ratio", 4, 1, 64);
    s.dropout = p.getDouble("dropout", 0.0);
    if (s.d_model % s.heads != 0) {
      throw ConfigError(detail::concat(p.where("heads"), "model 'gpt': param 'heads': expected a ",
                                       "divisor of d_model (", s.d_model, "), found ", s.heads,
                                       ". HINT: d_model = heads x head size, e.g. 768 = 12 x 64"));
    }
    if (!(s.dropout >= 0.0 && s.dropout < 1.0)) {
      throw ConfigError(detail::concat(p.where("dropout"),
                                       "model 'gpt': param 'dropout': expected a number in [0, 1), "
                                       "found ",
                                       s.dropout));
    }
    return s;
  }

  GptShape s_;
  at::Generator generator_;  // the rank's, shared by every dropout of net_
  GptNet net_;
};

}  // namespace
}  // namespace collie

COLLIE_MODEL_PLUGIN("gpt", "1.0.0",
                    "decoder-only transformer: pre-norm blocks, causal attention, tied head",
                    collie::GptModel);
