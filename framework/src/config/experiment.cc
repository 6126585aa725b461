// Experiment files: from bytes on disk to validated, typed runs.
#include "config/experiment.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "collie/error.h"
#include "config/schema.h"
#include "core/strings.h"

namespace collie::config {
namespace {

const char* kHintSchema = "HINT: docs/config.md lists every key; `collie validate FILE` checks one";

std::string location(const std::string& file, const YAML::Node& node) {
  return locate(file, node.Mark());
}

YAML::Node parse(const std::string& text, const std::string& file) {
  YAML::Node root = parseYaml(text, file);
  if (!root.IsDefined() || root.IsNull()) {
    throw ConfigError(file + ": the file is empty; expected a map of experiment keys. " +
                      kHintSchema);
  }
  if (!root.IsMap()) {
    throw ConfigError(location(file, root) +
                      ": expected a map of experiment keys at the top "
                      "level, found " +
                      (root.IsSequence() ? "a list" : "'" + root.Scalar() + "'") + ". " +
                      kHintSchema);
  }
  return root;
}

// A --set or matrix key that continues through a plugin slot written as a name
// (`backend: gloo`) into a key only a map has: the slot becomes {plugin: NAME}.
bool continuesIntoSlot(const std::string& slot, const YAML::Node& node,
                       const std::string& next_key) {
  static const std::set<std::string> kSlots = {"backend", "model", "train.scheduler",
                                               "train.compression"};
  return kSlots.count(slot) > 0 && node.IsScalar() &&
         (next_key == "params" || next_key == "plugin" || next_key == "label");
}

// "bench.iters" -> {"bench", "iters"}.
std::vector<std::string> splitDotted(const std::string& dotted) {
  return detail::split(dotted, '.');
}

// Sets `dotted` (e.g. "bench.iters") in `root`, creating maps on the way.
void setPath(YAML::Node root, const std::string& dotted, const YAML::Node& value,
             const std::string& origin) {
  const std::vector<std::string> parts = splitDotted(dotted);
  if (parts.empty() || std::any_of(parts.begin(), parts.end(), [](auto& p) { return p.empty(); })) {
    throw ConfigError(origin + ": '" + dotted + "' is not a dotted key such as bench.iters");
  }
  YAML::Node node;
  node.reset(root);
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix += (i ? "." : "") + parts[i];
    YAML::Node next = node[parts[i]];
    if (next.IsDefined() && continuesIntoSlot(prefix, next, parts[i + 1])) {
      YAML::Node slot(YAML::NodeType::Map);
      slot["plugin"] = next.Scalar();
      node[parts[i]] = slot;
      next = node[parts[i]];
    }
    if (next.IsDefined() && !next.IsNull() && !next.IsMap()) {
      throw ConfigError(origin + ": cannot set '" + dotted + "': '" + parts[i] +
                        "' holds a value, not a map");
    }
    if (!next.IsDefined() || next.IsNull()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = node[parts[i]];
    node.reset(child);
  }
  node[parts.back()] = value;
}

YAML::Node parseValue(const std::string& text) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception&) {
    return YAML::Node(text);
  }
}

// One point of a matrix: the dotted keys it sets, in order.
using MatrixPoint = std::vector<std::pair<std::string, YAML::Node>>;

void checkMatrixKey(const std::string& key, const YAML::Node& where, const std::string& file) {
  if (key == "matrix" || key.rfind("matrix.", 0) == 0) {
    throw ConfigError(location(file, where) + ": matrix." + key + ": a matrix cannot vary itself");
  }
}

// The points of `matrix:`, which is removed from `root`. A map of dotted key: [values] is
// their Cartesian product (the first key varies fastest); a list of maps of dotted key:
// value is its points as listed. No matrix: one point that sets nothing.
std::vector<MatrixPoint> takeMatrix(YAML::Node& root, const std::string& file) {
  YAML::Node matrix = root["matrix"];
  if (!matrix.IsDefined() || matrix.IsNull()) return {MatrixPoint{}};
  std::vector<MatrixPoint> points;
  if (matrix.IsSequence() && matrix.size() > kMaxRuns) {
    throw ConfigError(fmt::format("{}: matrix: {} points; a file runs at most {}",
                                  location(file, matrix), matrix.size(), kMaxRuns));
  }
  if (matrix.IsSequence() && matrix.size() > 0) {
    for (const auto& point : matrix) {
      if (!point.IsMap()) {
        throw ConfigError(location(file, point) +
                          ": matrix: each point of a list is a map of dotted key: value, e.g. "
                          "{launch.nproc_per_node: 2}");
      }
      MatrixPoint p;
      for (auto it = point.begin(); it != point.end(); ++it) {
        checkMatrixKey(it->first.Scalar(), it->first, file);
        p.emplace_back(it->first.Scalar(), it->second);
      }
      points.push_back(p);
    }
    root.remove("matrix");
    return points;
  }
  if (!matrix.IsMap()) {
    throw ConfigError(location(file, matrix) +
                      ": matrix: expected a map of dotted key: [values], e.g. {bench.dtype: "
                      "[f32, bf16]}, or a list of points, e.g. [{launch.nproc_per_node: 1}, "
                      "{launch.nproc_per_node: 4}]");
  }
  std::vector<std::pair<std::string, std::vector<YAML::Node>>> axes;
  for (auto it = matrix.begin(); it != matrix.end(); ++it) {
    std::string key = it->first.Scalar();
    checkMatrixKey(key, it->first, file);
    if (!it->second.IsSequence() || it->second.size() == 0) {
      throw ConfigError(location(file, it->second) + ": matrix." + key +
                        ": expected a non-empty list of values");
    }
    axes.emplace_back(key, std::vector<YAML::Node>(it->second.begin(), it->second.end()));
  }
  // Refused before anything is expanded: a few lines of YAML can ask for billions of runs.
  uint64_t runs = 1;
  for (const auto& [key, values] : axes) {
    runs = std::min<uint64_t>(runs * values.size(), kMaxRuns + 1);
  }
  if (runs > kMaxRuns) {
    throw ConfigError(
        fmt::format("{}: matrix: its keys make more than {} runs (the product of "
                    "their list lengths); a file runs at most {}",
                    location(file, matrix), kMaxRuns, kMaxRuns));
  }
  // An odometer over the axes.
  std::vector<size_t> index(axes.size(), 0);
  while (true) {
    MatrixPoint p;
    for (size_t a = 0; a < axes.size(); ++a)
      p.emplace_back(axes[a].first, axes[a].second[index[a]]);
    points.push_back(p);
    size_t a = 0;
    while (a < axes.size() && ++index[a] == axes[a].second.size()) index[a++] = 0;
    if (a == axes.size()) break;
  }
  root.remove("matrix");
  return points;
}

std::string scalarText(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

// "ring" for "ring", and for a path ".../libcollie_scheduler_ring.so" too.
std::string defaultLabel(const std::string& plugin, const std::string& kind) {
  if (plugin.find('/') == std::string::npos) return plugin;
  std::string file = std::filesystem::path(plugin).filename().string();
  std::string prefix = "libcollie_" + kind + "_";
  if (file.rfind(prefix, 0) == 0) file = file.substr(prefix.size());
  if (file.size() > 3 && file.compare(file.size() - 3, 3, ".so") == 0) file.resize(file.size() - 3);
  return file;
}

// Where a nested value came from. A value parsed from --set carries the mark 1:1 of its own
// one-line document; in a file no nested value can stand there (the file starts with a key).
std::string valueLocation(const std::string& file, const YAML::Node& value) {
  const YAML::Mark mark = value.Mark();
  if (!mark.is_null() && mark.line == 0 && mark.column == 0) return "--set";
  return location(file, value);
}

PluginRef pluginRef(const YAML::Node& node, const std::string& file, const std::string& kind) {
  PluginRef ref;
  ref.plugin = node.IsScalar() ? node.Scalar() : node["plugin"] ? node["plugin"].Scalar() : "";
  ref.params = Params(kind + " '" + ref.plugin + "'");
  if (node.IsMap()) {
    if (node["label"]) ref.label = node["label"].Scalar();
    if (YAML::Node params = node["params"]) {
      for (auto it = params.begin(); it != params.end(); ++it) {
        ref.params.set(it->first.Scalar(), it->second.Scalar(), valueLocation(file, it->second));
      }
    }
    if (YAML::Node rules = node["rules"]) {
      for (const auto& rule : rules) {
        SizeRule<PluginRef> sized;
        if (rule["max_bytes"]) parseBytes(rule["max_bytes"].Scalar(), &sized.max_bytes);
        sized.choice = pluginRef(rule, file, kind);
        ref.rules.push_back(sized);
      }
    }
  }
  if (ref.label.empty()) ref.label = ref.rules.empty() ? defaultLabel(ref.plugin, kind) : "rules";
  return ref;
}

// micro_batch: one size for every rank, a list with one per rank, or the word auto.
void setMicroBatch(TrainSpec& t, const YAML::Node& node, const std::string&) {
  t.auto_micro_batch = node.IsScalar();  // the word auto (a single size is a list of one)
  t.micro_batch = t.auto_micro_batch ? std::vector<int>() : node.as<std::vector<int>>();
}

// The values that follow from several keys, once fill() has written the bound ones.
void derive(const YAML::Node& root, const std::string& file, Experiment* e) {
  e->file = file;
  e->resolved = root;
  if (e->name.empty()) e->name = std::filesystem::path(file).stem().string();
  e->kind = root["train"] ? Experiment::Kind::kTrain : Experiment::Kind::kBench;
  std::vector<std::string> labels(e->nproc_per_node, "node0");
  for (int r = 0; e->ranks_per_node > 0 && r < e->nproc_per_node; ++r)
    labels[r] = fmt::format("node{}", r / e->ranks_per_node);
  if (!e->node_labels.empty()) labels = e->node_labels;
  e->topology = Topology::fromLabels(labels);
  e->explicit_topology = e->ranks_per_node > 0 || !e->node_labels.empty();
}

// Whether `path` names a regular file; false (never an exception) for a name the file system
// refuses, too long or otherwise.
bool isRegularFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// train.sync: the keys of its mode only (a key left at its default counts as unset: the
// resolved file holds every default), an interval for the local modes, local steps to
// take, no sharding, and no codec that would never run.
void checkSync(const Experiment& e, std::vector<Issue>* issues) {
  const SyncSpec& sync = e.train.sync;
  const YAML::Node node = e.resolved["train"]["sync"];
  const std::string mode = syncModeName(sync.mode);
  auto problem = [&](const char* key, const std::string& what) {
    issues->push_back({fmt::format("{}: train.sync.{}: {}",
                                   location(e.file, node[key] ? node[key] : node), key, what)});
  };
  const SyncSpec defaults = [] {
    SyncSpec d;
    d.outer_lr = 0.7;
    d.outer_momentum = 0.9;
    d.nesterov = true;
    return d;
  }();
  if (sync.mode != SyncSpec::Mode::kDiloco) {
    const char* only = "only mode diloco takes it";
    if (sync.outer_lr != defaults.outer_lr) problem("outer_lr", only);
    if (sync.outer_momentum != defaults.outer_momentum) problem("outer_momentum", only);
    if (sync.nesterov != defaults.nesterov) problem("nesterov", only);
  }
  if (!sync.local()) {
    if (sync.every != 0) problem("every", "only mode local_sgd or diloco takes it");
    if (sync.warmup_steps != 0) problem("warmup_steps", "only mode local_sgd or diloco takes it");
    return;
  }
  if (sync.every < 1) {
    problem("every", fmt::format("mode {} needs the steps between synchronisations: every: H "
                                 "(H >= 1)",
                                 mode));
  }
  if (sync.warmup_steps >= e.train.steps) {
    problem("warmup_steps",
            fmt::format("{} synchronous steps leave none of the run's {} to take alone. HINT: "
                        "fewer warmup_steps, or mode: every_step",
                        sync.warmup_steps, e.train.steps));
  }
  if (sync.mode == SyncSpec::Mode::kDiloco && !(sync.outer_lr > 0)) {
    problem("outer_lr",
            "expected a rate above 0 (0 would take every rank back to the last "
            "meeting's parameters)");
  }
  if (sync.mode == SyncSpec::Mode::kDiloco && !(sync.outer_momentum < 1)) {
    problem("outer_momentum", "expected a momentum below 1 (1 never forgets)");
  }
  if (e.train.compresses() && sync.warmup_steps == 0) {
    problem("mode", fmt::format("train.compression {} compresses gradient all-reduces, and mode "
                                "{} makes none without a warm-up (its meetings send float32 "
                                "parameters). HINT: set train.sync.warmup_steps, or "
                                "train.compression: none",
                                e.train.compression.label, mode));
  }
  if (e.train.sharding != ShardedState::kNone) {
    problem("mode", fmt::format("{} keeps a whole model on every rank between synchronisations; "
                                "train.sharding: {} keeps a shard. HINT: train.sharding: none",
                                mode, shardedStateName(e.train.sharding)));
  }
}

// train.compression: auto's candidate i in the file (only when it has candidates: a scalar
// slot has no params to index).
YAML::Node compressionCandidate(const Experiment& e, size_t i) {
  return e.resolved["train"]["compression"]["params"]["candidates"][i];
}

void checkTrain(const Experiment& e, std::vector<Issue>* issues) {
  const YAML::Node train = e.resolved["train"], data = e.resolved["data"];
  if (!e.resolved["model"]) {
    issues->push_back({location(e.file, e.resolved) +
                       ": model: missing required key for a train: experiment (a plugin name "
                       "such as gpt or mlp, or {plugin, params})"});
  }
  if (e.train.min_lr > e.train.lr) {
    issues->push_back({location(e.file, train["min_lr"]) + ": train.min_lr: expected at most " +
                       "train.lr (" + scalarText(train["lr"]) + "), found " +
                       scalarText(train["min_lr"])});
  }
  if (e.train.auto_micro_batch && e.train.global_batch == 0) {
    issues->push_back({location(e.file, train["micro_batch"]) +
                       ": train.global_batch: missing; micro_batch: auto splits it between the "
                       "ranks by their measured speed"});
  }
  if (!e.train.auto_micro_batch && e.train.global_batch != 0) {
    issues->push_back({location(e.file, train["global_batch"]) +
                       ": train.global_batch: only with micro_batch: auto (a list gives the "
                       "sizes itself)"});
  }
  if (e.data.source != DataSpec::Source::kSynthetic && e.data.path.empty()) {
    issues->push_back({location(e.file, data) + ": data.path: missing; source '" +
                       data["source"].Scalar() + "' reads a file"});
  }
  if (!e.data.path.empty() && e.data.source != DataSpec::Source::kSynthetic &&
      !isRegularFile(e.data.path)) {
    issues->push_back({valueLocation(e.file, data["path"]) + ": data.path: " + e.data.path +
                       " is not a readable file here (a relative path starts from the folder "
                       "collie runs in)"});
  }
  if (e.data.source == DataSpec::Source::kSynthetic && !e.data.path.empty()) {
    issues->push_back({location(e.file, data["path"]) +
                       ": data.path: the synthetic source reads no file. HINT: source: tokens "
                       "(a flat uint16 file) or source: text"});
  }
  checkSync(e, issues);
  if (!e.train.compresses() && !e.train.compression.params.values().empty()) {
    issues->push_back({fmt::format(
        "{}: train.compression: 'none' takes no params (the float32 all-reduce). HINT: name a "
        "codec (bf16, fp16, int8, powersgd) or drop params",
        location(e.file, train["compression"]))});
  }
  std::set<std::string> labels;
  for (size_t i = 0; i < e.train.compression_candidates.size(); ++i) {
    const PluginRef& c = e.train.compression_candidates[i];
    const std::string where = valueLocation(e.file, compressionCandidate(e, i));
    if (c.plugin == "auto") {
      issues->push_back(
          {fmt::format("{}: train.compression.params.candidates[{}]: auto is the "
                       "choice, not one of its candidates. HINT: name codecs "
                       "(none, bf16, fp16, int8, powersgd)",
                       where, i)});
    }
    if (c.plugin == "none" && !c.params.values().empty()) {
      issues->push_back(
          {fmt::format("{}: train.compression.params.candidates[{}]: 'none' takes "
                       "no params (the float32 all-reduce)",
                       where, i)});
    }
    if (!labels.insert(c.label).second) {
      issues->push_back({fmt::format(
          "{}: train.compression.params.candidates[{}]: a second candidate labelled '{}'. "
          "HINT: give each {{plugin: ..., params: {{...}}, label: NAME}} its own label",
          where, i, c.label)});
    }
  }
  if (e.train.compresses() && e.train.sharding != ShardedState::kNone) {
    issues->push_back({fmt::format(
        "{}: train.compression: codec '{}' synchronises whole buckets (all-reduces and "
        "all-gathers), but train.sharding: {} reduce-scatters each bucket so that a rank "
        "receives its shard only. HINT: train.sharding: none to compress, or "
        "train.compression: none to shard",
        location(e.file, train["compression"]), e.train.compression.label,
        shardedStateName(e.train.sharding))});
  }
}

// A label names a plugin slot in tables, CSV, JSON and plot titles: printable ASCII without
// quotes, backslashes or control characters, so that no writer has to trust it.
void checkLabel(const Experiment& e, const YAML::Node& slot, const std::string& key,
                const PluginRef& ref, std::vector<Issue>* issues) {
  for (const auto& rule : ref.rules) checkLabel(e, slot, key + ".rules", rule.choice, issues);
  const std::string& label = ref.label;
  const auto bad = std::find_if(label.begin(), label.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u > 0x7e || c == '\'' || c == '"' || c == '`' || c == '\\';
  });
  if (bad == label.end() && label.size() <= 64) return;
  issues->push_back({fmt::format(
      "{}: {}: the label '{}' {}; a label is at most 64 printable characters without quotes, "
      "backslashes or control characters (it names the plugin in tables and plots). HINT: "
      "give {{plugin: ..., label: NAME}}",
      valueLocation(e.file, slot), key, fmt::format("{:.64}", label),
      bad != label.end()
          ? fmt::format("holds the character {:#04x}", static_cast<unsigned char>(*bad))
          : "is longer than 64 characters")});
}

void checkLabels(const Experiment& e, std::vector<Issue>* issues) {
  checkLabel(e, e.resolved["backend"], "backend", e.backend, issues);
  const YAML::Node schedulers = e.resolved["bench"]["schedulers"];
  for (size_t i = 0; i < e.bench.schedulers.size(); ++i) {
    checkLabel(e, schedulers[i], fmt::format("bench.schedulers[{}]", i), e.bench.schedulers[i],
               issues);
  }
  if (e.kind == Experiment::Kind::kTrain) {
    checkLabel(e, e.resolved["model"], "model", e.model, issues);
    checkLabel(e, e.resolved["train"]["scheduler"], "train.scheduler", e.train.scheduler, issues);
    checkLabel(e, e.resolved["train"]["compression"], "train.compression", e.train.compression,
               issues);
    for (size_t i = 0; i < e.train.compression_candidates.size(); ++i) {
      checkLabel(e, compressionCandidate(e, i),
                 fmt::format("train.compression.params.candidates[{}]", i),
                 e.train.compression_candidates[i], issues);
    }
  }
}

// Size rules choose a scheduler by message size; every other plugin slot holds one plugin.
void checkSingularSlots(const Experiment& e, std::vector<Issue>* issues) {
  auto check = [&](const YAML::Node& slot, const std::string& key, const PluginRef& ref) {
    if (ref.rules.empty()) return;
    issues->push_back({fmt::format(
        "{}: {}: 'rules' choose a scheduler by message size; this slot takes one plugin. "
        "HINT: give {{plugin: NAME, params: {{...}}}}",
        location(e.file, slot), key)});
  };
  check(e.resolved["backend"], "backend", e.backend);
  if (e.kind != Experiment::Kind::kTrain) return;
  check(e.resolved["model"], "model", e.model);
  check(e.resolved["train"]["compression"], "train.compression", e.train.compression);
  for (size_t i = 0; i < e.train.compression_candidates.size(); ++i) {
    check(compressionCandidate(e, i), fmt::format("train.compression.params.candidates[{}]", i),
          e.train.compression_candidates[i]);
  }
}

// A fault names one trigger, and the keys of its action only.
void checkFaults(const Experiment& e, std::vector<Issue>* issues) {
  const YAML::Node list = e.resolved["faults"];
  for (const FaultSpec& f : e.faults) {
    const YAML::Node node = list[f.index];
    const std::string key = fmt::format("faults[{}]", f.index);
    auto problem = [&](const char* field, const std::string& text) {
      const YAML::Node at = node[field] ? node[field] : node;
      issues->push_back({location(e.file, at) + ": " + key + (node[field] ? "." : "") +
                         (node[field] ? field : "") + ": " + text});
    };
    if ((f.at_step > 0) == (f.at_collective > 0)) {
      problem("",
              "expected exactly one of at_step (before a training step, 1-based) or "
              "at_collective (before the collective of that seq), found " +
                  std::string(f.at_step > 0 ? "both" : "neither"));
    }
    if (f.at_step > 0 && e.kind != Experiment::Kind::kTrain) {
      problem("at_step", "only a train: experiment has steps. HINT: at_collective: N");
    }
    if (f.at_step > 0 && e.kind == Experiment::Kind::kTrain && f.at_step > e.train.steps) {
      problem("at_step", fmt::format("step {} is after the last one (train.steps is {}): the "
                                     "fault would never be taken",
                                     f.at_step, e.train.steps));
    }
    const bool exits = f.action == FaultSpec::Action::kExit;
    const bool delays = f.action == FaultSpec::Action::kDelay;
    const bool stops = f.action == FaultSpec::Action::kStop;
    const bool slows = f.action == FaultSpec::Action::kSlow;
    if (node["code"] && !exits) problem("code", "only action exit takes an exit code");
    if (exits && !node["code"]) problem("", "action exit needs code: N (0 included)");
    if (node["delay"] && !delays && !stops) {
      problem("delay", "only actions delay and stop take a delay");
    }
    if (delays && !node["delay"]) problem("", "action delay needs delay: DURATION (e.g. 500ms)");
    if (stops && node["delay"] && f.delay < std::chrono::milliseconds(100)) {
      problem("delay", fmt::format("a stop's delay is the time until SIGCONT, at least 100ms "
                                   "(its timer must not fire before the stop), found {} ms; "
                                   "leave it out for a stop that lasts until something "
                                   "continues the rank",
                                   f.delay.count()));
    }
    if (node["cpu_share"] && !slows) problem("cpu_share", "only action slow takes a cpu_share");
    if (slows && !node["cpu_share"]) {
      problem("", "action slow needs cpu_share: FRACTION (of one CPU, e.g. 0.25)");
    }
  }
}

// Checks that span several keys, once the schema has passed.
void checkConsistency(const Experiment& e, std::vector<Issue>* issues) {
  checkLabels(e, issues);
  checkSingularSlots(e, issues);
  checkFaults(e, issues);
  if (const YAML::Node rate = e.resolved["launch"]["lab"]["rate"]) {
    try {
      parseRate(e.lab.rate, "launch.lab.rate");
    } catch (const ConfigError& x) {
      issues->push_back({valueLocation(e.file, rate) + ": " + x.what()});
    }
  }
  const YAML::Node bench = e.resolved["bench"], train = e.resolved["train"];
  if (bool(bench) == bool(train)) {
    issues->push_back({location(e.file, e.resolved) +
                       ": expected exactly one of 'bench' (compare collectives) or 'train' "
                       "(data-parallel training), found " +
                       (bench ? "both" : "neither")});
  }
  if (train) checkTrain(e, issues);
  if (!train && (e.resolved["model"] || e.resolved["data"])) {
    const char* key = e.resolved["model"] ? "model" : "data";
    issues->push_back(
        {location(e.file, e.resolved[key]) + ": " + key + ": only a train: experiment uses it"});
  }
  if (bench && e.bench.min_bytes > e.bench.max_bytes) {
    issues->push_back({location(e.file, bench["min_bytes"]) +
                       ": bench.min_bytes: expected at most "
                       "bench.max_bytes (" +
                       formatBytes(e.bench.max_bytes) + "), found " +
                       formatBytes(e.bench.min_bytes)});
  }
  const YAML::Node launch = e.resolved["launch"];
  if (launch["node_labels"] && static_cast<int>(launch["node_labels"].size()) != e.nproc_per_node) {
    issues->push_back({fmt::format(
        "{}: launch.node_labels: expected {} labels (one per rank), found {}",
        location(e.file, launch["node_labels"]), e.nproc_per_node, launch["node_labels"].size())});
  }
  if (launch["node_labels"] && launch["ranks_per_node"].as<int>() > 0) {
    issues->push_back({location(e.file, launch["node_labels"]) +
                       ": launch.node_labels: give "
                       "either launch.node_labels or launch.ranks_per_node, not both"});
  }
  if (bench && e.bench.root >= e.nproc_per_node) {
    issues->push_back(
        {fmt::format("{}: bench.root: expected a rank below launch.nproc_per_node ({}), found {}",
                     location(e.file, bench["root"]), e.nproc_per_node, e.bench.root)});
  }
}

// The whole file through read(2), so that an I/O error is reported with its errno.
std::string readAll(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(path + ": cannot open " + what + ": " + std::strerror(errno));
  std::string text;
  char buffer[65536];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || text.size() + n > kMaxConfigBytes) {
      int error = errno;
      ::close(fd);
      if (n > 0)
        throw ConfigError(path + ": " + what + " grew past the " + formatBytes(kMaxConfigBytes) +
                          " limit while reading");
      throw ConfigError(path + ": cannot read " + what + ": " + std::strerror(error));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace

const std::vector<std::string>& shardedStateNames() {
  static const std::vector<std::string> names = {"none", "optimizer", "gradients", "parameters"};
  return names;
}

const std::string& shardedStateName(ShardedState s) {
  return shardedStateNames().at(static_cast<size_t>(s));
}

const std::string& syncModeName(SyncSpec::Mode mode) {
  static const std::vector<std::string> names = {"every_step", "local_sgd", "diloco"};
  return names.at(static_cast<size_t>(mode));
}

std::string readConfigFile(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw ConfigError(path + ": cannot open " + what + ": " + std::strerror(errno) +
                      (what == "config" ? ". HINT: shipped experiments are in configs/" : ""));
  }
  if (S_ISDIR(st.st_mode)) {
    throw ConfigError(path + ": is a directory, expected a YAML file. HINT: e.g. " +
                      (std::filesystem::path(path) / "quickstart.yaml").string());
  }
  if (!S_ISREG(st.st_mode)) throw ConfigError(path + ": not a regular file");
  if (static_cast<size_t>(st.st_size) > kMaxConfigBytes) {
    throw ConfigError(
        fmt::format("{}: {} is {} bytes, larger than the {} limit; is it really an "
                    "experiment file?",
                    path, what, st.st_size, formatBytes(kMaxConfigBytes)));
  }
  std::string text = readAll(path, what);
  if (text.find('\0') != std::string::npos) {
    throw ConfigError(path + ": is a binary file (it holds NUL bytes), expected YAML text");
  }
  return text;
}

// The file with --set applied; parsed afresh on every call so that marks survive (a cloned
// yaml-cpp node loses them).
YAML::Node loadWithOverrides(const std::string& text, const std::string& path,
                             const std::vector<std::string>& sets,
                             std::vector<std::string>* overrides) {
  YAML::Node root = parse(text, path);
  overrides->clear();
  for (const auto& set : sets) {
    if (set.find('\0') != std::string::npos) {
      throw ConfigError(fmt::format("--set {}...: holds a NUL byte, which no command line can",
                                    set.substr(0, set.find('\0'))));
    }
    auto eq = set.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("--set " + set + ": expected key=value, e.g. --set bench.iters=5");
    }
    std::string key = set.substr(0, eq);
    setPath(root, key, parseValue(set.substr(eq + 1)), "--set " + set);
    overrides->push_back(key);
  }
  return root;
}

std::string FaultSpec::describe() const {
  switch (action) {
    case Action::kKill:
      return "SIGKILL";
    case Action::kStop:
      return delay.count() > 0 ? fmt::format("SIGSTOP, then SIGCONT after {} ms", delay.count())
                               : "SIGSTOP";
    case Action::kExit:
      return fmt::format("exit with code {}", exit_code);
    case Action::kThrow:
      return "an exception";
    case Action::kDelay:
      return fmt::format("a delay of {} ms", delay.count());
    case Action::kSlow:
      return fmt::format("a CPU share of {:g} for the rest of the run", cpu_share);
  }
  return "?";
}

std::string FaultSpec::when() const {
  return at_step > 0 ? fmt::format("before step {}", at_step)
                     : fmt::format("before collective {}", at_collective);
}

bool FaultSpec::needsOwnProcess() const {
  return action == Action::kKill || action == Action::kStop || action == Action::kExit ||
         action == Action::kSlow;
}

const std::vector<std::string> kPerHostKeys = {"backend.params.interface",
                                               "backend.params.hostname", "backend.params.device",
                                               "launch.token_file"};

YAML::Node sharedSettings(const Experiment& e) {
  YAML::Node shared = YAML::Clone(e.resolved);
  for (const auto& dotted : kPerHostKeys) {
    YAML::Node node = shared;
    const std::vector<std::string> parts = splitDotted(dotted);
    for (size_t i = 0; i + 1 < parts.size() && node.IsMap(); ++i) node.reset(node[parts[i]]);
    if (node.IsMap()) node.remove(parts.back());
  }
  // `backend: gloo` and `backend: {plugin: gloo, params: {}}` are one setting.
  YAML::Node backend = shared["backend"];
  if (backend.IsScalar()) {
    const std::string name = backend.Scalar();
    shared["backend"] = YAML::Node(YAML::NodeType::Map);
    shared["backend"]["plugin"] = name;
  } else if (backend.IsMap() && backend["params"].IsMap() && backend["params"].size() == 0) {
    backend.remove("params");
  }
  return shared;
}

std::vector<Experiment> loadExperiments(const std::string& path,
                                        const std::vector<std::string>& sets) {
  const std::string text = readConfigFile(path);
  std::vector<std::string> overrides;
  YAML::Node root = loadWithOverrides(text, path, sets, &overrides);
  const bool listed = root["matrix"].IsSequence();
  std::vector<MatrixPoint> points = takeMatrix(root, path);

  std::vector<Experiment> runs;
  std::vector<std::string> problems;
  for (const MatrixPoint& setting : points) {
    YAML::Node point = loadWithOverrides(text, path, sets, &overrides);
    point.remove("matrix");
    std::vector<std::string> labels;
    for (const auto& [key, value] : setting) {
      setPath(point, key, YAML::Clone(value), path + ": matrix");
      labels.push_back(key + "=" + scalarText(value));
    }
    std::string label = detail::join(labels, ", ");
    if (listed && label.empty()) label = "as written";  // a listed point that sets nothing
    std::vector<Issue> issues = validate(point, experimentSchema(), path, overrides);
    if (issues.empty()) {
      Experiment e;
      experimentSchema().fill(point, &e, path);
      derive(point, path, &e);
      e.matrix_point = label;
      e.matrix_index = static_cast<int>(runs.size());
      checkConsistency(e, &issues);
      if (issues.empty()) runs.push_back(std::move(e));
    }
    for (const auto& issue : issues) {
      std::string line = issue.message + (label.empty() ? "" : " [matrix point " + label + "]");
      if (std::find(problems.begin(), problems.end(), line) == problems.end())
        problems.push_back(line);
    }
  }
  if (!problems.empty()) {
    throw ConfigError(detail::join(problems, "\n") + "\n" + kHintSchema);
  }
  for (const auto& e : runs) {
    if (e.kind != runs.front().kind) {
      throw ConfigError(fmt::format(
          "{}: the matrix turns a {} experiment into the other kind; one file runs one kind", path,
          runs.front().kind == Experiment::Kind::kTrain ? "train" : "bench"));
    }
  }
  return runs;
}

void checkFixedWorld(const std::vector<Experiment>& runs, const std::string& source, int world) {
  const int nproc = runs.front().nproc_per_node;
  for (const auto& e : runs) {
    if (e.nproc_per_node != nproc) {
      throw ConfigError(fmt::format(
          "{}: the matrix changes launch.nproc_per_node, but {} started a fixed {} ranks. HINT: "
          "run it with `collie run` alone, which starts the workers itself",
          e.file, source, world));
    }
  }
  if (nproc != world && nproc != 1) {
    logWarn(fmt::format("launch.nproc_per_node is {} but {} started {} ranks; using {}", nproc,
                        source, world, world));
  }
}

const Schema& experimentSchema() {
  using S = Schema;
  auto plugin = [](PluginRef Experiment::*slot, const char* kind) {
    return [slot, kind](Experiment& e, const YAML::Node& node, const std::string& file) {
      e.*slot = pluginRef(node, file, kind);
    };
  };
  static const Schema schema = S::map({
      {"name", S::string().into(&Experiment::name).doc("experiment name (default: the file name)")},
      {"description", S::string().doc("free text")},
      {"log_level",
       S::oneOf({"trace", "debug", "info", "warn", "error", "off"})
           .byDefault("info")
           .into(&Experiment::log_level, {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo,
                                          LogLevel::kWarn, LogLevel::kError, LogLevel::kOff})},
      {"launch",
       S::map({
           {"nproc_per_node", S::integer(1, kMostSimulatedRanks)
                                  .byDefault("1")
                                  .into(&Experiment::nproc_per_node)
                                  .doc("ranks on this node: at most 1,024, or 65,536 on a "
                                       "simulated backend (simgrid)")},
           {"threads_per_rank", S::integer(1, 1024)
                                    .byDefault("1")
                                    .into(&Experiment::threads_per_rank)
                                    .doc("intra-op CPU threads per rank")},
           {"ranks_per_node", S::integer(0, 1024)
                                  .byDefault("0")
                                  .into(&Experiment::ranks_per_node)
                                  .doc("emulate nodes of this many ranks (0: one node)")},
           {"node_labels", S::list(S::string())
                               .into(&Experiment::node_labels)
                               .doc("a node label per rank (emulated nodes)")},
           {"cpu_affinity", S::boolean()
                                .byDefault("false")
                                .into(&Experiment::cpu_affinity)
                                .doc("bind each rank to threads_per_rank CPUs of its own")},
           {"cpu_share", S::list(S::number(0.01, 1024), 1)
                             .into(&Experiment::cpu_share)
                             .doc("limit each rank's process to this share of one CPU (cgroup "
                                  "cpu controller, root): one for every rank or one per rank, "
                                  "to emulate unequal machines")},
           {"memory_limit", S::list(S::bytes(uint64_t{16} << 20, uint64_t{1} << 50), 1)
                                .into(&Experiment::memory_limit)
                                .doc("hold each rank's process to this much memory (cgroup "
                                     "memory controller, root; no swap): one for every rank or "
                                     "one per rank. A rank that goes over is killed by the "
                                     "kernel, and the run fails saying so")},
           {"master_addr",
            S::string()
                .byDefault("127.0.0.1")
                .into(&Experiment::master_addr)
                .doc("where rank 0's rendezvous store is reached (collie's launcher)")},
           {"master_port", S::integer(0, 65535)
                               .byDefault("0")
                               .into(&Experiment::master_port)
                               .doc("its port (0: a free one)")},
           {"rendezvous_timeout", S::duration()
                                      .byDefault("60s")
                                      .into(&Experiment::rendezvous_timeout)
                                      .doc("how long ranks wait for each other to arrive")},
           {"token_file", S::string()
                              .into(&Experiment::token_file)
                              .doc("the job token's file (across nodes; written when missing)")},
           {"max_restarts", S::integer(0, 1000)
                                .byDefault("0")
                                .into(&Experiment::max_restarts)
                                .doc("restart every worker after a failure, this many times (a "
                                     "training run resumes from its newest checkpoint)")},
           {"lab",
            S::map({
                       {"hosts", S::integer(0, LabSpec::kMaxHosts)
                                     .byDefault("0")
                                     .into(&LabSpec::hosts)
                                     .doc("emulated hosts, nproc_per_node ranks each (0: no lab)")},
                       {"rate", S::string()
                                    .byDefault("1gbit")
                                    .into(&LabSpec::rate)
                                    .doc("every link's rate in both directions: 100mbit, 1gbit")},
                       {"cpus", S::string()
                                    .into(&LabSpec::cpus)
                                    .doc("CPUs per host, ';' between hosts: '0;1' (default: any)")},
                   })
                .optionalSection()
                .section(&Experiment::lab)},
       })},
      {"backend", S::pluginRef()
                      .required()
                      .into<Experiment>(plugin(&Experiment::backend, "backend"))
                      .doc("the transport between ranks")},
      {"bench",
       S::map(
           {
               {"collective",
                S::oneOf({"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"})
                    .byDefault("allreduce")
                    .into(&BenchSpec::collective,
                          {Collective::kAllReduce, Collective::kReduceScatter,
                           Collective::kAllGather, Collective::kBroadcast, Collective::kBarrier})
                    .doc("barrier: one row per scheduler, sizes do not apply")},
               {"schedulers", S::list(S::pluginRef(), 1)
                                  .required()
                                  .into<BenchSpec>([](BenchSpec& b, const YAML::Node& node,
                                                      const std::string& file) {
                                    for (const auto& s : node)
                                      b.schedulers.push_back(pluginRef(s, file, "scheduler"));
                                  })},
               {"dtype", S::oneOf({"f32", "f64", "f16", "bf16", "i32", "i64"})
                             .byDefault("f32")
                             .into(&BenchSpec::dtype, {DType::kF32, DType::kF64, DType::kF16,
                                                       DType::kBF16, DType::kI32, DType::kI64})},
               {"op", S::oneOf({"sum", "avg", "min", "max", "prod"})
                          .byDefault("sum")
                          .into(&BenchSpec::op, {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                                 ReduceOp::kMax, ReduceOp::kProd})},
               {"root",
                S::integer(0, 1 << 20).byDefault("0").into(&BenchSpec::root).doc("broadcast root")},
               {"min_bytes", S::bytes(0, 1ull << 36).byDefault("4KiB").into(&BenchSpec::min_bytes)},
               {"max_bytes",
                S::bytes(0, 1ull << 36).byDefault("64MiB").into(&BenchSpec::max_bytes)},
               {"step_factor", S::integer(2, 1024).byDefault("2").into(&BenchSpec::step_factor)},
               {"warmup_iters",
                S::integer(0, 100000).byDefault("5").into(&BenchSpec::warmup_iters)},
               {"iters", S::integer(1, 1000000)
                             .byDefault("20")
                             .into(&BenchSpec::iters)
                             .doc("timed calls of one measurement (their mean is its time)")},
               {"min_time", S::duration()
                                .byDefault("0s")
                                .into(&BenchSpec::min_time)
                                .doc("the least time the timed calls of one measurement take: "
                                     "more than iters calls where they are short")},
               {"repeats", S::integer(1, 1000)
                               .byDefault("5")
                               .into(&BenchSpec::repeats)
                               .doc("measurements of each size and scheduler, interleaved; the "
                                    "table gives their median and min-max")},
               {"check", S::boolean()
                             .byDefault("true")
                             .into(&BenchSpec::check)
                             .doc("count wrong elements (#wrong)")},
               {"calibrate", S::boolean()
                                 .byDefault("true")
                                 .into(&BenchSpec::calibrate)
                                 .doc("fit the cost model, print predictions")},
               {"plots", S::boolean()
                             .byDefault("true")
                             .into(&BenchSpec::plots)
                             .doc("busbw/time plots with gnuplot")},
               {"trace", S::boolean()
                             .byDefault("false")
                             .into(&BenchSpec::trace)
                             .doc("write the job's timeline to trace.json in the run's folder: "
                                  "every timed loop and collective of every rank")},
               {"emit_rules", S::string()
                                  .into(&BenchSpec::emit_rules)
                                  .doc("write the best scheduler per size range (for auto)")},
           })
           .optionalSection()
           .section(&Experiment::bench)},
      {"model", S::pluginRef()
                    .into<Experiment>(plugin(&Experiment::model, "model"))
                    .doc("the model a train: experiment trains")},
      {"data", S::map({
                          {"source", S::oneOf({"synthetic", "tokens", "text"})
                                         .byDefault("synthetic")
                                         .into(&DataSpec::source, {DataSpec::Source::kSynthetic,
                                                                   DataSpec::Source::kTokens,
                                                                   DataSpec::Source::kText})},
                          {"path", S::string()
                                       .into(&DataSpec::path)
                                       .doc("the token file (tokens) or text file (text)")},
                          {"seed", S::integer(0, int64_t{1} << 62)
                                       .byDefault("1234")
                                       .into(&DataSpec::seed)
                                       .doc("sample order, and synthetic tokens")},
                      })
                   .optionalSection()
                   .section(&Experiment::data)},
      {"train",
       S::map(
           {
               {"scheduler",
                S::pluginRef()
                    .byDefault("ring")
                    .into<TrainSpec>(
                        [](TrainSpec& t, const YAML::Node& node, const std::string& file) {
                          t.scheduler = pluginRef(node, file, "scheduler");
                        })
                    .doc("gradient all-reduce")},
               {"compression",
                S::pluginRef()
                    .orAutoAmongCandidates()
                    .byDefault("none")
                    .into<TrainSpec>(
                        [](TrainSpec& t, const YAML::Node& node, const std::string& file) {
                          t.compression = pluginRef(node, file, "codec");
                          t.compression_candidates.clear();
                          if (!t.choosesCompression()) return;
                          t.compression.params = Params("codec 'auto'");  // its candidates
                          for (const auto& c : node["params"]["candidates"])
                            t.compression_candidates.push_back(pluginRef(c, file, "codec"));
                        })
                    .doc("a codec plugin that synchronises each gradient bucket in fewer bytes "
                         "(bf16, fp16, powersgd, int8; none: float32 all-reduce), or {plugin: "
                         "auto, params: {candidates: [...]}}: the one whose step the cost "
                         "model predicts shortest")},
               {"sync",
                S::map(
                    {
                        {"mode",
                         S::oneOf({"every_step", "local_sgd", "diloco"})
                             .byDefault("every_step")
                             .into(&SyncSpec::mode,
                                   {SyncSpec::Mode::kEveryStep, SyncSpec::Mode::kLocalSgd,
                                    SyncSpec::Mode::kDiloco})
                             .doc("every_step: gradients all-reduced every step (DDP); "
                                  "local_sgd: each rank steps alone and the parameters are "
                                  "averaged every `every` steps; diloco: and an outer Nesterov "
                                  "step on their averaged change")},
                        {"every", S::integer(0, 100000000)
                                      .byDefault("0")
                                      .into(&SyncSpec::every)
                                      .doc("local_sgd, diloco: steps between synchronisations")},
                        {"warmup_steps",
                         S::integer(0, 100000000)
                             .byDefault("0")
                             .into(&SyncSpec::warmup_steps)
                             .doc("local_sgd, diloco: synchronous (every_step) steps first")},
                        {"outer_lr", S::number(0, 100)
                                         .byDefault("0.7")
                                         .into(&SyncSpec::outer_lr)
                                         .doc("diloco: the outer SGD's learning rate")},
                        {"outer_momentum", S::number(0, 1)
                                               .byDefault("0.9")
                                               .into(&SyncSpec::outer_momentum)
                                               .doc("diloco: the outer SGD's momentum")},
                        {"nesterov", S::boolean()
                                         .byDefault("true")
                                         .into(&SyncSpec::nesterov)
                                         .doc("diloco: Nesterov momentum")},
                    })
                    .section(&TrainSpec::sync)},
               {"steps", S::integer(1, 100000000).byDefault("100").into(&TrainSpec::steps)},
               {"micro_batch", S::list(S::integer(1, 1 << 20), 1)
                                   .orWord("auto")
                                   .byDefault("[8]")
                                   .into<TrainSpec>(setMicroBatch)
                                   .doc("samples per micro-batch: one for every rank, a list "
                                        "with one per rank, or auto (split global_batch by "
                                        "measured speed)")},
               {"global_batch",
                S::integer(0, 1 << 30)
                    .byDefault("0")
                    .into(&TrainSpec::global_batch)
                    .doc("with micro_batch: auto, the samples of one micro-batch over all ranks")},
               {"rebalance_every",
                S::integer(0, 100000000)
                    .byDefault("20")
                    .into(&TrainSpec::rebalance_every)
                    .doc("with micro_batch: auto, split global_batch again every N steps from "
                         "the measured compute time per sample (0: only at the start)")},
               {"rebalance_hysteresis",
                S::number(0, 0.9)
                    .byDefault("0.05")
                    .into(&TrainSpec::rebalance_hysteresis)
                    .doc("take a new split only when it predicts the slowest rank's compute "
                         "at least this fraction shorter")},
               {"grad_accum", S::integer(1, 1 << 16)
                                  .byDefault("1")
                                  .into(&TrainSpec::grad_accum)
                                  .doc("micro-batches per step (communication after the last)")},
               {"grad_weighting", S::oneOf({"tokens", "uniform"})
                                      .byDefault("tokens")
                                      .into(&TrainSpec::tokens_weighting, {true, false})},
               {"optimizer",
                S::oneOf({"adamw", "sgd"}).byDefault("adamw").into(&TrainSpec::sgd, {false, true})},
               {"lr", S::number(0, 1e3).byDefault("3e-4").into(&TrainSpec::lr)},
               {"min_lr", S::number(0, 1e3)
                              .byDefault("0")
                              .into(&TrainSpec::min_lr)
                              .doc("the cosine schedule's floor")},
               {"target_loss",
                S::number(0, 1e6)
                    .byDefault("0")
                    .into(&TrainSpec::target_loss)
                    .doc("the summary says when the job's loss, a mean over 8 steps, first "
                         "reached it (0: no target)")},
               {"lr_schedule", S::oneOf({"cosine", "constant"})
                                   .byDefault("cosine")
                                   .into(&TrainSpec::cosine, {true, false})},
               {"warmup_steps",
                S::integer(0, 100000000).byDefault("0").into(&TrainSpec::warmup_steps)},
               {"linear_scaling_batch",
                S::integer(0, 1 << 30)
                    .byDefault("0")
                    .into(&TrainSpec::linear_scaling_batch)
                    .doc("linear scaling rule: lr x world batch / this many samples (0: off)")},
               {"weight_decay", S::number(0, 10).byDefault("0.1").into(&TrainSpec::weight_decay)},
               {"beta1", S::number(0, 1).byDefault("0.9").into(&TrainSpec::beta1)},
               {"beta2", S::number(0, 1).byDefault("0.95").into(&TrainSpec::beta2)},
               {"momentum", S::number(0, 1).byDefault("0.9").into(&TrainSpec::momentum).doc("sgd")},
               {"grad_clip",
                S::number(0, 1e9)
                    .byDefault("1.0")
                    .into(&TrainSpec::grad_clip)
                    .doc("max global norm (0: off)")},
               {"device",
                S::oneOf({"cpu", "cuda"})
                    .byDefault("cpu")
                    .into(&TrainSpec::cuda, {false, true})
                    .doc("cuda: the local rank's GPU (local rank modulo the GPUs visible)")},
               {"precision",
                S::oneOf({"fp32", "bf16"}).byDefault("fp32").into(&TrainSpec::bf16, {false, true})},
               {"grad_checkpointing",
                S::boolean().byDefault("false").into(&TrainSpec::grad_checkpointing)},
               {"bucket_bytes",
                S::bytes(1, 1ull << 40).byDefault("25MB").into(&TrainSpec::bucket_bytes)},
               {"overlap",
                S::boolean()
                    .byDefault("true")
                    .into(&TrainSpec::overlap)
                    .doc("all-reduce each bucket during backward, on a communication thread")},
               {"sharding",
                S::oneOf(shardedStateNames())
                    .byDefault("none")
                    .into(&TrainSpec::sharding,
                          {ShardedState::kNone, ShardedState::kOptimizer, ShardedState::kGradients,
                           ShardedState::kParameters})
                    .doc("ZeRO stage 1 (optimizer): each rank keeps the optimizer state of its "
                         "shard; gradients are reduce-scattered, parameters all-gathered. "
                         "Stage 2 (gradients): and only its shard of the reduced gradients. "
                         "Stage 3 (parameters): and of the parameters, each unit of the model "
                         "gathered while it computes")},
               {"verify_sync_every",
                S::integer(0, 100000000)
                    .byDefault("0")
                    .into(&TrainSpec::verify_sync_every)
                    .doc("compare every parameter across ranks every N steps (0: at the end "
                         "only)")},
               {"straggler_every",
                S::integer(0, 100000000)
                    .byDefault("10")
                    .into(&TrainSpec::straggler_every)
                    .doc("gather every rank's compute and collective times every N steps to "
                         "score the ranks (0: off)")},
               {"straggler_threshold",
                S::number(0.01, 1)
                    .byDefault("0.7")
                    .into(&TrainSpec::straggler_threshold)
                    .doc("warn about a rank whose score (the fastest rank's compute time over "
                         "its own) over the last straggler_window steps is below this")},
               {"straggler_window",
                S::integer(1, 100000000)
                    .byDefault("20")
                    .into(&TrainSpec::straggler_window)
                    .doc("the steps a score is taken over (medians)")},
               {"trace", S::boolean()
                             .byDefault("false")
                             .into(&TrainSpec::trace)
                             .doc("write the job's timeline to trace.json in the run's folder "
                                  "(Chrome trace-event JSON: ui.perfetto.dev)")},
               {"on_divergence", S::oneOf({"fail", "warn"})
                                     .byDefault("fail")
                                     .into(&TrainSpec::fail_on_divergence, {true, false})},
               {"seed", S::integer(0, int64_t{1} << 62)
                            .byDefault("1234")
                            .into(&TrainSpec::seed)
                            .doc("initial weights")},
               {"log_every", S::integer(1, 100000000)
                                 .byDefault("10")
                                 .into(&TrainSpec::log_every)
                                 .doc("progress lines")},
               {"peak_flops",
                S::number(0, 1e18)
                    .byDefault("0")
                    .into(&TrainSpec::peak_flops)
                    .doc("peak FLOP/s of one rank's device, for MFU (0: unknown)")},
               {"checkpoint_dir", S::string()
                                      .into(&TrainSpec::checkpoint_dir)
                                      .doc("write checkpoints here (and resume from the newest)")},
               {"checkpoint_every",
                S::integer(0, 100000000)
                    .byDefault("0")
                    .into(&TrainSpec::checkpoint_every)
                    .doc("steps between checkpoints (0: only after the last step)")},
               {"checkpoint_keep", S::integer(1, 1000000)
                                       .byDefault("2")
                                       .into(&TrainSpec::checkpoint_keep)
                                       .doc("newest checkpoints kept in checkpoint_dir")},
               {"resume", S::boolean()
                              .byDefault("true")
                              .into(&TrainSpec::resume)
                              .doc("continue from the newest checkpoint in checkpoint_dir")},
               {"token_budgets",
                S::list(S::number(1, 1e18))
                    .into(&TrainSpec::token_budgets)
                    .doc("token counts to project the time to (besides 20 x params)")},
           })
           .optionalSection()
           .section(&Experiment::train)},
      {"faults",
       S::list(S::map({
                   {"rank", S::integer(0, 1 << 20)
                                .required()
                                .into(&FaultSpec::rank)
                                .doc("the rank that takes the fault")},
                   {"at_step", S::integer(1, 100000000)
                                   .into(&FaultSpec::at_step)
                                   .doc("before this training step (1-based)")},
                   {"at_collective", S::integer(1, int64_t{1} << 62)
                                         .into(&FaultSpec::at_collective)
                                         .doc("before the collective of this seq")},
                   {"action", S::oneOf({"kill", "stop", "exit", "throw", "delay", "slow"})
                                  .required()
                                  .into(&FaultSpec::action,
                                        {FaultSpec::Action::kKill, FaultSpec::Action::kStop,
                                         FaultSpec::Action::kExit, FaultSpec::Action::kThrow,
                                         FaultSpec::Action::kDelay, FaultSpec::Action::kSlow})},
                   {"code", S::integer(0, 255).into(&FaultSpec::exit_code).doc("exit: its code")},
                   {"delay",
                    S::duration()
                        .into(&FaultSpec::delay)
                        .doc("delay: the sleep; stop: how long until SIGCONT")},
                   {"cpu_share", S::number(0.01, 1)
                                     .into(&FaultSpec::cpu_share)
                                     .doc("slow: the fraction of one CPU left")},
               }))
           .eachInto(&Experiment::faults, &FaultSpec::index)
           .doc("faults to inject, each on one rank at a step or collective")},
      {"debug",
       S::map({
                  {"consistency", S::boolean()
                                      .byDefault("false")
                                      .into(&DebugSpec::consistency)
                                      .doc("before each collective, ranks compare what they call")},
                  {"flight_recorder", S::integer(0, 1 << 20)
                                          .byDefault("256")
                                          .into(&DebugSpec::flight_recorder)
                                          .doc("last collectives each rank writes when it fails")},
                  {"stall_warning",
                   S::duration()
                       .byDefault("10s")
                       .into(&DebugSpec::stall_warning)
                       .doc("a wait after which the job names the ranks a collective waits for")},
              })
           .section(&Experiment::debug)},
      {"output", S::map({
                     {"dir",
                      S::string()
                          .byDefault("runs")
                          .into(&Experiment::output_dir)
                          .doc("results go to DIR/NAME-TIMESTAMP")},
                 })},
  });
  return schema;
}

uint64_t parseRate(const std::string& rate, const std::string& what) {
  static const std::vector<std::pair<std::string, uint64_t>> kUnits = {
      {"gbit", 1000000000ull}, {"mbit", 1000000ull}, {"kbit", 1000ull}, {"bit", 1ull}, {"", 1ull}};
  size_t digits = 0;
  while (digits < rate.size() && std::isdigit(static_cast<unsigned char>(rate[digits]))) ++digits;
  const std::string unit = rate.substr(digits);
  for (const auto& [name, scale] : kUnits) {
    if (digits == 0 || digits > 12 || unit != name) continue;
    const uint64_t value = std::stoull(rate.substr(0, digits)) * scale;
    if (value >= 8000 && value <= 100000000000ull) return value;
  }
  throw ConfigError(fmt::format(
      "{}: '{}' is not a link rate from 8kbit to 100gbit; expected e.g. 100mbit, 1gbit, 10gbit",
      what, rate));
}

}  // namespace collie::config
