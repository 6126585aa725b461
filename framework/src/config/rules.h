// Rules files for `auto` (collie/rules.h): the framework reads and validates them, and the
// bench writes them. Plugins get parsed rules through PluginContext::read_rules.
#pragma once

#include <string>

#include "collie/rules.h"

namespace collie::config {

// Reads a rules file. Throws ConfigError with file:line:col for anything malformed.
RulesFile readRulesFile(const std::string& path);
// Writes it (YAML, with a header comment naming where the rules came from).
void writeRulesFile(const std::string& path, const RulesFile& rules, const std::string& comment);

}  // namespace collie::config
