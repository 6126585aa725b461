// The job's rendezvous store, collie's own: rank 0 hosts a small key-value
// server on one address (never every interface, as c10d's TCPStore of LibTorch 1.13 does),
// and every rank, rank 0 included, is its client. With a job token, a client must present
// it before anything else; messages and the store's contents are bounded, so a stranger that
// connects can neither read nor write job keys nor grow the server's memory without limit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "collie/store.h"

namespace collie {

// The limits the server enforces (a config or a backend address is a few KiB).
struct StoreLimits {
  static constexpr uint32_t kMaxFrame = 4u << 20;   // one request, authenticated
  static constexpr uint32_t kMaxHelloFrame = 1024;  // before the token is checked
  static constexpr size_t kMaxConnections = 1024;
  static constexpr uint64_t kMaxStoredBytes = 256ull << 20;
};

// The server's refusal of a hello whose token differs from the job's, as a rank's CommError
// quotes it (a rank that read a stale token file retries on it).
inline constexpr const char* kWrongTokenRefusal = "a wrong job token";

class StoreServer;

class TcpStore : public Store {
 public:
  // Rank 0 (is_server) listens on `host` (an IPv4 address or a name resolving to one of this
  // host's) at `port` (0: a free one; port() says which); every rank then connects to
  // host:port, retrying until `timeout`, and presents `token` ("" : none). A server with a
  // token refuses clients without it. Throws CommError naming the address, ConfigError for
  // a server on an address other hosts reach without a token.
  TcpStore(const std::string& host, uint16_t port, bool is_server,
           std::chrono::milliseconds timeout, const std::string& token = "");
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

  // Bounds every later request by `limit` as well as the timeout: a rank that already failed
  // asks the store what the others know, and a store whose host is stopped must not hold it
  // for the whole timeout.
  void limitCalls(std::chrono::milliseconds limit) { call_limit_ = limit.count(); }

  uint16_t port() const { return port_; }
  const std::string& address() const { return where_; }

 private:
  // One request and its reply, under the client lock; CommError when the store is gone.
  std::string call(const std::string& request, const std::string& what);

  std::unique_ptr<StoreServer> server_;
  int fd_ = -1;
  std::mutex mu_;
  uint16_t port_ = 0;
  std::string where_;  // "host:port", for messages
  std::chrono::milliseconds timeout_;
  std::atomic<std::chrono::milliseconds::rep> call_limit_{0};  // 0: the timeout alone
  bool held_waits_ = false;     // the server holds a WAIT (else wait() polls CHECK)
  std::atomic<int> queued_{0};  // threads waiting for mu_ in call()
};

// Whether `host` is a loopback address (127.0.0.0/8, "localhost"): reachable from this
// host only.
bool isLoopbackHost(const std::string& host);

}  // namespace collie
