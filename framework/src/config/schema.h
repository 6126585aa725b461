// A small schema language for collie's YAML files: every key validated with its location,
// defaults filled in so that the saved config is the resolved one.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "collie/error.h"

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
  // A pluginRef that also takes {plugin: auto, params: {candidates: [REF, ...]}}: a choice
  // among plugins, each a pluginRef (train.compression).
  Schema&& orAutoAmongCandidates() &&;

  // Bindings: where fill() writes a validated value. A map's entries write into the struct
  // of the nearest enclosing section(); the root's is the struct fill() is given.
  //
  // The value converted by this entry's type (integer, number, bool, size in bytes,
  // duration, string, or a list of them) goes into `member`.
  template <typename S, typename T>
  Schema&& into(T S::*member) &&;
  // For oneOf(): `values[i]` goes into `member` when the file says choices[i].
  template <typename S, typename T>
  Schema&& into(T S::*member, std::vector<T> values) &&;
  // A value that needs more than a conversion: `set(section, node, file)`.
  template <typename S>
  Schema&& into(std::function<void(S&, const YAML::Node&, const std::string& file)> set) &&;
  // For map(): its entries bind into `member` of the enclosing struct.
  template <typename S, typename T>
  Schema&& section(T S::*member) &&;
  // For a list of map(): each item is filled into a T (its entries bind into T) appended to
  // `member`; `index`, when given, receives the item's place in the list.
  template <typename S, typename T>
  Schema&& eachInto(std::vector<T> S::*member, int T::*index = nullptr) &&;

  // Writes every bound value of `node` (validated: defaults filled in) into `target`, the
  // struct the root binds into. An optional section the file left out gets its defaults.
  template <typename Root>
  void fill(const YAML::Node& node, Root* target, const std::string& file) const {
    fillAny(node, target, file);
  }

  Type type() const { return type_; }
  const std::string& documentation() const { return doc_; }
  const std::vector<std::pair<std::string, Schema>>& fields() const { return fields_; }
  const Schema* field(const std::string& name) const;
  const Schema* item() const { return item_.get(); }
  const std::vector<std::string>& choices() const { return choices_; }
  bool isRequired() const { return required_; }
  bool isOptionalSection() const { return optional_section_; }
  const std::string& defaultValue() const { return default_; }
  // Whether fill() writes this entry's value somewhere (into()).
  bool isBound() const { return static_cast<bool>(set_); }
  // "a size between 1 B and 1 GiB (e.g. 4KiB, 64MiB, 25MB)"
  std::string expected() const;

 private:
  // A scalar of `type` between min and max.
  static Schema ranged(Type type, double min, double max);

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
  bool auto_candidates_ = false;
  std::string default_;
  std::function<void(void* target, const YAML::Node& node, const std::string& file)> set_;
  std::function<void*(void* target)> section_;

  void fillAny(const YAML::Node& node, void* target, const std::string& file) const;
  // The value of a scalar `node` of this schema's type, as T.
  template <typename T>
  static T convert(Type type, const Schema* item, const YAML::Node& node);
  static uint64_t bytesOf(const YAML::Node& node);
  static std::chrono::milliseconds durationOf(const YAML::Node& node);

  friend class Validator;
};

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
T Schema::convert(Type type, const Schema* item, const YAML::Node& node) {
  if constexpr (IsVector<T>::value) {
    T values;
    for (const auto& v : node) {
      values.push_back(convert<typename T::value_type>(item->type_, item->item(), v));
    }
    return values;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return node.Scalar();
  } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    return durationOf(node);
  } else if constexpr (std::is_same_v<T, bool>) {
    return node.as<bool>();
  } else {
    static_assert(std::is_arithmetic_v<T>, "into(): bind a number, bool, string or list");
    if (type == Type::kBytes) return static_cast<T>(bytesOf(node));
    return node.as<T>();
  }
}

template <typename S, typename T>
Schema&& Schema::into(T S::*member) && {
  const Type type = type_;
  const Schema* item = item_.get();  // shared, so it outlives copies of this entry
  std::shared_ptr<Schema> keep = item_;
  set_ = [member, type, item, keep](void* target, const YAML::Node& node, const std::string&) {
    static_cast<S*>(target)->*member = convert<T>(type, item, node);
  };
  return std::move(*this);
}

template <typename S, typename T>
Schema&& Schema::into(T S::*member, std::vector<T> values) && {
  COLLIE_CHECK(type_ == Type::kEnum && values.size() == choices_.size(),
               "into(): one value per choice");
  set_ = [member, values, choices = choices_](void* target, const YAML::Node& node,
                                              const std::string&) {
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i] == node.Scalar()) static_cast<S*>(target)->*member = values[i];
    }
  };
  return std::move(*this);
}

template <typename S>
Schema&& Schema::into(std::function<void(S&, const YAML::Node&, const std::string& file)> set) && {
  set_ = [set](void* target, const YAML::Node& node, const std::string& file) {
    set(*static_cast<S*>(target), node, file);
  };
  return std::move(*this);
}

template <typename S, typename T>
Schema&& Schema::section(T S::*member) && {
  section_ = [member](void* target) -> void* { return &(static_cast<S*>(target)->*member); };
  return std::move(*this);
}

template <typename S, typename T>
Schema&& Schema::eachInto(std::vector<T> S::*member, int T::*index) && {
  COLLIE_CHECK(type_ == Type::kList && item_ && item_->type_ == Type::kMap,
               "eachInto(): a list of maps");
  std::shared_ptr<Schema> item = item_;
  set_ = [member, index, item](void* target, const YAML::Node& node, const std::string& file) {
    auto& items = static_cast<S*>(target)->*member;
    for (const auto& one : node) {
      T value{};
      if (index != nullptr) value.*index = static_cast<int>(items.size());
      item->fillAny(one, &value, file);
      items.push_back(std::move(value));
    }
  };
  return std::move(*this);
}

// "file:line:col" of `mark`, 1-based; just `file` when the mark is unknown.
std::string locate(const std::string& file, const YAML::Mark& mark);

// Parses YAML `text` of `file`. Throws ConfigError "file:line:col: not valid YAML: ..." (or
// that the nesting is too deep) for text yaml-cpp cannot read.
YAML::Node parseYaml(const std::string& text, const std::string& file);

// One problem found in a config, already formatted "where: key: expected ..., found ...".
struct Issue {
  std::string message;
};

// Validates `node` against `schema` in place: fills defaults, and collects every problem.
// `file` and `overrides` (dotted keys set by --set) are used to say where a value came from.
std::vector<Issue> validate(YAML::Node& node, const Schema& schema, const std::string& file,
                            const std::vector<std::string>& overrides);

// The schema of an experiment file, bound to config::Experiment (experiment.cc;
// docs/config.md documents it, and a test checks that the two agree).
const Schema& experimentSchema();

}  // namespace collie::config
