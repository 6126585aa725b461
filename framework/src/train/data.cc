// Token sources: synthetic sequences, flat uint16 token files and byte-level text files.
#include "train/data.h"

#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>

#include "collie/error.h"
#include "core/strings.h"
#include "util/files.h"

namespace collie::train {
namespace {

// splitmix64's finaliser: a counter-based generator, so sample i needs no other sample.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Learnable sequences: each token follows from the previous one three times in four
// (t -> 5 t + 3 mod V), otherwise it is drawn uniformly. Loss falls from ln V towards the
// entropy of that rule, so a run shows learning without any file.
class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(uint64_t seed, int64_t vocab)
      : seed_(seed), vocab_(static_cast<uint64_t>(vocab)) {}

  void sample(uint64_t index, int64_t window, int64_t* out) const override {
    const uint64_t state = mix(seed_ ^ mix(index + 1));
    uint64_t token = state % vocab_;
    for (int64_t i = 0; i < window; ++i) {
      if (i > 0) {
        const uint64_t r = mix(state + static_cast<uint64_t>(i));
        token = (r & 3) != 0 ? (token * 5 + 3) % vocab_ : (r >> 8) % vocab_;
      }
      out[i] = static_cast<int64_t>(token);
    }
  }

  std::string describe() const override {
    return fmt::format("synthetic (seed {}, vocab {})", seed_, vocab_);
  }

 private:
  uint64_t seed_, vocab_;
};

// Windows at seeded random offsets of a token array (nanoGPT's sampling), from a file of
// little-endian uint16 ids (`tokens`) or of bytes (`text`).
class FileSource final : public TokenSource {
 public:
  FileSource(const config::DataSpec& spec, int64_t window, int64_t vocab)
      : file_(mapData(spec.path)),
        path_(spec.path),
        seed_(spec.seed),
        text_(spec.source == config::DataSpec::Source::kText) {
    if (!text_ && file_->size() % 2 != 0) {
      throw ConfigError(fmt::format(
          "data.path {}: a tokens file holds uint16 ids (2 bytes each), but it has an odd size "
          "of {} bytes. HINT: for a text file use data.source: text",
          path_, file_->size()));
    }
    count_ = text_ ? file_->size() : file_->size() / 2;
    if (count_ < static_cast<size_t>(window) + 1) {
      throw ConfigError(fmt::format(
          "data.path {}: expected at least {} tokens (the model's seq_len + 2), found {}", path_,
          window + 1, count_));
    }
    if (text_ && vocab < 256) {
      throw ConfigError(fmt::format(
          "data.source text: byte-level tokens need a model vocab of at least 256, found {}. "
          "HINT: set the model's vocab: 256",
          vocab));
    }
    int64_t largest = 0;
    size_t where = 0;
    for (size_t i = 0; i < count_; ++i) {
      if (at(i) > largest) largest = at(i), where = i;
    }
    if (largest >= vocab) {
      throw ConfigError(fmt::format(
          "data.path {}: token {} at index {} is outside the model's vocab ({}). HINT: raise the "
          "model's vocab param",
          path_, largest, where, vocab));
    }
  }

  void sample(uint64_t index, int64_t window, int64_t* out) const override {
    const uint64_t starts = count_ - static_cast<uint64_t>(window) + 1;
    const uint64_t start = mix(seed_ ^ mix(index + 1)) % starts;
    for (int64_t i = 0; i < window; ++i) out[i] = at(start + static_cast<uint64_t>(i));
  }

  std::string describe() const override {
    return fmt::format("{} {} ({} tokens)", text_ ? "text" : "tokens", path_, count_);
  }

 private:
  int64_t at(size_t i) const {
    const uint8_t* b = file_->bytes();
    return text_ ? b[i] : static_cast<int64_t>(b[2 * i] | (b[2 * i + 1] << 8));
  }

  static std::unique_ptr<detail::MappedFile> mapData(const std::string& path) {
    try {
      return std::make_unique<detail::MappedFile>(path);
    } catch (const std::runtime_error& e) {
      throw ConfigError("data.path " + path + ": " + e.what());
    }
  }

  std::unique_ptr<detail::MappedFile> file_;
  std::string path_;
  uint64_t seed_;
  bool text_;
  size_t count_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> openSource(const config::DataSpec& spec, int64_t window,
                                        int64_t vocab) {
  if (spec.source == config::DataSpec::Source::kSynthetic) {
    return std::make_unique<SyntheticSource>(spec.seed, vocab);
  }
  return std::make_unique<FileSource>(spec, window, vocab);
}

at::Tensor batch(const TokenSource& source, uint64_t first, int64_t count, int64_t window) {
  at::Tensor out = at::empty({count, window}, at::kLong);  // (count, window)
  int64_t* data = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) source.sample(first + i, window, data + i * window);
  return out;
}

int64_t Sharding::globalBatch() const {
  return std::accumulate(micro_batch.begin(), micro_batch.end(), int64_t{0}) * grad_accum;
}

uint64_t Sharding::firstSample(int64_t step, int micro, int rank) const {
  const int64_t per_micro = globalBatch() / grad_accum;
  const int64_t before =
      std::accumulate(micro_batch.begin(), micro_batch.begin() + rank, int64_t{0});
  return static_cast<uint64_t>(step * globalBatch() + micro * per_micro + before);
}

namespace {

// `exact` (adding up to `total`) rounded to integers that add up to `total`: floors first,
// then one more for the largest remainders (ties to the lower rank).
std::vector<int> roundKeepingTotal(const std::vector<double>& exact, int total) {
  std::vector<int> out;
  std::vector<std::pair<double, size_t>> remainders;
  int given = 0;
  for (size_t r = 0; r < exact.size(); ++r) {
    out.push_back(static_cast<int>(exact[r]));
    given += out.back();
    remainders.emplace_back(exact[r] - out.back(), r);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int i = 0; i < total - given; ++i) ++out[remainders[i].second];
  return out;
}

}  // namespace

std::vector<int> proportionalSplit(int total, const std::vector<double>& speeds) {
  // Shares in proportion to the speeds, so that every rank's compute takes as long. A rank
  // whose share is under one sample gets one, and the others share what is left in
  // proportion again. (Giving everyone one first and sharing the rest hands a slow rank more
  // than its speed's share: 22 samples at speeds 120, 88 and 63 went [9, 7, 6], the slowest
  // rank's compute 20 % longer than [10, 7, 5].)
  const size_t n = speeds.size();
  std::vector<double> exact(n);
  std::vector<bool> one(n, false);
  for (bool again = true; again;) {
    again = false;
    double rest = total, sum = 0;
    for (size_t r = 0; r < n; ++r) {
      if (one[r]) {
        rest -= 1;
      } else {
        sum += speeds[r];
      }
    }
    for (size_t r = 0; r < n; ++r) {
      exact[r] = one[r] ? 1.0 : rest * speeds[r] / sum;
      if (exact[r] < 1) {
        one[r] = true;
        again = true;
      }
    }
  }
  return roundKeepingTotal(exact, total);
}

Resplit resplit(int total, const std::vector<int>& now, const std::vector<double>& per_sample,
                double hysteresis) {
  COLLIE_CHECK(now.size() == per_sample.size(), "a split of ", now.size(), " ranks with ",
               per_sample.size(), " timings");
  Resplit out;
  out.split = now;
  std::vector<double> speeds;
  for (const double t : per_sample) {
    if (!(t > 0) || !std::isfinite(t)) return out;  // nothing measured: keep the split
    speeds.push_back(1 / t);
  }
  // Halfway from the current split to the proportional one: a rank's time per sample depends
  // on its batch too (fixed costs, a CPU share that its other threads also draw on), so the
  // whole way can overshoot and the next measurement swing back.
  const std::vector<int> target = proportionalSplit(total, speeds);
  std::vector<double> halfway;
  for (size_t r = 0; r < now.size(); ++r) halfway.push_back(0.5 * (now[r] + target[r]));
  out.split = roundKeepingTotal(halfway, total);
  if (out.split == now) out.split = target;  // a sample or two away: the rest of the way
  auto slowest = [&](const std::vector<int>& split) {
    double most = 0;
    for (size_t r = 0; r < split.size(); ++r) most = std::max(most, split[r] * per_sample[r]);
    return most;
  };
  out.slowest_now = slowest(now);
  out.slowest_next = slowest(out.split);
  out.take = out.split != now && out.slowest_next < (1 - hysteresis) * out.slowest_now;
  return out;
}

}  // namespace collie::train
