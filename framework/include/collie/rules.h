// Scheduler selection rules by message size: written by the bench (--emit-rules), read by
// the `auto` scheduler. The first rule whose max_bytes admits the message wins.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace collie {

struct SizeRule {
  uint64_t max_bytes = 0;  // 0: any size
  std::string plugin;      // a scheduler name or path
};

struct RulesFile {
  std::string collective = "allreduce";
  int world_size = 0;   // the group size the rules were measured on (0: unknown)
  std::string backend;  // the backend they were measured on
  std::vector<SizeRule> rules;
};

// Reads a rules file. Throws ConfigError with file:line:col for anything malformed.
RulesFile readRulesFile(const std::string& path);
// Writes it (YAML, with a header comment naming where the rules came from).
void writeRulesFile(const std::string& path, const RulesFile& rules, const std::string& comment);

// The plugin of the first rule admitting `bytes`, or "" when none does.
std::string pickRule(const std::vector<SizeRule>& rules, uint64_t bytes);

}  // namespace collie
