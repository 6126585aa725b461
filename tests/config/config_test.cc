// Experiment files: schema errors with locations, units, --set, matrix, and hostile files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "collie/error.h"
#include "config/experiment.h"
#include "config/schema.h"
#include "expect.h"
#include "run_command.h"

namespace collie::config {
namespace {

using collie::testing::writeTempFile;

const char* kValid = R"(name: t
launch:
  nproc_per_node: 3
backend: loopback
bench:
  schedulers: [ring, {plugin: tree, label: tree-64k, params: {segment_bytes: 64KiB}}]
  min_bytes: 1KiB
  max_bytes: 4MiB
)";

// The ConfigError message of loading `text` with `sets`, or "" when it loads.
std::string errorOf(const std::string& text, const std::vector<std::string>& sets = {}) {
  std::string path = writeTempFile("case.yaml", text);
  try {
    loadExperiments(path, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ValidFileLoadsWithDefaultsAndUnits) {
  auto runs = loadExperiments(writeTempFile("ok.yaml", kValid), {});
  ASSERT_EQ(runs.size(), 1u);
  const Experiment& e = runs[0];
  EXPECT_EQ(e.nproc_per_node, 3);
  EXPECT_EQ(e.bench.min_bytes, 1024u);
  EXPECT_EQ(e.bench.max_bytes, 4u << 20);
  EXPECT_EQ(e.bench.iters, 20);  // default
  ASSERT_EQ(e.bench.schedulers.size(), 2u);
  EXPECT_EQ(e.bench.schedulers[1].label, "tree-64k");
  EXPECT_EQ(e.bench.schedulers[1].params.getBytes("segment_bytes", 0, 0, 1 << 30), 65536u);
  EXPECT_EQ(e.resolved["bench"]["warmup_iters"].as<int>(), 5);  // saved config is resolved
}

TEST(Config, UnknownKeySuggestsTheClosestOne) {
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "benhc: {}\n"),
                                {"case.yaml:9:1", "benhc", "unknown key", "did you mean 'bench'"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "  itres: 4\n"),
                                {"case.yaml:9:3", "bench.itres", "did you mean 'iters'"}));
}

TEST(Config, WrongTypeOutOfRangeAndMissingKey) {
  EXPECT_TRUE(
      testing::contains(errorOf(std::string(kValid) + "  iters: many\n"),
                        {"case.yaml:9:10", "bench.iters", "expected an integer", "found 'many'"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "  iters: 0\n"),
                                {"bench.iters", "[1, 1000000]", "found '0'"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "  dtype: float33\n"),
                                {"bench.dtype", "one of f32", "found 'float33'"}));
  EXPECT_TRUE(testing::contains(errorOf("bench: {schedulers: [ring]}\n"),
                                {"backend", "missing required key"}));
  EXPECT_TRUE(testing::contains(errorOf(kValid, {"bench.max_bytes=12 parsecs"}),
                                {"--set bench.max_bytes: bench.max_bytes: expected a size"}));
  EXPECT_TRUE(
      testing::contains(errorOf("backend: loopback\nlaunch: [1, 2]\nbench: {schedulers: [ring]}\n"),
                        {"case.yaml:2:9: launch: expected a map, found a list"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "  min_bytes: 2KiB\n"),
                                {"case.yaml:9:3: bench.min_bytes: duplicate key"}));
}

TEST(Config, CrossKeyChecks) {
  EXPECT_TRUE(
      testing::contains(errorOf(kValid, {"bench.min_bytes=8MiB"}),
                        {"bench.min_bytes", "at most bench.max_bytes (4 MiB), found 8 MiB"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "  root: 3\n"),
                                {"bench.root", "below launch.nproc_per_node (3)"}));
}

TEST(Config, FaultsAreReadIntoTheirStructs) {
  auto runs = loadExperiments(writeTempFile("faults.yaml", std::string(kValid) + R"(faults:
  - {rank: 1, at_collective: 40, action: delay, delay: 500ms}
  - {rank: 2, at_collective: 7, action: exit, code: 0}
  - {rank: 0, at_collective: 3, action: slow, cpu_share: 0.25}
  - {rank: 2, at_collective: 5, action: stop, delay: 20s}
  - {rank: 2, at_collective: 6, action: stop}
)"),
                              {});
  const auto& faults = runs.at(0).faults;
  ASSERT_EQ(faults.size(), 5u);
  EXPECT_EQ(faults[0].index, 0);
  EXPECT_EQ(faults[0].rank, 1);
  EXPECT_EQ(faults[0].at_collective, 40);
  EXPECT_EQ(faults[0].at_step, 0);
  EXPECT_EQ(faults[0].action, FaultSpec::Action::kDelay);
  EXPECT_EQ(faults[0].delay, std::chrono::milliseconds(500));
  EXPECT_EQ(faults[1].index, 1);
  EXPECT_EQ(faults[1].action, FaultSpec::Action::kExit);
  EXPECT_EQ(faults[1].exit_code, 0);
  EXPECT_EQ(faults[1].describe(), "exit with code 0");
  EXPECT_EQ(faults[1].when(), "before collective 7");
  EXPECT_DOUBLE_EQ(faults[2].cpu_share, 0.25);
  EXPECT_TRUE(faults[2].needsOwnProcess());
  EXPECT_FALSE(faults[0].needsOwnProcess());
  EXPECT_EQ(faults[3].delay, std::chrono::milliseconds(20000));
  EXPECT_EQ(faults[3].describe(), "SIGSTOP, then SIGCONT after 20000 ms");
  EXPECT_EQ(faults[4].describe(), "SIGSTOP");
}

TEST(Config, AFaultNeedsOneTriggerAndOnlyItsActionsKeys) {
  const std::string bench = std::string(kValid) + "faults:\n";
  // A fault on a bench, and what its refusal says.
  const std::vector<std::pair<std::string, std::vector<std::string>>> refused = {
      {"{rank: 1, action: kill}", {"faults[0]: expected exactly one of at_step", "found neither"}},
      {"{rank: 1, at_step: 2, at_collective: 3, action: kill}", {"found both"}},
      {"{rank: 1, at_step: 2, action: kill}",
       {"faults[0].at_step: only a train: experiment has steps"}},
      {"{rank: 1, at_collective: 2, action: kill, code: 3}",
       {"faults[0].code: only action exit takes an exit code"}},
      {"{rank: 1, at_collective: 2, action: exit}", {"faults[0]: action exit needs code: N"}},
      {"{rank: 1, at_collective: 2, action: delay}", {"action delay needs delay: DURATION"}},
      {"{rank: 1, at_collective: 2, action: kill, delay: 1s}",
       {"faults[0].delay: only actions delay and stop take a delay"}},
      {"{rank: 1, at_collective: 2, action: stop, delay: 50ms}",
       {"faults[0].delay: a stop's delay is the time until SIGCONT, at least 100ms",
        "found 50 ms"}},
      {"{rank: 1, at_collective: 2, action: slow}", {"action slow needs cpu_share"}},
      {"{rank: 1, at_collective: 2, action: slow, cpu_share: 2}",
       {"faults[0].cpu_share: expected a number in [0.01, 1], found '2'"}},
      {"{rank: 1, at_collective: 2, action: explode}",
       {"faults[0].action: expected one of kill, stop, exit"}},
      {"{at_collective: 2, action: kill}", {"faults[0].rank: missing required key"}},
      {"{rank: 1, at_collective: 2, action: kill, when: now}", {"faults[0].when: unknown key"}},
  };
  for (const auto& [fault, says] : refused) {
    EXPECT_TRUE(testing::contains(errorOf(bench + "  - " + fault + "\n"), says)) << fault;
  }
  const std::string train = R"(backend: loopback
model: mlp
train: {steps: 5}
faults: [{rank: 0, at_step: 6, action: throw}]
)";
  EXPECT_TRUE(testing::contains(errorOf(train),
                                {"faults[0].at_step: step 6 is after the last one (train.steps "
                                 "is 5)"}));
  EXPECT_EQ(errorOf(train, {"train.steps=6"}), "");
}

TEST(Config, HostileValuesAreRefusedNotThrownOrExpanded) {
  // 2^13 runs from thirteen lines: refused before anything is expanded.
  std::string keys = std::string(kValid) + "matrix:\n";
  for (const char* key :
       {"bench.iters", "bench.warmup_iters", "bench.repeats", "bench.step_factor",
        "bench.min_bytes", "bench.max_bytes", "bench.root", "launch.nproc_per_node",
        "launch.threads_per_rank", "bench.dtype", "bench.op", "bench.check", "bench.plots"})
    keys += std::string("  ") + key + ": [1, 2]\n";
  EXPECT_TRUE(testing::contains(errorOf(keys), {"matrix: its keys make more than 4096 runs"}));
  // A file name the file system refuses is a config error, not a filesystem exception.
  EXPECT_TRUE(testing::contains(errorOf("backend: loopback\nmodel: mlp\ntrain: {steps: 1}\n"
                                        "data: {source: tokens, path: " +
                                        std::string(5000, 'x') + "}\n"),
                                {"data.path: ", "is not a readable file here"}));
  EXPECT_TRUE(testing::contains(errorOf(kValid, {std::string("bench.iters=3\0x", 15)}),
                                {"holds a NUL byte"}));
}

TEST(Config, SetOverridesAnyKeyAndIsNamedInErrors) {
  auto runs =
      loadExperiments(writeTempFile("ok.yaml", kValid),
                      {"bench.iters=3", "launch.nproc_per_node=5", "bench.schedulers=[tree]"});
  EXPECT_EQ(runs[0].bench.iters, 3);
  EXPECT_EQ(runs[0].nproc_per_node, 5);
  ASSERT_EQ(runs[0].bench.schedulers.size(), 1u);
  EXPECT_EQ(runs[0].bench.schedulers[0].plugin, "tree");
  EXPECT_TRUE(testing::contains(errorOf(kValid, {"bench.iters=lots"}),
                                {"--set bench.iters", "expected an integer", "found 'lots'"}));
  EXPECT_TRUE(testing::contains(errorOf(kValid, {"noequals"}), {"--set noequals", "key=value"}));
  EXPECT_TRUE(
      testing::contains(errorOf(kValid, {"bench.schedulers.x=1"}), {"holds a value, not a map"}));
}

TEST(Config, DottedOverridesReachAPluginSlotWrittenAsAName) {
  // kValid has `backend: loopback`, the shorthand: its params are still reachable.
  auto runs = loadExperiments(writeTempFile("ok.yaml", kValid), {"backend.params.timeout=5s"});
  EXPECT_EQ(runs[0].backend.plugin, "loopback");
  ASSERT_TRUE(runs[0].backend.params.has("timeout"));
  EXPECT_EQ(runs[0].backend.params.values().at("timeout"), "5s");
  // And from a matrix axis.
  runs = loadExperiments(
      writeTempFile("m.yaml", std::string(kValid) + "matrix: {backend.params.timeout: [5s, 9s]}\n"),
      {});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].backend.params.values().at("timeout"), "9s");
  // Only plugin slots: another scalar still holds a value.
  EXPECT_TRUE(
      testing::contains(errorOf(kValid, {"name.params.x=1"}), {"'name' holds a value, not a map"}));
}

TEST(Config, PerHostSettingsAreNotPartOfWhatRanksShare) {
  auto shared = [](const std::vector<std::string>& sets) {
    YAML::Emitter out;
    out << sharedSettings(loadExperiments(writeTempFile("ok.yaml", kValid), sets)[0]);
    return std::string(out.c_str());
  };
  const std::string plain = shared({});
  // One host's NIC is eth0, another's wlp2s0: the ranks still run one experiment.
  EXPECT_EQ(shared({"backend.params.interface=eth0"}), plain);
  EXPECT_EQ(shared({"backend.params.interface=wlp2s0", "backend.params.hostname=h1"}), plain);
  // What must agree still differs.
  EXPECT_NE(shared({"backend.params.timeout=5s"}), plain);
  EXPECT_NE(shared({"bench.iters=3"}), plain);
}

TEST(Config, MatrixExpandsTheCartesianProduct) {
  auto runs = loadExperiments(
      writeTempFile(
          "m.yaml",
          std::string(kValid) +
              "matrix:\n  bench.dtype: [f32, bf16]\n  launch.nproc_per_node: [2, 4, 5]\n"),
      {});
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[0].matrix_point, "bench.dtype=f32, launch.nproc_per_node=2");
  EXPECT_EQ(runs[5].matrix_point, "bench.dtype=bf16, launch.nproc_per_node=5");
  EXPECT_EQ(runs[5].bench.dtype, DType::kBF16);
}

TEST(Config, AMatrixCanListItsPoints) {
  // Points that are no product of axes: the file as written, 4 ranks, 2 ranks with f64.
  auto runs = loadExperiments(
      writeTempFile("points.yaml", std::string(kValid) +
                                       "matrix:\n  - {}\n  - {launch.nproc_per_node: 4}\n"
                                       "  - {launch.nproc_per_node: 2, bench.dtype: f64}\n"),
      {});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].matrix_point, "as written");
  EXPECT_EQ(runs[0].nproc_per_node, 3);
  EXPECT_EQ(runs[1].matrix_point, "launch.nproc_per_node=4");
  EXPECT_EQ(runs[1].nproc_per_node, 4);
  EXPECT_EQ(runs[2].matrix_point, "launch.nproc_per_node=2, bench.dtype=f64");
  EXPECT_EQ(runs[2].bench.dtype, DType::kF64);
}

// A matrix whose axes or points do not make runs, and what the refusal says.
TEST(Config, AMatrixThatMakesNoRunsIsRefusedNamingWhy) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> refused = {
      {"  bench.dtype: [f32, f99]", {"bench.dtype", "f99", "matrix point bench.dtype=f99"}},
      {"  bench.dtype: f32", {"matrix.bench.dtype", "non-empty list"}},
      {"  - launch.nproc_per_node", {"each point of a list is a map"}},
      {"  - {bench.dtype: f99}", {"f99", "matrix point bench.dtype=f99"}}};
  for (const auto& [matrix, says] : refused) {
    EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "matrix:\n" + matrix + "\n"), says))
        << matrix;
  }
}

TEST(Config, SchedulerRulesLists) {
  auto runs = loadExperiments(
      writeTempFile("rules.yaml", std::string(kValid) +
                                      "matrix:\n  bench.schedulers: [[{label: mixed, rules: "
                                      "[{max_bytes: 64KiB, plugin: tree}, {plugin: ring}]}]]\n"),
      {});
  ASSERT_EQ(runs[0].bench.schedulers.size(), 1u);
  const PluginRef& mixed = runs[0].bench.schedulers[0];
  EXPECT_EQ(mixed.label, "mixed");
  ASSERT_EQ(mixed.rules.size(), 2u);
  EXPECT_EQ(mixed.rules[0].max_bytes, 65536u);
  EXPECT_EQ(mixed.rules[0].choice.plugin, "tree");
  EXPECT_EQ(mixed.rules[1].max_bytes, 0u);
  EXPECT_TRUE(testing::contains(
      errorOf(kValid, {"bench.schedulers=[{plugin: ring, rules: [{plugin: tree}]}]"}),
      {"bench.schedulers[0]", "exactly one of 'plugin'"}));
  EXPECT_TRUE(testing::contains(
      errorOf(kValid, {"bench.schedulers=[{rules: [{max_bytes: big, plugin: tree}]}]"}),
      {"bench.schedulers[0].rules[0].max_bytes", "expected a size"}));
}

const char* kTrain = R"(name: t
launch: {nproc_per_node: 2}
backend: gloo
model: {plugin: gpt, params: {layers: 2}}
train:
  micro_batch: [8, 6]
  lr: 1e-3
)";

TEST(TrainConfig, DefaultsAndTypedValues) {
  auto runs = loadExperiments(writeTempFile("train.yaml", kTrain), {});
  ASSERT_EQ(runs.size(), 1u);
  const Experiment& e = runs[0];
  EXPECT_EQ(e.kind, Experiment::Kind::kTrain);
  EXPECT_EQ(e.model.plugin, "gpt");
  EXPECT_EQ(e.train.scheduler.plugin, "ring");
  EXPECT_EQ(e.train.micro_batch, std::vector<int>({8, 6}));
  EXPECT_EQ(e.train.microBatchOf(1), 6);
  EXPECT_TRUE(e.train.tokens_weighting);
  EXPECT_EQ(e.train.bucket_bytes, 25000000u);
  EXPECT_EQ(e.data.source, DataSpec::Source::kSynthetic);
  EXPECT_FALSE(e.resolved["bench"].IsDefined()) << "the other kind's section is not filled in";
  auto one = loadExperiments(writeTempFile("train.yaml", kTrain), {"train.micro_batch=4"});
  EXPECT_EQ(one[0].train.micro_batch, std::vector<int>({4}));
  EXPECT_EQ(one[0].train.microBatchOf(1), 4);
}

TEST(TrainConfig, ExactlyOneKindAndTheKeysTrainingNeeds) {
  EXPECT_TRUE(testing::contains(errorOf(std::string(kTrain) + "bench: {schedulers: [ring]}\n"),
                                {"expected exactly one of 'bench'", "found both"}));
  EXPECT_TRUE(testing::contains(errorOf("backend: loopback\n"), {"found neither"}));
  EXPECT_TRUE(testing::contains(errorOf("backend: gloo\ntrain: {steps: 3}\n"),
                                {"model: missing required key for a train: experiment"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kTrain) + "data: {source: tokens}\n"),
                                {"data.path: missing; source 'tokens' reads a file"}));
  EXPECT_TRUE(
      testing::contains(errorOf(std::string(kTrain) + "  grad_weighting: mean\n"),
                        {"train.grad_weighting", "one of tokens, uniform", "found 'mean'"}));
  EXPECT_TRUE(testing::contains(errorOf(std::string(kTrain) + "  min_lr: 0.1\n"),
                                {"train.min_lr: expected at most train.lr"}));
  EXPECT_TRUE(testing::contains(errorOf(kTrain, {"train.micro_batch=[8, 0]"}),
                                {"train.micro_batch[1]", "expected an integer in [1, "}));
  EXPECT_TRUE(testing::contains(errorOf(kTrain, {"train.micro_batch=auto"}),
                                {"train.global_batch: missing; micro_batch: auto splits it"}));
  EXPECT_TRUE(testing::contains(errorOf(kTrain, {"train.global_batch=16"}),
                                {"train.global_batch: only with micro_batch: auto"}));
  // One size stands for a list of one: the message names all three forms.
  EXPECT_TRUE(testing::contains(errorOf(kTrain, {"train.micro_batch=fast"}),
                                {"train.micro_batch",
                                 "expected an integer in [1, 1048576] or a list of "
                                 "them or 'auto'"}));
  auto runs = loadExperiments(writeTempFile("auto.yaml", kTrain),
                              {"train.micro_batch=auto", "train.global_batch=16"});
  EXPECT_TRUE(runs[0].train.auto_micro_batch);
  EXPECT_EQ(runs[0].train.global_batch, 16);
  EXPECT_TRUE(testing::contains(errorOf(std::string(kValid) + "model: gpt\n"),
                                {"model: only a train: experiment uses it"}));
}

TEST(ConfigFiles, EmptyFile) {
  EXPECT_TRUE(testing::contains(errorOf(""), {"the file is empty"}));
  EXPECT_TRUE(testing::contains(errorOf("# only a comment\n"), {"the file is empty"}));
}

TEST(ConfigFiles, BinaryGarbage) {
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage += static_cast<char>((i * 7919 + 13) % 256);
  EXPECT_TRUE(testing::contains(errorOf(garbage), {"binary file"}));
  EXPECT_TRUE(testing::contains(errorOf("\x7f"
                                        "ELF\x02\x01\x01 junk: [\n"),
                                {"case.yaml"}));
}

TEST(ConfigFiles, DeepNestingIsRefusedNotACrash) {
  std::string deep(100000, '[');
  EXPECT_FALSE(errorOf(deep).empty());
  std::string deep_maps;
  for (int i = 0; i < 100000; ++i) deep_maps += "{a: ";
  EXPECT_FALSE(errorOf(deep_maps).empty());
}

TEST(ConfigFiles, HugeFileIsRefusedBeforeParsing) {
  std::string path = writeTempFile("huge.yaml", "");
  {
    std::ofstream out(path);
    std::string line = "# " + std::string(1022, 'x') + "\n";
    for (int i = 0; i < 50 * 1024; ++i) out << line;  // 50 MiB
  }
  try {
    loadExperiments(path, {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(), {"larger than the 1 MiB limit"}));
  }
}

TEST(ConfigFiles, DirectoryMissingAndUnreadable) {
  EXPECT_THROW(readConfigFile("/tmp"), ConfigError);
  EXPECT_TRUE(testing::contains(
      [] {
        try {
          readConfigFile("/tmp");
        } catch (const ConfigError& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      {"is a directory"}));
  EXPECT_THROW(readConfigFile("/nonexistent/x.yaml"), ConfigError);
  // /proc/self/mem opens but every read at offset 0 fails: an unreadable file even for root.
  try {
    readConfigFile("/proc/self/mem");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(testing::contains(e.what(), {"/proc/self/mem", "cannot read config"}));
  }
}

}  // namespace
}  // namespace collie::config

namespace collie::config {
namespace {

// Every key of the experiment schema, dotted, with its schema entry.
void schemaKeys(const Schema& map, const std::string& prefix,
                std::vector<std::pair<std::string, const Schema*>>* keys) {
  for (const auto& [name, field] : map.fields()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    if (field.type() == Schema::Type::kMap) {
      schemaKeys(field, key, keys);
    } else {
      keys->push_back({key, &field});
      // A list of maps: its items' keys too, as faults[].rank.
      if (field.type() == Schema::Type::kList && field.item()->type() == Schema::Type::kMap)
        schemaKeys(*field.item(), key + "[]", keys);
    }
  }
}

std::vector<std::string> splitCells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|') {
      size_t a = cell.find_first_not_of(' '), b = cell.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return cells;
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    size_t comma = text.find(", ", start);
    items.push_back(
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 2;
  }
  return items;
}

// docs/config.md: every row of its key tables whose first cell names keys in backticks
// ("`a`" or "`a`, `b`"), with the default cell ("x" or "x, y", one per key).
std::map<std::string, std::string> documentedDefaults() {
  std::ifstream in(COLLIE_TEST_SOURCE_DIR "/docs/config.md");
  EXPECT_TRUE(in.is_open());
  std::map<std::string, std::string> documented;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    auto cells = splitCells(line);
    if (cells.size() < 4) continue;
    std::vector<std::string> keys;
    for (const auto& k : splitList(cells[0])) {
      EXPECT_TRUE(k.size() > 2 && k.front() == '`' && k.back() == '`') << line;
      keys.push_back(k.substr(1, k.size() - 2));
    }
    std::vector<std::string> defaults = splitList(cells[2]);
    if (defaults.empty() || defaults.front().rfind("(", 0) == 0 ||
        defaults.front() == "**required**")
      defaults.assign(keys.size(), cells[2]);  // one text for every key of the row
    EXPECT_EQ(defaults.size(), keys.size()) << "one default per key: " << line;
    for (size_t i = 0; i < keys.size() && i < defaults.size(); ++i) {
      EXPECT_TRUE(documented.emplace(keys[i], defaults[i]).second) << "listed twice: " << keys[i];
    }
  }
  return documented;
}

TEST(ConfigSchema, EveryKeyButFreeTextIsBoundToTheStruct) {
  std::vector<std::pair<std::string, const Schema*>> keys;
  schemaKeys(experimentSchema(), "", &keys);
  for (const auto& [key, schema] : keys) {
    if (key == "description") continue;  // free text, read by people only
    EXPECT_TRUE(schema->isBound()) << key << " is validated but never reaches config::Experiment";
  }
}

TEST(ConfigSchema, FillWritesDefaultsAndTheValuesOfTheFile) {
  auto runs = loadExperiments(writeTempFile("fill.yaml", R"(backend: loopback
launch: {nproc_per_node: 2, rendezvous_timeout: 2m, node_labels: [a, b]}
model: mlp
train:
  micro_batch: [3, 5]
  optimizer: sgd
  lr_schedule: constant
  bucket_bytes: 1MiB
  on_divergence: warn
  token_budgets: [1e6]
)"),
                              {"train.precision=bf16"});
  ASSERT_EQ(runs.size(), 1u);
  const Experiment& e = runs.front();
  EXPECT_EQ(e.kind, Experiment::Kind::kTrain);
  EXPECT_EQ(e.name, "fill");
  EXPECT_EQ(e.nproc_per_node, 2);
  EXPECT_EQ(e.rendezvous_timeout, std::chrono::minutes(2));
  EXPECT_TRUE(e.explicit_topology);
  EXPECT_EQ(e.topology.nodeCount(), 2);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // a default
  EXPECT_EQ(e.train.micro_batch, (std::vector<int>{3, 5}));
  EXPECT_FALSE(e.train.auto_micro_batch);
  EXPECT_TRUE(e.train.sgd);
  EXPECT_FALSE(e.train.cosine);
  EXPECT_TRUE(e.train.bf16);  // from --set
  EXPECT_EQ(e.train.bucket_bytes, 1u << 20);
  EXPECT_FALSE(e.train.fail_on_divergence);
  EXPECT_EQ(e.train.token_budgets, (std::vector<double>{1e6}));
  EXPECT_EQ(e.train.scheduler.plugin, "ring");  // a default plugin slot
  EXPECT_EQ(e.train.steps, 100);
  EXPECT_DOUBLE_EQ(e.train.beta2, 0.95);
  EXPECT_EQ(e.data.seed, 1234u);  // data: left out, its defaults still apply
  EXPECT_EQ(e.data.source, DataSpec::Source::kSynthetic);
  EXPECT_EQ(e.output_dir, "runs");
}

TEST(ConfigDocs, ListExactlyTheSchemaKeysWithTheirDefaults) {
  std::vector<std::pair<std::string, const Schema*>> keys;
  schemaKeys(experimentSchema(), "", &keys);
  ASSERT_GT(keys.size(), 50u);
  auto documented = documentedDefaults();
  documented.erase("matrix");  // not a schema key: expanded before validation
  for (const auto& [key, schema] : keys) {
    auto it = documented.find(key);
    if (it == documented.end()) {
      ADD_FAILURE() << "docs/config.md does not list " << key;
      continue;
    }
    const std::string& doc = it->second;
    if (schema->isRequired()) {
      EXPECT_EQ(doc, "**required**") << key;
    } else if (!schema->defaultValue().empty()) {
      EXPECT_EQ(doc, schema->defaultValue()) << key << ": docs/config.md gives another default";
    } else {
      EXPECT_TRUE(doc.empty() || doc.front() == '(')
          << key << " has no default in the schema; the docs may only describe one, in "
          << "parentheses, found '" << doc << "'";
    }
    documented.erase(it);
  }
  for (const auto& [key, doc] : documented) {
    ADD_FAILURE() << "docs/config.md lists " << key << ", which the schema does not have";
  }
}

}  // namespace
}  // namespace collie::config
