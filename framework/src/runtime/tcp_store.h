// The job's rendezvous store: LibTorch's c10d TCPStore, hosted by rank 0 (DESIGN §4). This is
// the only file of collie that includes c10d headers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "collie/store.h"

namespace collie {

// Rank 0 (is_server) listens on `port` (0: any free port; port() says which); the others
// connect to host:port, retrying until `timeout`. Throws CommError naming the address.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port, bool is_server,
           std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

  uint16_t port() const;
  const std::string& address() const { return where_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string where_;  // "host:port", for messages
  std::chrono::milliseconds timeout_;
};

}  // namespace collie
