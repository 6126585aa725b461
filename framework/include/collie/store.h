// The rendezvous key-value store every process of a job shares. Backends use it
// to exchange addresses (Gloo pairs, UCX worker addresses, the NCCL unique id); the runtime
// uses it to check that every rank loaded the same experiment. collie's implementation is its
// own TCP store hosted by rank 0 (runtime/tcp_store.h); in-process jobs have no store.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace collie {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until `key` exists (up to timeout()). Throws CommError naming the key.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  // Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists. Throws CommError naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  void setString(const std::string& key, const std::string& value) {
    set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string getString(const std::string& key) {
    auto bytes = get(key);
    return std::string(bytes.begin(), bytes.end());
  }
};

// A view of another store with every key prefixed, so that sub-groups and consecutive runs
// of one job never read each other's keys.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix)), base_(base) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    base_.set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override { return base_.get(prefix_ + key); }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }
  bool check(const std::vector<std::string>& keys) override { return base_.check(full(keys)); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_.wait(full(keys), timeout);
  }
  std::chrono::milliseconds timeout() const override { return base_.timeout(); }

 private:
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::string prefix_;
  Store& base_;
};

}  // namespace collie
