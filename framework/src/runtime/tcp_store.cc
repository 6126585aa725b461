// c10d's TCPStore behind collie's Store interface, its exceptions turned into CommErrors.
#include "runtime/tcp_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "collie/error.h"

namespace collie {

struct TcpStore::Impl {
  std::unique_ptr<c10d::TCPStore> store;
};

namespace {

template <typename F>
auto guarded(const std::string& where, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string message = e.what();
    auto newline = message.find('\n');  // c10::Error appends a C++ backtrace
    if (newline != std::string::npos) message.resize(newline);
    throw CommError("rendezvous store at " + where + ": " + what + " failed: " + message +
                    ". HINT: rank 0 hosts the store; check that it is alive and that "
                    "MASTER_ADDR/MASTER_PORT reach it");
  }
}

}  // namespace

TcpStore::TcpStore(const std::string& host, uint16_t port, bool is_server,
                   std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), where_(fmt::format("{}:{}", host, port)), timeout_(timeout) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = is_server;
  options.waitWorkers = false;  // collie's own join names the ranks that never came
  options.timeout = timeout;
  try {
    impl_->store = std::make_unique<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    std::string message = e.what();
    auto newline = message.find('\n');
    if (newline != std::string::npos) message.resize(newline);
    while (!message.empty() && message.back() == '.') message.pop_back();
    if (is_server) {
      throw CommError(fmt::format(
          "rank 0 cannot host the rendezvous store on port {}: {}. HINT: another job may use the "
          "port; set MASTER_PORT",
          port, message));
    }
    throw CommError(fmt::format("cannot reach the rendezvous store at {} within {} s: {}", where_,
                                timeout.count() / 1000, message) +
                    ". HINT: rank 0 hosts it; it did not start, or MASTER_ADDR/MASTER_PORT "
                    "do not point at it");
  }
  where_ = fmt::format("{}:{}", host, impl_->store->getPort());
}

TcpStore::~TcpStore() = default;

uint16_t TcpStore::port() const { return impl_->store->getPort(); }

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  guarded(where_, "set '" + key + "'", [&] { impl_->store->set(key, value); });
}

std::vector<uint8_t> TcpStore::get(const std::string& key) {
  return guarded(where_, "get '" + key + "'", [&] { return impl_->store->get(key); });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return guarded(where_, "add '" + key + "'", [&] { return impl_->store->add(key, delta); });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return guarded(where_, "check", [&] { return impl_->store->check(keys); });
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    impl_->store->wait(keys, timeout);
    return;
  } catch (const std::exception&) {
  }
  std::string missing;
  for (const auto& key : keys) {
    if (!check({key})) missing += (missing.empty() ? "" : ", ") + key;
  }
  if (missing.empty()) return;  // they arrived while we looked
  throw CommError(
      fmt::format("rendezvous store at {}: waited {} ms for {}", where_, timeout.count(), missing));
}

}  // namespace collie
