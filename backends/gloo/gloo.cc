// The gloo backend: Gloo's TCP transport between processes. Point-to-point uses unbound
// buffers with the collie tag as the slot, and messages up to params.eager_threshold go
// through staging buffers on a slot of their own, whose receives are posted ahead
// (EagerChannel); `native` runs Gloo's own all-reduce algorithms (the algorithm classes:
// ring, ring_chunked, halving_doubling, bcube).
//
// Every blocking wait has the group's timeout. A peer that dies closes its sockets, which
// Gloo reports as an I/O error at once (a message caught half way across: 1 to 1.2 s
// later, see PeerWatch); a peer that stops leaves them open, so the wait runs into the
// timeout. Either way the error names the peer, the tag (collective sequence number,
// phase, step) and what Gloo said.
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "collie/log.h"
#include "collie/plugin.h"
#include "collie/store.h"

namespace collie::gloo_backend {
namespace {

// Gloo's algorithm classes number their own slots from a small counter; collie's tags go in
// the upper half of the slot space so that the two never meet.
constexpr uint64_t kTagSlotBit = 1ull << 63;
// The slot of eager messages (below collie's tags, far above Gloo's counter).
constexpr uint64_t kEagerSlot = 1ull << 62;
// A slot nothing is ever sent on: the peer watch keeps a receive posted there per pair it
// watches, which Gloo fails with the pair.
constexpr uint64_t kProbeSlot = kEagerSlot + 1;
// How often the peer watch looks at the pairs that threads wait on, and how long a wait goes
// on over a failed pair before the watch ends it (a message that completed before the pair
// failed has woken its waiter long before).
constexpr auto kPeerWatchInterval = std::chrono::milliseconds(100);
constexpr auto kStuckOnAFailedPair = std::chrono::seconds(1);
// Eager receives a rank keeps posted per peer: that many messages can be sent before the
// receiver asks for any of them without the sender's Gloo waiting for a "ready" notice.
constexpr size_t kEagerDepth = 4;
// Send staging buffers kept per peer for reuse once their sends completed.
constexpr size_t kEagerSpareSends = 4;

// Gloo's first line, without the source location it prefixes.
std::string glooMessage(const std::exception& e) {
  std::string text = e.what();
  auto bracket = text.find("] ");
  if (text.rfind("[", 0) == 0 && bracket != std::string::npos) text = text.substr(bracket + 2);
  return text;
}

// Gloo's algorithm classes size a pair's send buffer to their first message on it
// (setsockopt SO_SNDBUF, cached in the pair, only ever raised afterwards). A ring sends
// only 4-byte notifications to its left neighbour, so that pair's socket keeps the
// kernel's minimum, 4.6 KB, for good; collie's own messages to that rank then crawl
// (measured: 64 KB per 40 ms, a 4-rank 256 MiB sweep stalled with idle CPUs). After an
// algorithm's first run, every TCP socket of this process below 4 MiB is set back up (the
// kernel caps it at net.core.wmem_max).
void raiseSendBuffers() {
  constexpr int kWanted = 4 << 20;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd == ::dirfd(dir)) continue;
    int type = 0, size = 0;
    socklen_t len = sizeof(type);
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    sockaddr_storage addr{};
    len = sizeof(addr);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        (addr.ss_family != AF_INET && addr.ss_family != AF_INET6)) {
      continue;
    }
    len = sizeof(size);
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_SNDBUF, &size, &len) == 0 &&
        size < kWanted / 2) {
      ::setsockopt(static_cast<int>(fd), SOL_SOCKET, SO_SNDBUF, &kWanted, sizeof(kWanted));
    }
  }
  ::closedir(dir);
}

// collie's store seen through Gloo's rendezvous interface.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(collie::Store& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto bytes = store_.get(key);
    return std::vector<char>(bytes.begin(), bytes.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.timeout()); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  collie::Store& store_;
};

// Gloo's event-loop thread spins when it cannot lock a pair that the caller's thread holds
// (its handler returns and epoll reports the same event again; pytorch/gloo#246). Woken by
// a peer's message, it preempts the thread that holds the lock, on the same CPU, and spins
// for the rest of its time slice: with more ranks than CPUs every message can cost
// milliseconds. Under SCHED_BATCH a woken thread does not preempt a running one, and
// keeps its full share of the CPU. The loop thread inherits the policy of the thread that
// creates the device, so the caller takes SCHED_BATCH for that long and then gets its own
// policy back.
class LoopThreadPolicy {
 public:
  explicit LoopThreadPolicy(bool batch) {
    if (!batch || sched_getscheduler(0) != SCHED_OTHER || sched_getparam(0, &saved_) != 0) return;
    sched_param none{};
    active_ = sched_setscheduler(0, SCHED_BATCH, &none) == 0;
  }
  ~LoopThreadPolicy() {
    if (active_ && sched_setscheduler(0, SCHED_OTHER, &saved_) != 0) {
      logWarn(std::string("backend gloo: cannot restore this thread's scheduling policy: ") +
              std::strerror(errno));
    }
  }
  LoopThreadPolicy(const LoopThreadPolicy&) = delete;
  LoopThreadPolicy& operator=(const LoopThreadPolicy&) = delete;

 private:
  sched_param saved_{};
  bool active_ = false;
};

using Clock = std::chrono::steady_clock;

// A buffer that abort() wakes: the group and peer it goes through and, while a thread waits
// on it, since when. `broken` is what the peer watch found when it ended the wait.
struct Pending {
  gloo::transport::UnboundBuffer* buf = nullptr;
  std::weak_ptr<gloo::Context> context;
  int peer = -1;
  bool sending = false;
  Clock::time_point waiting{};  // the epoch: no thread waits on it yet
  std::string broken;
};

class PeerWatch;

// Gloo writes to its sockets with writev, which raises SIGPIPE when the peer has reset the
// connection; its default action would end this process before the write's EPIPE could
// become a CommError naming the peer. So SIGPIPE is ignored, as Python ignores it for
// PyTorch's gloo, unless the process already handles it.
void ignoreBrokenPipes() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction now {};
    if (::sigaction(SIGPIPE, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) return;
    now.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &now, nullptr);
  });
}

// A thread of its own that calls `tick` every `interval` until this goes: the destructor
// stops and joins it. Throws std::system_error (or bad_alloc) where no thread can be had.
class Every {
 public:
  Every(std::chrono::microseconds interval, std::function<void()> tick)
      : interval_(interval), tick_(std::move(tick)), thread_([this] { run(); }) {}
  ~Every() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Every(const Every&) = delete;
  Every& operator=(const Every&) = delete;

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
      lock.unlock();
      tick_();
      lock.lock();
    }
  }

  const std::chrono::microseconds interval_;
  const std::function<void()> tick_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

// Gloo's event loop wakes every 10 ms when idle, and a thread that changes what it watches
// (connecting a pair, closing one) waits for its next wake, as does the end of the device
// (its loop thread's join): making and closing a two-rank backend spent about 35 ms waiting
// for nothing. A Ticker is an eventfd the loop watches; while a Ticking lives, a thread of
// its own writes to it every millisecond, so that the loop wakes and those waits end within
// one (a thousand wake-ups a second of two threads, only while a backend connects or
// closes). The ticks only save time: where the eventfd, its registration or the thread
// cannot be had, the waits take Gloo's 10 ms as before.
class Ticker : public gloo::transport::tcp::Handler {
 public:
  explicit Ticker(std::shared_ptr<gloo::transport::Device> device)
      : device_(std::dynamic_pointer_cast<gloo::transport::tcp::Device>(device)) {
    if (device_ == nullptr) return;
    fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) return;
    try {
      device_->registerDescriptor(fd_, EPOLLIN, this);
    } catch (const std::exception&) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Ticker() override {
    if (fd_ < 0) return;
    {
      Ticking ticking(*this);
      // The device's last reference ends its loop, whose join the ticks make short; no
      // handler runs after it. Where others keep the device, its loop goes on, and this
      // handler leaves it first (a wait the ticks do not shorten: the eventfd is off the
      // loop by then). epoll_ctl does not fail on a descriptor it holds.
      try {
        if (device_.use_count() > 1) device_->unregisterDescriptor(fd_, this);
      } catch (const std::exception&) {
      }
      device_.reset();
    }
    ::close(fd_);
  }
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  void handleEvents(int) override {
    uint64_t count = 0;
    while (::read(fd_, &count, sizeof(count)) == sizeof(count)) {
    }
  }

  // Ticks the loop from a thread of its own while it lives.
  class Ticking {
   public:
    explicit Ticking(Ticker& ticker) {
      const int fd = ticker.fd_;
      if (fd < 0) return;
      try {
        every_.emplace(std::chrono::milliseconds(1), [fd] {
          const uint64_t one = 1;
          if (::write(fd, &one, sizeof(one)) < 0) return;  // full (EAGAIN): it wakes anyway
        });
      } catch (const std::exception&) {  // no thread (or memory) to spare: no ticks
      }
    }

   private:
    std::optional<Every> every_;
  };

 private:
  std::shared_ptr<gloo::transport::tcp::Device> device_;
  int fd_ = -1;
};

// What every group of one backend shares: the device (one event loop thread) and its
// ticker, the store, the registry of pending buffers that abort() and the peer watch wake,
// and the watch.
struct Shared {
  ~Shared();
  // Before `device`, so that it goes after it, holding the device's last reference when
  // nothing else does (see Ticker).
  std::unique_ptr<Ticker> ticker;
  std::shared_ptr<gloo::transport::Device> device;
  collie::Store* store = nullptr;
  std::chrono::milliseconds timeout{30000};
  std::string algorithm = "ring";
  uint64_t eager_bytes = 64 * 1024;  // params.eager_threshold; 0: every message rendezvous
  std::mutex mu;
  // Under `mu`. A vector, not a set: it keeps its capacity, so that registering a message
  // costs no allocation; it holds a few entries per thread.
  std::vector<Pending> pending;
  AbortFlag aborted;  // set before the pending buffers are woken, under `mu`

  // `waiting`: a thread waits on it from now on (else from beginWait()).
  void addPending(gloo::transport::UnboundBuffer* buf,
                  const std::shared_ptr<gloo::Context>& context, int peer, bool sending,
                  bool waiting) {
    std::lock_guard<std::mutex> lock(mu);
    pending.push_back(
        {buf, context, peer, sending, waiting ? Clock::now() : Clock::time_point{}, {}});
  }
  void beginWait(gloo::transport::UnboundBuffer* buf) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = find(buf);
    if (it != pending.end()) it->waiting = Clock::now();
  }
  // Unregisters `buf`; what the peer watch found if it ended the wait, else "".
  std::string removePending(gloo::transport::UnboundBuffer* buf) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = find(buf);
    if (it == pending.end()) return "";
    std::string broken = std::move(it->broken);
    *it = std::move(pending.back());
    pending.pop_back();
    return broken;
  }

 private:
  std::vector<Pending>::iterator find(gloo::transport::UnboundBuffer* buf) {
    return std::find_if(pending.begin(), pending.end(),
                        [buf](const Pending& p) { return p.buf == buf; });
  }

 public:
  // Started by the backend's first group; every group split from it, and every request
  // that outlives them, is watched until the last of them is gone. ~Shared resets it first,
  // while the loop is ticked.
  std::unique_ptr<PeerWatch> watch;
};

// Ends the waits that Gloo would leave to the timeout after their peer failed. When a peer
// dies while its message to this rank is half read (or this rank's to it half written),
// Gloo closes the pair and fails the buffers queued on it, but not the one of the message
// in flight (its reader or writer holds it): that wait would run for the whole timeout.
// The watch keeps a receive posted on kProbeSlot of each pair a thread has waited on, which
// Gloo fails with the pair, and looks at it every kPeerWatchInterval without waiting (an
// abortWaitRecv() first makes the wait return at once unless the buffer failed). A wait
// that has gone on for kStuckOnAFailedPair over a failed pair is ended, and fails with
// what Gloo said of the pair.
class PeerWatch {
 public:
  explicit PeerWatch(Shared& shared)
      : shared_(shared), every_(kPeerWatchInterval, [this] { lookOnce(); }) {}
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

 private:
  // One watched pair: its probe, and when the watch first saw it failed and why.
  struct Watched {
    std::weak_ptr<gloo::Context> context;
    const gloo::Context* key;
    int peer;
    char byte = 0;  // the probe's memory; nothing is ever written into it
    std::unique_ptr<gloo::transport::UnboundBuffer> probe;
    Clock::time_point failed_since{};
    std::string why;
  };

  void lookOnce() {
    try {
      look();
    } catch (const std::exception& e) {
      // Out of memory, or Gloo refusing a probe: this round ends; the waits keep their
      // timeout, and the next round tries again.
      logWarn(std::string("backend gloo: the peer watch skipped a round: ") + e.what());
    }
  }

  void look() {
    std::vector<std::pair<std::shared_ptr<gloo::Context>, int>> waited_on;
    {
      std::lock_guard<std::mutex> lock(shared_.mu);
      for (const Pending& p : shared_.pending) {
        if (p.waiting == Clock::time_point{}) continue;
        auto context = p.context.lock();
        const std::pair<std::shared_ptr<gloo::Context>, int> pair{std::move(context), p.peer};
        if (pair.first != nullptr &&
            std::find(waited_on.begin(), waited_on.end(), pair) == waited_on.end()) {
          waited_on.push_back(pair);  // each pair once, however many threads wait on it
        }
      }
    }
    // The pairs of groups that are gone are forgotten (their probes with them).
    watched_.remove_if([](const Watched& w) { return w.context.expired(); });
    const auto now = Clock::now();
    bool any_failed = false;
    for (const auto& [context, peer] : waited_on) {
      Watched& w = watch(context, peer);
      if (w.why.empty()) {
        w.why = failure(w);
        if (!w.why.empty()) w.failed_since = now;
      }
      any_failed = any_failed || !w.why.empty();
    }
    if (!any_failed) return;
    std::lock_guard<std::mutex> lock(shared_.mu);
    for (Pending& p : shared_.pending) {
      if (p.waiting == Clock::time_point{} || !p.broken.empty()) continue;
      for (const Watched& w : watched_) {
        // The same group, told without locking its context here (under the registry's lock,
        // a lock could be the one that destroys it).
        const bool same = !p.context.owner_before(w.context) && !w.context.owner_before(p.context);
        if (!same || w.peer != p.peer || w.why.empty()) continue;
        if (now - std::max(p.waiting, w.failed_since) < kStuckOnAFailedPair) continue;
        p.broken = w.why;
        if (p.sending) {
          p.buf->abortWaitSend();
        } else {
          p.buf->abortWaitRecv();
        }
      }
    }
  }

  // The pair to `peer` in `context`, watched from now on if it was not.
  Watched& watch(const std::shared_ptr<gloo::Context>& context, int peer) {
    for (Watched& w : watched_) {
      if (w.key == context.get() && w.peer == peer && !w.context.expired()) return w;
    }
    // Listed only once its probe is made: a round that throws before tries this pair again.
    std::list<Watched> made(1);
    Watched& w = made.front();
    w.context = context;
    w.key = context.get();
    w.peer = peer;
    w.probe = context->createUnboundBuffer(&w.byte, 1);
    try {
      w.probe->recv(peer, kProbeSlot);
    } catch (const std::exception& e) {
      w.probe.reset();  // the pair had failed before: Gloo refused the receive
      w.why = glooMessage(e);
      w.failed_since = Clock::now();
    }
    watched_.splice(watched_.end(), made);  // the element, and its `byte`, stay where they are
    return w;
  }

  // What Gloo said when the pair of `w` failed; "" while it is good. Never waits.
  static std::string failure(Watched& w) {
    if (w.probe == nullptr) return w.why;
    w.probe->abortWaitRecv();
    try {
      w.probe->waitRecv(nullptr, std::chrono::hours(1));  // returns at once: aborted
    } catch (const std::exception& e) {
      return glooMessage(e);
    }
    return "";
  }

  Shared& shared_;
  std::list<Watched> watched_;  // the watch thread's own; a list: `byte` must not move
  Every every_;                 // last: its thread starts once the rest is made
};

Shared::~Shared() {
  // The watch's probes hold the pairs they watch, which close as it goes: ticked.
  std::optional<Ticker::Ticking> ticking;
  if (ticker) ticking.emplace(*ticker);
  watch.reset();
}

using Transfer = TransferInfo;

// The CommError for a wait that ran out of time; `detail` is what Gloo said, if anything.
CommError timeoutError(const Transfer& transfer, std::chrono::milliseconds timeout,
                       const std::string& detail) {
  return CommError("gloo: " + transfer.describe() + " timed out after " +
                   std::to_string(timeout.count()) + " ms" +
                   (detail.empty() ? std::string() : ": " + detail) +
                   ". HINT: the peer never matched it; is it stopped, stuck or running a "
                   "different collective?");
}

// The CommError for a wait that Gloo ended with `e`.
CommError waitFailure(const Transfer& transfer, const std::exception& e,
                      std::chrono::milliseconds timeout) {
  std::string message = glooMessage(e);
  if (message.find("imeout") != std::string::npos || message.find("imed out") != std::string::npos)
    return timeoutError(transfer, timeout, message);
  return CommError("gloo: " + transfer.describe() + " failed: " + message +
                   ". HINT: the peer process died or closed its connection");
}

// The CommError for a transfer whose pair failed: `why` is what Gloo said of it.
CommError pairFailure(const Transfer& transfer, const std::string& why) {
  return CommError("gloo: " + transfer.describe() + " failed: " + why +
                   ". HINT: the peer process died or closed its connection");
}

// The CommError for a send or receive that Gloo refused to post.
CommError postFailure(const Transfer& transfer, const std::exception& e) {
  return pairFailure(transfer, glooMessage(e));
}

// The CommError for a wait that abort() ended.
CommError abortedError(const Transfer& transfer, const Shared& shared) {
  return CommError("gloo: " + transfer.describe() + " aborted: " + shared.aborted.reason());
}

// Memory of collie's own with a Gloo unbound buffer over it.
struct Staging {
  std::unique_ptr<char[]> memory;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
};

// What an eager message carries before its bytes.
struct EagerHeader {
  uint64_t tag = 0;
  uint64_t bytes = 0;
};

// Registers a receive buffer that a thread waits on, so that abort() and the peer watch
// wake it.
class PendingWait {
 public:
  PendingWait(Shared& shared, gloo::transport::UnboundBuffer* buf,
              const std::shared_ptr<gloo::Context>& context, int peer)
      : shared_(shared), buf_(buf) {
    shared_.addPending(buf_, context, peer, /*sending=*/false, /*waiting=*/true);
  }
  ~PendingWait() {
    if (buf_ != nullptr) shared_.removePending(buf_);
  }
  // Unregisters it; why the peer watch ended the wait, if it did.
  std::string end() {
    std::string broken = shared_.removePending(buf_);
    buf_ = nullptr;
    return broken;
  }
  PendingWait(const PendingWait&) = delete;
  PendingWait& operator=(const PendingWait&) = delete;

 private:
  Shared& shared_;
  gloo::transport::UnboundBuffer* buf_;
};

// One peer's eager messages within one group. Gloo's unbound buffers are a rendezvous: a
// send waits for the receiver's "ready" notice, so a message costs two one-way latencies.
// Here every message up to `capacity` bytes goes, behind an EagerHeader (its tag and
// length), into one of kEagerDepth receives that this rank posted on kEagerSlot ahead of
// time: the notices have long arrived when the sender sends, and the message costs one
// latency and two copies. Gloo fills the posted receives in posting order; `staged_` keeps
// that order. The k-th message with tag T meets the k-th receive with tag T; one that
// arrives before its receive is asked for is copied aside (`early_`) and its staging
// buffer posted again, so a sender never waits on messages the receiver asks for later.
//
// Any thread may receive: one at a time waits in Gloo on the oldest posted buffer (the
// reader) and hands whatever arrives to its owner, the others wait on `arrived_`. Senders
// copy into a staging buffer of their own (a few are kept for reuse).
class EagerChannel : public std::enable_shared_from_this<EagerChannel> {
 public:
  EagerChannel(std::shared_ptr<Shared> shared, std::shared_ptr<gloo::Context> context, int peer,
               size_t capacity)
      : shared_(std::move(shared)),
        context_(std::move(context)),
        peer_(peer),
        capacity_(capacity) {}

  // Posts the first receives; a CommError names the peer when Gloo refuses.
  void start(const Transfer& transfer) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_.reserve(kEagerDepth);
    for (size_t i = 0; i < kEagerDepth; ++i) {
      try {
        post(makeStaging());
      } catch (const std::exception& e) {
        throw postFailure(transfer, e);
      }
    }
  }

  // Sends `buf` with `tag` through a staging buffer; the request completes when Gloo wrote it.
  std::unique_ptr<Request> send(const Buffer& buf, const Transfer& transfer);

  // The position of a new receive among the receives of `tag` from this peer.
  uint64_t expect(Tag tag) {
    std::lock_guard<std::mutex> lock(mu_);
    return countsOf(tag).expected++;
  }

  // Blocks until the `index`-th message with `tag` arrived and was copied into `into`.
  void receive(Tag tag, uint64_t index, const Buffer& into, std::chrono::milliseconds timeout,
               const Transfer& transfer);

  void giveBack(Staging staging) {
    std::lock_guard<std::mutex> lock(mu_);
    if (spare_sends_.size() < kEagerSpareSends) spare_sends_.push_back(std::move(staging));
  }

 private:
  struct Counts {
    Tag tag = 0;
    uint64_t expected = 0, arrived = 0, consumed = 0;
  };

  // The counts of `tag`, made when it has none. A linear search from the newest: a peer
  // has a few tags in flight at a time, and the vector keeps its capacity, so that counting
  // a message costs no allocation.
  Counts& countsOf(Tag tag) {
    for (auto it = counts_.rbegin(); it != counts_.rend(); ++it) {
      if (it->tag == tag) return *it;
    }
    counts_.push_back({tag});
    return counts_.back();
  }

  // A staging buffer: the header and up to `capacity_` bytes.
  Staging makeStaging() {
    Staging staging;
    staging.memory.reset(new char[sizeof(EagerHeader) + capacity_]);
    staging.buf =
        context_->createUnboundBuffer(staging.memory.get(), sizeof(EagerHeader) + capacity_);
    return staging;
  }

  // Posts `staging` as the newest receive; Gloo's exception when it refuses.
  void post(Staging staging) {
    staging.buf->recv(peer_, kEagerSlot, 0, sizeof(EagerHeader) + capacity_);
    staged_.push_back(std::move(staging));  // within the capacity reserved in start()
  }

  // Posts a buffer whose message was taken out again. A peer that has finished and closed
  // its connection makes Gloo refuse: the message just taken out is still good, so the
  // refusal is kept for a receive that would need this buffer (`staged_` runs dry).
  void repost(Staging staging) {
    try {
      post(std::move(staging));
    } catch (const std::exception& e) {
      if (broken_.empty()) broken_ = glooMessage(e);
    }
  }

  // A receive of `tag` was served: its counts go once every message was matched.
  void consumed(Tag tag) {
    auto it =
        std::find_if(counts_.begin(), counts_.end(), [&](const Counts& c) { return c.tag == tag; });
    if (it == counts_.end()) return;
    ++it->consumed;
    if (it->consumed == it->expected && it->consumed == it->arrived) counts_.erase(it);
  }

  // Copies a message of `length` bytes into `into`; false (nothing copied) when the sizes
  // disagree.
  static bool deliver(const char* bytes, uint64_t length, const Buffer& into) {
    if (length != into.bytes()) return false;
    if (length > 0) std::memcpy(into.data, bytes, length);
    return true;
  }

  static CommError sizeMismatch(uint64_t length, const Buffer& into, const Transfer& transfer) {
    return CommError("gloo: " + transfer.describe() + ": the sizes disagree: the peer sent " +
                     std::to_string(length) + " bytes, this rank receives " +
                     std::to_string(into.bytes()) +
                     ". HINT: both ranks must run the same collective on the same count");
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<gloo::Context> context_;
  const int peer_;
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable arrived_;
  bool reading_ = false;         // a thread waits in Gloo for the next message
  std::vector<Staging> staged_;  // posted receives, oldest first (at most kEagerDepth)
  // Messages that arrived before their receive was asked for, and the memory of ones already
  // taken out, kept for the next (kEagerDepth of them): arriving early costs a copy, and an
  // allocation only while the pile grows.
  struct Early {
    Tag tag;
    uint64_t index;
    std::vector<char> bytes;
  };
  std::vector<Early> early_;
  std::vector<std::vector<char>> spare_early_;
  std::vector<Counts> counts_;  // the tags with messages expected or arrived, oldest first
  std::vector<Staging> spare_sends_;
  std::string broken_;       // why Gloo refused to post a buffer again, if it did
  std::string failed_pair_;  // what the peer watch found when it ended a receive, if it did
};

class GlooRequest : public Request, public PooledAllocation<GlooRequest> {
 public:
  GlooRequest(std::shared_ptr<Shared> shared, std::unique_ptr<gloo::transport::UnboundBuffer> buf,
              const std::shared_ptr<gloo::Context>& context, Transfer transfer)
      : shared_(std::move(shared)), buf_(std::move(buf)), transfer_(transfer) {
    shared_->addPending(buf_.get(), context, transfer_.peer, transfer_.sending, /*waiting=*/false);
  }
  // An eager send from `staging`, handed back to `channel` once it completed.
  GlooRequest(std::shared_ptr<Shared> shared, Staging staging,
              const std::shared_ptr<gloo::Context>& context, Transfer transfer,
              std::shared_ptr<EagerChannel> channel)
      : GlooRequest(std::move(shared), std::move(staging.buf), context, transfer) {
    memory_ = std::move(staging.memory);
    channel_ = std::move(channel);
  }
  ~GlooRequest() override { forget(); }

  void wait(std::chrono::milliseconds timeout) override {
    if (done_) return;
    // The buffer registered for abort after it was posted (the constructor): an abort() in
    // between set the flag without waking it. abort() sets the flag under the lock the
    // registration takes, so either it woke this buffer or the flag is seen here.
    if (shared_->aborted.isSet()) {
      forget();
      throw abortedError(transfer_, *shared_);
    }
    bool completed = false;
    shared_->beginWait(buf_.get());
    try {
      completed = transfer_.sending ? buf_->waitSend(timeout) : buf_->waitRecv(timeout);
    } catch (const std::exception& e) {
      forget();
      throw waitFailure(transfer_, e, timeout);
    }
    const std::string broken = forget();
    if (!completed) {
      if (!broken.empty()) throw pairFailure(transfer_, broken);
      throw abortedError(transfer_, *shared_);
    }
    done_ = true;
    if (channel_ != nullptr) channel_->giveBack({std::move(memory_), std::move(buf_)});
  }

  bool test() override { return done_; }

 private:
  std::string forget() { return shared_->removePending(buf_.get()); }

  std::shared_ptr<Shared> shared_;
  // An eager send's staging memory: declared before `buf_`, which reads it, so that it is
  // freed after the buffer (a request dropped unwaited ends its transfer with the buffer).
  std::unique_ptr<char[]> memory_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  Transfer transfer_;
  std::shared_ptr<EagerChannel> channel_;  // where it goes back to
  bool done_ = false;
};

std::unique_ptr<Request> EagerChannel::send(const Buffer& buf, const Transfer& transfer) {
  Staging staging;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!spare_sends_.empty()) {
      staging = std::move(spare_sends_.back());
      spare_sends_.pop_back();
    }
  }
  if (staging.buf == nullptr) staging = makeStaging();
  const EagerHeader header{transfer.tag, buf.bytes()};
  std::memcpy(staging.memory.get(), &header, sizeof(header));
  if (buf.bytes() > 0) std::memcpy(staging.memory.get() + sizeof(header), buf.data, buf.bytes());
  try {
    staging.buf->send(peer_, kEagerSlot, 0, sizeof(header) + buf.bytes());
  } catch (const std::exception& e) {
    throw postFailure(transfer, e);
  }
  return std::make_unique<GlooRequest>(shared_, std::move(staging), context_, transfer,
                                       shared_from_this());
}

class EagerRecvRequest : public Request, public PooledAllocation<EagerRecvRequest> {
 public:
  EagerRecvRequest(std::shared_ptr<EagerChannel> channel, const Buffer& into, Transfer transfer)
      : channel_(std::move(channel)),
        into_(into),
        transfer_(transfer),
        index_(channel_->expect(transfer.tag)) {}

  void wait(std::chrono::milliseconds timeout) override {
    if (done_) return;
    channel_->receive(transfer_.tag, index_, into_, timeout, transfer_);
    done_ = true;
  }
  bool test() override { return done_; }

 private:
  std::shared_ptr<EagerChannel> channel_;
  Buffer into_;
  Transfer transfer_;
  uint64_t index_;
  bool done_ = false;
};

void EagerChannel::receive(Tag tag, uint64_t index, const Buffer& into,
                           std::chrono::milliseconds timeout, const Transfer& transfer) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  const std::pair<Tag, uint64_t> wanted{tag, index};
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto early = std::find_if(early_.begin(), early_.end(), [&](const Early& e) {
      return e.tag == wanted.first && e.index == wanted.second;
    });
    if (early != early_.end()) {
      std::vector<char> bytes = std::move(early->bytes);
      early_.erase(early);
      consumed(tag);
      const bool delivered = deliver(bytes.data(), bytes.size(), into);
      const uint64_t length = bytes.size();
      if (spare_early_.size() < kEagerDepth) spare_early_.push_back(std::move(bytes));
      if (!delivered) throw sizeMismatch(length, into, transfer);
      return;
    }
    if (shared_->aborted.isSet()) {
      throw abortedError(transfer, *shared_);
    }
    if (!failed_pair_.empty()) throw pairFailure(transfer, failed_pair_);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw timeoutError(transfer, timeout, "");
    if (reading_) {
      // Another thread reads; it hands this message over when it comes. The slices notice
      // an abort.
      arrived_.wait_for(lock, std::min(left, std::chrono::milliseconds(20)));
      continue;
    }
    if (staged_.empty()) {
      throw CommError("gloo: " + transfer.describe() + " failed: " +
                      (broken_.empty() ? std::string("no eager receive is posted") : broken_) +
                      ". HINT: the peer process died or closed its connection");
    }
    reading_ = true;
    Staging staging = std::move(staged_.front());
    staged_.erase(staged_.begin());
    lock.unlock();
    bool completed = false;
    // Kept as a value and thrown with `throw` below: an exception made by
    // std::make_exception_ptr here would carry a destructor of this plugin's, and the
    // framework may destroy it after the plugin is unloaded.
    std::optional<CommError> failure;
    std::string pair_failed;  // what the peer watch found, if it ended this wait
    {
      PendingWait pending(*shared_, staging.buf.get(), context_, peer_);
      try {
        // An abort() before the registration above set the flag before it looked.
        completed = !shared_->aborted.isSet() && staging.buf->waitRecv(nullptr, left);
      } catch (const std::exception& e) {
        failure = waitFailure(transfer, e, timeout);
      }
      pair_failed = pending.end();
      if (!completed && !failure && !pair_failed.empty())
        failure = pairFailure(transfer, pair_failed);
    }
    lock.lock();
    reading_ = false;
    if (!pair_failed.empty()) failed_pair_ = pair_failed;  // every later receive fails at once
    arrived_.notify_all();
    if (failure || !completed) {
      staged_.insert(staged_.begin(), std::move(staging));  // still Gloo's oldest receive
      if (failure) throw *failure;
      throw abortedError(transfer, *shared_);
    }
    EagerHeader header;
    std::memcpy(&header, staging.memory.get(), sizeof(header));
    const char* bytes = staging.memory.get() + sizeof(header);
    if (header.bytes > capacity_) {
      repost(std::move(staging));
      throw CommError("gloo: " + transfer.describe() + ": an eager message claims " +
                      std::to_string(header.bytes) + " bytes, more than the " +
                      std::to_string(capacity_) +
                      " the ranks agreed on. HINT: every rank needs the same "
                      "params.eager_threshold");
    }
    const std::pair<Tag, uint64_t> got{header.tag, countsOf(header.tag).arrived++};
    if (got == wanted) {
      // Copied out before the buffer is posted again: Gloo may fill it at once.
      const bool delivered = deliver(bytes, header.bytes, into);
      consumed(tag);
      repost(std::move(staging));
      if (!delivered) throw sizeMismatch(header.bytes, into, transfer);
      return;
    }
    std::vector<char> aside;
    if (!spare_early_.empty()) {
      aside = std::move(spare_early_.back());
      spare_early_.pop_back();
    }
    aside.assign(bytes, bytes + header.bytes);
    early_.push_back({got.first, got.second, std::move(aside)});
    repost(std::move(staging));
  }
}

// What a cached instance of one of Gloo's all-reduce algorithm classes is for. Nothing in it
// may differ between ranks (a buffer's address does): building an instance takes slots from
// the context's counter, so every rank must build (and evict) the same ones at the same call.
struct NativeKey {
  size_t count;
  DType dtype;
  ReduceOp op;
  bool operator<(const NativeKey& o) const {
    return std::tie(count, dtype, op) < std::tie(o.count, o.dtype, o.op);
  }
};

// A cached instance, bound to a buffer of its own: the data is copied in and out.
struct Native {
  NativeKey key{};
  std::vector<uint8_t> bound;
  std::unique_ptr<gloo::Algorithm> algorithm;
};

template <typename T>
const gloo::ReductionFunction<T>* reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return gloo::ReductionFunction<T>::sum;
    case ReduceOp::kProd:
      return gloo::ReductionFunction<T>::product;
    case ReduceOp::kMin:
      return gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax:
      return gloo::ReductionFunction<T>::max;
  }
  return nullptr;
}

template <typename T>
std::unique_ptr<gloo::Algorithm> makeAlgorithm(const std::string& name,
                                               const std::shared_ptr<gloo::Context>& context,
                                               void* data, size_t count, ReduceOp op) {
  std::vector<T*> ptrs{static_cast<T*>(data)};
  const int n = static_cast<int>(count);
  const auto* fn = reduction<T>(op);
  if (name == "ring") return std::make_unique<gloo::AllreduceRing<T>>(context, ptrs, n, fn);
  if (name == "ring_chunked")
    return std::make_unique<gloo::AllreduceRingChunked<T>>(context, ptrs, n, fn);
  if (name == "halving_doubling")
    return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context, ptrs, n, fn);
  return std::make_unique<gloo::AllreduceBcube<T>>(context, ptrs, n, fn);
}

const std::vector<std::string> kAlgorithms = {"ring", "ring_chunked", "halving_doubling", "bcube"};

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(const PluginContext& context) : shared_(std::make_shared<Shared>()) {
    const auto& ctx = context.backend;
    Params& params = *context.params;
    shared_->timeout = params.getDuration("timeout", std::chrono::milliseconds(30000));
    shared_->algorithm = params.getString("algorithm", "ring_chunked");
    if (std::find(kAlgorithms.begin(), kAlgorithms.end(), shared_->algorithm) ==
        kAlgorithms.end()) {
      throw ConfigError(
          "backend gloo: params.algorithm: expected one of ring, ring_chunked, "
          "halving_doubling, bcube, found '" +
          shared_->algorithm + "'");
    }
    if (shared_->algorithm == "bcube" && ctx.size % 2 != 0) {
      throw ConfigError(
          "backend gloo: params.algorithm bcube needs an even number of ranks (Gloo "
          "computes wrong sums on others); this job has " +
          std::to_string(ctx.size) + ". HINT: ring_chunked or halving_doubling");
    }
    if (shared_->algorithm == "ring" && ctx.rank == 0) {
      logWarn(
          "backend gloo: params.algorithm ring adds the ranks' buffers in a different order on "
          "every rank, so float results differ in their last bits between ranks (a trainer's "
          "weights drift apart); ring_chunked and halving_doubling give every rank the same "
          "bits");
    }
    shared_->eager_bytes = params.getBytes("eager_threshold", shared_->eager_bytes, 0, 16 << 20);
    const std::string interface = params.getString("interface", "");
    if (!interface.empty()) requireInterface("backend gloo", interface);
    const std::string hostname = params.getString("hostname", "");
    if (!interface.empty() && !hostname.empty()) {
      throw ConfigError("backend gloo: give params.interface or params.hostname, not both");
    }
    if (ctx.store == nullptr) {
      throw PluginError(
          "backend gloo needs the job's rendezvous store: it runs one process "
          "per rank (collie run starts them)");
    }
    shared_->store = ctx.store;
    gloo::transport::tcp::attr attr;
    attr.iface = interface;
    attr.hostname = hostname;
    // One host: listen on the loopback, not on whatever the host name resolves to.
    if (ctx.one_host && interface.empty() && hostname.empty()) attr.hostname = "127.0.0.1";
    const std::string loop_thread = params.getString("loop_thread", "batch");
    if (loop_thread != "batch" && loop_thread != "normal") {
      throw ConfigError("backend gloo: params.loop_thread: expected batch or normal, found '" +
                        loop_thread + "'");
    }
    ignoreBrokenPipes();
    try {
      LoopThreadPolicy policy(loop_thread == "batch");
      shared_->device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw ConfigError("backend gloo: cannot open a TCP device" +
                        (interface.empty() ? std::string() : " on interface '" + interface + "'") +
                        ": " + glooMessage(e) +
                        ". HINT: params.interface names a NIC (`ip -brief addr` lists them)");
    }
    shared_->ticker = std::make_unique<Ticker>(shared_->device);
    {
      Ticker::Ticking ticking(*shared_->ticker);
      connect(ctx.rank, ctx.size, "gloo/");
    }
    shared_->watch = std::make_unique<PeerWatch>(*shared_);
  }

  GlooBackend(std::shared_ptr<Shared> shared, int rank, int size, const std::string& prefix)
      : shared_(std::move(shared)) {
    Ticker::Ticking ticking(*shared_->ticker);
    connect(rank, size, prefix);
  }

  // What the members' own ends would do, in their order, while the loop is ticked: the
  // pairs close with the context, unless a request or the peer watch's probe still holds
  // them (those close later: the watch's in its next round, or as it goes in ~Shared).
  ~GlooBackend() override {
    Ticker::Ticking ticking(*shared_->ticker);
    channels_.clear();
    natives_.clear();
    context_.reset();
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::chrono::milliseconds timeout() const override { return shared_->timeout; }
  Capabilities capabilities() const override {
    Capabilities caps;
    // Gloo's bcube is wrong on odd groups (a sub-group of an even job can be one).
    caps.native_allreduce = !(shared_->algorithm == "bcube" && size() % 2 != 0);
    caps.native_dtypes &= ~(1u << static_cast<unsigned>(DType::kBF16));  // no bf16 in Gloo
    return caps;
  }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    return post(peer, buf, tag, true);
  }
  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    return post(peer, buf, tag, false);
  }

  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    const int me = splitPosition(ranks, rank(), "gloo");
    return std::make_unique<GlooBackend>(shared_, me, static_cast<int>(ranks.size()),
                                         prefix_ + splitName(splits_++, ranks) + "/");
  }

  Decision runNative(const CollectiveArgs& args) override {
    if (args.coll != Collective::kAllReduce) {
      return Decision::no("gloo's native collectives here are all-reduce only");
    }
    if (args.data.memory != MemoryKind::kHost) return Decision::no("gloo moves host memory only");
    if (args.data.dtype == DType::kBF16) return Decision::no("Gloo has no bfloat16 reduction");
    // Gloo's algorithms hold the element count and the byte count in an int (allreduce_ring.h
    // computes `const int bytes_ = count * sizeof(T)`): past 2 GiB the byte count wraps.
    if (args.data.bytes() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return Decision::no(
          "Gloo's algorithms count bytes in an int (at most 2 GiB - 1 per "
          "all-reduce; this one is " +
          std::to_string(args.data.bytes()) + " bytes)");
    }
    if (shared_->algorithm == "bcube" && size() % 2 != 0) {
      // Gloo's bcube needs a group size divisible by its base (2) and computes wrong sums
      // otherwise, without a word.
      return Decision::no("gloo's bcube all-reduce needs an even group size (this one has " +
                          std::to_string(size()) + "); ring_chunked and halving_doubling take any");
    }
    if (args.data.count == 0 || size() == 1) return Decision::yes();
    shared_->aborted.throwIfSet("gloo: native all-reduce seq " + std::to_string(args.seq));
    try {
      bool first_run = false;
      Native& native = algorithmFor(args.data, args.op, &first_run);
      std::memcpy(native.bound.data(), args.data.data, args.data.bytes());
      native.algorithm->run();
      std::memcpy(args.data.data, native.bound.data(), args.data.bytes());
      if (first_run) raiseSendBuffers();
    } catch (const std::exception& e) {
      throw CommError("gloo: rank " + std::to_string(rank()) + ": native " + shared_->algorithm +
                      " all-reduce seq " + std::to_string(args.seq) + " failed: " + glooMessage(e));
    }
    finishAverage(args.data, args.op, size());
    return Decision::yes();
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->aborted.set(reason);
    for (const Pending& p : shared_->pending) {
      p.buf->abortWaitSend();
      p.buf->abortWaitRecv();
    }
  }

 private:
  void connect(int rank, int size, const std::string& prefix) {
    prefix_ = prefix;
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(shared_->timeout);
    PrefixStore scoped(prefix, *shared_->store);
    StoreAdapter store(scoped);
    try {
      context->connectFullMesh(store, shared_->device);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError("gloo: rank " + std::to_string(rank) + " could not connect to its " +
                      std::to_string(size - 1) + " peers: " + glooMessage(e));
    }
    context_ = context;
  }

  std::unique_ptr<Request> post(int peer, const Buffer& buf, Tag tag, bool sending) {
    checkTransfer("gloo", rank(), size(), peer, buf, sending, MemoryKind::kHost);
    const Transfer transfer{rank(), peer, sending, tag};
    if (shared_->aborted.isSet()) shared_->aborted.throwIfSet("gloo: " + transfer.describe());
    if (shared_->eager_bytes > 0 && buf.bytes() <= shared_->eager_bytes) {
      auto channel = eagerChannel(peer, transfer);
      if (sending) return channel->send(buf, transfer);
      return std::make_unique<EagerRecvRequest>(std::move(channel), buf, transfer);
    }
    std::unique_ptr<gloo::transport::UnboundBuffer> ub;
    try {
      ub = context_->createUnboundBuffer(buf.data, buf.bytes());
      if (sending) {
        ub->send(peer, tag | kTagSlotBit);
      } else {
        ub->recv(peer, tag | kTagSlotBit);
      }
    } catch (const std::exception& e) {
      throw postFailure(transfer, e);
    }
    return std::make_unique<GlooRequest>(shared_, std::move(ub), context_, transfer);
  }

  // The eager channel to `peer`, made (and its receives posted) on first use.
  std::shared_ptr<EagerChannel> eagerChannel(int peer, const Transfer& transfer) {
    std::lock_guard<std::mutex> lock(channels_mu_);
    if (channels_.empty()) channels_.resize(size());
    auto& channel = channels_[peer];
    if (channel == nullptr) {
      auto made = std::make_shared<EagerChannel>(shared_, context_, peer, shared_->eager_bytes);
      made->start(transfer);
      channel = std::move(made);
    }
    return channel;
  }

  // Gloo's algorithm objects bind their buffer when built; the last few are kept, by what
  // every rank's call has in common (count, dtype, op; never the buffer's address), so every
  // rank builds and evicts the same ones in the same order.
  Native& algorithmFor(const Buffer& data, ReduceOp op, bool* created) {
    *created = false;
    const NativeKey key{data.count, data.dtype, op};
    for (auto it = natives_.begin(); it != natives_.end(); ++it) {
      if (!(it->key < key) && !(key < it->key)) {
        natives_.splice(natives_.begin(), natives_, it);
        return natives_.front();
      }
    }
    Native native;
    native.key = key;
    native.bound.resize(data.bytes());
    void* bound = native.bound.data();  // a vector's storage stays put when it is moved
    const auto& name = shared_->algorithm;
    native.algorithm = [&]() -> std::unique_ptr<gloo::Algorithm> {
      switch (data.dtype) {
        case DType::kF32:
          return makeAlgorithm<float>(name, context_, bound, data.count, op);
        case DType::kF64:
          return makeAlgorithm<double>(name, context_, bound, data.count, op);
        case DType::kF16:
          return makeAlgorithm<gloo::float16>(name, context_, bound, data.count, op);
        case DType::kI32:
          return makeAlgorithm<int32_t>(name, context_, bound, data.count, op);
        case DType::kI64:
          return makeAlgorithm<int64_t>(name, context_, bound, data.count, op);
        case DType::kBF16:
          break;
      }
      return nullptr;
    }();
    *created = true;
    natives_.push_front(std::move(native));
    // Every rank holds the same entries, so every rank evicts the same ones.
    size_t held = 0;
    for (const Native& n : natives_) held += n.bound.size();
    while (natives_.size() > 1 && (natives_.size() > kCachedAlgorithms || held > kCachedBytes)) {
      held -= natives_.back().bound.size();
      natives_.pop_back();
    }
    return natives_.front();
  }

  static constexpr size_t kCachedAlgorithms = 8;
  static constexpr size_t kCachedBytes = size_t{256} << 20;  // the copies kept, the newest always
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<gloo::Context> context_;
  std::string prefix_;
  int splits_ = 0;
  std::list<Native> natives_;
  std::mutex channels_mu_;
  std::vector<std::shared_ptr<EagerChannel>> channels_;  // by peer; destroyed before context_
};

}  // namespace
}  // namespace collie::gloo_backend

COLLIE_BACKEND_PLUGIN("gloo", "1.0.0",
                      "Gloo's TCP transport between processes; Gloo's own all-reduce as native",
                      collie::gloo_backend::GlooBackend);
