// The loopback backend: ranks are threads of one process that exchange messages through
// in-memory mailboxes. Full backend contract (tags, timeouts, split, abort), for tests.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>

#include "collie/plugin.h"

namespace collie::loopback {
namespace {

std::string describeTag(Tag tag) {
  std::ostringstream out;
  out << "tag " << tag << " (seq " << (tag >> 24) << ", phase " << ((tag >> 20) & 0xF) << ", step "
      << (tag & 0xFFFFF) << ")";
  return out.str();
}

// A posted receive waiting for its message. Guarded by World::mu.
struct PendingRecv {
  Buffer buffer;
  bool done = false;
  bool claimed = false;  // a sender is copying into it outside the lock
  std::string error;
};

// The shared state of one group: a mailbox per destination rank.
struct World {
  using Key = std::pair<int, Tag>;  // (source rank, tag)
  struct Mailbox {
    std::map<Key, std::deque<std::vector<char>>> unexpected;  // sent before the receive
    std::map<Key, std::deque<std::shared_ptr<PendingRecv>>> posted;
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

class DoneRequest : public Request {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool test() override { return true; }
};

class RecvRequest : public Request {
 public:
  RecvRequest(std::shared_ptr<World> world, std::shared_ptr<PendingRecv> pending, int rank,
              int peer, Tag tag)
      : world_(std::move(world)),
        pending_(std::move(pending)),
        rank_(rank),
        peer_(peer),
        tag_(tag) {}

  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(world_->mu);
    auto& box = world_->boxes[rank_];
    bool finished = world_->cv.wait_for(
        lock, timeout, [&] { return pending_->done || (box.aborted && !pending_->claimed); });
    // A sender that already claimed the buffer is copying into it: let it finish first.
    if (!finished && pending_->claimed) {
      world_->cv.wait(lock, [&] { return pending_->done; });
      finished = true;
    }
    if (finished && pending_->done) {
      if (!pending_->error.empty()) throw CommError(pending_->error);
      return;
    }
    forget();
    if (box.aborted) {
      throw CommError("loopback: rank " + std::to_string(rank_) + ": receive from rank " +
                      std::to_string(peer_) + " " + describeTag(tag_) +
                      " aborted: " + box.abort_reason);
    }
    throw CommError("loopback: rank " + std::to_string(rank_) + ": receive from rank " +
                    std::to_string(peer_) + " " + describeTag(tag_) + " timed out after " +
                    std::to_string(timeout.count()) +
                    " ms. HINT: the peer never sent it; is it stuck, dead, or running a "
                    "different collective?");
  }

  bool test() override {
    std::lock_guard<std::mutex> lock(world_->mu);
    return pending_->done;
  }

 private:
  // Removes the receive from the mailbox so that a late message cannot land in its buffer.
  void forget() {
    auto& queue = world_->boxes[rank_].posted[{peer_, tag_}];
    queue.erase(std::remove(queue.begin(), queue.end(), pending_), queue.end());
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<PendingRecv> pending_;
  int rank_, peer_;
  Tag tag_;
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
    caps.in_process = true;
    return caps;
  }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    check(peer, buf, "send to");
    std::shared_ptr<PendingRecv> target = claimPostedRecv(peer, tag);
    if (target) {
      deliver(*target, buf, tag);
      return std::make_unique<DoneRequest>();
    }
    // No receive yet: copy the message (outside the lock), then queue it unless a receive
    // was posted meanwhile.
    std::vector<char> copy(static_cast<const char*>(buf.data),
                           static_cast<const char*>(buf.data) + buf.bytes());
    target = claimPostedRecv(peer, tag, &copy);
    if (target) deliver(*target, buf, tag);
    return std::make_unique<DoneRequest>();
  }

  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    check(peer, buf, "receive from");
    std::vector<char> message;
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      throwIfAborted();
      auto& box = world_->boxes[rank_];
      auto it = box.unexpected.find({peer, tag});
      if (it == box.unexpected.end() || it->second.empty()) {
        auto pending = std::make_shared<PendingRecv>();
        pending->buffer = buf;
        box.posted[{peer, tag}].push_back(pending);
        return std::make_unique<RecvRequest>(world_, pending, rank_, peer, tag);
      }
      message = std::move(it->second.front());
      it->second.pop_front();
    }
    if (message.size() != buf.bytes())
      throw CommError(sizeMismatch(peer, tag, message.size(), buf));
    if (!message.empty()) std::memcpy(buf.data, message.data(), message.size());
    return std::make_unique<DoneRequest>();
  }

  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    if (me == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end())) {
      throw CommError("loopback: rank " + std::to_string(rank_) +
                      " called split with a list that does not hold it or is not ascending");
    }
    std::string key = key_ + "/split" + std::to_string(splits_++) + ":";
    for (int r : ranks) key += std::to_string(r) + ",";
    return std::make_unique<LoopbackBackend>(key, static_cast<int>(me - ranks.begin()),
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
  void check(int peer, const Buffer& buf, const char* verb) {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw CommError("loopback: rank " + std::to_string(rank_) + " cannot " + verb + " rank " +
                      std::to_string(peer) + " in a group of " + std::to_string(size_));
    }
    if (buf.memory != MemoryKind::kHost) {
      throw CommError(
          "loopback: only host memory is supported. HINT: use the nccl backend for "
          "CUDA tensors");
    }
  }

  void throwIfAborted() {
    const auto& box = world_->boxes[rank_];
    if (box.aborted) {
      throw CommError("loopback: rank " + std::to_string(rank_) +
                      " was aborted: " + box.abort_reason);
    }
  }

  std::string sizeMismatch(int peer, Tag tag, size_t found, const Buffer& buf) const {
    return "loopback: rank " + std::to_string(rank_) + ": message from rank " +
           std::to_string(peer) + " " + describeTag(tag) + " has " + std::to_string(found) +
           " bytes, the receive expects " + std::to_string(buf.bytes());
  }

  // Takes the oldest receive that `peer` posted for (rank_, tag). When none is posted and
  // `queue_instead` is given, queues that message as unexpected instead.
  std::shared_ptr<PendingRecv> claimPostedRecv(int peer, Tag tag,
                                               std::vector<char>* queue_instead = nullptr) {
    std::lock_guard<std::mutex> lock(world_->mu);
    throwIfAborted();
    auto& box = world_->boxes[peer];
    if (box.aborted) return nullptr;  // the peer is gone: drop the message
    auto it = box.posted.find({rank_, tag});
    if (it != box.posted.end() && !it->second.empty()) {
      auto pending = it->second.front();
      it->second.pop_front();
      pending->claimed = true;
      return pending;
    }
    if (queue_instead != nullptr) box.unexpected[{rank_, tag}].push_back(std::move(*queue_instead));
    return nullptr;
  }

  // Copies the message straight into a claimed receive buffer and completes it.
  void deliver(PendingRecv& target, const Buffer& buf, Tag tag) {
    std::string error;
    if (target.buffer.bytes() != buf.bytes()) {
      error = "loopback: rank " + std::to_string(rank_) + " sent " + std::to_string(buf.bytes()) +
              " bytes " + describeTag(tag) + ", the receive expects " +
              std::to_string(target.buffer.bytes());
    } else if (buf.bytes() > 0) {
      std::memcpy(target.buffer.data, buf.data, buf.bytes());
    }
    std::lock_guard<std::mutex> lock(world_->mu);
    target.error = error;
    target.done = true;
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

COLLIE_BACKEND_PLUGIN("loopback", "1.0.0",
                      "ranks as threads of one process, exchanging messages in memory (tests)",
                      collie::loopback::LoopbackBackend);
