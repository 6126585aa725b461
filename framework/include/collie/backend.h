// The transport contract: tagged non-blocking point-to-point between ranks,
// optional native collectives, sub-groups and abort. Every blocking call has a timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collie/buffer.h"
#include "collie/collective.h"
#include "collie/params.h"
#include "collie/request_pool.h"

namespace collie {

// Messages between the same two ranks match on their tag, in the order they were posted.
using Tag = uint64_t;

// Builds a tag that cannot collide across collectives: the collective's sequence number,
// a phase (reduce-scatter, all-gather, ...) and a step inside the phase.
constexpr Tag makeTag(uint64_t seq, uint32_t phase, uint32_t step) {
  return (seq << 24) | (static_cast<uint64_t>(phase & 0xFu) << 20) | (step & 0xFFFFFu);
}

// "tag 17825792 (seq 1, phase 1, step 0)": a tag as error messages show it.
std::string describeTag(Tag tag);

// A pending send or receive.
//
// Lifetime. A request owns what its transfer needs (the backend's shared state, staging
// memory, the transport's handle) until the transfer completed or the transport confirmed
// its cancellation. So it may outlive the group that made it: wait() then completes or
// throws CommError, and never touches freed memory. Dropping a request that has not
// completed cancels it; the caller's buffer may be reused once the destructor returns.
// Over a backend with batch completion (Capabilities) a request dropped before its batch
// went out is never issued and aborts the group (its partner's message would pair with
// the next one), and one dropped after is not cancelled: nccl writes its buffer until the
// group completes, so the caller waits (or aborts) before reusing it.
class Request {
 public:
  virtual ~Request() = default;
  // Blocks until the transfer completed. Throws CommError naming the peer and the tag when
  // `timeout` passes first, when the backend was aborted, or when the sizes disagree.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // True once the transfer completed (never throws; wait() reports the error).
  virtual bool test() = 0;
};

// A request that completed when it was posted (a message the transport finished at once).
// Backends that make a request per message derive theirs from PooledAllocation too
// (collie/request_pool.h), so that a message costs no heap allocation.
class CompletedRequest : public Request, public PooledAllocation<CompletedRequest> {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool test() override { return true; }
};

// What a backend can do besides point-to-point.
//
// Memory kinds (ABI 8.0). A backend moves the kinds it declares here and refuses every other
// in checkTransfer. The framework keeps the other side of the rule: every buffer it hands a
// backend is of a kind the backend declares, its own messages included (the control plane's
// barriers, gathers and folds, the calibration's probes, the bench's buffers, clock offsets,
// the trace gather, the consistency check, the weight check, plugin-check's transfers). On
// a backend without host memory those messages are staged through a small device buffer
// (runtime/control.h) and measurement buffers are device memory (collie/device_memory.h);
// on a backend without device memory a device tensor passes through host memory (host
// staging). A backend that moves device memory touches it through its own device runtime
// or through copyInto and reduceInto (the device memory table), never as host memory: a
// device pointer may not be readable by the host (a GPU's), or may be checked (the
// emulated device's).
struct Capabilities {
  bool host_memory = true;
  bool cuda_memory = false;
  bool native_allreduce = false;
  bool native_reduce_scatter = false;
  bool native_allgather = false;
  bool native_broadcast = false;
  bool native_barrier = false;
  // Batch completion (ABI 15.0), nccl's model of point-to-point: the sends and receives a
  // group posted since its last wait go out together at the next wait() or test() of any of
  // them (nothing of them matches before), that wait returns only once all of them completed,
  // and messages between two ranks match in posting order whatever their tags. Over such a
  // backend a scheduler never waits while it holds a request whose match its peer posts only
  // after a wait of its own that depends on this rank (see irecv), and a request dropped
  // before its batch went out aborts the group (its partner's message would pair with the
  // next one). The loopback backend has the model too (params.completion: batch), so that a
  // scheduler and the framework's own messages are checked against it on a CPU.
  bool batch_completion = false;
  // Whether the group and its sub-groups may be used from several threads at once, one
  // thread per group (ABI 15.0; collie::concurrentGroups). Not over nccl: NCCL's kernels of
  // two communicators on one GPU can wait for each other, and its documentation asks for one
  // at a time; schedulers then keep to the calling thread (hierarchical runs its levels one
  // after the other).
  bool concurrent_groups = true;
  // The dtypes its native collectives handle: bit (1 << DType); every dtype by default.
  uint32_t native_dtypes = 0x3F;
  bool nativeHandles(DType dtype) const {
    return (native_dtypes >> static_cast<unsigned>(dtype)) & 1u;
  }
};

// The order of device work (ABI 6.0). Device memory is written and read by the caller's
// stream (LibTorch's current stream of the calling thread). A backend that moves device
// memory on a stream of its own (nccl) makes that stream wait for what the caller queued
// before each call, and makes the caller's stream wait for its own work before the result
// is used, through these hooks. The framework installs hooks that speak for LibTorch's
// current stream; with none installed, a backend orders against the device's legacy default
// stream, which is LibTorch's current stream where nothing set another.
struct DeviceStreamHooks {
  // Records an event on the calling thread's current stream of CUDA device `device` and
  // returns it (a cudaEvent_t that the hooks own; valid until this thread's next call).
  void* (*producer_event)(int device) = nullptr;
  // Makes the calling thread's current stream of `device` wait for `event` (a cudaEvent_t
  // recorded behind the backend's work; the backend may destroy it after this returns).
  void (*consumer_wait)(int device, void* event) = nullptr;
};
// Process-wide; installed once before any backend moves device memory. Never throws.
void setDeviceStreamHooks(DeviceStreamHooks hooks);
DeviceStreamHooks deviceStreamHooks();

class Simulation;
class Store;

// Everything a backend needs to join its group.
struct BackendContext {
  int rank = 0;
  int size = 1;
  std::string job_id;  // ranks of one job share it; in-process backends meet through it
  std::chrono::milliseconds timeout{30000};  // for joining the group
  // The job's rendezvous store (collie/store.h) for exchanging addresses; it outlives the
  // backend. Null for in-process backends.
  Store* store = nullptr;
  // Every rank runs on this host (ABI 3.1): a backend listens on the loopback only, unless
  // its params name an interface, so that nothing of the job is reachable from elsewhere.
  bool one_host = false;
  // This rank's position among the ranks of its host, as the launcher that started it
  // numbered them (collie's, torchrun, mpirun, srun; the rank itself for ranks as threads).
  // A backend with a device per rank uses device local_rank % devices, the one the trainer
  // puts the rank's tensors on (ABI 8.0).
  int local_rank = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Capabilities capabilities() const = 0;
  // The default timeout for this group (params.timeout).
  virtual std::chrono::milliseconds timeout() const = 0;

  // Starts sending `buf` to `peer`. The buffer must stay untouched until the request
  // completes. Throws CommError for a bad peer, an unsupported memory kind or after abort().
  virtual std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) = 0;
  // Starts receiving exactly buf.bytes() bytes from `peer` with `tag` into `buf`.
  // Any number of sends and receives may be outstanding at once, to and from one peer, each
  // with its own tag (a ring posts a block's chunks at once, and the calibration streams 16
  // messages each way to time the gap of a stream). None waits for another to complete,
  // except on a backend with Capabilities::batch_completion (nccl), where a wait completes
  // with every request posted before it. A scheduler that must run there never waits while
  // it holds a request whose match its peer posts only after a wait of its own that depends
  // on this rank: a receive posted for the next step (the neighbour sends it only after its
  // own wait, all round a ring), or the segments of two trees taken in turn. What every
  // collie scheduler does about it: docs/writing-a-scheduler.md, "Batch completion".
  virtual std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) = 0;

  // A new group of `ranks` (ranks of this group, ascending, including this rank); every
  // member must call split with the same list, in the same order relative to other splits.
  virtual std::unique_ptr<Backend> split(const std::vector<int>& ranks) = 0;

  // Runs `args` with the backend's own implementation. Returns a refusal (the framework then
  // uses a scheduler) when capabilities() does not list it; throws CommError on failure.
  virtual Decision runNative(const CollectiveArgs& args) {
    (void)args;
    return Decision::no("backend has no native collectives");
  }

  // Abort, one state machine for every backend: live -> aborted, once (AbortFlag below
  // holds it). abort() may come from any thread (on a simulator, any rank's actor), returns
  // without waiting for a peer, and keeps the first reason: a second call does nothing.
  // Afterwards every pending wait() of this group ends at once, not at its timeout, and every
  // post fails; both throw CommError with "aborted: <first reason>". Abort is this group's:
  // a peer learns of it through its own requests' failures or timeouts (in-process backends
  // end the requests of peers that wait for this rank too). plugin-check tests the abort rules
  // and a receive that outlives its group (check/conformance.h).
  virtual void abort(const std::string& reason) = 0;

  // The simulator's side of a backend (collie/simulation.h): its clock, its platform's
  // nodes, its payload mode. Null for every backend that moves real bytes in real time.
  virtual const Simulation* simulation() const { return nullptr; }

  // Blocking helpers built on the two primitives above, with the group's timeout.
  void send(int peer, const Buffer& buf, Tag tag) { isend(peer, buf, tag)->wait(timeout()); }
  void recv(int peer, const Buffer& buf, Tag tag) { irecv(peer, buf, tag)->wait(timeout()); }
};

// For isend/irecv implementations: the checks every backend makes before it posts a
// transfer, with the messages users see. Throws CommError "<backend>: rank R cannot send to
// rank P in a group of N" for a peer that is not another rank of the group, and "<backend>:
// only host memory is supported. HINT: ..." for a buffer of a memory kind other than `moves`.
void checkTransfer(const std::string& backend, int rank, int size, int peer, const Buffer& buf,
                   bool sending, MemoryKind moves);
// "rank R: send to rank P tag T (seq s, phase p, step k)": one transfer, for messages.
// `peer_name` replaces "rank P" where a backend knows more ("rank 1 (world rank 3)").
std::string describeTransfer(int rank, int peer, bool sending, Tag tag,
                             const std::string& peer_name = "");

// One transfer's numbers, kept by a request so that it can say what it was when it fails:
// describe() makes the words only then (formatting them for every message cost more than
// a shared-memory exchange, benchmarks/overhead.cc).
struct TransferInfo {
  int rank = 0;  // this rank, in its group
  int peer = 0;
  bool sending = false;
  Tag tag = 0;
  std::string describe(const std::string& peer_name = "") const {
    return describeTransfer(rank, peer, sending, tag, peer_name);
  }
};

// For backends that take a network interface by name (params.interface): throws ConfigError
// "<owner>: params.interface 'eth9' does not exist on host H; it has: lo, eth0" when this
// host has no such interface.
void requireInterface(const std::string& owner, const std::string& name);

// The aborted state of a group: abort() sets it with its reason (the first reason stays);
// posts and waits check it. Thread-safe, and never blocks for long.
class AbortFlag {
 public:
  // Returns true for the call that set it, false when it was set already.
  bool set(const std::string& reason);
  bool isSet() const { return set_.load(std::memory_order_acquire); }
  std::string reason() const;
  // Throws CommError("<what>: aborted: <reason>") when set.
  void throwIfSet(const std::string& what) const;

 private:
  std::atomic<bool> set_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// For Backend::split implementations: this rank's position in `ranks`, or a CommError
// ("<who>: rank R called split with a list that does not hold it or is not ascending").
int splitPosition(const std::vector<int>& ranks, int rank, const std::string& who);
// A name for the `ordinal`-th split of a group into `ranks` ("split0[0,2]"): the same on
// every member, different for every other split of the group.
std::string splitName(int ordinal, const std::vector<int>& ranks);

// Waits for every request in order, then clears the list. The first failure is thrown.
// `Requests`: a std::vector of std::unique_ptr<Request>, or any container like it (the
// schedulers keep theirs in small vectors on the stack).
template <typename Requests>
void waitAll(Requests& requests, std::chrono::milliseconds timeout) {
  for (auto& request : requests) request->wait(timeout);
  requests.clear();
}

}  // namespace collie
