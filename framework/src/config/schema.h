// A small schema language for collie's YAML files: every key validated with its location,
// defaults filled in so that the saved config is the resolved one.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace collie::config {

class Schema {
 public:
  enum class Type {
    kMap,
    kList,
    kString,
    kInt,
    kFloat,
    kBool,
    kBytes,
    kDuration,
    kEnum,
    kParams,
    kPluginRef
  };

  static Schema map(std::vector<std::pair<std::string, Schema>> fields);
  static Schema list(Schema item, size_t min_items = 0);
  static Schema string();
  static Schema integer(int64_t min, int64_t max);
  static Schema number(double min, double max);
  static Schema boolean();
  static Schema bytes(uint64_t min, uint64_t max);
  static Schema duration();
  static Schema oneOf(std::vector<std::string> choices);
  // A free map of scalar plugin params (checked by the plugin itself).
  static Schema params();
  // A plugin: a name/path, or {plugin: NAME, params: {...}, label: TEXT}.
  static Schema pluginRef();

  Schema&& required() &&;
  Schema&& byDefault(const std::string& yaml) &&;
  Schema&& doc(const std::string& text) &&;
  // A map that stays absent when the file leaves it out (no defaults filled in): one of
  // several alternative sections, such as bench: and train:.
  Schema&& optionalSection() &&;
  // Also accepts this one word in place of the value (micro_batch: auto).
  Schema&& orWord(const std::string& word) &&;

  Type type() const { return type_; }
  const std::string& documentation() const { return doc_; }
  const std::vector<std::pair<std::string, Schema>>& fields() const { return fields_; }
  const Schema* field(const std::string& name) const;
  const Schema* item() const { return item_.get(); }
  const std::vector<std::string>& choices() const { return choices_; }
  bool isRequired() const { return required_; }
  bool isOptionalSection() const { return optional_section_; }
  const std::string& defaultValue() const { return default_; }
  // "a size between 1 B and 1 GiB (e.g. 4KiB, 64MiB, 25MB)"
  std::string expected() const;

 private:
  Type type_ = Type::kString;
  std::string doc_;
  std::vector<std::pair<std::string, Schema>> fields_;
  std::shared_ptr<Schema> item_;
  std::vector<std::string> choices_;
  size_t min_items_ = 0;
  double min_ = 0, max_ = 0;
  bool required_ = false;
  bool optional_section_ = false;
  std::string word_;
  std::string default_;

  friend class Validator;
};

// One problem found in a config, already formatted "where: key: expected ..., found ...".
struct Issue {
  std::string message;
};

// Validates `node` against `schema` in place: fills defaults, and collects every problem.
// `file` and `overrides` (dotted keys set by --set) are used to say where a value came from.
std::vector<Issue> validate(YAML::Node& node, const Schema& schema, const std::string& file,
                            const std::vector<std::string>& overrides);

// The schema of an experiment file (docs/config.md documents it).
const Schema& experimentSchema();

}  // namespace collie::config
