// The loaders of untrusted files under AddressSanitizer: this test and the sources that read
// configs, rules files and checkpoints are built with -fsanitize=address (tests/CMakeLists).
// COLLIE_FUZZ_RUNS mutants (default 20,000) of every shipped config, of rules files and of
// checkpoints must each load or be refused with collie's error for that file: never a crash
// (ASan aborts on a bad read or write), a hang, or another exception. A failure names the
// iteration and leaves its input beside the test's scratch files.
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "collie/error.h"
#include "config/experiment.h"
#include "config/rules.h"
#include "format_one.h"
#include "mutator.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

int runs() {
  const char* text = std::getenv("COLLIE_FUZZ_RUNS");
  return text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 20000;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path scratch() {
  const fs::path dir = fs::temp_directory_path() / ("collie-fuzz-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

void writeFile(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Words a mutant may gain: YAML syntax and collie's keys and values.
std::vector<std::string> yamlTokens() {
  return {": ",
          "- ",
          "\n  ",
          "{",
          "}",
          "[",
          "]",
          ", ",
          "&a ",
          "*a",
          "<<: *a",
          "!!binary ",
          "!!str ",
          "? ",
          "|\n",
          ">-\n",
          "---\n",
          "...\n",
          "%YAML 1.2\n",
          "~",
          "null",
          "1e999",
          "-1",
          "0x10",
          "99999999999999999999",
          "64MiB",
          "1ms",
          "auto",
          "matrix:",
          "bench:",
          "train:",
          "launch:",
          "faults:",
          "backend:",
          "model:",
          "schedulers:",
          "nproc_per_node: ",
          "rules:",
          "max_bytes: ",
          "plugin: ",
          "params: ",
          "label: ",
          "lab: {hosts: 2}",
          "rank: ",
          "at_step: ",
          "action: ",
          "\"\\x00\"",
          "'",
          "\"",
          "\\",
          "#",
          "\t"};
}

// Runs `load` on `runs() / divisor` mutants of `seeds`; `refused` is collie's error for the
// file. A divisor keeps the loaders whose every mutant writes files (checkpoint shards and
// manifests) within CI's time.
template <typename Refusal, typename Load>
void fuzz(const std::string& what, const std::vector<std::string>& seeds,
          const std::vector<std::string>& tokens, uint64_t seed, Load load,
          const std::function<std::string(std::string)>& finish = nullptr, int divisor = 1) {
  const int count = std::max(1, runs() / divisor);
  ASSERT_FALSE(seeds.empty());
  fuzz::Mutator mutator(seed, tokens);
  const fs::path dir = scratch();
  int loaded = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    std::string input = mutator.mutate(seeds[i % seeds.size()], seeds);
    if (finish) input = finish(std::move(input));
    const fs::path path = dir / (what + "-input");
    writeFile(path, input);
    try {
      load(path.string(), i);
      ++loaded;
    } catch (const Refusal& e) {
      ++refused;
      EXPECT_GT(std::string(e.what()).size(), 10u)
          << what << " " << i << ": a refusal says why, not \"" << e.what() << "\"";
    } catch (const std::exception& e) {
      const fs::path kept = dir / (what + "-" + std::to_string(i));
      fs::copy_file(path, kept, fs::copy_options::overwrite_existing);
      FAIL() << what << " mutant " << i << " (kept as " << kept.string()
             << ") was neither loaded nor refused with collie's error: " << e.what();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %d mutants in %.1f s: %d loaded, %d refused\n", what.c_str(), count, seconds,
              loaded, refused);
  EXPECT_EQ(loaded + refused, count);
}

TEST(FuzzLoaders, ConfigsLoadOrAreRefusedWithAConfigError) {
  std::vector<std::string> seeds;
  for (const char* folder : {"configs", "benchmarks"}) {
    for (const auto& entry : fs::directory_iterator(fs::path(COLLIE_TEST_SOURCE_DIR) / folder)) {
      if (entry.path().extension() == ".yaml") seeds.push_back(readFile(entry.path()));
    }
  }
  ASSERT_GE(seeds.size(), 10u);
  fuzz::Mutator sets(7, yamlTokens());
  fuzz<ConfigError>("config", seeds, yamlTokens(), 1, [&](const std::string& path, int i) {
    std::vector<std::string> overrides;
    if (i % 8 == 0) overrides.push_back(sets.mutate("bench.iters=3", {"train.steps=[1, 2]"}));
    config::loadExperiments(path, overrides);
  });
}

TEST(FuzzLoaders, RulesFilesLoadOrAreRefusedWithAConfigError) {
  const fs::path dir = scratch();
  RulesFile rules;
  rules.world_size = 4;
  rules.backend = "gloo";
  rules.rules.push_back({65536, {"tree", {}}});
  rules.rules.push_back({0, {"hierarchical", {{"intra", "ring"}, {"inter", "tree"}}}});
  config::writeRulesFile((dir / "seed.yaml").string(), rules, "a seed");
  const std::vector<std::string> seeds{readFile(dir / "seed.yaml")};
  fuzz<ConfigError>("rules", seeds, yamlTokens(), 2,
                    [](const std::string& path, int) { config::readRulesFile(path); });
}

// Most mutants are sealed again (the hash recomputed) so that they reach the parser behind
// the hash check instead of stopping at it.
TEST(FuzzLoaders, FormatOneCheckpointsLoadOrAreRefusedWithACheckpointError) {
  std::vector<std::string> seeds;
  for (int k = 0; k < 3; ++k) {
    seeds.push_back(testing::formatOneBytes(
        7 + k, "model mlp {layers: 2}; optimizer adamw; micro_batch [4, 4] x 1; data seed 1",
        {{"param/w", at::arange(12 * (k + 1), at::kFloat).reshape({3, -1})},
         {"exp_avg/0", at::zeros({3, 4 * (k + 1)}, at::kFloat)},
         {k == 2 ? "optimizer/step" : "param/empty",
          k == 2 ? at::zeros({}, at::kLong) : at::zeros({0, 5}, at::kFloat)}}));
  }
  std::vector<std::string> tokens = {"\"shape\": [",
                                     "\"offset\": ",
                                     "\"bytes\": ",
                                     "-1",
                                     "[]",
                                     "18446744073709551615",
                                     "9223372036854775807",
                                     "\"i64\"",
                                     "\"f32\"",
                                     "{}",
                                     "null",
                                     "1e308",
                                     ",",
                                     "\"step\": "};
  int resealed = 0;
  fuzz<CheckpointError>(
      "checkpoint-1", seeds, tokens, 3,
      [](const std::string& path, int) { train::CheckpointReader(path).readAll(); },
      [&](std::string bytes) {
        if (bytes.size() >= 16 && resealed++ % 4 != 3) {
          const uint64_t digest = XXH3_64bits(bytes.data(), bytes.size() - 8);
          std::memcpy(&bytes[bytes.size() - 8], &digest, 8);
        }
        return bytes;
      },
      4);  // format 1 is only read now
}

// A format-2 checkpoint of two shards in `dir`: two tensors, one split over both files.
std::vector<train::ShardFile> writeFormatTwo(const fs::path& dir,
                                             const train::CheckpointInfo& info) {
  fs::create_directories(dir);
  const at::Tensor w = at::arange(24, at::kFloat).reshape({4, 6}), b = at::arange(5, at::kFloat);
  auto piece = [](const std::string& key, const at::Tensor& t, int64_t start, int64_t numel) {
    return std::make_pair(train::Piece{key, t.sizes().vec(), start, numel},
                          t.reshape({-1}).narrow(0, start, numel));
  };
  std::vector<train::ShardFile> files = {
      train::writeShard(dir.string(), 0, 2, info, {piece("w", w, 0, 10), piece("b", b, 0, 5)}),
      train::writeShard(dir.string(), 1, 2, info, {piece("w", w, 10, 14)})};
  train::writeManifest(dir.string(), info, files, 0);
  return files;
}

std::vector<std::string> formatTwoTokens() {
  return {"\"shape\":[",
          "\"data_offsets\":[",
          "\"pieces\":",
          "\"start\":",
          "-1",
          "[]",
          "18446744073709551615",
          "9223372036854775807",
          "\"F32\"",
          "\"I64\"",
          "{}",
          "null",
          "1e308",
          ",",
          "\"step\":",
          "\"../x\"",
          "\"__metadata__\":",
          "\"0000000000000000\""};
}

// The manifest: the first thing a resume reads, and what says where every piece lies.
TEST(FuzzLoaders, ManifestsLoadOrAreRefusedWithACheckpointError) {
  const fs::path dir = scratch() / "manifest-step";
  train::CheckpointInfo info;
  info.step = 4;
  info.identity = "fuzz";
  info.micro_batch = {2, 1};
  writeFormatTwo(dir, info);
  const std::vector<std::string> seeds{readFile(dir / "manifest.json")};
  auto load = [&](const std::string& path, int) {
    fs::copy_file(path, dir / "manifest.json", fs::copy_options::overwrite_existing);
    train::CheckpointReader(dir.string()).readAll();
  };
  fuzz<CheckpointError>("manifest", seeds, formatTwoTokens(), 4, load, nullptr, 2);
}

// A shard file (safetensors), its manifest mostly rewritten to match the mutant's size and
// digest so that the mutant reaches the header parser.
TEST(FuzzLoaders, ShardFilesLoadOrAreRefusedWithACheckpointError) {
  const fs::path dir = scratch() / "shard-step";
  train::CheckpointInfo info;
  info.step = 5;
  info.identity = "fuzz";
  info.micro_batch = {2, 1};
  const auto files = writeFormatTwo(dir, info);
  const std::vector<std::string> seeds{readFile(dir / files[0].name),
                                       readFile(dir / files[1].name)};
  // The manifest's entry of file f ("bytes":N ... "xxh3":"D"), rewritten by text (a plain
  // write: writeManifest's fsyncs would make this fuzzer ten times slower).
  const std::string manifest = readFile(dir / "manifest.json");
  auto listing = [&](size_t f, uint64_t bytes, uint64_t digest) {
    std::string text = manifest;
    const size_t entry =
        text.find("{\"bytes\":" + std::to_string(files[f].bytes) + ",\"name\":\"" + files[f].name);
    const size_t number = entry + 9, xxh3 = text.find("\"xxh3\":\"", entry) + 8;
    text.replace(xxh3, 16, fmt::format("{:016x}", digest));
    text.replace(number, std::to_string(files[f].bytes).size(), std::to_string(bytes));
    return text;
  };
  ASSERT_EQ(listing(0, files[0].bytes, files[0].digest), manifest);
  auto load = [&](const std::string& path, int i) {
    const std::string bytes = readFile(path);
    const size_t f = static_cast<size_t>(i) % files.size();  // the seed it came from
    writeFile(
        dir / "manifest.json",
        i % 4 == 3 ? manifest : listing(f, bytes.size(), XXH3_64bits(bytes.data(), bytes.size())));
    writeFile(dir / files[f].name, bytes);
    train::CheckpointReader(dir.string()).readAll();
  };
  // The harness itself loads an unchanged shard.
  writeFile(dir / "seed", seeds[0]);
  load((dir / "seed").string(), 0);
  fuzz<CheckpointError>("shard", seeds, formatTwoTokens(), 5, load, nullptr, 2);
}

}  // namespace
}  // namespace collie
