// Scheduler selection rules by message size: written by the bench (--emit-rules), read and
// validated by the framework, handed to the `auto` scheduler (PluginContext::read_rules).
// The first rule whose max_bytes admits the message wins. Types only: plugins include this,
// the framework implements reading and writing (config/rules.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace collie {

// A choice that applies to messages of up to max_bytes. Wherever collie selects by size (a
// rules file for `auto`, a config's scheduler rules, the Communicator's rules) the first
// rule that admits a message wins: firstAdmitting().
template <typename T>
struct SizeRule {
  uint64_t max_bytes = 0;  // 0: any size
  T choice;

  bool admits(uint64_t bytes) const { return max_bytes == 0 || bytes <= max_bytes; }
};

// The first of `rules` that admits `bytes` and for which accept(rule) holds, or null.
template <typename T, typename Accept>
const SizeRule<T>* firstAdmitting(const std::vector<SizeRule<T>>& rules, uint64_t bytes,
                                  Accept&& accept) {
  for (const auto& rule : rules) {
    if (rule.admits(bytes) && accept(rule)) return &rule;
  }
  return nullptr;
}
template <typename T>
const SizeRule<T>* firstAdmitting(const std::vector<SizeRule<T>>& rules, uint64_t bytes) {
  return firstAdmitting(rules, bytes, [](const SizeRule<T>&) { return true; });
}

// What a rule chooses: a scheduler with the params it was measured with (a hierarchical
// scheduler's intra and inter, a tree's segment size).
struct RuleChoice {
  std::string plugin;                         // a name or path
  std::map<std::string, std::string> params;  // scalar params, as a config's params: holds

  // "ring", or "hierarchical{inter: tree, intra: ring}": one name per distinct choice.
  std::string name() const {
    if (params.empty()) return plugin;
    std::string text = plugin + "{";
    for (const auto& [key, value] : params)
      text += (text.back() == '{' ? "" : ", ") + key + ": " + value;
    return text + "}";
  }
};

struct RulesFile {
  std::string collective = "allreduce";
  int world_size = 0;   // the group size the rules were measured on (0: any)
  std::string backend;  // the backend they were measured on ("": any)
  std::vector<SizeRule<RuleChoice>> rules;
};

}  // namespace collie
