// The nccl backend: NCCL between processes, one GPU per rank, device memory only.
//
// Point-to-point: NCCL has no tags and a lone ncclSend blocks its stream until the matching
// ncclRecv runs, so isend/irecv only queue the operation in a Batch; the first wait() or
// test() of any of its requests (or the next native collective) issues the whole batch in one
// ncclGroupStart/ncclGroupEnd and records an event behind it. Messages between two ranks
// therefore match in the order they were posted (every collie scheduler posts in the same
// order on both sides); tags are not checked.
//
// Stream order: the communicator's stream waits for an event on the caller's stream
// (collie::deviceStreamHooks: LibTorch's current stream) before every batch and every native
// collective, and the caller's stream waits for the event behind them before anything after
// the call runs there; wait() still blocks the host until that event.
//
// Natively: all-reduce, reduce-scatter, all-gather and broadcast. The communicator is
// non-blocking: every NCCL call that may answer ncclInProgress (init, a collective, a group
// end, finalize) is polled with ncclCommGetAsyncError until it finished, and every wait polls
// the stream event the same way, all against a timeout that aborts the communicator
// (ncclCommAbort) when it passes, so a dead or stopped peer never hangs a rank. Comm holds
// the rules that make abort() safe from another thread.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collie/device_memory.h"
#include "collie/log.h"
#include "collie/plugin.h"
#include "collie/store.h"

namespace collie::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void checkCuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw CommError("nccl backend: " + what + ": CUDA error: " + cudaGetErrorString(status));
  }
}

std::string ncclText(ncclResult_t result) { return ncclGetErrorString(result); }

std::string envOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

ncclDataType_t ncclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProd:
      return ncclProd;
  }
  return ncclSum;
}

// Queues the native collective `args` on `stream` (all-reduce and broadcast in place).
ncclResult_t launchNative(const CollectiveArgs& args, ncclComm_t comm, cudaStream_t stream) {
  const ncclDataType_t type = ncclType(args.data.dtype);
  switch (args.coll) {
    case Collective::kAllReduce:
      return ncclAllReduce(args.data.data, args.data.data, args.data.count, type, ncclOp(args.op),
                           comm, stream);
    case Collective::kReduceScatter:
      return ncclReduceScatter(args.data.data, args.output.data, args.output.count, type,
                               ncclOp(args.op), comm, stream);
    case Collective::kAllGather:
      return ncclAllGather(args.data.data, args.output.data, args.data.count, type, comm, stream);
    case Collective::kBroadcast:
      return ncclBroadcast(args.data.data, args.data.data, args.data.count, type, args.root, comm,
                           stream);
    case Collective::kBarrier:
      break;
  }
  return ncclInvalidUsage;
}

// The CUDA device of a rank: local_rank % devices, the one the trainer puts its tensors on.
// Throws PluginError when no device is visible.
int chooseDevice(int local_rank) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw PluginError(std::string("backend nccl: no CUDA device is visible (") +
                      (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) +
                      "). HINT: nccl needs one GPU per rank; use gloo or ucx on CPUs");
  }
  if (local_rank < 0) {
    throw PluginError("backend nccl: local rank " + std::to_string(local_rank) +
                      " is negative (internal: the launcher numbers the ranks of a host from 0)");
  }
  return local_rank % count;
}

// NCCL moves a GPU's memory; the emulated device's (COLLIE_EMULATED_DEVICE=1) is host memory
// that NCCL cannot read. Throws ConfigError when it is installed.
void refuseTheEmulatedDevice() {
  if (deviceMemoryOps().owns == nullptr) return;
  throw ConfigError(
      "backend nccl moves a GPU's memory, but COLLIE_EMULATED_DEVICE=1 made this process's "
      "device memory the emulated device's (host memory). HINT: unset COLLIE_EMULATED_DEVICE; "
      "to check device-only paths without a GPU, use loopback with params memory: device");
}

// Points NCCL's bootstrap and socket transport at an interface through NCCL_SOCKET_IFNAME,
// which NCCL reads once per process, when it creates its first unique id or communicator:
// `interface` (validated, matched exactly) when given; else, when every rank is on this
// host, the loopback, unless the user set NCCL_SOCKET_IFNAME (then theirs wins); else
// whatever NCCL picks. Never throws.
void chooseInterface(const std::string& interface, bool one_host) {
  const char* user = std::getenv("NCCL_SOCKET_IFNAME");
  if (!interface.empty()) {
    const std::string exact = "=" + interface;  // NCCL's syntax for "this name, not a prefix"
    if (user != nullptr && exact != user && interface != user) {
      logWarn("backend nccl: params.interface '" + interface + "' replaces NCCL_SOCKET_IFNAME '" +
              user + "'");
    }
    ::setenv("NCCL_SOCKET_IFNAME", exact.c_str(), /*overwrite=*/1);
  } else if (one_host && user == nullptr) {
    ::setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  }
  logDebug("backend nccl: NCCL_SOCKET_IFNAME=" + envOr("NCCL_SOCKET_IFNAME", "(NCCL's choice)"));
}

// Keeps this plugin loaded until the process exits. A request (and NCCL's threads) may outlive
// the backend object that made it, and the loader unloads a plugin with its last backend;
// the code they run lives here. Never throws: if it fails, the plugin stays as loaded as it was.
void pinThisPlugin() {
  static const char anchor = 0;
  Dl_info self;
  if (dladdr(&anchor, &self) != 0 && self.dli_fname != nullptr) {
    dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);  // the handle is kept
  }
}

// A time limit, and how long it was (for messages).
struct Deadline {
  explicit Deadline(milliseconds length) : limit(length), at(Clock::now() + length) {}
  bool passed() const { return Clock::now() >= at; }
  milliseconds limit;
  Clock::time_point at;
};

// A CUDA event without timing; destroyed with its owner.
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  // Records it behind the work queued on `stream` (created on the current device first).
  void record(cudaStream_t stream) {
    if (event_ == nullptr) {
      checkCuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating an event");
    }
    checkCuda(cudaEventRecord(event_, stream), "recording an event");
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One NCCL communicator and its stream. Shared by the group, its batches and their requests;
// the last of them to go tears it down (~Comm).
//
// State: live -> aborted, once. abort() (the group's, a timeout, an asynchronous error) sets
// the flag, then takes mu_ and calls ncclCommAbort. Every NCCL call on the communicator holds
// mu_ for that one call and does not start once the flag is set, so ncclCommAbort never runs
// beside another call and nothing reaches NCCL after it: callers get CommError
// "nccl: <what>: aborted: <reason>". Polling loops take mu_ once per poll.
class Comm {
 public:
  // Creates the stream on `device`. Throws CommError.
  Comm(int rank, int size, int device, milliseconds timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {
    checkCuda(cudaSetDevice(device_), "selecting device " + std::to_string(device_));
    checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  // Finalizes a live communicator (teardown()). Never throws.
  ~Comm() {
    teardown();
    cudaStreamDestroy(stream_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  milliseconds timeout() const { return timeout_; }
  cudaStream_t stream() const { return stream_; }

  // Creates the communicator of `id` (non-blocking) and polls until NCCL has made it. Throws
  // CommError when NCCL refuses or the timeout passes first (the communicator is aborted).
  void init(const ncclUniqueId& id) {
    const std::string what = "rank " + std::to_string(rank_) + ": communicator init on device " +
                             std::to_string(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    checkCall(what, locked(what, [&] {
                checkCuda(cudaSetDevice(device_), "selecting device " + std::to_string(device_));
                return ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
              }));
    waitReady(what, Deadline(timeout_),
              "HINT: did every rank start, and can they reach each other on NCCL_SOCKET_IFNAME '" +
                  envOr("NCCL_SOCKET_IFNAME", "(NCCL's choice)") +
                  "'? params.interface names the interface");
  }

  // Runs `call(comm, stream)` (one NCCL call, or one ncclGroupStart..ncclGroupEnd) under mu_,
  // then polls until NCCL has queued its work on the stream, until `deadline`. Throws
  // CommError when aborted, when NCCL refuses the call or when the deadline passes (both
  // abort the communicator).
  template <typename Call>
  void enqueue(const std::string& what, const Deadline& deadline, Call&& call) {
    checkCall(what, locked(what, [&] { return call(comm_, stream_); }));
    waitReady(what, deadline, "HINT: is a peer stopped, stuck or running a different collective?");
  }

  // Blocks until `event` (recorded behind the work of `what`) completed, until `deadline`.
  // Throws CommError when aborted, on NCCL's asynchronous error or when the deadline passes
  // (both abort the communicator).
  void waitEvent(cudaEvent_t event, const std::string& what, const Deadline& deadline) {
    while (true) {
      throwIfAborted(what);
      const cudaError_t done = cudaEventQuery(event);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) {
        throwIfAborted(what);  // an abort that just ended NCCL's kernels says so
        checkCuda(done, what);
      }
      const ncclResult_t state = asyncState(what);
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(what, ncclText(state),
             "nccl: " + what + " failed: " + ncclText(state) +
                 ". HINT: a peer process died or its GPU failed");
      }
      if (deadline.passed()) {
        fail(what, "timed out",
             "nccl: " + what + " timed out after " + std::to_string(deadline.limit.count()) +
                 " ms; the communicator was aborted. HINT: is a peer stopped, stuck or running "
                 "a different collective?");
      }
      std::this_thread::yield();
    }
  }

  // live -> aborted, with `reason` (the first reason stays). Waits for at most the one NCCL
  // call in flight, then ncclCommAbort. Returns true for the call that aborted. Never throws.
  bool abort(const std::string& reason) noexcept {
    if (!aborted_.set(reason)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    return true;
  }
  bool aborted() const { return aborted_.isSet(); }
  // Throws CommError "nccl: <what>: aborted: <reason>" once aborted.
  void throwIfAborted(const std::string& what) const { aborted_.throwIfSet("nccl: " + what); }

  // Makes this communicator's stream wait for the work the caller queued on its stream.
  // Called first in every batch and native call: it also makes `device` the calling thread's
  // current device (each thread has its own), where the events are created.
  void orderAfterCaller() {
    checkCuda(cudaSetDevice(device_), "selecting device " + std::to_string(device_));
    const DeviceStreamHooks hooks = deviceStreamHooks();
    cudaEvent_t produced = nullptr;
    if (hooks.producer_event != nullptr) {
      produced = static_cast<cudaEvent_t>(hooks.producer_event(device_));
    } else {  // nobody speaks for the caller: LibTorch's default, the legacy stream
      legacy_event_.record(cudaStreamLegacy);
      produced = legacy_event_.get();
    }
    if (produced != nullptr) {
      checkCuda(cudaStreamWaitEvent(stream_, produced, 0), "ordering after the caller's stream");
    }
  }

  // Makes the caller's stream wait for `done`, recorded behind this communicator's work.
  void orderCallerAfter(cudaEvent_t done) {
    const DeviceStreamHooks hooks = deviceStreamHooks();
    if (hooks.consumer_wait != nullptr) {
      hooks.consumer_wait(device_, done);
    } else {
      checkCuda(cudaStreamWaitEvent(cudaStreamLegacy, done, 0),
                "ordering the caller's stream after nccl");
    }
  }

 private:
  // Runs `call` (which uses comm_) under mu_, unless aborted. Throws CommError when aborted.
  template <typename Call>
  ncclResult_t locked(const std::string& what, Call&& call) {
    std::lock_guard<std::mutex> lock(mu_);
    throwIfAborted(what);
    return call();
  }

  // Aborts and throws CommError for a result other than success or in progress.
  void checkCall(const std::string& what, ncclResult_t result) {
    if (result != ncclSuccess && result != ncclInProgress) {
      fail(what, ncclText(result), "nccl: " + what + " failed: " + ncclText(result));
    }
  }

  // One poll of NCCL's state: ncclInProgress while a call is still running, then its result
  // or the first asynchronous error. Throws CommError when aborted.
  ncclResult_t asyncState(const std::string& what) {
    return locked(what, [&] {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
      return result == ncclSuccess ? state : result;
    });
  }

  // Polls asyncState() until it leaves ncclInProgress. Throws CommError (and aborts) on an
  // error or when `deadline` passes, with `hint` for the timeout.
  void waitReady(const std::string& what, const Deadline& deadline, const std::string& hint) {
    while (true) {
      const ncclResult_t state = asyncState(what);
      if (state == ncclSuccess) return;
      checkCall(what, state);
      if (deadline.passed()) {
        fail(what, "timed out",
             "nccl: " + what + " timed out after " + std::to_string(deadline.limit.count()) +
                 " ms; the communicator was aborted. " + hint);
      }
      std::this_thread::yield();
    }
  }

  // Aborts with `reason` and throws CommError(message); when another caller aborted first,
  // throws theirs ("aborted: <their reason>"), the cause.
  [[noreturn]] void fail(const std::string& what, const std::string& reason,
                         const std::string& message) {
    if (!abort(reason)) throwIfAborted(what);
    throw CommError(message);
  }

  // live -> closed: ncclCommFinalize (NCCL completes what was issued), polled until it leaves
  // ncclInProgress, at most the timeout; then ncclCommDestroy, or ncclCommAbort after an
  // error or the timeout. Nothing when aborted. Never throws.
  void teardown() noexcept {
    std::unique_lock<std::mutex> lock(mu_);
    if (comm_ == nullptr) return;
    ncclResult_t state = ncclCommFinalize(comm_);
    const Deadline deadline(timeout_);
    while (state == ncclInProgress && !deadline.passed()) {
      lock.unlock();
      std::this_thread::sleep_for(milliseconds(1));
      lock.lock();
      const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
      if (result != ncclSuccess) state = result;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      logWarn("backend nccl: rank " + std::to_string(rank_) + ": finalizing the communicator " +
              (state == ncclInProgress ? "timed out" : "failed: " + ncclText(state)) +
              "; aborted it instead");
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }

  const int rank_, size_, device_;
  const milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  Event legacy_event_;         // without hooks: recorded on the legacy stream
  std::mutex mu_;              // held by every NCCL call on comm_, for that one call
  ncclComm_t comm_ = nullptr;  // guarded by mu_; null before init and once aborted or closed
  AbortFlag aborted_;
};

struct Op {
  bool send;
  int peer;
  Buffer buf;
  Tag tag;               // not matched on (NCCL has none): for messages
  bool dropped = false;  // its request went before the batch was issued: never issued
};

// The sends and receives a group queued since its last batch was issued. The first wait() or
// test() of any of their requests (or the group's next native collective) issues them,
// once, in one ncclGroupStart..ncclGroupEnd, and records an event behind them.
class Batch {
 public:
  explicit Batch(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}

  // Queues `op` and returns its place in the batch; nothing once the batch was issued (a
  // wait on another thread may issue it between the caller's look and this).
  std::optional<size_t> add(const Op& op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (issued_) return std::nullopt;
    ops_.push_back(op);
    return ops_.size() - 1;
  }
  // A request dropped before its batch was issued takes its buffer back: the operation is
  // never issued, and the communicator is aborted, since its partner's message would pair
  // with this rank's next one (NCCL matches in posting order). Once issued, NCCL owns the
  // buffer until the group completes.
  // The abort comes under the lock, so that no wait on another thread issues the batch
  // without the operation first.
  void drop(size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (issued_) return;
    ops_[index].dropped = true;
    const Op& op = ops_[index];
    comm_->abort(describeTransfer(comm_->rank(), op.peer, op.send, op.tag) +
                 " was given up before its batch was issued (its collective stopped: this "
                 "rank's own error says why); its partner's message would pair with this "
                 "rank's next one");
  }
  bool issued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return issued_;
  }

  // Issues the operations unless that happened, waiting for NCCL until `deadline`. Throws
  // CommError (aborted, NCCL refused them, or the deadline passed).
  void issue(const Deadline& deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    if (issued_) return;
    const std::string what = "rank " + std::to_string(comm_->rank()) + ": " +
                             std::to_string(ops_.size()) + " point-to-point operations";
    comm_->throwIfAborted(what);
    comm_->orderAfterCaller();
    comm_->enqueue(what, deadline, [this](ncclComm_t comm, cudaStream_t stream) {
      ncclResult_t result = ncclGroupStart();
      for (const Op& op : ops_) {
        if (result != ncclSuccess) break;
        if (op.dropped) continue;
        result = op.send ? ncclSend(op.buf.data, op.buf.bytes(), ncclUint8, op.peer, comm, stream)
                         : ncclRecv(op.buf.data, op.buf.bytes(), ncclUint8, op.peer, comm, stream);
      }
      const ncclResult_t end = ncclGroupEnd();  // closes the group even after an error
      return result == ncclSuccess ? end : result;
    });
    issued_ = true;  // NCCL has the operations: never again, whatever follows throws
    done_.record(comm_->stream());
    comm_->orderCallerAfter(done_.get());
  }

  // Issues the operations if needed, then blocks until they completed, at most `timeout`.
  // Throws CommError naming `what`.
  void wait(const std::string& what, milliseconds timeout) {
    const Deadline deadline(timeout);
    issue(deadline);
    comm_->waitEvent(done_.get(), what, deadline);
  }

  // Issues the operations if needed; true once they completed. Never throws (wait() reports).
  bool test() noexcept {
    try {
      issue(Deadline(comm_->timeout()));
    } catch (...) {
      return false;
    }
    return !comm_->aborted() && cudaEventQuery(done_.get()) == cudaSuccess;
  }

 private:
  const std::shared_ptr<Comm> comm_;
  mutable std::mutex mu_;  // issue() runs once, for whichever caller gets there first
  std::vector<Op> ops_;
  Event done_;  // recorded behind the operations when they were issued
  bool issued_ = false;
};

// A queued send or receive. It owns its batch, and through it the communicator, so it stays
// safe when it outlives the backend that made it: wait() then completes or throws CommError.
class NcclRequest : public Request {
 public:
  NcclRequest(std::shared_ptr<Batch> batch, size_t index, std::string what)
      : batch_(std::move(batch)), index_(index), what_(std::move(what)) {}
  ~NcclRequest() override {
    try {
      batch_->drop(index_);
    } catch (...) {  // the message's allocation: the operation stays dropped
    }
  }
  void wait(milliseconds timeout) override { batch_->wait(what_, timeout); }
  bool test() override { return batch_->test(); }

 private:
  const std::shared_ptr<Batch> batch_;
  const size_t index_;      // in the batch
  const std::string what_;  // "rank R: send to rank P tag T (...)"
};

// Rank 0 creates the group's unique id and publishes it under `key`; the other ranks read it
// (the store waits for it). Throws CommError.
ncclUniqueId shareUniqueId(Store& store, const std::string& key, int rank) {
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw CommError("nccl: cannot create the unique id: " + ncclText(result) +
                      ". HINT: NCCL_SOCKET_IFNAME '" +
                      envOr("NCCL_SOCKET_IFNAME", "(NCCL's choice)") +
                      "' must name an interface with an address; params.interface sets it");
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    return id;
  }
  const std::vector<uint8_t> bytes = store.get(key);
  if (bytes.size() != sizeof(id)) {
    throw CommError("nccl: the unique id under '" + key + "' in the store has " +
                    std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(sizeof(id)) +
                    ". HINT: does another job share this store and prefix?");
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

class NcclBackend : public Backend {
 public:
  // Joins the job's group on device local_rank % devices. Throws ConfigError for bad params,
  // PluginError without a GPU or a store, CommError when the communicator cannot be made.
  explicit NcclBackend(const PluginContext& context) {
    const BackendContext& ctx = context.backend;
    const Params& params = *context.params;
    const milliseconds timeout = params.getDuration("timeout", milliseconds(30000));
    const std::string interface = params.getString("interface", "");
    if (!interface.empty()) requireInterface("backend nccl", interface);
    refuseTheEmulatedDevice();
    const int device = chooseDevice(ctx.local_rank);
    if (ctx.store == nullptr) {
      throw PluginError(
          "backend nccl needs the job's rendezvous store: it runs one process "
          "per rank (collie run starts them)");
    }
    chooseInterface(interface, ctx.one_host);
    pinThisPlugin();
    store_ = ctx.store;
    comm_ = connect(*store_, prefix_, ctx.rank, ctx.size, device, timeout);
  }

  // A sub-group made by split().
  NcclBackend(Store* store, std::shared_ptr<Comm> comm, std::string prefix)
      : store_(store), comm_(std::move(comm)), prefix_(std::move(prefix)) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  milliseconds timeout() const override { return comm_->timeout(); }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_memory = false;
    caps.cuda_memory = true;
    caps.batch_completion = true;    // one NCCL group per wait (Batch)
    caps.concurrent_groups = false;  // two communicators' kernels may wait for each other
    caps.native_allreduce = caps.native_reduce_scatter = caps.native_allgather =
        caps.native_broadcast = true;
    return caps;
  }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    return queue(true, peer, buf, tag);
  }
  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    return queue(false, peer, buf, tag);
  }

  // A new communicator for the members, its unique id in the store under a prefix of its own
  // (only the members take part, so this is not ncclCommSplit, which needs every rank).
  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    comm_->throwIfAborted("rank " + std::to_string(rank()) + ": split");
    const int me = splitPosition(ranks, rank(), "nccl");
    const std::string prefix = prefix_ + splitName(splits_++, ranks) + "/";
    auto comm = connect(*store_, prefix, me, static_cast<int>(ranks.size()), comm_->device(),
                        comm_->timeout());
    return std::make_unique<NcclBackend>(store_, std::move(comm), prefix);
  }

  Decision runNative(const CollectiveArgs& args) override {
    if (args.coll == Collective::kBarrier) return Decision::no("nccl has no barrier");
    if (args.data.memory != MemoryKind::kCuda) {
      return Decision::no("nccl reduces device memory only");
    }
    checkCollectiveShape("nccl", args, size());
    const std::string what = "rank " + std::to_string(rank()) + ": native " +
                             collectiveName(args.coll) + " seq " + std::to_string(args.seq);
    comm_->throwIfAborted(what);
    flush();
    const Deadline deadline(comm_->timeout());
    comm_->orderAfterCaller();
    comm_->enqueue(what, deadline, [&args](ncclComm_t comm, cudaStream_t stream) {
      return launchNative(args, comm, stream);
    });
    Event done;
    done.record(comm_->stream());
    comm_->orderCallerAfter(done.get());
    comm_->waitEvent(done.get(), what, deadline);
    return Decision::yes();
  }

  // Aborts the communicator (Comm::abort): every pending and later call fails with `reason`.
  void abort(const std::string& reason) override { comm_->abort(reason); }

 private:
  static std::shared_ptr<Comm> connect(Store& store, const std::string& prefix, int rank, int size,
                                       int device, milliseconds timeout) {
    auto comm = std::make_shared<Comm>(rank, size, device, timeout);
    comm->init(shareUniqueId(store, prefix + "id", rank));
    return comm;
  }

  std::unique_ptr<Request> queue(bool send, int peer, const Buffer& buf, Tag tag) {
    checkTransfer("nccl", rank(), size(), peer, buf, send, MemoryKind::kCuda);
    comm_->throwIfAborted("rank " + std::to_string(rank()));
    std::lock_guard<std::mutex> lock(batch_mu_);
    std::optional<size_t> index;
    if (batch_) index = batch_->add({send, peer, buf, tag});
    if (!index) {
      batch_ = std::make_shared<Batch>(comm_);
      index = batch_->add({send, peer, buf, tag});
    }
    try {
      return std::make_unique<NcclRequest>(batch_, *index,
                                           describeTransfer(rank(), peer, send, tag));
    } catch (...) {
      batch_->drop(*index);  // an operation nobody owns is never issued
      throw;
    }
  }

  // Issues the open batch before a native collective, which must come after it on the stream.
  void flush() {
    std::shared_ptr<Batch> open;
    {
      std::lock_guard<std::mutex> lock(batch_mu_);
      open = batch_;
    }
    if (open && !open->issued()) open->issue(Deadline(comm_->timeout()));
  }

  Store* store_ = nullptr;
  std::shared_ptr<Comm> comm_;
  std::string prefix_ = "nccl/";  // this group's store keys
  std::mutex batch_mu_;           // guards batch_ (posts may come from several threads)
  std::shared_ptr<Batch> batch_;  // the batch queue() adds to, until it is issued
  int splits_ = 0;
};

}  // namespace
}  // namespace collie::nccl

COLLIE_DEVICE_BACKEND_PLUGIN("nccl", "1.0.0",
                             "NCCL between processes, a GPU per rank; NCCL's collectives native",
                             collie::nccl::NcclBackend);
