// The `params:` map of a plugin, with typed getters that report bad values with the
// config location, and a record of which keys the plugin read (unread keys are errors).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace collie {

class Params {
 public:
  // `owner` names the plugin slot in messages, e.g. "scheduler 'ring'".
  explicit Params(std::string owner = "plugin") : owner_(std::move(owner)) {}

  // Adds a scalar value; `where` is "file:line:col" (or "--set") for messages.
  void set(const std::string& key, const std::string& value, const std::string& where = "");
  bool has(const std::string& key) const;

  // Each getter marks the key as read and throws ConfigError (with location, expected and
  // found) when the value does not parse or is out of range.
  std::string getString(const std::string& key, const std::string& fallback) const;
  int64_t getInt(const std::string& key, int64_t fallback, int64_t min, int64_t max) const;
  double getDouble(const std::string& key, double fallback) const;
  bool getBool(const std::string& key, bool fallback) const;
  // Accepts "4KiB", "64MiB", "25MB", "1024" (bytes).
  uint64_t getBytes(const std::string& key, uint64_t fallback, uint64_t min, uint64_t max) const;
  // Accepts "30s", "500ms", "2m", "1.5" (seconds).
  std::chrono::milliseconds getDuration(const std::string& key,
                                        std::chrono::milliseconds fallback) const;

  // Keys that were set but never read: the framework rejects them after creating the plugin,
  // naming the closest known key.
  std::vector<std::string> unreadKeys() const;
  const std::set<std::string>& readKeys() const { return read_; }
  const std::string& owner() const { return owner_; }
  std::string where(const std::string& key) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  // Marks `key` read; its value, or nullptr when it is not set.
  const std::string* lookup(const std::string& key) const;

  std::string owner_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> where_;
  mutable std::set<std::string> read_;
};

// Parses a byte size with optional unit (B, KB, MB, GB, KiB, MiB, GiB; case of the unit
// matters only for the 'i'). Returns false for anything else, including overflow.
bool parseBytes(const std::string& text, uint64_t* out);
// Parses a duration: a number with unit ms, s, m or h (a bare number is seconds).
bool parseDuration(const std::string& text, std::chrono::milliseconds* out);
// "4 KiB", "16 MiB", "512 B": the largest binary unit that divides the size exactly.
std::string formatBytes(uint64_t bytes);

}  // namespace collie
