// "auto": picks a scheduler per collective from its message size and the group. Built-in
// decisions come from the candidates' α-β-γ predictions; a rules file written by the bench
// (`--emit-rules`) replaces them, as Open MPI's coll/tuned keeps fixed rules apart from rules
// read from a file.
#include <cmath>
#include <map>
#include <sstream>

#include "collie/plugin.h"
#include "collie/rules.h"

namespace collie::autoselect {
namespace {

// Built-in model parameters: loopback ranks on the 2-core reference machine, as the bench
// calibrated them (docs in plugins/auto/README.md). Only their ratios matter for choosing.
CostModel builtInModel() {
  CostModel model;
  model.intra = {30e-6, 1.0 / 2.0e9};
  model.inter = model.intra;
  model.gamma = 1.0 / 3.0e9;
  return model;
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

class AutoScheduler : public Scheduler {
 public:
  explicit AutoScheduler(const PluginContext& context) {
    const std::string rules_file = context.params->getString("rules_file", "");
    auto names = splitList(context.params->getString("candidates", "ring,tree,halving_doubling"));
    if (!rules_file.empty()) {
      rules_ = context.read_rules(rules_file).rules;
      for (const auto& r : rules_) {
        if (std::find(names.begin(), names.end(), r.choice) == names.end())
          names.push_back(r.choice);
      }
    }
    if (names.empty()) throw ConfigError("auto: params.candidates names no scheduler");
    for (const auto& name : names) {
      if (name == "auto") throw ConfigError("auto: cannot choose among itself");
      Params params("scheduler '" + name + "' (auto candidate)");
      candidates_.emplace_back(name, context.make_scheduler(name, params));
    }
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

  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const override {
    std::string ignored;
    Scheduler* chosen = choose(args, topology, &ignored);
    return chosen ? chosen->predictSeconds(args, topology, model) : kNoPrediction;
  }

 private:
  std::string nameOf(const Scheduler* scheduler) const {
    for (const auto& [n, s] : candidates_) {
      if (s.get() == scheduler) return n;
    }
    return "";
  }

  Scheduler* find(const std::string& name) const {
    for (const auto& [n, s] : candidates_) {
      if (n == name) return s.get();
    }
    return nullptr;
  }

  // The rules file's choice when there is one, else the fastest predicted candidate that
  // accepts; ties and missing predictions fall back to candidate order.
  Scheduler* choose(const CollectiveArgs& args, const Topology& topology,
                    std::string* reasons) const {
    const uint64_t bytes = std::max(args.data.bytes(), args.output.bytes());
    if (!rules_.empty()) {
      const auto* rule = firstAdmitting(rules_, bytes);
      Scheduler* ruled = rule ? find(rule->choice) : nullptr;
      if (ruled != nullptr && ruled->accepts(args, topology).accepted) return ruled;
    }
    const CostModel model = builtInModel();
    Scheduler* best = nullptr;
    double best_time = INFINITY;
    for (const auto& [name, scheduler] : candidates_) {
      Decision d = scheduler->accepts(args, topology);
      if (!d.accepted) {
        *reasons += " " + d.reason + ";";
        continue;
      }
      double t = scheduler->predictSeconds(args, topology, model);
      if (best == nullptr || (std::isfinite(t) && t < best_time)) {
        best = scheduler.get();
        best_time = std::isfinite(t) ? t : best_time;
      }
    }
    return best;
  }

  std::vector<SizeRule<std::string>> rules_;
  std::vector<std::pair<std::string, std::shared_ptr<Scheduler>>> candidates_;
};

}  // namespace
}  // namespace collie::autoselect

COLLIE_SCHEDULER_PLUGIN("auto", "1.0.0",
                        "picks ring, tree or halving_doubling per message size (cost model or "
                        "a rules file from the bench)",
                        collie::autoselect::AutoScheduler);
