// Schema construction and validation of YAML nodes, with file:line:col in every message.
#include "config/schema.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>

#include <cmath>
#include <set>

#include "collie/buffer.h"
#include "collie/collective.h"
#include "collie/params.h"
#include "core/strings.h"

namespace collie::config {

Schema Schema::map(std::vector<std::pair<std::string, Schema>> fields) {
  Schema s;
  s.type_ = Type::kMap;
  s.fields_ = std::move(fields);
  return s;
}
Schema Schema::list(Schema item, size_t min_items) {
  Schema s;
  s.type_ = Type::kList;
  s.item_ = std::make_shared<Schema>(std::move(item));
  s.min_items_ = min_items;
  return s;
}
Schema Schema::string() { return Schema(); }
Schema Schema::ranged(Type type, double min, double max) {
  Schema s;
  s.type_ = type;
  s.min_ = min;
  s.max_ = max;
  return s;
}
Schema Schema::integer(int64_t min, int64_t max) {
  return ranged(Type::kInt, static_cast<double>(min), static_cast<double>(max));
}
Schema Schema::number(double min, double max) { return ranged(Type::kFloat, min, max); }
Schema Schema::boolean() {
  Schema s;
  s.type_ = Type::kBool;
  return s;
}
Schema Schema::bytes(uint64_t min, uint64_t max) {
  return ranged(Type::kBytes, static_cast<double>(min), static_cast<double>(max));
}
Schema Schema::duration() {
  Schema s;
  s.type_ = Type::kDuration;
  return s;
}
Schema Schema::oneOf(std::vector<std::string> choices) {
  Schema s;
  s.type_ = Type::kEnum;
  s.choices_ = std::move(choices);
  return s;
}
Schema Schema::params() {
  Schema s;
  s.type_ = Type::kParams;
  return s;
}
Schema Schema::pluginRef() {
  Schema s;
  s.type_ = Type::kPluginRef;
  return s;
}
Schema&& Schema::required() && {
  required_ = true;
  return std::move(*this);
}
Schema&& Schema::byDefault(const std::string& yaml) && {
  default_ = yaml;
  return std::move(*this);
}
Schema&& Schema::doc(const std::string& text) && {
  doc_ = text;
  return std::move(*this);
}
Schema&& Schema::orAutoAmongCandidates() && {
  auto_candidates_ = true;
  return std::move(*this);
}
Schema&& Schema::orWord(const std::string& word) && {
  word_ = word;
  return std::move(*this);
}
Schema&& Schema::optionalSection() && {
  optional_section_ = true;
  return std::move(*this);
}

const Schema* Schema::field(const std::string& name) const {
  for (const auto& [key, schema] : fields_) {
    if (key == name) return &schema;
  }
  return nullptr;
}

std::string Schema::expected() const {
  if (!word_.empty()) {
    Schema plain = *this;
    plain.word_.clear();
    return plain.expected() + " or '" + word_ + "'";
  }
  auto num = [](double v) {
    if (v == std::floor(v) && std::fabs(v) < 1e18)
      return fmt::format("{}", static_cast<int64_t>(v));
    return fmt::format("{:g}", v);
  };
  switch (type_) {
    case Type::kMap:
      return "a map";
    case Type::kList:  // a single item stands for a list of one
      return item_ ? item_->expected() + " or a list of them" : "a list";
    case Type::kString:
      return "a string";
    case Type::kInt:
      return "an integer in [" + num(min_) + ", " + num(max_) + "]";
    case Type::kFloat:
      return "a number in [" + num(min_) + ", " + num(max_) + "]";
    case Type::kBool:
      return "true or false";
    case Type::kBytes:
      return "a size between " + formatBytes(static_cast<uint64_t>(min_)) + " and " +
             formatBytes(static_cast<uint64_t>(max_)) + " (e.g. 4KiB, 64MiB, 25MB)";
    case Type::kDuration:
      return "a duration (e.g. 30s, 500ms, 2m)";
    case Type::kEnum:
      return "one of " + detail::join(choices_, ", ");
    case Type::kParams:
      return "a map of plugin params";
    case Type::kPluginRef:
      return "a plugin name, a path, or {plugin: NAME, params: {...}}";
  }
  return "?";
}

namespace {

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "'" + node.Scalar() + "'";
  }
}

}  // namespace

class Validator {
 public:
  Validator(const std::string& file, const std::vector<std::string>& overrides)
      : file_(file), overrides_(overrides) {}

  void check(YAML::Node& node, const Schema& schema, const std::string& key) {
    if (!schema.word_.empty() && node.IsScalar() && node.Scalar() == schema.word_) return;
    switch (schema.type_) {
      case Schema::Type::kMap:
        return checkMap(node, schema, key);
      case Schema::Type::kList:
        return checkList(node, schema, key);
      case Schema::Type::kParams:
        return checkParams(node, key);
      case Schema::Type::kPluginRef:
        return checkPluginRef(node, schema, key);
      default:
        return checkScalar(node, schema, key);
    }
  }

  std::vector<Issue> issues;

 private:
  std::string where(const YAML::Node& node, const std::string& key) const {
    for (const auto& o : overrides_) {
      if (key == o || key.rfind(o + ".", 0) == 0 || key.rfind(o + "[", 0) == 0) {
        return "--set " + o;
      }
    }
    return locate(file_, node.Mark());
  }

  void report(const YAML::Node& node, const std::string& key, const std::string& text) {
    issues.push_back({where(node, key) + ": " + (key.empty() ? "(top level)" : key) + ": " + text});
  }

  void mismatch(const YAML::Node& node, const Schema& schema, const std::string& key) {
    report(node, key, "expected " + schema.expected() + ", found " + describe(node));
  }

  static std::string child(const std::string& key, const std::string& name) {
    return key.empty() ? name : key + "." + name;
  }

  void checkMap(YAML::Node& node, const Schema& schema, const std::string& key) {
    if (!node.IsMap()) return mismatch(node, schema, key);
    std::vector<std::string> names;
    for (const auto& [name, s] : schema.fields_) names.push_back(name);
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) {
        report(it->first, key, "map keys must be plain words, found " + describe(it->first));
        continue;
      }
      std::string name = it->first.Scalar();
      if (!seen.insert(name).second) {
        report(it->first, child(key, name), "duplicate key (YAML would keep only one of them)");
        continue;
      }
      if (schema.field(name) == nullptr) {
        report(it->first, child(key, name),
               "unknown key" + detail::didYouMean(name, names) +
                   "; expected one of: " + detail::join(names, ", "));
      }
    }
    for (const auto& [name, s] : schema.fields_) {
      YAML::Node value = node[name];
      if (!value.IsDefined() || value.IsNull()) {
        if (s.required_) {
          report(node, child(key, name), "missing required key (" + s.expected() + ")");
        } else if (!s.default_.empty()) {
          node[name] = YAML::Load(s.default_);
        } else if (s.type_ == Schema::Type::kMap && !s.optional_section_) {
          YAML::Node empty(YAML::NodeType::Map);
          check(empty, s, child(key, name));  // fills the nested defaults
          node[name] = empty;
        }
        continue;
      }
      check(value, s, child(key, name));
    }
  }

  void checkList(YAML::Node& node, const Schema& schema, const std::string& key) {
    if (node.IsScalar()) {          // a single value stands for a list of one
      if (!schema.word_.empty()) {  // neither the word nor one item: say both are possible
        Validator probe(file_, overrides_);
        YAML::Node copy = YAML::Clone(node);
        probe.check(copy, *schema.item_, key);
        if (!probe.issues.empty()) return mismatch(node, schema, key);
      }
      YAML::Node list(YAML::NodeType::Sequence);
      list.push_back(YAML::Clone(node));
      node = list;
    }
    if (!node.IsSequence()) return mismatch(node, schema, key);
    if (node.size() < schema.min_items_) {
      report(node, key,
             fmt::format("expected at least {} item(s), found {}", schema.min_items_, node.size()));
    }
    for (size_t i = 0; i < node.size(); ++i) {
      YAML::Node item = node[i];
      check(item, *schema.item_, fmt::format("{}[{}]", key, i));
    }
  }

  void checkParams(YAML::Node& node, const std::string& key) {
    if (!node.IsMap()) return mismatch(node, Schema::params(), key);
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar() || !it->second.IsScalar()) {
        report(
            it->second, child(key, it->first.Scalar()),
            "plugin params must be scalars (numbers, sizes, words), found " + describe(it->second));
      }
    }
  }

  void checkPluginRef(YAML::Node& node, const Schema& schema, const std::string& key) {
    if (schema.auto_candidates_) {
      const bool word = node.IsScalar() && node.Scalar() == "auto";
      if (word || (node.IsMap() && node["plugin"] && node["plugin"].IsScalar() &&
                   node["plugin"].Scalar() == "auto")) {
        if (word) {
          report(node, key,
                 "auto chooses among params.candidates. HINT: give {plugin: auto, params: "
                 "{candidates: [none, bf16, powersgd]}}");
          return;
        }
        static const Schema kAuto = Schema::map(
            {{"plugin", Schema::string()},
             {"label", Schema::string()},
             {"params",
              Schema::map({{"candidates", Schema::list(Schema::pluginRef(), 1).required()}})
                  .required()}});
        checkMap(node, kAuto, key);
        return;
      }
    }
    static const Schema kRule = Schema::map({{"max_bytes", Schema::bytes(1, 1ull << 50)},
                                             {"plugin", Schema::string().required()},
                                             {"params", Schema::params()}});
    static const Schema kRef = Schema::map({{"plugin", Schema::string()},
                                            {"params", Schema::params()},
                                            {"label", Schema::string()},
                                            {"rules", Schema::list(kRule, 1)}});
    if (node.IsScalar() && !node.Scalar().empty()) return;
    if (node.IsMap()) {
      checkMap(node, kRef, key);
      const bool plugin = node["plugin"].IsDefined(), rules = node["rules"].IsDefined();
      if (plugin == rules) {
        report(node, key,
               "expected exactly one of 'plugin' (one scheduler) or 'rules' (a list "
               "of {max_bytes, plugin}, first match by message size wins)");
      }
      return;
    }
    mismatch(node, Schema::pluginRef(), key);
  }

  void checkScalar(YAML::Node& node, const Schema& schema, const std::string& key) {
    if (!node.IsScalar()) return mismatch(node, schema, key);
    const std::string& text = node.Scalar();
    bool ok = true;
    switch (schema.type_) {
      case Schema::Type::kInt: {
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(text.c_str(), &end, 10);
        ok = !text.empty() && *end == '\0' && errno == 0 && v >= schema.min_ && v <= schema.max_;
        break;
      }
      case Schema::Type::kFloat: {
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        ok = !text.empty() && *end == '\0' && std::isfinite(v) && v >= schema.min_ &&
             v <= schema.max_;
        break;
      }
      case Schema::Type::kBool: {
        bool b;
        ok = YAML::convert<bool>::decode(node, b);
        break;
      }
      case Schema::Type::kBytes: {
        uint64_t v = 0;
        ok = parseBytes(text, &v) && v >= schema.min_ && v <= schema.max_;
        break;
      }
      case Schema::Type::kDuration: {
        std::chrono::milliseconds v{};
        ok = parseDuration(text, &v);
        break;
      }
      case Schema::Type::kEnum: {
        bool found = false;
        for (const auto& c : schema.choices_) found = found || c == text;
        if (!found) {
          return report(node, key,
                        "expected " + schema.expected() + ", found '" + text + "'" +
                            detail::didYouMean(text, schema.choices_));
        }
        break;
      }
      default:
        break;
    }
    if (!ok) mismatch(node, schema, key);
  }

  std::string file_;
  std::vector<std::string> overrides_;
};

std::string locate(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return fmt::format("{}:{}:{}", file, mark.line + 1, mark.column + 1);
}

YAML::Node parseYaml(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw ConfigError(fmt::format("{}: nesting deeper than {} levels; a config needs a few",
                                  locate(file, e.mark), e.depth() - 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError(locate(file, e.mark) + ": not valid YAML: " + e.msg);
  }
}

std::vector<Issue> validate(YAML::Node& node, const Schema& schema, const std::string& file,
                            const std::vector<std::string>& overrides) {
  Validator validator(file, overrides);
  validator.check(node, schema, "");
  return validator.issues;
}

uint64_t Schema::bytesOf(const YAML::Node& node) {
  uint64_t v = 0;
  parseBytes(node.Scalar(), &v);
  return v;
}

std::chrono::milliseconds Schema::durationOf(const YAML::Node& node) {
  std::chrono::milliseconds v{};
  parseDuration(node.Scalar(), &v);
  return v;
}

void Schema::fillAny(const YAML::Node& node, void* target, const std::string& file) const {
  if (section_) target = section_(target);
  if (set_) {
    // The word of orWord() is for a custom setter to read; a plain binding skips it.
    set_(target, node, file);
    return;
  }
  if (type_ != Type::kMap) return;
  for (const auto& [name, field] : fields_) {
    YAML::Node value = node.IsMap() ? node[name] : YAML::Node();
    if (value.IsDefined() && !value.IsNull()) {
      field.fillAny(value, target, file);
    } else if (field.type_ == Type::kMap) {  // a section left out: its defaults
      YAML::Node defaults(YAML::NodeType::Map);
      validate(defaults, field, file, {});
      field.fillAny(defaults, target, file);
    }
  }
}

}  // namespace collie::config
