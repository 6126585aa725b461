// Rules files (YAML) for the auto scheduler.
#include "config/rules.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>

#include "collie/error.h"
#include "collie/params.h"
#include "config/experiment.h"
#include "config/schema.h"

namespace collie::config {
namespace {

void setRules(RulesFile& file, const YAML::Node& rules, const std::string&) {
  for (const auto& r : rules) {
    SizeRule<RuleChoice> rule;
    rule.choice.plugin = r["plugin"].Scalar();
    if (r["params"]) {
      for (auto it = r["params"].begin(); it != r["params"].end(); ++it)
        rule.choice.params[it->first.Scalar()] = it->second.Scalar();
    }
    if (r["max_bytes"]) parseBytes(r["max_bytes"].Scalar(), &rule.max_bytes);
    file.rules.push_back(rule);
  }
}

const Schema& rulesSchema() {
  static const Schema schema = Schema::map({
      {"collective",
       Schema::oneOf({"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"})
           .byDefault("allreduce")
           .into(&RulesFile::collective)},
      {"world_size", Schema::integer(0, 1 << 20).byDefault("0").into(&RulesFile::world_size)},
      {"backend", Schema::string().into(&RulesFile::backend)},
      {"rules", Schema::list(Schema::map({{"max_bytes", Schema::bytes(1, 1ull << 50)},
                                          {"plugin", Schema::string().required()},
                                          {"params", Schema::params()}}),
                             1)
                    .required()
                    .into<RulesFile>(setRules)},
  });
  return schema;
}

}  // namespace

RulesFile readRulesFile(const std::string& path) {
  std::string text = readConfigFile(path, "rules file");
  YAML::Node root = parseYaml(text, path);
  auto issues = validate(root, rulesSchema(), path, {});
  if (issues.empty() && !root.IsMap()) issues.push_back({path + ": expected a rules map"});
  if (!issues.empty()) {
    std::string all;
    for (const auto& i : issues) all += (all.empty() ? "" : "\n") + i.message;
    throw ConfigError(all + "\nHINT: `collie run CONFIG --emit-rules FILE` writes a valid one");
  }
  RulesFile file;
  rulesSchema().fill(root, &file, path);
  return file;
}

void writeRulesFile(const std::string& path, const RulesFile& rules, const std::string& comment) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "collective" << YAML::Value << rules.collective << YAML::Key
      << "world_size" << YAML::Value << rules.world_size << YAML::Key << "backend" << YAML::Value
      << rules.backend << YAML::Key << "rules" << YAML::Value << YAML::BeginSeq;
  for (const auto& r : rules.rules) {
    out << YAML::Flow << YAML::BeginMap;
    if (r.max_bytes != 0) {
      std::string size = formatBytes(r.max_bytes);
      size.erase(std::remove(size.begin(), size.end(), ' '), size.end());
      out << YAML::Key << "max_bytes" << YAML::Value << size;
    }
    out << YAML::Key << "plugin" << YAML::Value << r.choice.plugin;
    if (!r.choice.params.empty()) {
      out << YAML::Key << "params" << YAML::Value << YAML::BeginMap;
      for (const auto& [key, value] : r.choice.params)
        out << YAML::Key << key << YAML::Value << value;
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  std::ofstream file(path);
  file << "# " << comment << "\n" << out.c_str() << "\n";
  if (!file) throw ConfigError("cannot write rules file " + path);
}

}  // namespace collie::config
