// Scheduler selection and provenance.
#include "runtime/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "collie/error.h"
#include "collie/params.h"
#include "config/experiment.h"
#include "plugin/loader.h"
#include "runtime/faults.h"

namespace collie {

Communicator::Communicator(std::shared_ptr<Backend> backend, std::string backend_name,
                           Topology topology)
    : backend_(std::move(backend)),
      backend_name_(std::move(backend_name)),
      topology_(std::move(topology)) {
  topology_.capabilities = backend_->capabilities();  // what native and accepts() consult
}

void Communicator::addRule(std::string label, std::shared_ptr<Scheduler> scheduler,
                           uint64_t max_bytes) {
  rules_.push_back({max_bytes, {std::move(label), std::move(scheduler)}});
}

namespace {
uint64_t bytesOf(const CollectiveArgs& args) {
  return std::max(args.data.bytes(), args.output.bytes());
}
}  // namespace

Provenance Communicator::runRule(const Rule& rule, CollectiveArgs args, std::string ran) {
  const std::string& label = rule.choice.label;
  args.seq = next_seq_++;
  if (faults_ != nullptr) faults_->beforeCollective(args.seq);
  const uint64_t bytes = bytesOf(args);
  auto start = std::chrono::steady_clock::now();
  try {
    rule.choice.scheduler->run(args, *backend_, topology_);
  } catch (const CommError& e) {
    throw CommError(fmt::format("{} seq {} ({}, scheduler {}, backend {}) failed on rank {}: {}",
                                collectiveName(args.coll), args.seq, formatBytes(bytes), label,
                                backend_name_, backend_->rank(), e.what()));
  }
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return {label, backend_name_, args.coll, bytes, args.seq, took.count(), std::move(ran)};
}

Provenance Communicator::run(CollectiveArgs args) { return run(args, rules_); }

const Communicator::Rule* Communicator::select(const CollectiveArgs& args,
                                               const std::vector<Rule>& rules,
                                               std::string* refusals, std::string* ran) const {
  return firstAdmitting(rules, bytesOf(args), [&](const Rule& rule) {
    Decision decision = rule.choice.scheduler->accepts(args, topology_);
    if (!decision.accepted) {
      // A refusal names its plugin ("tree: ..."); the label is added only when it differs.
      const std::string prefix = rule.choice.label + ": ";
      const bool named = decision.reason.compare(0, prefix.size(), prefix) == 0;
      *refusals += (refusals->empty() ? "" : "; ") + (named ? "" : prefix) + decision.reason;
    } else if (ran != nullptr) {
      *ran = decision.reason.empty() ? rule.choice.label : decision.reason;
    }
    return decision.accepted;
  });
}

Provenance Communicator::run(CollectiveArgs args, const std::vector<Rule>& rules) {
  std::string refusals, ran;
  if (const Rule* rule = select(args, rules, &refusals, &ran)) return runRule(*rule, args, ran);
  throw ConfigError(std::string("no scheduler can run ") + collectiveName(args.coll) + " of " +
                    formatBytes(bytesOf(args)) + ": " +
                    (refusals.empty() ? "no rule admits this size" : refusals) +
                    ". HINT: add a scheduler that implements it to the rules");
}

std::vector<Communicator::Rule> createRules(const PluginLoader& loader,
                                            const config::PluginRef& ref) {
  auto create = [&](const config::PluginRef& one) {
    Params params = one.params;
    return loader.createScheduler(one.plugin, params);
  };
  std::vector<Communicator::Rule> rules;
  if (ref.rules.empty()) rules.push_back({0, {ref.label, create(ref)}});
  for (const auto& rule : ref.rules) {
    rules.push_back({rule.max_bytes, {rule.choice.label, create(rule.choice)}});
  }
  return rules;
}

}  // namespace collie
