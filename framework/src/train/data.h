// Training data: where each sample's tokens come from. Sample i of a run is a
// pure function of the source, the seed and i, so every rank computes its own share and a
// resumed run sees exactly the samples it would have seen.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/experiment.h"

namespace collie::train {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes sample `index`'s window of `window` token ids (seq_len + 1) to `out`.
  virtual void sample(uint64_t index, int64_t window, int64_t* out) const = 0;
  // "synthetic (seed 1234)", "tokens data/train.bin (1,048,576 tokens)".
  virtual std::string describe() const = 0;
};

// Opens the spec's source for a model reading windows of `window` tokens below `vocab`.
// Throws ConfigError when the file is missing, unreadable, shorter than two windows, or
// holds a token the model cannot embed.
std::unique_ptr<TokenSource> openSource(const config::DataSpec& spec, int64_t window,
                                        int64_t vocab);

// Samples [first, first + count) as a (count, window) int64 tensor.
at::Tensor batch(const TokenSource& source, uint64_t first, int64_t count, int64_t window);

// Which samples a rank reads: a step's global batch is every rank's micro-batches in rank
// order, micro-batch after micro-batch, so that N ranks together read exactly the batch one
// process with the summed micro-batch reads.
struct Sharding {
  std::vector<int> micro_batch;  // per rank
  int grad_accum = 1;

  int64_t globalBatch() const;  // samples per step, all ranks
  // The first sample of `rank`'s micro-batch `micro` in step `step`.
  uint64_t firstSample(int64_t step, int micro, int rank) const;
};

// `total` samples split in proportion to each rank's `speeds` (largest remainders), at
// least one each: a rank whose share is under one gets one, and the others share the rest in
// proportion. Requires total >= speeds.size() and positive speeds.
std::vector<int> proportionalSplit(int total, const std::vector<double>& speeds);

// micro_batch: auto during a run. `total` samples are split now as `now`, and rank r took
// `per_sample[r]` seconds of compute per sample: a split halfway to the one in proportion to
// the speeds (all the way when that is a sample or two), and whether to take it: only when
// it predicts the slowest rank's compute (its samples times its time per sample) at least
// `hysteresis` shorter, so that noise does not move samples back and forth.
struct Resplit {
  std::vector<int> split;
  double slowest_now = 0, slowest_next = 0;  // seconds per micro-batch, predicted
  bool take = false;
};
Resplit resplit(int total, const std::vector<int>& now, const std::vector<double>& per_sample,
                double hysteresis);

}  // namespace collie::train
