// The loopback backend: ranks are threads of one process that exchange messages through
// in-memory mailboxes. Full backend contract (tags, timeouts, split, abort), for tests.
//
// Rendezvous protocol: whichever side of a transfer arrives second copies the bytes straight
// from the send buffer into the receive buffer (one memcpy, no staging copy), and completes
// the waiting side. A send therefore completes once its receive is posted, as the contract
// allows ("the buffer stays untouched until the request completes").
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "collie/plugin.h"

namespace collie::loopback {
namespace {

// One side of a transfer waiting for its match: a posted receive (the buffer to fill) or a
// send whose receive is not posted yet (the buffer to copy from). Guarded by World::mu.
struct Pending {
  explicit Pending(const Buffer& b) : buffer(b) {}
  Buffer buffer;
  bool done = false;
  bool claimed = false;  // the matching side is copying outside the lock
  std::string error;
};
using Queue = std::deque<std::shared_ptr<Pending>>;

// The shared state of one group: a mailbox per destination rank.
struct World {
  using Key = std::pair<int, Tag>;  // (source rank, tag)
  struct Mailbox {
    std::map<Key, Queue> sends;  // sends to this rank waiting for their receive
    std::map<Key, Queue> recvs;  // receives this rank posted, waiting for their send
    bool aborted = false;
    std::string abort_reason;
  };

  explicit World(int n) : size(n), boxes(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Mailbox> boxes;
};

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

// A send or receive that waits for the other side.
class PendingRequest : public Request {
 public:
  // `queue` is where `pending` waits; `owner` is the rank whose abort fails it; `what`
  // describes the transfer for messages ("rank 1: receive from rank 0 tag ...").
  PendingRequest(std::shared_ptr<World> world, std::shared_ptr<Pending> pending, Queue* queue,
                 int owner, int peer, std::string what)
      : world_(std::move(world)),
        pending_(std::move(pending)),
        queue_(queue),
        owner_(owner),
        peer_(peer),
        what_(std::move(what)) {}

  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(world_->mu);
    auto aborted = [&] { return world_->boxes[owner_].aborted || world_->boxes[peer_].aborted; };
    bool finished = world_->cv.wait_for(
        lock, timeout, [&] { return pending_->done || (aborted() && !pending_->claimed); });
    // The other side already claimed our buffer and is copying: let it finish first.
    if (!pending_->done && pending_->claimed) {
      world_->cv.wait(lock, [&] { return pending_->done; });
      finished = true;
    }
    if (finished && pending_->done) {
      if (!pending_->error.empty()) throw CommError(pending_->error);
      return;
    }
    // Withdraw, so that a late partner cannot touch a buffer the caller gave up.
    queue_->erase(std::remove(queue_->begin(), queue_->end(), pending_), queue_->end());
    if (aborted()) {
      const auto& box =
          world_->boxes[owner_].aborted ? world_->boxes[owner_] : world_->boxes[peer_];
      throw CommError("loopback: " + what_ + " aborted: " + box.abort_reason);
    }
    throw CommError("loopback: " + what_ + " timed out after " + std::to_string(timeout.count()) +
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
  Queue* queue_;  // owned by the world; std::map nodes do not move
  int owner_, peer_;
  std::string what_;
};

class LoopbackBackend : public Backend {
 public:
  explicit LoopbackBackend(const PluginContext& context)
      : LoopbackBackend(context.backend.job_id, context.backend.rank, context.backend.size,
                        context.params->getDuration("timeout", context.backend.timeout)) {}

  LoopbackBackend(const std::string& key, int rank, int size, std::chrono::milliseconds timeout)
      : key_(key), rank_(rank), size_(size), timeout_(timeout) {
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
                                             static_cast<int>(ranks.size()), timeout_);
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(world_->mu);
    auto& box = world_->boxes[rank_];
    box.aborted = true;
    box.abort_reason = reason;
    world_->cv.notify_all();
  }

 private:
  // Matches a send or receive with the other side if it is waiting (and copies), or queues
  // it. A send waits in the peer's mailbox under (this rank, tag), a receive in ours under
  // (peer, tag), so both sides look in the same place.
  std::unique_ptr<Request> post(int peer, const Buffer& buf, Tag tag, bool sending) {
    checkTransfer("loopback", rank_, size_, peer, buf, sending, MemoryKind::kHost);
    const std::string what = describeTransfer(rank_, peer, sending, tag);
    auto& box = world_->boxes[sending ? peer : rank_];
    const World::Key key{sending ? rank_ : peer, tag};
    std::shared_ptr<Pending> other;
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      throwIfAborted(peer, what);
      other = claim(sending ? box.recvs[key] : box.sends[key]);
      if (!other) {
        Queue& queue = sending ? box.sends[key] : box.recvs[key];
        queue.push_back(std::make_shared<Pending>(buf));
        return std::make_unique<PendingRequest>(world_, queue.back(), &queue, rank_, peer, what);
      }
    }
    std::string error =
        sending ? transfer(buf, other->buffer, what) : transfer(other->buffer, buf, what);
    complete(*other, error);
    if (!error.empty()) throw CommError(error);
    return std::make_unique<CompletedRequest>();
  }

  // Under the lock: fails when this rank or the peer was aborted.
  void throwIfAborted(int peer, const std::string& what) const {
    for (int r : {rank_, peer}) {
      const auto& box = world_->boxes[r];
      if (box.aborted) {
        throw CommError("loopback: " + what + ": rank " + std::to_string(r) +
                        " was aborted: " + box.abort_reason);
      }
    }
  }

  // Under the lock: takes the oldest waiting side from `queue`, or null.
  static std::shared_ptr<Pending> claim(Queue& queue) {
    if (queue.empty()) return nullptr;
    auto pending = queue.front();
    queue.pop_front();
    pending->claimed = true;
    return pending;
  }

  // Outside the lock: copies a message; returns an error when the sizes disagree.
  static std::string transfer(const Buffer& from, const Buffer& to, const std::string& what) {
    if (from.bytes() != to.bytes()) {
      return "loopback: " + what + ": the message has " + std::to_string(from.bytes()) +
             " bytes, the receive expects " + std::to_string(to.bytes());
    }
    if (from.bytes() > 0) std::memcpy(to.data, from.data, from.bytes());
    return "";
  }

  void complete(Pending& pending, const std::string& error) {
    std::lock_guard<std::mutex> lock(world_->mu);
    pending.error = error;
    pending.done = true;
    world_->cv.notify_all();
  }

  std::string key_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<World> world_;
  int splits_ = 0;
};

}  // namespace
}  // namespace collie::loopback

COLLIE_IN_PROCESS_BACKEND_PLUGIN(
    "loopback", "1.1.0", "ranks as threads of one process, exchanging messages in memory (tests)",
    collie::loopback::LoopbackBackend);
