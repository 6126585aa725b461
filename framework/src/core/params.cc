// Plugin params: typed getters with located errors, sizes and durations with units.
#include "collie/params.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "collie/error.h"
#include "core/strings.h"

namespace collie {
namespace {

// Splits "64 MiB" into the number 64 and the unit "MiB".
bool splitNumber(const std::string& text, double* number, std::string* unit) {
  std::string t = detail::trim(text);
  if (t.empty()) return false;
  const char* begin = t.c_str();
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(begin, &end);
  if (end == begin || errno == ERANGE || !std::isfinite(value)) return false;
  *number = value;
  *unit = detail::trim(std::string(end));
  return true;
}

}  // namespace

bool parseBytes(const std::string& text, uint64_t* out) {
  double number = 0;
  std::string unit;
  if (!splitNumber(text, &number, &unit) || number < 0) return false;
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0},
                                                          {"k", 1e3},
                                                          {"K", 1024.0},
                                                          {"M", 1048576.0},
                                                          {"G", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    double bytes = number * scale;
    if (bytes > 1.8e19 || bytes != std::floor(bytes)) return false;
    *out = static_cast<uint64_t>(bytes);
    return true;
  }
  return false;
}

bool parseDuration(const std::string& text, std::chrono::milliseconds* out) {
  double number = 0;
  std::string unit;
  if (!splitNumber(text, &number, &unit) || number < 0) return false;
  double ms = 0;
  if (unit.empty() || unit == "s") {
    ms = number * 1e3;
  } else if (unit == "ms") {
    ms = number;
  } else if (unit == "m" || unit == "min") {
    ms = number * 60e3;
  } else if (unit == "h") {
    ms = number * 3600e3;
  } else {
    return false;
  }
  if (ms > 1e15) return false;
  *out = std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
  return true;
}

std::string formatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return fmt::format("{} {}", bytes, kUnits[unit]);
}

void Params::set(const std::string& key, const std::string& value, const std::string& where) {
  values_[key] = value;
  where_[key] = where;
}

bool Params::has(const std::string& key) const { return values_.count(key) != 0; }

std::string Params::where(const std::string& key) const {
  auto it = where_.find(key);
  return it == where_.end() || it->second.empty() ? "" : it->second + ": ";
}

const std::string* Params::lookup(const std::string& key) const {
  read_.insert(key);
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::string Params::getString(const std::string& key, const std::string& fallback) const {
  const std::string* found = lookup(key);
  return found == nullptr ? fallback : *found;
}

namespace {
[[noreturn]] void badParam(const Params& params, const std::string& key, const std::string& found,
                           const std::string& expected) {
  throw ConfigError(params.where(key) + params.owner() + ": params." + key + ": expected " +
                    expected + ", found '" + found + "'");
}
}  // namespace

int64_t Params::getInt(const std::string& key, int64_t fallback, int64_t min, int64_t max) const {
  const std::string* found = lookup(key);
  if (found == nullptr) return fallback;
  const std::string& text = *found;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  std::string range = fmt::format("an integer in [{}, {}]", min, max);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min || value > max) {
    badParam(*this, key, text, range);
  }
  return value;
}

double Params::getDouble(const std::string& key, double fallback) const {
  const std::string* found = lookup(key);
  if (found == nullptr) return fallback;
  const std::string& text = *found;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value)) badParam(*this, key, text, "a number");
  return value;
}

bool Params::getBool(const std::string& key, bool fallback) const {
  const std::string* found = lookup(key);
  if (found == nullptr) return fallback;
  const std::string& text = *found;
  if (text == "true" || text == "yes" || text == "on" || text == "1") return true;
  if (text == "false" || text == "no" || text == "off" || text == "0") return false;
  badParam(*this, key, text, "true or false");
}

uint64_t Params::getBytes(const std::string& key, uint64_t fallback, uint64_t min,
                          uint64_t max) const {
  const std::string* found = lookup(key);
  if (found == nullptr) return fallback;
  const std::string& text = *found;
  uint64_t value = 0;
  if (!parseBytes(text, &value) || value < min || value > max) {
    badParam(*this, key, text,
             "a size between " + formatBytes(min) + " and " + formatBytes(max) +
                 " (e.g. 4KiB, 1MiB, 25MB)");
  }
  return value;
}

std::chrono::milliseconds Params::getDuration(const std::string& key,
                                              std::chrono::milliseconds fallback) const {
  const std::string* found = lookup(key);
  if (found == nullptr) return fallback;
  const std::string& text = *found;
  std::chrono::milliseconds value{};
  if (!parseDuration(text, &value)) badParam(*this, key, text, "a duration (e.g. 30s, 500ms, 2m)");
  return value;
}

std::vector<std::string> Params::unreadKeys() const {
  std::vector<std::string> unread;
  for (const auto& [key, value] : values_) {
    if (!read_.count(key)) unread.push_back(key);
  }
  return unread;
}

}  // namespace collie
