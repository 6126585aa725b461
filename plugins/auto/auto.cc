// "auto": picks a scheduler per collective from its message size and the group: by a rules
// file written by the bench (`--emit-rules`, measured) when one applies, else by the
// candidates' α-β-γ predictions under a calibration the bench saved (`calibration.json`),
// else under the run's own calibration (the bench and the trainer hand it over,
// useCostModel), else, before one, under a built-in model. Rules are kept apart from predictions,
// as Open MPI's coll/tuned keeps rules read from a file apart from its fixed ones.
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "collie/cost_model_json.h"
#include "collie/log.h"
#include "collie/plugin.h"
#include "collie/rules.h"

namespace collie::autoselect {
namespace {

// The fallback without a calibration: loopback ranks on the 2-core reference machine, as the
// bench calibrated them (plugins/auto/README.md). Only their ratios matter for choosing.
CostModel builtInModel() {
  CostModel model;
  model.intra = {30e-6, 1.0 / 2.0e9};
  model.inter = model.intra;
  model.gamma = 1.0 / 3.0e9;
  return model;
}

// A calibration the bench saved (OUT/calibration.json): the model of the machine and
// backend it ran on.
CostModel readCalibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("auto: params.calibration: cannot read " + path);
  try {
    return costModelFromJson(nlohmann::json::parse(in));
  } catch (const std::exception& e) {
    throw ConfigError("auto: params.calibration: " + path +
                      " is not a calibration the bench wrote (" + e.what() +
                      "). HINT: a bench run with bench.calibrate writes OUT/calibration.json");
  }
}

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(' ') - first + 1);
}

// "ring, swing{variant: latency}, tree": plugin names, each with params in braces written as
// RuleChoice::name() writes them, split at the commas outside braces.
std::vector<RuleChoice> parseCandidates(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return ConfigError("auto: params.candidates '" + text + "': " + why +
                       ". HINT: name schedulers with optional params, e.g. "
                       "\"ring, swing{variant: latency}\"");
  };
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  for (char c : text) {
    if (c == '{') ++depth;
    if (c == '}' && --depth < 0) throw bad("a '}' without its '{'");
    if (c == ',' && depth == 0) {
      items.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) throw bad("a '{' without its '}'");
  items.push_back(item);
  std::vector<RuleChoice> choices;
  for (const std::string& raw : items) {
    const std::string one = trimmed(raw);
    if (one.empty()) continue;
    RuleChoice choice;
    const size_t brace = one.find('{');
    choice.plugin = trimmed(one.substr(0, brace));
    if (choice.plugin.empty()) throw bad("params without a scheduler");
    if (brace != std::string::npos) {
      if (one.back() != '}') throw bad("text after the params of " + choice.plugin);
      std::stringstream params(one.substr(brace + 1, one.size() - brace - 2));
      for (std::string pair; std::getline(params, pair, ',');) {
        const size_t colon = pair.find(':');
        if (colon == std::string::npos || trimmed(pair.substr(0, colon)).empty()) {
          throw bad("'" + trimmed(pair) + "' is not key: value");
        }
        choice.params[trimmed(pair.substr(0, colon))] = trimmed(pair.substr(colon + 1));
      }
    }
    choices.push_back(choice);
  }
  return choices;
}

// Every shipped scheduler that predicts its time, in the order ties are broken.
constexpr const char* kDefaultCandidates =
    "ring, tree, halving_doubling, recursive_doubling, swing, swing{variant: latency}, "
    "bidirectional_ring, double_binary_tree, knomial, bruck";

class AutoScheduler : public Scheduler {
 public:
  explicit AutoScheduler(const PluginContext& context) {
    const std::string rules_file = context.params->getString("rules_file", "");
    const std::string calibration = context.params->getString("calibration", "");
    auto choices = parseCandidates(context.params->getString("candidates", kDefaultCandidates));
    if (choices.empty()) throw ConfigError("auto: params.candidates names no scheduler");
    for (const auto& choice : choices) add(context, choice, "auto candidate");
    if (!rules_file.empty()) {
      rules_ = context.read_rules(rules_file);
      // A rule's scheduler with the params it was measured with.
      for (const auto& r : rules_.rules) add(context, r.choice, "rule of " + rules_file);
    }
    model_ = calibration.empty() ? builtInModel() : readCalibration(calibration);
    model_from_file_ = !calibration.empty();
  }

  Decision accepts(const CollectiveArgs& args, const Topology& topology) const override {
    std::string reasons;
    // Accepted "by" the candidate it picks, so that the provenance names what ran.
    if (Scheduler* chosen = choose(args, topology, &reasons))
      return Decision::yesBy(nameOf(chosen));
    return Decision::no("auto: no candidate can run it:" + reasons);
  }

  void run(const CollectiveArgs& args, Backend& backend, const Topology& topology) override {
    std::string reasons;
    Scheduler* chosen = choose(args, topology, &reasons);
    if (chosen == nullptr) throw CommError("auto: no candidate can run it:" + reasons);
    chosen->run(args, backend, topology);
  }

  // The run's own calibration replaces the built-in model; a file named in
  // params.calibration stays what the user asked for. Candidates that hold schedulers get
  // it too.
  void useCostModel(const CostModel& model) override {
    if (!model_from_file_) model_ = model;
    for (auto& [name, scheduler] : candidates_) scheduler->useCostModel(model);
    std::lock_guard<std::mutex> lock(chosen_mu_);
    chosen_.clear();
  }

  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    std::string ignored;
    Scheduler* chosen = choose(args, topology, &ignored);
    // `model` is sized already, and a bank priced by the caller (predictCollective).
    return chosen ? chosen->predictSeconds(args, topology, model) : kNoPrediction;
  }

 private:
  std::string nameOf(const Scheduler* scheduler) const {
    for (const auto& [n, s] : candidates_) {
      if (s.get() == scheduler) return n;
    }
    return "";
  }

  void add(const PluginContext& context, const RuleChoice& choice, const std::string& why) {
    const std::string name = choice.name();
    if (find(name) != nullptr) return;
    if (choice.plugin == "auto") throw ConfigError("auto: cannot choose among itself");
    Params params("scheduler '" + name + "' (" + why + ")");
    for (const auto& [key, value] : choice.params) params.set(key, value);
    candidates_.emplace_back(name, context.make_scheduler(choice.plugin, params));
  }

  // Whether the rules file was measured for this collective, group size (0: any) and
  // backend ("": any; a group that does not know its backend takes any).
  bool rulesApply(const CollectiveArgs& args, const Topology& topology) const {
    if (rules_.rules.empty()) return false;
    const bool same =
        rules_.collective == collectiveName(args.coll) &&
        (rules_.world_size == 0 || rules_.world_size == topology.world_size) &&
        (rules_.backend.empty() || topology.backend.empty() || rules_.backend == topology.backend);
    if (!same) {
      std::call_once(*mismatch_warned_, [&] {
        logWarn("auto: the rules file was measured for " + rules_.collective + " on " +
                std::to_string(rules_.world_size) + " ranks over " +
                (rules_.backend.empty() ? "any backend" : rules_.backend) + ", not " +
                collectiveName(args.coll) + " on " + std::to_string(topology.world_size) +
                " over " + (topology.backend.empty() ? "this backend" : topology.backend) +
                "; choosing by the cost model instead");
      });
    }
    return same;
  }

  Scheduler* find(const std::string& name) const {
    for (const auto& [n, s] : candidates_) {
      if (n == name) return s.get();
    }
    return nullptr;
  }

  // What a choice depends on: the call's shape and the group's.
  struct Shape {
    Collective coll;
    DType dtype;
    ReduceOp op;
    MemoryKind memory;
    int root;
    size_t data, output;
    int world_size;
    std::vector<int> node_of_rank;
    std::string backend;
    bool same(const CollectiveArgs& a, const Topology& t) const {
      return coll == a.coll && dtype == a.data.dtype && op == a.op && memory == a.data.memory &&
             root == a.root && data == a.data.count && output == a.output.count &&
             world_size == t.world_size && node_of_rank == t.node_of_rank && backend == t.backend;
    }
  };
  static constexpr size_t kChoicesKept = 64;

  // choose(), remembered for the last kChoicesKept shapes that one was found for: a
  // collective's choice is the same every time its shape is, and the predictions behind it
  // cost hundreds of allocations; training calls the same few shapes every step.
  Scheduler* choose(const CollectiveArgs& args, const Topology& topology,
                    std::string* reasons) const {
    {
      std::lock_guard<std::mutex> lock(chosen_mu_);
      for (const auto& [shape, scheduler] : chosen_) {
        if (shape.same(args, topology)) return scheduler;
      }
    }
    Scheduler* chosen = chooseNow(args, topology, reasons);
    if (chosen != nullptr) {
      std::lock_guard<std::mutex> lock(chosen_mu_);
      if (chosen_.size() == kChoicesKept) chosen_.erase(chosen_.begin());
      chosen_.push_back(
          {Shape{args.coll, args.data.dtype, args.op, args.data.memory, args.root, args.data.count,
                 args.output.count, topology.world_size, topology.node_of_rank, topology.backend},
           chosen});
    }
    return chosen;
  }

  // The rules file's choice when there is one, else the fastest predicted candidate that
  // accepts; ties and missing predictions fall back to candidate order.
  Scheduler* chooseNow(const CollectiveArgs& args, const Topology& topology,
                       std::string* reasons) const {
    const uint64_t bytes = args.bufferBytes();
    if (rulesApply(args, topology)) {
      const auto* rule = firstAdmitting(rules_.rules, bytes);
      Scheduler* ruled = rule ? find(rule->choice.name()) : nullptr;
      if (ruled != nullptr && ruled->accepts(args, topology).accepted) return ruled;
    }
    Scheduler* best = nullptr;
    double best_time = INFINITY;
    for (const auto& [name, scheduler] : candidates_) {
      Decision d = scheduler->accepts(args, topology);
      if (!d.accepted) {
        *reasons += " " + d.reason + ";";
        continue;
      }
      double t = predictCollective(*scheduler, args, topology, model_);
      if (best == nullptr || (std::isfinite(t) && t < best_time)) {
        best = scheduler.get();
        best_time = std::isfinite(t) ? t : best_time;
      }
    }
    return best;
  }

  RulesFile rules_;
  CostModel model_;
  bool model_from_file_ = false;
  std::unique_ptr<std::once_flag> mismatch_warned_ = std::make_unique<std::once_flag>();
  std::vector<std::pair<std::string, std::shared_ptr<Scheduler>>> candidates_;
  mutable std::mutex chosen_mu_;
  mutable std::vector<std::pair<Shape, Scheduler*>> chosen_;  // oldest first
};

}  // namespace
}  // namespace collie::autoselect

COLLIE_SCHEDULER_PLUGIN("auto", "1.0.0",
                        "picks a scheduler per collective and size (cost model or bench rules)",
                        collie::autoselect::AutoScheduler);
