// collie's rendezvous store: a poll loop on rank 0 serving length-prefixed requests, and a
// blocking client with timeouts.
//
// Frame: u32 length (little endian), then that many bytes. Request: u8 op, then its fields
// (strings as u32 length + bytes, integers little endian). Reply: u8 status (0 ok, 1
// refused: a string follows), then the op's result. The first request of a connection must
// be HELLO with the job token; anything else, a frame over the limit or a malformed request
// closes the connection. WAIT is answered when its keys are all there or its slice of time
// has passed, whichever comes first: a waiting rank learns of a key as soon as it is set,
// without polling, and the connection answers nothing else meanwhile.
#include "runtime/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>

#include "collie/error.h"
#include "collie/log.h"

namespace collie {
namespace {

using Clock = std::chrono::steady_clock;

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kCheck = 5, kWait = 6 };

// The longest a WAIT is held by the server (the client asks for less: TcpStore::wait), and
// the most keys one may name (a rendezvous waits for a few).
constexpr std::chrono::milliseconds kMaxWaitSlice{2000};
constexpr uint32_t kMaxWaitKeys = 1u << 16;

// What a server can do beyond the requests every collie store serves, in the byte after
// HELLO's status: a client of a server without it (another collie version, which the job
// then refuses by name) polls CHECK instead of sending WAIT.
constexpr uint8_t kFeatureHeldWait = 1;

// A key as messages quote it: at most its first 80 bytes, so that an error about a key of
// megabytes stays readable (and a refusal stays within a frame).
std::string shown(const std::string& key) {
  return "'" + (key.size() <= 80 ? key : key.substr(0, 80) + "...") + "'";
}

void putU32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
void putI64(std::string& out, int64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
void putString(std::string& out, const std::string& s) {
  putU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
std::string framed(const std::string& payload) {
  std::string out;
  putU32(out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}

// Bounds-checked reading of a request or reply (which must outlive it); ok() is false once
// anything was short.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  uint8_t u8() {
    if (!need(1)) return 0;
    return static_cast<uint8_t>(data_[at_++]);
  }
  uint32_t u32() {
    uint32_t v = 0;
    if (need(4)) std::memcpy(&v, data_.data() + at_, 4), at_ += 4;
    return v;
  }
  int64_t i64() {
    int64_t v = 0;
    if (need(8)) std::memcpy(&v, data_.data() + at_, 8), at_ += 8;
    return v;
  }
  std::string string() {
    const uint32_t n = u32();
    if (!need(n)) return {};
    std::string s = data_.substr(at_, n);
    at_ += n;
    return s;
  }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && at_ == data_.size(); }

 private:
  bool need(size_t n) {
    ok_ = ok_ && n <= data_.size() - at_;
    return ok_;
  }
  const std::string& data_;
  size_t at_ = 0;
  bool ok_ = true;
};

// An IPv4 address for `host` (a dotted quad or a name), or a CommError.
in_addr resolve(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return a;
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw CommError(fmt::format("cannot resolve the rendezvous address '{}': {}", host,
                                rc != 0 ? ::gai_strerror(rc) : "no IPv4 address"));
  }
  a = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return a;
}

bool sameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;  // every byte compared: the time says nothing about the token
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool isLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// Rank 0's server: one thread, one poll loop, bounded buffers.
class StoreServer {
 public:
  StoreServer(const std::string& host, uint16_t port, std::string token)
      : token_(std::move(token)) {
    const in_addr address = resolve(host);
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_ < 0) throw CommError(std::string("cannot open a socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr = address;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        ::listen(listen_, 1024) != 0) {
      const int err = errno;
      ::close(listen_);
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &address, text, sizeof(text));
      throw CommError(fmt::format("rank 0 cannot host the rendezvous store on {}:{}: {}. HINT: {}",
                                  text, port, std::strerror(err),
                                  err == EADDRNOTAVAIL
                                      ? "MASTER_ADDR must be an address of rank 0's host"
                                      : "another job may use the port; set MASTER_PORT"));
    }
    socklen_t len = sizeof(sa);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      ::close(listen_);
      throw CommError(std::string("cannot make a pipe: ") + std::strerror(errno));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~StoreServer() {
    const char stop = 1;
    (void)!::write(wake_[1], &stop, 1);
    thread_.join();
    for (auto& c : conns_) ::close(c.fd);
    ::close(listen_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  uint16_t port() const { return port_; }

 private:
  struct Conn {
    int fd = -1;
    std::string in, out;
    bool authenticated = false;
    bool closing = false;  // close once `out` is written
    Clock::time_point opened;
    // A WAIT not yet answered: its keys and when it is answered "not yet". Requests after
    // it stay in `in` until it is.
    bool parked = false;
    std::vector<std::string> awaited;
    size_t awaited_next = 0;    // awaited[0, next) are there (keys are never removed)
    uint64_t awaited_seen = 0;  // the store's changes_ when they were last looked at
    Clock::time_point awaited_until;
  };

  // A connection must greet the store this soon, or it is closed: strangers cannot hold
  // the server's connections.
  static constexpr std::chrono::seconds kGreetingDeadline{10};

  void loop() {
    while (true) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_, POLLIN, 0}};
      for (const auto& c : conns_) {
        fds.push_back({c.fd, static_cast<short>(c.closing ? 0 : POLLIN), 0});
        if (!c.out.empty()) fds.back().events |= POLLOUT;
      }
      if (::poll(fds.data(), fds.size(), pollTimeoutMs()) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;
      size_t k = 2;  // conns_ in the order `fds` lists them
      for (auto it = conns_.begin(); it != conns_.end(); ++k) {
        const short revents = fds[k].revents;
        const bool late = !it->authenticated && Clock::now() - it->opened > kGreetingDeadline;
        if (!late && serve(*it, revents)) {
          ++it;
        } else {
          ::close(it->fd);
          it = conns_.erase(it);
        }
      }
      if (fds[1].revents & POLLIN) accept();  // after: accepting may evict a stranger
      answerWaits();
    }
  }

  // Until the nearest parked WAIT is due, at most a second (the greeting deadline's check).
  int pollTimeoutMs() const {
    auto wake = Clock::now() + std::chrono::seconds(1);
    for (const auto& c : conns_) {
      if (c.parked) wake = std::min(wake, c.awaited_until);
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now());
    return static_cast<int>(std::max<int64_t>(0, left.count()));
  }

  // Answers every parked WAIT whose keys are all there now ("yes") or whose slice is over
  // ("not yet"), then serves what its connection sent meanwhile; a connection whose requests
  // turn out malformed closes.
  void answerWaits() {
    const auto now = Clock::now();
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = *it;
      bool open = true;
      if (c.parked) {
        if (c.awaited_seen != changes_) {
          c.awaited_seen = changes_;
          c.awaited_next = firstMissing(c.awaited, c.awaited_next);
        }
        const bool all = c.awaited_next == c.awaited.size();
        if (all || now >= c.awaited_until) {
          c.parked = false;
          c.awaited.clear();
          c.out += framed(std::string{'\0', all ? '\1' : '\0'});
          open = drain(c);
        }
      }
      if (open) {
        ++it;
      } else {
        ::close(it->fd);
        it = conns_.erase(it);
      }
    }
  }

  // The index of the first of keys[from, end) the store lacks (keys.size(): none).
  size_t firstMissing(const std::vector<std::string>& keys, size_t from) const {
    while (from < keys.size() && data_.count(keys[from]) > 0) ++from;
    return from;
  }

  void accept() {
    while (true) {
      const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      if (conns_.size() >= StoreLimits::kMaxConnections) {
        // Full: the oldest connection that has not greeted makes room, else the new one goes.
        auto stranger = std::find_if(conns_.begin(), conns_.end(),
                                     [](const Conn& c) { return !c.authenticated; });
        if (stranger == conns_.end()) {
          ::close(fd);
          continue;
        }
        ::close(stranger->fd);
        conns_.erase(stranger);
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Conn c;
      c.fd = fd;
      c.opened = Clock::now();
      conns_.push_back(std::move(c));
    }
  }

  // Reads, answers and writes what `c` is ready for; false: close it.
  bool serve(Conn& c, short revents) {
    if (revents & (POLLERR | POLLNVAL)) return false;
    if (revents & (POLLIN | POLLHUP)) {
      char buffer[65536];
      const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
      if (n > 0) c.in.append(buffer, static_cast<size_t>(n));
      if (c.in.size() > 2 * StoreLimits::kMaxFrame) return false;  // piled up behind a WAIT
      if (!drain(c)) return false;
    }
    if (!c.out.empty() && (revents & POLLOUT)) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
      if (n > 0) c.out.erase(0, static_cast<size_t>(n));
      if (!drain(c)) return false;  // what waited for room in `out`
    }
    if (c.out.size() > 2 * StoreLimits::kMaxFrame) return false;  // a client that never reads
    return !(c.closing && c.out.empty());
  }

  // Answers the whole requests in `c.in`, up to a WAIT that has to be held or until a frame's
  // worth of replies waits to be sent (the rest once it is); false: close.
  bool drain(Conn& c) {
    while (!c.closing && !c.parked && c.out.size() < StoreLimits::kMaxFrame && c.in.size() >= 4) {
      uint32_t length = 0;
      std::memcpy(&length, c.in.data(), 4);
      const uint32_t limit = c.authenticated ? StoreLimits::kMaxFrame : StoreLimits::kMaxHelloFrame;
      if (length > limit) return false;  // a huge length prefix: never buffered
      if (c.in.size() < 4 + static_cast<size_t>(length)) break;
      const std::string request = c.in.substr(4, length);
      c.in.erase(0, 4 + static_cast<size_t>(length));
      if (!answer(c, request)) return false;
    }
    return true;
  }

  // Handles one request of `c`; false for a malformed one (the connection closes).
  bool answer(Conn& c, const std::string& request) {
    Reader r(request);
    const uint8_t op = r.u8();
    std::string reply(1, '\0');
    if (!c.authenticated) {
      const std::string token = r.string();
      if (op != kHello || !r.done()) return false;
      if (!token_.empty() && !sameToken(token, token_)) {
        reply = std::string(1, '\1');
        putString(reply, token.empty() ? "this job needs its token" : kWrongTokenRefusal);
        c.out += framed(reply);
        c.closing = true;
        return true;
      }
      c.authenticated = true;
      reply += static_cast<char>(kFeatureHeldWait);
      c.out += framed(reply);
      return true;
    }
    const auto refusal = [](const std::string& why) {
      std::string refused(1, '\1');
      putString(refused, why);
      return refused;
    };
    const auto full = [&] {
      return fmt::format(
          "the store is full: {} of its {} bytes are taken. HINT: it holds the ranks' "
          "addresses, counters and errors; whatever stored this much is at fault",
          stored_, StoreLimits::kMaxStoredBytes);
    };
    switch (op) {
      case kSet: {
        const std::string key = r.string(), value = r.string();
        if (!r.done()) return false;
        auto it = data_.find(key);
        const uint64_t freed = it == data_.end() ? 0 : key.size() + it->second.size();
        if (stored_ - freed + key.size() + value.size() > StoreLimits::kMaxStoredBytes) {
          reply = refusal(full());
          break;
        }
        stored_ = stored_ - freed + key.size() + value.size();
        data_[key] = value;
        ++changes_;
        break;
      }
      case kGet: {
        const std::string key = r.string();
        if (!r.done()) return false;
        auto it = data_.find(key);
        reply += it == data_.end() ? '\0' : '\1';
        if (it != data_.end()) putString(reply, it->second);
        break;
      }
      case kAdd: {
        const std::string key = r.string();
        const int64_t delta = r.i64();
        if (!r.done()) return false;
        auto it = data_.find(key);
        int64_t now = 0;
        if (it != data_.end() && !it->second.empty()) {
          char* end = nullptr;
          errno = 0;
          now = std::strtoll(it->second.c_str(), &end, 10);
          if (*end != '\0' || errno == ERANGE) {
            reply = refusal(fmt::format("{} does not hold a 64-bit integer", shown(key)));
            break;
          }
        }
        int64_t sum = 0;
        if (__builtin_add_overflow(now, delta, &sum)) {
          reply = refusal(fmt::format("adding {} to {} ({}) would overflow a 64-bit integer", delta,
                                      shown(key), now));
          break;
        }
        std::string value = std::to_string(sum);
        // Counted as a set of the new value would be: the key once, and the digits.
        const uint64_t freed = it == data_.end() ? 0 : key.size() + it->second.size();
        if (stored_ - freed + key.size() + value.size() > StoreLimits::kMaxStoredBytes) {
          reply = refusal(full());
          break;
        }
        stored_ = stored_ - freed + key.size() + value.size();
        if (it == data_.end()) {
          data_.emplace(key, std::move(value));
        } else {
          it->second = std::move(value);
        }
        ++changes_;
        putI64(reply, sum);
        break;
      }
      case kCheck: {
        const uint32_t n = r.u32();
        bool all = r.ok();
        for (uint32_t i = 0; i < n && r.ok(); ++i) all = data_.count(r.string()) > 0 && all;
        if (!r.done()) return false;
        reply += all ? '\1' : '\0';
        break;
      }
      case kWait: {  // held (parked) until its keys are there or its slice is over
        const uint32_t n = r.u32();
        if (n > kMaxWaitKeys) {
          reply = refusal(fmt::format("a wait for {} keys; at most {}", n, kMaxWaitKeys));
          break;
        }
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.string());
        const std::chrono::milliseconds slice(r.u32());
        if (!r.done()) return false;
        const size_t missing = firstMissing(keys, 0);
        if (missing < keys.size() && slice.count() > 0) {
          c.parked = true;
          c.awaited = std::move(keys);
          c.awaited_next = missing;
          c.awaited_seen = changes_;
          c.awaited_until = Clock::now() + std::min(slice, kMaxWaitSlice);
          return true;
        }
        reply += missing == keys.size() ? '\1' : '\0';
        break;
      }
      default:
        return false;
    }
    c.out += framed(reply);
    return true;
  }

  std::string token_;
  int listen_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread thread_;
  std::list<Conn> conns_;
  std::map<std::string, std::string> data_;
  uint64_t stored_ = 0;
  uint64_t changes_ = 0;  // sets and adds so far: parked WAITs look again when it moves
};

namespace {

// Writes or reads exactly `n` bytes before `deadline`; false on a timeout, an error or EOF.
bool sendAll(int fd, const char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    pollfd pfd{fd, POLLOUT, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool recvAll(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

const char* kStoreHint =
    ". HINT: rank 0 hosts the store; check that it is alive and that MASTER_ADDR/MASTER_PORT "
    "reach it";

}  // namespace

TcpStore::TcpStore(const std::string& host, uint16_t port, bool is_server,
                   std::chrono::milliseconds timeout, const std::string& token)
    : timeout_(timeout) {
  if (is_server) {
    if (token.empty() && !isLoopbackHost(host)) {
      throw ConfigError(fmt::format(
          "the rendezvous store would listen on {}, which other hosts reach, without a job "
          "token. HINT: set launch.token_file to a file every node can read (node 0's "
          "launcher writes it when it is missing), or export the same COLLIE_JOB_TOKEN to "
          "every rank",
          host));
    }
    server_ = std::make_unique<StoreServer>(host, port, token);
    port = server_->port();
  }
  port_ = port;
  where_ = fmt::format("{}:{}", host, port);
  const in_addr address = resolve(host);
  const auto deadline = Clock::now() + timeout;
  std::string last = "nothing listens there";
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) throw CommError(std::string("cannot open a socket: ") + std::strerror(errno));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr = address;
    int rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd_, POLLOUT, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      rc = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) == 1 ? 0 : -1;
      int err = rc == 0 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (rc == 0) ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) break;
    last = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    if (Clock::now() >= deadline) {
      throw CommError(
          fmt::format("cannot reach the rendezvous store at {} within {} s: {}. "
                      "HINT: rank 0 hosts it; it did not start, or "
                      "MASTER_ADDR/MASTER_PORT do not point at it",
                      where_, timeout.count() / 1000, last));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string hello(1, static_cast<char>(kHello));
  putString(hello, token);
  const std::string features = call(hello, "joining");
  held_waits_ = !features.empty() && (static_cast<uint8_t>(features[0]) & kFeatureHeldWait) != 0;
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::call(const std::string& request, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  queued_.fetch_add(1);  // wait() lets a thread that queues here go first between its slices
  lock.lock();
  queued_.fetch_sub(1);
  if (fd_ < 0) throw CommError("rendezvous store at " + where_ + ": " + what + " failed: closed");
  const std::chrono::milliseconds limit(call_limit_.load());
  const auto deadline = Clock::now() + (limit.count() > 0 ? std::min(timeout_, limit) : timeout_);
  const std::string frame = framed(request);
  char head[4];
  uint32_t length = 0;
  std::string reply;
  bool ok = sendAll(fd_, frame.data(), frame.size(), deadline) && recvAll(fd_, head, 4, deadline);
  if (ok) {
    std::memcpy(&length, head, 4);
    ok = length >= 1 && length <= StoreLimits::kMaxFrame;
  }
  if (ok) {
    reply.resize(length);
    ok = recvAll(fd_, reply.data(), length, deadline);
  }
  if (!ok) {
    ::close(fd_);
    fd_ = -1;
    throw CommError("rendezvous store at " + where_ + ": " + what +
                    " failed: the connection closed or timed out" + kStoreHint);
  }
  if (reply[0] != 0) {
    Reader r(reply);
    r.u8();
    const std::string why = r.string();
    if (what == "joining") {
      ::close(fd_);
      fd_ = -1;
      throw CommError(fmt::format(
          "the rendezvous store at {} refused this rank: {}. HINT: every rank needs the job "
          "token of rank 0 (the same COLLIE_JOB_TOKEN, or the same launch.token_file)",
          where_, why));
    }
    throw CommError("rendezvous store at " + where_ + ": " + what + " failed: " + why);
  }
  return reply.substr(1);
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::string request(1, static_cast<char>(kSet));
  putString(request, key);
  putString(request, std::string(value.begin(), value.end()));
  call(request, "set " + shown(key));
}

std::vector<uint8_t> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::string request(1, static_cast<char>(kGet));
  putString(request, key);
  const std::string reply = call(request, "get " + shown(key));
  Reader r(reply);
  const bool found = r.u8() == 1;
  const std::string value = r.string();
  if (!found || !r.done()) {
    throw CommError("rendezvous store at " + where_ + ": get " + shown(key) + " found nothing");
  }
  return std::vector<uint8_t>(value.begin(), value.end());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string request(1, static_cast<char>(kAdd));
  putString(request, key);
  putI64(request, delta);
  const std::string reply = call(request, "add " + shown(key));
  Reader r(reply);
  return r.i64();
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string request(1, static_cast<char>(kCheck));
  putU32(request, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) putString(request, k);
  const std::string reply = call(request, "check");
  Reader r(reply);
  return r.u8() == 1;
}

// The server holds the request until the keys are all there, for one slice at most. The
// client lock is free between slices, and a thread of this rank queued for it (one reporting
// an error) takes it before the next slice. A server without held waits is polled instead.
void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  constexpr milliseconds kSlice{100};
  const auto deadline = Clock::now() + timeout;
  auto pause = milliseconds(1);  // polling's
  while (true) {
    bool there = false;
    if (held_waits_) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      const milliseconds limit(call_limit_.load());
      // Short enough that the reply comes within the call's own deadline.
      auto slice = std::min(kSlice, timeout_ / 2);
      if (limit.count() > 0) slice = std::min(slice, limit / 2);
      slice = left.count() > 0 ? std::clamp(slice, milliseconds(1), std::max(left, milliseconds(1)))
                               : milliseconds(0);
      std::string request(1, static_cast<char>(kWait));
      putU32(request, static_cast<uint32_t>(keys.size()));
      for (const auto& k : keys) putString(request, k);
      putU32(request, static_cast<uint32_t>(slice.count()));
      const std::string reply = call(request, "wait");
      Reader r(reply);
      there = r.u8() == 1;
    } else {
      there = check(keys);
    }
    if (there) return;
    if (Clock::now() >= deadline) {
      std::string missing;
      for (const auto& key : keys) {
        if (!check({key})) missing += (missing.empty() ? "" : ", ") + key;
      }
      if (missing.empty()) return;  // they arrived while we looked
      throw CommError(fmt::format("rendezvous store at {}: waited {} ms for {}", where_,
                                  timeout.count(), missing));
    }
    if (held_waits_) {
      for (int i = 0; i < 50 && queued_.load() > 0; ++i)
        std::this_thread::sleep_for(milliseconds(1));
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, milliseconds(20));
    }
  }
}

}  // namespace collie
