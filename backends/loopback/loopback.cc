// The loopback backend: ranks are threads of one process that exchange messages through
// in-memory mailboxes. Full backend contract (tags, timeouts, split, abort), for tests.
//
// Rendezvous protocol: whichever side of a transfer arrives second copies the bytes straight
// from the send buffer into the receive buffer (one copy, no staging copy), and completes
// the waiting side. A send therefore completes once its receive is posted, as the contract
// allows ("the buffer stays untouched until the request completes").
//
// Memory (params.memory): host memory by default, copied by memcpy; with `device`, device
// memory only, as nccl moves it, copied through the framework's device memory table
// (copyInto), so that on a GPU it moves device buffers and on the emulated device every
// pointer it is handed is checked.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "collie/device_memory.h"
#include "collie/plugin.h"

namespace collie::loopback {
namespace {

// One side of a transfer waiting for its match: a posted receive (the buffer to fill) or a
// send whose receive is not posted yet (the buffer to copy from). Guarded by World::mu.
struct Pending {
  Pending(const Buffer& b, int owner_rank) : buffer(b), owner(owner_rank) {}
  Buffer buffer;
  int owner;  // the rank that posted it: its mailbox's condition variable announces the end
  bool done = false;
  bool claimed = false;  // the matching side is copying outside the lock
  std::string error;
};
using Queue = std::deque<std::shared_ptr<Pending>>;

// The shared state of one group: a mailbox per destination rank. A queue is erased as soon
// as it is empty, so the mailboxes hold only what waits (they do not grow with every tag).
struct World {
  using Key = std::pair<int, Tag>;  // (source rank, tag)
  using Queues = std::map<Key, Queue>;
  struct Mailbox {
    Queues sends;  // sends to this rank waiting for their receive
    Queues recvs;  // receives this rank posted, waiting for their send
    AbortFlag aborted;
    // This rank's waiters: a finished transfer wakes only the rank that posted it (one
    // condition variable for the world woke every rank's thread for every message).
    std::condition_variable cv;
  };

  explicit World(int n) : size(n), boxes(n) {}
  const int size;
  std::mutex mu;
  std::vector<Mailbox> boxes;
};

using Transfer = TransferInfo;

// Groups meet by name: every rank thread of a job (or of a split) finds the same World.
std::shared_ptr<World> joinWorld(const std::string& key, int size) {
  static std::mutex registry_mu;
  static std::map<std::string, std::weak_ptr<World>> registry;
  std::lock_guard<std::mutex> lock(registry_mu);
  for (auto it = registry.begin(); it != registry.end();) {
    it = it->second.expired() ? registry.erase(it) : std::next(it);
  }
  auto world = registry[key].lock();
  if (!world) {
    world = std::make_shared<World>(size);
    registry[key] = world;
  } else if (world->size != size) {
    throw CommError("loopback: group '" + key + "' has " + std::to_string(world->size) +
                    " ranks, but a rank joined it with size " + std::to_string(size));
  }
  return world;
}

// Under World::mu: removes `pending` from the queue of `key`, and the queue when it empties.
void withdraw(World::Queues& queues, const World::Key& key,
              const std::shared_ptr<Pending>& pending) {
  auto it = queues.find(key);
  if (it == queues.end()) return;
  Queue& queue = it->second;
  queue.erase(std::remove(queue.begin(), queue.end(), pending), queue.end());
  if (queue.empty()) queues.erase(it);
}

// A send or receive that waits for the other side.
class PendingRequest : public Request {
 public:
  // `pending` waits in `queues` under `key`; the transfer's rank (its owner) and peer are
  // the ranks whose abort fails it.
  PendingRequest(std::shared_ptr<World> world, std::shared_ptr<Pending> pending,
                 World::Queues* queues, World::Key key, Transfer transfer)
      : world_(std::move(world)),
        pending_(std::move(pending)),
        queues_(queues),
        key_(key),
        owner_(transfer.rank),
        peer_(transfer.peer),
        transfer_(transfer) {}

  // A request dropped without a successful wait (a collective that unwinds) takes its buffer
  // back: a partner copying into it right now finishes first, a later one never finds it.
  ~PendingRequest() override {
    std::unique_lock<std::mutex> lock(world_->mu);
    if (pending_->claimed) {
      world_->boxes[owner_].cv.wait(lock, [&] { return pending_->done; });
    } else if (!pending_->done) {
      withdraw(*queues_, key_, pending_);
    }
  }

  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(world_->mu);
    auto aborted = [&] {
      return world_->boxes[owner_].aborted.isSet() || world_->boxes[peer_].aborted.isSet();
    };
    auto& cv = world_->boxes[owner_].cv;
    bool finished = cv.wait_for(
        lock, timeout, [&] { return pending_->done || (aborted() && !pending_->claimed); });
    // The other side already claimed our buffer and is copying: let it finish first.
    if (!pending_->done && pending_->claimed) {
      cv.wait(lock, [&] { return pending_->done; });
      finished = true;
    }
    if (finished && pending_->done) {
      if (!pending_->error.empty()) throw CommError(pending_->error);
      return;
    }
    // Withdraw, so that a late partner cannot touch a buffer the caller gave up.
    withdraw(*queues_, key_, pending_);
    if (aborted()) {
      const auto& box =
          world_->boxes[owner_].aborted.isSet() ? world_->boxes[owner_] : world_->boxes[peer_];
      throw CommError("loopback: " + transfer_.describe() + " aborted: " + box.aborted.reason());
    }
    throw CommError("loopback: " + transfer_.describe() + " timed out after " +
                    std::to_string(timeout.count()) +
                    " ms. HINT: the peer never matched it; is it stuck, dead, or running a "
                    "different collective?");
  }

  bool test() override {
    std::lock_guard<std::mutex> lock(world_->mu);
    return pending_->done;
  }

 private:
  std::shared_ptr<World> world_;
  std::shared_ptr<Pending> pending_;
  World::Queues* queues_;  // in the world's mailboxes, which never move
  World::Key key_;
  int owner_, peer_;
  Transfer transfer_;
};

class LoopbackBackend : public Backend {
 public:
  explicit LoopbackBackend(const PluginContext& context)
      : LoopbackBackend(context.backend.job_id, context.backend.rank, context.backend.size,
                        context.params->getDuration("timeout", context.backend.timeout),
                        memoryOf(*context.params)) {}

  LoopbackBackend(const std::string& key, int rank, int size, std::chrono::milliseconds timeout,
                  MemoryKind moves)
      : key_(key), rank_(rank), size_(size), timeout_(timeout), moves_(moves) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw CommError("loopback: rank " + std::to_string(rank) + " is outside a group of " +
                      std::to_string(size));
    }
    world_ = joinWorld(key, size);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_memory = moves_ == MemoryKind::kHost;
    caps.cuda_memory = moves_ == MemoryKind::kCuda;
    return caps;
  }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    return post(peer, buf, tag, /*sending=*/true);
  }

  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    return post(peer, buf, tag, /*sending=*/false);
  }

  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    const int me = splitPosition(ranks, rank_, "loopback");
    return std::make_unique<LoopbackBackend>(key_ + "/" + splitName(splits_++, ranks), me,
                                             static_cast<int>(ranks.size()), timeout_, moves_);
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(world_->mu);
    auto& box = world_->boxes[rank_];
    if (!box.aborted.set(reason)) return;  // the first reason stays
    // Waiters of every rank check this rank's flag (their peer may be this rank).
    for (auto& b : world_->boxes) b.cv.notify_all();
  }

 private:
  // Matches a send or receive with the other side if it is waiting (and copies), or queues
  // it. A send waits in the peer's mailbox under (this rank, tag), a receive in ours under
  // (peer, tag), so both sides look in the same place.
  std::unique_ptr<Request> post(int peer, const Buffer& buf, Tag tag, bool sending) {
    checkTransfer("loopback", rank_, size_, peer, buf, sending, moves_);
    const Transfer t{rank_, peer, sending, tag};
    auto& box = world_->boxes[sending ? peer : rank_];
    const World::Key key{sending ? rank_ : peer, tag};
    std::shared_ptr<Pending> other;
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      throwIfAborted(t);
      other = claim(sending ? box.recvs : box.sends, key);
      if (!other) {
        World::Queues& queues = sending ? box.sends : box.recvs;
        auto pending = std::make_shared<Pending>(buf, rank_);
        queues[key].push_back(pending);
        return std::make_unique<PendingRequest>(world_, pending, &queues, key, t);
      }
    }
    std::string error = sending ? transfer(buf, other->buffer, t) : transfer(other->buffer, buf, t);
    complete(*other, error);
    if (!error.empty()) throw CommError(error);
    return std::make_unique<CompletedRequest>();
  }

  // Under the lock: fails when this rank or the peer was aborted.
  void throwIfAborted(const Transfer& t) const {
    for (int r : {rank_, t.peer}) {
      const auto& box = world_->boxes[r];
      if (box.aborted.isSet()) {
        throw CommError("loopback: " + t.describe() + ": rank " + std::to_string(r) +
                        " was aborted: " + box.aborted.reason());
      }
    }
  }

  // Under the lock: takes the oldest side waiting under `key`, or null.
  static std::shared_ptr<Pending> claim(World::Queues& queues, const World::Key& key) {
    auto it = queues.find(key);
    if (it == queues.end()) return nullptr;
    auto pending = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) queues.erase(it);
    pending->claimed = true;
    return pending;
  }

  // Outside the lock: copies a message; returns an error when the sizes disagree.
  static std::string transfer(const Buffer& from, const Buffer& to, const Transfer& t) {
    if (from.bytes() != to.bytes()) {
      return "loopback: " + t.describe() + ": the message has " + std::to_string(from.bytes()) +
             " bytes, the receive expects " + std::to_string(to.bytes());
    }
    if (from.bytes() == 0) return "";
    if (from.memory == MemoryKind::kHost) {
      std::memcpy(to.data, from.data, from.bytes());
      return "";
    }
    try {
      Buffer dst = to;  // the same bytes, viewed as the sender's elements
      dst.dtype = from.dtype;
      dst.count = from.count;
      copyInto(dst, from);
    } catch (const std::exception& e) {
      return "loopback: " + t.describe() + ": " + e.what();
    }
    return "";
  }

  // params.memory: "host" (the default) or "device".
  static MemoryKind memoryOf(const Params& params) {
    const std::string memory = params.getString("memory", "host");
    if (memory == "host") return MemoryKind::kHost;
    if (memory == "device") return MemoryKind::kCuda;
    throw ConfigError("loopback: params.memory '" + memory +
                      "' is not a memory it moves; expected host or device. HINT: device moves "
                      "device memory only (as nccl does); without a GPU set "
                      "COLLIE_EMULATED_DEVICE=1");
  }

  // Wakes the waiters after the lock is released: a waiter woken under it would block on
  // the lock at once, a second sleep and wake-up per message.
  void complete(Pending& pending, const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      pending.error = error;
      pending.done = true;
    }
    world_->boxes[pending.owner].cv.notify_all();
  }

  std::string key_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  MemoryKind moves_;
  std::shared_ptr<World> world_;
  int splits_ = 0;
};

}  // namespace
}  // namespace collie::loopback

COLLIE_IN_PROCESS_BACKEND_PLUGIN(
    "loopback", "1.1.0", "ranks as threads of one process, exchanging messages in memory (tests)",
    collie::loopback::LoopbackBackend);
