// The model contract: a model plugin builds a LibTorch module from its params,
// computes the loss of a batch of token windows, and accounts for its parameters and FLOPs.
// Models know nothing of communication: the trainer owns the gradients once backward runs.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/ops/empty_like.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collie/plugin.h"

namespace collie {

// ZeRO stage 3 (train.sharding: parameters) keeps only a shard of every parameter on each
// rank and gathers a unit's parameters just before the unit computes, in forward and again
// in backward. The trainer implements the gate; a model that declares units() calls it
// around each unit's computation while one is set (docs/writing-a-model.md).
class UnitGate {
 public:
  virtual ~UnitGate() = default;
  // Before unit `unit` computes on `x` (its input, part of the graph): gathers the unit's
  // parameters (and starts gathering the next unit's). Returns the tensor to compute on: x's
  // values, through a node whose backward frees what backward no longer needs.
  virtual at::Tensor enter(size_t unit, const at::Tensor& x) = 0;
  // After the unit computed `y`: frees its parameters until backward. Returns the tensor to
  // continue with: y's values, through a node whose backward gathers them again.
  virtual at::Tensor leave(size_t unit, const at::Tensor& y) = 0;
};

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

  // The parameter units for stage 3 (FSDP's wrapped modules), in the order forward computes
  // them: each the names (as module().named_parameters() gives them) of parameters used only
  // inside that unit's computation. Parameters in no unit (a tied embedding used at both
  // ends, say) form the root, gathered for the whole step. Empty, the default: the model
  // cannot shard its parameters and the trainer refuses train.sharding: parameters.
  virtual std::vector<std::vector<std::string>> units() const { return {}; }
  // The gate to call around each unit's computation in loss(); nullptr (the default
  // state) when parameters are not sharded.
  virtual void setUnitGate(UnitGate* gate) { (void)gate; }

  // The generator every random draw in loss() must use (dropout's masks, for one): the
  // rank's own, on the training device, which the trainer reseeds before each step to a
  // function of (seed, rank, step). A model never draws from LibTorch's global generators:
  // ranks may be threads of one process, which share them, so the draws would follow the
  // threads' timing; the trainer refuses a model whose step moved the global generator.
  // Called once, before the first step; a model without randomness ignores it.
  virtual void setGenerator(at::Generator generator) { (void)generator; }
};

// Inverted dropout whose mask comes from `generator` (LibTorch 1.13's dropout takes no
// generator and draws from the global one). Returns x itself when not training or p is 0.
inline at::Tensor dropout(const at::Tensor& x, double p, bool training,
                          const at::Generator& generator) {
  if (!training || p == 0.0) return x;
  if (!generator.defined()) {
    throw InternalError(
        "collie::dropout: no generator: the model draws before the trainer called "
        "setGenerator()");
  }
  at::Tensor keep = at::empty_like(x, at::MemoryFormat::Contiguous);
  keep.bernoulli_(1.0 - p, generator);
  return x * keep.div_(1.0 - p);
}

}  // namespace collie

// TYPE derives from collie::Model and has a constructor TYPE(const collie::PluginContext&).
// Model plugins link LibTorch; include this header instead of collie/plugin.h.
#define COLLIE_MODEL_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                                 \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_MODEL, ::collie::Model, NAME, VERSION, DESCRIPTION, \
                              TYPE, 0u)
