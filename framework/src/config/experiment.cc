// Experiment files: from bytes on disk to validated, typed runs.
#include "config/experiment.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>

#include "collie/error.h"
#include "config/schema.h"
#include "util/strings.h"

namespace collie::config {
namespace {

const char* kHintSchema = "HINT: docs/config.md lists every key; `collie validate FILE` checks one";

std::string location(const std::string& file, const YAML::Node& node) {
  YAML::Mark mark = node.Mark();
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

YAML::Node parse(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw ConfigError(file + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": nesting deeper than " +
                      std::to_string(e.depth() - 1) + " levels; an experiment file needs a few");
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": not valid YAML: " + e.msg);
  }
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

// Sets `dotted` (e.g. "bench.iters") in `root`, creating maps on the way.
void setPath(YAML::Node root, const std::string& dotted, const YAML::Node& value,
             const std::string& origin) {
  std::vector<std::string> parts;
  std::stringstream in(dotted);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  if (parts.empty() || std::any_of(parts.begin(), parts.end(), [](auto& p) { return p.empty(); })) {
    throw ConfigError(origin + ": '" + dotted + "' is not a dotted key such as bench.iters");
  }
  YAML::Node node;
  node.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = node[parts[i]];
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

struct MatrixAxis {
  std::string key;
  std::vector<YAML::Node> values;
};

std::vector<MatrixAxis> takeMatrix(YAML::Node& root, const std::string& file) {
  std::vector<MatrixAxis> axes;
  YAML::Node matrix = root["matrix"];
  if (!matrix.IsDefined() || matrix.IsNull()) return axes;
  if (!matrix.IsMap()) {
    throw ConfigError(location(file, matrix) +
                      ": matrix: expected a map of dotted key: [values], "
                      "e.g. {bench.dtype: [f32, bf16]}");
  }
  for (auto it = matrix.begin(); it != matrix.end(); ++it) {
    std::string key = it->first.Scalar();
    if (key == "matrix" || key.rfind("matrix.", 0) == 0) {
      throw ConfigError(location(file, it->first) + ": matrix." + key +
                        ": a matrix cannot vary itself");
    }
    if (!it->second.IsSequence() || it->second.size() == 0) {
      throw ConfigError(location(file, it->second) + ": matrix." + key +
                        ": expected a non-empty list of values");
    }
    MatrixAxis axis{key, {}};
    for (const auto& v : it->second) axis.values.push_back(v);
    axes.push_back(axis);
  }
  root.remove("matrix");
  return axes;
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
        PluginRef::SizeRule sized;
        if (rule["max_bytes"]) parseBytes(rule["max_bytes"].Scalar(), &sized.max_bytes);
        sized.scheduler = pluginRef(rule, file, kind);
        ref.rules.push_back(sized);
      }
    }
  }
  if (ref.label.empty()) ref.label = ref.rules.empty() ? defaultLabel(ref.plugin, kind) : "rules";
  return ref;
}

uint64_t bytesOf(const YAML::Node& node) {
  uint64_t v = 0;
  parseBytes(node.Scalar(), &v);
  return v;
}

void typedBench(const YAML::Node& bench, const std::string& file, BenchSpec* spec) {
  BenchSpec& b = *spec;
  parseCollective(bench["collective"].Scalar(), &b.collective);
  for (const auto& s : bench["schedulers"]) b.schedulers.push_back(pluginRef(s, file, "scheduler"));
  parseDType(bench["dtype"].Scalar(), &b.dtype);
  parseReduceOp(bench["op"].Scalar(), &b.op);
  b.root = bench["root"].as<int>();
  b.min_bytes = bytesOf(bench["min_bytes"]);
  b.max_bytes = bytesOf(bench["max_bytes"]);
  b.step_factor = bench["step_factor"].as<int>();
  b.warmup_iters = bench["warmup_iters"].as<int>();
  b.iters = bench["iters"].as<int>();
  b.check = bench["check"].as<bool>();
  b.calibrate = bench["calibrate"].as<bool>();
  b.plots = bench["plots"].as<bool>();
  if (bench["emit_rules"]) b.emit_rules = bench["emit_rules"].Scalar();
}

void typedData(const YAML::Node& data, DataSpec* d) {
  const std::string source = data["source"].Scalar();
  d->source = source == "tokens" ? DataSpec::Source::kTokens
              : source == "text" ? DataSpec::Source::kText
                                 : DataSpec::Source::kSynthetic;
  if (data["path"]) d->path = data["path"].Scalar();
  d->seed = data["seed"].as<uint64_t>();
}

void typedTrain(const YAML::Node& train, const std::string& file, TrainSpec* t) {
  t->scheduler = pluginRef(train["scheduler"], file, "scheduler");
  t->steps = train["steps"].as<int>();
  t->auto_micro_batch = train["micro_batch"].IsScalar();  // the word auto
  if (!t->auto_micro_batch) t->micro_batch = train["micro_batch"].as<std::vector<int>>();
  t->global_batch = train["global_batch"].as<int>();
  t->grad_accum = train["grad_accum"].as<int>();
  t->tokens_weighting = train["grad_weighting"].Scalar() == "tokens";
  t->sgd = train["optimizer"].Scalar() == "sgd";
  t->lr = train["lr"].as<double>();
  t->min_lr = train["min_lr"].as<double>();
  t->cosine = train["lr_schedule"].Scalar() == "cosine";
  t->warmup_steps = train["warmup_steps"].as<int>();
  t->linear_scaling_batch = train["linear_scaling_batch"].as<int>();
  t->weight_decay = train["weight_decay"].as<double>();
  t->beta1 = train["beta1"].as<double>();
  t->beta2 = train["beta2"].as<double>();
  t->momentum = train["momentum"].as<double>();
  t->grad_clip = train["grad_clip"].as<double>();
  t->bf16 = train["precision"].Scalar() == "bf16";
  t->grad_checkpointing = train["grad_checkpointing"].as<bool>();
  t->bucket_bytes = bytesOf(train["bucket_bytes"]);
  t->overlap = train["overlap"].as<bool>();
  t->verify_sync_every = train["verify_sync_every"].as<int>();
  t->fail_on_divergence = train["on_divergence"].Scalar() == "fail";
  t->seed = train["seed"].as<uint64_t>();
  t->log_every = train["log_every"].as<int>();
  if (train["checkpoint_dir"]) t->checkpoint_dir = train["checkpoint_dir"].Scalar();
  t->checkpoint_every = train["checkpoint_every"].as<int>();
  t->checkpoint_keep = train["checkpoint_keep"].as<int>();
  t->resume = train["resume"].as<bool>();
  t->peak_flops = train["peak_flops"].as<double>();
  if (train["token_budgets"]) t->token_budgets = train["token_budgets"].as<std::vector<double>>();
}

Experiment typed(const YAML::Node& root, const std::string& file) {
  Experiment e;
  e.file = file;
  e.resolved = root;
  e.name = root["name"] ? root["name"].Scalar() : std::filesystem::path(file).stem().string();
  parseLogLevel(root["log_level"].Scalar(), &e.log_level);
  e.nproc_per_node = root["launch"]["nproc_per_node"].as<int>();
  e.threads_per_rank = root["launch"]["threads_per_rank"].as<int>();
  std::vector<std::string> labels(e.nproc_per_node, "node0");
  const int per_node = root["launch"]["ranks_per_node"].as<int>();
  for (int r = 0; per_node > 0 && r < e.nproc_per_node; ++r)
    labels[r] = "node" + std::to_string(r / per_node);
  if (root["launch"]["node_labels"])
    labels = root["launch"]["node_labels"].as<std::vector<std::string>>();
  e.topology = Topology::fromLabels(labels);
  e.explicit_topology = per_node > 0 || root["launch"]["node_labels"];
  e.cpu_affinity = root["launch"]["cpu_affinity"].as<bool>();
  e.master_addr = root["launch"]["master_addr"].Scalar();
  e.master_port = root["launch"]["master_port"].as<int>();
  parseDuration(root["launch"]["rendezvous_timeout"].Scalar(), &e.rendezvous_timeout);
  e.max_restarts = root["launch"]["max_restarts"].as<int>();
  e.backend = pluginRef(root["backend"], file, "backend");
  if (root["bench"]) typedBench(root["bench"], file, &e.bench);
  if (root["train"]) {
    e.kind = Experiment::Kind::kTrain;
    typedTrain(root["train"], file, &e.train);
  }
  if (root["model"]) e.model = pluginRef(root["model"], file, "model");
  if (root["data"]) typedData(root["data"], &e.data);
  e.output_dir = root["output"]["dir"].Scalar();
  return e;
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
      !std::filesystem::is_regular_file(e.data.path)) {
    issues->push_back({valueLocation(e.file, data["path"]) + ": data.path: " + e.data.path +
                       " is not a readable file here (a relative path starts from the folder "
                       "collie runs in)"});
  }
  if (e.data.source == DataSpec::Source::kSynthetic && !e.data.path.empty()) {
    issues->push_back({location(e.file, data["path"]) +
                       ": data.path: the synthetic source reads no file. HINT: source: tokens "
                       "(a flat uint16 file) or source: text"});
  }
}

// Checks that span several keys, once the schema has passed.
void checkConsistency(const Experiment& e, std::vector<Issue>* issues) {
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
    issues->push_back({location(e.file, launch["node_labels"]) + ": launch.node_labels: expected " +
                       std::to_string(e.nproc_per_node) + " labels (one per rank), found " +
                       std::to_string(launch["node_labels"].size())});
  }
  if (launch["node_labels"] && launch["ranks_per_node"].as<int>() > 0) {
    issues->push_back({location(e.file, launch["node_labels"]) +
                       ": launch.node_labels: give "
                       "either launch.node_labels or launch.ranks_per_node, not both"});
  }
  if (bench && e.bench.root >= e.nproc_per_node) {
    issues->push_back({location(e.file, bench["root"]) + ": bench.root: expected a rank below " +
                       "launch.nproc_per_node (" + std::to_string(e.nproc_per_node) + "), found " +
                       std::to_string(e.bench.root)});
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
    throw ConfigError(path + ": " + what + " is " + std::to_string(st.st_size) +
                      " bytes, larger than "
                      "the " +
                      formatBytes(kMaxConfigBytes) + " limit; is it really an experiment file?");
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

std::vector<Experiment> loadExperiments(const std::string& path,
                                        const std::vector<std::string>& sets) {
  const std::string text = readConfigFile(path);
  std::vector<std::string> overrides;
  YAML::Node root = loadWithOverrides(text, path, sets, &overrides);
  std::vector<MatrixAxis> axes = takeMatrix(root, path);

  // Every point of the matrix: an odometer over the axes.
  std::vector<Experiment> runs;
  std::vector<size_t> index(axes.size(), 0);
  std::vector<std::string> problems;
  while (true) {
    YAML::Node point = loadWithOverrides(text, path, sets, &overrides);
    point.remove("matrix");
    std::vector<std::string> labels;
    for (size_t a = 0; a < axes.size(); ++a) {
      setPath(point, axes[a].key, YAML::Clone(axes[a].values[index[a]]), path + ": matrix");
      labels.push_back(axes[a].key + "=" + scalarText(axes[a].values[index[a]]));
    }
    std::string label = detail::join(labels, ", ");
    std::vector<Issue> issues = validate(point, experimentSchema(), path, overrides);
    if (issues.empty()) {
      Experiment e = typed(point, path);
      e.matrix_point = label;
      checkConsistency(e, &issues);
      if (issues.empty()) runs.push_back(std::move(e));
    }
    for (const auto& issue : issues) {
      std::string line = issue.message + (label.empty() ? "" : " [matrix point " + label + "]");
      if (std::find(problems.begin(), problems.end(), line) == problems.end())
        problems.push_back(line);
    }
    size_t a = 0;
    while (a < axes.size() && ++index[a] == axes[a].values.size()) index[a++] = 0;
    if (a == axes.size()) break;
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

}  // namespace collie::config
