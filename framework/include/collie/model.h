// The model contract (DESIGN §3): a model plugin builds a LibTorch module from its params,
// computes the loss of a batch of token windows, and accounts for its parameters and FLOPs.
// Models know nothing of communication: the trainer owns the gradients once backward runs.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

#include "collie/plugin.h"

namespace collie {

// What a model eats: windows of seq_len + 1 token ids in [0, vocab).
struct ModelShape {
  int64_t seq_len = 0;
  int64_t vocab = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  // The module the trainer trains. Its parameters() order is the same on every rank and in
  // every run with the same params (the trainer hashes, buckets and checkpoints by it).
  virtual torch::nn::Module& module() = 0;
  virtual ModelShape shape() const = 0;

  // Mean loss over the batch's predicted tokens, as a scalar with a graph.
  //   tokens: (B, seq_len + 1) int64, B >= 1.
  // Throws ConfigError when the batch does not match shape().
  virtual at::Tensor loss(const at::Tensor& tokens) = 0;

  // Predictions per sample that loss() averages over (gpt: seq_len; mlp: 1). The trainer
  // weights each rank's gradient by its share of the step's predictions.
  virtual int64_t targetsPerSample() const = 0;

  // The parameter count by the model's formula (documented in its README). The trainer
  // checks it against the module's actual count and refuses to run when they differ.
  virtual int64_t parameterCount() const = 0;

  // Training FLOPs per input token (forward + backward: 6 N plus attention), for MFU and
  // time projections.
  virtual double flopsPerToken() const = 0;

  // Recomputes activations during backward instead of keeping them (activation
  // checkpointing). Returns false when the model cannot; the trainer then refuses the key.
  virtual bool setGradCheckpointing(bool on) { return !on; }
};

}  // namespace collie

// TYPE derives from collie::Model and has a constructor TYPE(const collie::PluginContext&).
// Model plugins link LibTorch; include this header instead of collie/plugin.h.
#define COLLIE_MODEL_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                                 \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_MODEL, ::collie::Model, NAME, VERSION, DESCRIPTION, \
                              TYPE, 0u)
