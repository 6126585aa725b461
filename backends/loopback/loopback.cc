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
//
// Completion (params.completion): each request on its own by default; with `batch`, as nccl
// completes point-to-point operations, so that collie's use of a backend can be checked on
// a CPU against nccl's rules. Sends and receives are only queued; the first wait() or
// test() of any queued request posts every queued operation of the rank's group (a batch,
// in the order they were queued), and a wait returns only once the whole batch completed.
// Messages between two ranks match in the order they were posted, whatever their tags.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

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

// One rank of a group: what posting a message needs, shared by the backend and by the
// batches whose requests may outlive it.
class Endpoint {
 public:
  Endpoint(const std::string& key, int rank, int size, MemoryKind moves, bool ignore_tags)
      : rank_(rank), size_(size), moves_(moves), ignore_tags_(ignore_tags) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw CommError("loopback: rank " + std::to_string(rank) + " is outside a group of " +
                      std::to_string(size));
    }
    world_ = joinWorld(key, size);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MemoryKind moves() const { return moves_; }

  // The checks every post makes, and a post after abort() refused.
  void check(int peer, const Buffer& buf, bool sending, Tag tag) const {
    checkTransfer("loopback", rank_, size_, peer, buf, sending, moves_);
    std::lock_guard<std::mutex> lock(world_->mu);
    throwIfAborted({rank_, peer, sending, tag});
  }

  // Matches a send or receive with the other side if it is waiting (and copies), or queues
  // it. A send waits in the peer's mailbox under (this rank, tag), a receive in ours under
  // (peer, tag), so both sides look in the same place (tag 0 for all when tags are ignored).
  std::unique_ptr<Request> post(int peer, const Buffer& buf, Tag tag, bool sending) {
    checkTransfer("loopback", rank_, size_, peer, buf, sending, moves_);
    const Transfer t{rank_, peer, sending, tag};
    auto& box = world_->boxes[sending ? peer : rank_];
    const World::Key key{sending ? rank_ : peer, ignore_tags_ ? Tag{0} : tag};
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

  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(world_->mu);
    auto& box = world_->boxes[rank_];
    if (!box.aborted.set(reason)) return;  // the first reason stays
    // Waiters of every rank check this rank's flag (their peer may be this rank).
    for (auto& b : world_->boxes) b.cv.notify_all();
  }

 private:
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

  const int rank_, size_;
  const MemoryKind moves_;
  const bool ignore_tags_;
  std::shared_ptr<World> world_;
};

// A post that failed when its batch was posted: its wait reports why.
class FailedRequest : public Request {
 public:
  explicit FailedRequest(std::string error) : error_(std::move(error)) {}
  void wait(std::chrono::milliseconds) override { throw CommError(error_); }
  bool test() override { return false; }

 private:
  std::string error_;
};

// completion: batch. The operations a rank queued since its last batch was posted; the first
// wait() or test() of any of them posts them all, and each of their waits returns only when
// every one completed (nccl's group).
class Batch {
 public:
  explicit Batch(std::shared_ptr<Endpoint> at) : at_(std::move(at)) {}

  // Queues an operation and returns its place in the batch; nothing once the batch was
  // posted (a wait on another thread may post it between the caller's look and this).
  std::optional<size_t> add(int peer, const Buffer& buf, Tag tag, bool sending) {
    std::lock_guard<std::mutex> lock(mu_);
    if (posted_) return std::nullopt;
    ops_.push_back({peer, buf, tag, sending, false, nullptr});
    return ops_.size() - 1;
  }

  // Blocks until every operation of the batch completed, at most `timeout`; throws the
  // first failure, told from operation `index`'s side.
  void wait(size_t index, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool first = true;
    for (const auto& [request, place] : postAll()) {
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      const bool later = !first;
      first = false;
      try {
        request->wait(left);
      } catch (const CommError& e) {
        // A later part waits for what is left of the batch's time, perhaps nothing: say how
        // long the batch's wait was in all.
        const std::string context =
            later ? "in a batch's wait of " + std::to_string(timeout.count()) + " ms, " +
                        std::to_string(left.count()) + " ms left for this part: "
                  : "";
        if (place == index) throw CommError(context + e.what());
        throw CommError(context + e.what() + " (" + describe(index) +
                        " completes with its batch, and this part of it failed)");
      }
    }
  }

  // True once every operation of the batch completed; never throws.
  bool test() {
    for (const auto& posted : postAll()) {
      if (!posted.first->test()) return false;
    }
    return true;
  }

  // A request given up: withdrawn if its batch was posted. If it was not, it is never
  // posted, and the group is aborted: messages between two ranks match in posting order, so
  // its partner's message would pair with this rank's next one (nccl's backend does the same).
  // The abort comes under the lock, so that no wait on another thread posts the batch
  // without the operation first.
  void drop(size_t index) {
    std::shared_ptr<Request> gone;  // released after the lock
    std::lock_guard<std::mutex> lock(mu_);
    ops_[index].dropped = true;
    gone = std::move(ops_[index].request);
    if (!posted_) {
      at_->abort(describe(index) +
                 " was given up before its batch was posted (its collective stopped: this "
                 "rank's own error says why); its partner's message would pair with this "
                 "rank's next one");
    }
  }

 private:
  struct Op {
    int peer;
    Buffer buf;
    Tag tag;
    bool sending;
    bool dropped;
    std::shared_ptr<Request> request;  // once posted
  };

  std::string describe(size_t index) const {
    const Op& op = ops_[index];
    return "loopback: " + Transfer{at_->rank(), op.peer, op.sending, op.tag}.describe();
  }

  // Posts the batch unless it was; returns its live requests with their places.
  std::vector<std::pair<std::shared_ptr<Request>, size_t>> postAll() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!posted_) {
      posted_ = true;
      for (Op& op : ops_) {
        if (op.dropped) continue;
        try {
          op.request = at_->post(op.peer, op.buf, op.tag, op.sending);
        } catch (const std::exception& e) {
          op.request = std::make_shared<FailedRequest>(e.what());
        }
      }
    }
    std::vector<std::pair<std::shared_ptr<Request>, size_t>> live;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].request) live.emplace_back(ops_[i].request, i);
    }
    return live;
  }

  const std::shared_ptr<Endpoint> at_;
  mutable std::mutex mu_;
  std::vector<Op> ops_;
  bool posted_ = false;
};

class BatchRequest : public Request {
 public:
  BatchRequest(std::shared_ptr<Batch> batch, size_t index)
      : batch_(std::move(batch)), index_(index) {}
  ~BatchRequest() override {
    try {
      if (!waited_) batch_->drop(index_);
    } catch (...) {  // the message's allocation: the operation stays dropped
    }
  }
  void wait(std::chrono::milliseconds timeout) override {
    batch_->wait(index_, timeout);
    waited_ = true;
  }
  bool test() override { return batch_->test(); }

 private:
  const std::shared_ptr<Batch> batch_;
  const size_t index_;
  bool waited_ = false;
};

class LoopbackBackend : public Backend {
 public:
  explicit LoopbackBackend(const PluginContext& context)
      : LoopbackBackend(context.backend.job_id, context.backend.rank, context.backend.size,
                        context.params->getDuration("timeout", context.backend.timeout),
                        memoryOf(*context.params), batchedOf(*context.params)) {}

  LoopbackBackend(const std::string& key, int rank, int size, std::chrono::milliseconds timeout,
                  MemoryKind moves, bool batched)
      : key_(key),
        timeout_(timeout),
        batched_(batched),
        at_(std::make_shared<Endpoint>(key, rank, size, moves, batched)) {}

  int rank() const override { return at_->rank(); }
  int size() const override { return at_->size(); }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_memory = at_->moves() == MemoryKind::kHost;
    caps.cuda_memory = at_->moves() == MemoryKind::kCuda;
    caps.batch_completion = batched_;
    caps.concurrent_groups = !batched_;  // nccl's model: one group at a time, as nccl says
    return caps;
  }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    return batched_ ? queue(peer, buf, tag, true) : at_->post(peer, buf, tag, true);
  }

  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    return batched_ ? queue(peer, buf, tag, false) : at_->post(peer, buf, tag, false);
  }

  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    const int me = splitPosition(ranks, rank(), "loopback");
    return std::make_unique<LoopbackBackend>(key_ + "/" + splitName(splits_++, ranks), me,
                                             static_cast<int>(ranks.size()), timeout_, at_->moves(),
                                             batched_);
  }

  void abort(const std::string& reason) override { at_->abort(reason); }

 private:
  // completion: batch. Adds the operation to the open batch (a new one once the last was
  // posted), checked and refused after abort() as a post would be.
  std::unique_ptr<Request> queue(int peer, const Buffer& buf, Tag tag, bool sending) {
    at_->check(peer, buf, sending, tag);
    std::lock_guard<std::mutex> lock(batch_mu_);
    std::optional<size_t> index;
    if (batch_) index = batch_->add(peer, buf, tag, sending);
    if (!index) {
      batch_ = std::make_shared<Batch>(at_);
      index = batch_->add(peer, buf, tag, sending);
    }
    try {
      return std::make_unique<BatchRequest>(batch_, *index);
    } catch (...) {
      batch_->drop(*index);  // an operation nobody owns is never posted
      throw;
    }
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

  // params.completion: "each" (the default) or "batch".
  static bool batchedOf(const Params& params) {
    const std::string completion = params.getString("completion", "each");
    if (completion == "each") return false;
    if (completion == "batch") return true;
    throw ConfigError("loopback: params.completion '" + completion +
                      "' is not a way it completes requests; expected each or batch. HINT: "
                      "batch completes them as nccl does, a whole batch at a wait");
  }

  std::string key_;
  std::chrono::milliseconds timeout_;
  bool batched_;
  std::shared_ptr<Endpoint> at_;
  std::mutex batch_mu_;
  std::shared_ptr<Batch> batch_;  // completion: batch: the batch queue() adds to, until posted
  int splits_ = 0;
};

}  // namespace
}  // namespace collie::loopback

COLLIE_IN_PROCESS_BACKEND_PLUGIN(
    "loopback", "1.2.0", "ranks as threads of one process, exchanging messages in memory (tests)",
    collie::loopback::LoopbackBackend);
