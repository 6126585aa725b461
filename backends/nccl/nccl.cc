// The nccl backend: NCCL between processes, one GPU per rank, device memory only.
//
// Point-to-point: NCCL has no tags and a lone ncclSend blocks its stream until the matching
// ncclRecv runs, so isend/irecv only queue the operation; the first wait() or test() issues
// every queued operation of this group in one ncclGroupStart/ncclGroupEnd and records an
// event behind them. Messages between two ranks therefore match in the order they were
// posted (every collie scheduler posts in the same order on both sides); tags are not checked.
//
// Stream order: the communicator's stream waits for an event on the caller's stream
// (collie::deviceStreamHooks: LibTorch's current stream) before every group of operations
// and every native collective, and the caller's stream waits for the event behind them
// before anything after the call runs there; wait() still blocks the host until that event.
//
// Natively: all-reduce, reduce-scatter, all-gather and broadcast. The communicator is
// created non-blocking with the unique id from the job's store; every wait polls the stream
// event and ncclCommGetAsyncError against the timeout, and aborts the communicator
// (ncclCommAbort) when it passes, so a dead or stopped peer never hangs a rank.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "collie/plugin.h"
#include "collie/store.h"

namespace collie::nccl {
namespace {

using Clock = std::chrono::steady_clock;

void checkCuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw CommError("nccl backend: " + what + ": CUDA error: " + cudaGetErrorString(status));
  }
}

std::string ncclText(ncclResult_t result) { return ncclGetErrorString(result); }

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

// One communicator with its stream. Shared by the group and the requests it handed out.
struct Comm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{30000};
  AbortFlag aborted;

  ~Comm() {
    if (comm != nullptr) {
      if (aborted.isSet()) {
        // ncclCommAbort already released it
      } else {
        ncclCommFinalize(comm);
        ncclCommDestroy(comm);
      }
    }
    if (legacy_event != nullptr) cudaEventDestroy(legacy_event);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Waits for NCCL's non-blocking calls (init, group end) to leave ncclInProgress.
  void waitReady(const std::string& what) {
    auto deadline = Clock::now() + timeout;
    ncclResult_t state = ncclInProgress;
    while (true) {
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclInProgress) break;
      if (Clock::now() >= deadline) {
        abortComm("timed out");
        throw CommError("nccl: rank " + std::to_string(rank) + ": " + what + " timed out after " +
                        std::to_string(timeout.count()) + " ms; the communicator was aborted");
      }
      std::this_thread::yield();
    }
    if (state != ncclSuccess) {
      abortComm(ncclText(state));
      throw CommError("nccl: rank " + std::to_string(rank) + ": " + what +
                      " failed: " + ncclText(state));
    }
  }

  // Waits for `event` (recorded behind the operations of `what`) with the timeout.
  void waitEvent(cudaEvent_t event, const std::string& what, std::chrono::milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (true) {
      aborted.throwIfSet("nccl: " + what);
      cudaError_t done = cudaEventQuery(event);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) checkCuda(done, what);
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        abortComm(ncclText(state));
        throw CommError("nccl: " + what + " failed: " + ncclText(state) +
                        ". HINT: a peer process died or its GPU failed");
      }
      if (Clock::now() >= deadline) {
        abortComm("timed out");
        throw CommError("nccl: " + what + " timed out after " + std::to_string(limit.count()) +
                        " ms; the communicator was aborted. HINT: is a peer stopped, stuck or "
                        "running a different collective?");
      }
      std::this_thread::yield();
    }
  }

  void abortComm(const std::string& reason) {
    if (aborted.set(reason)) ncclCommAbort(comm);
  }

  // Makes this communicator's stream wait for the work the caller queued on its stream.
  // Called first in every flush and native call: it also makes `device` the calling thread's
  // current device (each thread has its own), where the events below are created.
  void orderAfterCaller() {
    checkCuda(cudaSetDevice(device), "selecting device " + std::to_string(device));
    const DeviceStreamHooks hooks = deviceStreamHooks();
    cudaEvent_t produced = nullptr;
    if (hooks.producer_event != nullptr) {
      produced = static_cast<cudaEvent_t>(hooks.producer_event(device));
    } else {  // nobody speaks for the caller: LibTorch's default, the legacy stream
      if (legacy_event == nullptr) {
        checkCuda(cudaEventCreateWithFlags(&legacy_event, cudaEventDisableTiming),
                  "creating an event");
      }
      checkCuda(cudaEventRecord(legacy_event, cudaStreamLegacy), "recording an event");
      produced = legacy_event;
    }
    if (produced != nullptr) {
      checkCuda(cudaStreamWaitEvent(stream, produced, 0), "ordering after the caller's stream");
    }
  }

  // Makes the caller's stream wait for `done`, recorded behind this communicator's work.
  void orderCallerAfter(cudaEvent_t done) {
    const DeviceStreamHooks hooks = deviceStreamHooks();
    if (hooks.consumer_wait != nullptr) {
      hooks.consumer_wait(device, done);
    } else {
      checkCuda(cudaStreamWaitEvent(cudaStreamLegacy, done, 0),
                "ordering the caller's stream after nccl");
    }
  }

  cudaEvent_t legacy_event = nullptr;  // without hooks: recorded on the legacy stream
};

struct Op {
  bool send;
  int peer;
  Buffer buf;
};

// The operations queued since the last flush, and the event behind the last flush.
struct Batch {
  std::vector<Op> ops;
  cudaEvent_t event = nullptr;
  bool flushed = false;
  ~Batch() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

class NcclBackend;

class NcclRequest : public Request {
 public:
  NcclRequest(NcclBackend* backend, std::shared_ptr<Comm> comm, std::shared_ptr<Batch> batch,
              std::string what)
      : backend_(backend),
        comm_(std::move(comm)),
        batch_(std::move(batch)),
        what_(std::move(what)) {}
  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

 private:
  NcclBackend* backend_;
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<Batch> batch_;
  std::string what_;
};

class NcclBackend : public Backend {
 public:
  explicit NcclBackend(const PluginContext& context) {
    const auto& ctx = context.backend;
    Params& params = *context.params;
    auto timeout = params.getDuration("timeout", std::chrono::milliseconds(30000));
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      throw PluginError(std::string("backend nccl: no CUDA device is visible (") +
                        (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) +
                        "). HINT: nccl needs one GPU per rank; use gloo or ucx on CPUs");
    }
    const char* local = std::getenv("LOCAL_RANK");
    int device = static_cast<int>(
        params.getInt("device", local ? std::atoi(local) % count : ctx.rank % count, 0, count - 1));
    if (ctx.store == nullptr) {
      throw PluginError(
          "backend nccl needs the job's rendezvous store: it runs one process "
          "per rank (collie run starts them)");
    }
    store_ = ctx.store;
    comm_ = connect(*store_, prefix_, ctx.rank, ctx.size, device, timeout);
  }

  NcclBackend(Store* store, std::shared_ptr<Comm> comm, std::string prefix)
      : store_(store), comm_(std::move(comm)), prefix_(std::move(prefix)) {}

  int rank() const override { return comm_->rank; }
  int size() const override { return comm_->size; }
  std::chrono::milliseconds timeout() const override { return comm_->timeout; }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_memory = false;
    caps.cuda_memory = true;
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

  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    const int me = splitPosition(ranks, rank(), "nccl");
    const std::string prefix = prefix_ + splitName(splits_++, ranks) + "/";
    auto comm =
        connect(*store_, prefix, me, static_cast<int>(ranks.size()), comm_->device, comm_->timeout);
    return std::make_unique<NcclBackend>(store_, comm, prefix);
  }

  Decision runNative(const CollectiveArgs& args) override {
    if (args.coll == Collective::kBarrier) return Decision::no("nccl has no barrier");
    if (args.data.memory != MemoryKind::kCuda) {
      return Decision::no("nccl reduces device memory only");
    }
    flush();
    comm_->orderAfterCaller();
    const auto type = ncclType(args.data.dtype);
    ncclResult_t result = ncclSuccess;
    ncclComm_t c = comm_->comm;
    switch (args.coll) {
      case Collective::kAllReduce:
        result = ncclAllReduce(args.data.data, args.data.data, args.data.count, type,
                               ncclOp(args.op), c, comm_->stream);
        break;
      case Collective::kReduceScatter:
        result = ncclReduceScatter(args.data.data, args.output.data, args.output.count, type,
                                   ncclOp(args.op), c, comm_->stream);
        break;
      case Collective::kAllGather:
        result = ncclAllGather(args.data.data, args.output.data, args.data.count, type, c,
                               comm_->stream);
        break;
      case Collective::kBroadcast:
        result = ncclBroadcast(args.data.data, args.data.data, args.data.count, type, args.root, c,
                               comm_->stream);
        break;
      case Collective::kBarrier:
        break;
    }
    std::string what = "rank " + std::to_string(rank()) + ": native " + collectiveName(args.coll) +
                       " seq " + std::to_string(args.seq);
    if (result != ncclSuccess && result != ncclInProgress) {
      throw CommError("nccl: " + what + " failed: " + ncclText(result));
    }
    comm_->waitReady(what);
    cudaEvent_t event = nullptr;
    checkCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creating an event");
    checkCuda(cudaEventRecord(event, comm_->stream), "recording an event");
    try {
      comm_->orderCallerAfter(event);
      comm_->waitEvent(event, what, comm_->timeout);
    } catch (...) {
      cudaEventDestroy(event);
      throw;
    }
    cudaEventDestroy(event);
    return Decision::yes();
  }

  void abort(const std::string& reason) override { comm_->abortComm(reason); }

  // Issues every queued operation in one group and records the event behind them.
  void flush() {
    if (!batch_ || batch_->ops.empty()) return;
    auto batch = std::move(batch_);
    batch_.reset();
    comm_->orderAfterCaller();
    ncclResult_t result = ncclGroupStart();
    for (const Op& op : batch->ops) {
      if (result != ncclSuccess) break;
      result = op.send ? ncclSend(op.buf.data, op.buf.bytes(), ncclUint8, op.peer, comm_->comm,
                                  comm_->stream)
                       : ncclRecv(op.buf.data, op.buf.bytes(), ncclUint8, op.peer, comm_->comm,
                                  comm_->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    if (result == ncclSuccess) result = end;
    const std::string what = "rank " + std::to_string(rank()) + ": " +
                             std::to_string(batch->ops.size()) + " point-to-point operations";
    if (result != ncclSuccess && result != ncclInProgress) {
      throw CommError("nccl: " + what + " failed: " + ncclText(result));
    }
    comm_->waitReady(what);
    checkCuda(cudaEventCreateWithFlags(&batch->event, cudaEventDisableTiming), "creating an event");
    checkCuda(cudaEventRecord(batch->event, comm_->stream), "recording an event");
    comm_->orderCallerAfter(batch->event);
    batch->flushed = true;
  }

 private:
  static std::shared_ptr<Comm> connect(Store& store, const std::string& prefix, int rank, int size,
                                       int device, std::chrono::milliseconds timeout) {
    auto comm = std::make_shared<Comm>();
    comm->rank = rank;
    comm->size = size;
    comm->device = device;
    comm->timeout = timeout;
    checkCuda(cudaSetDevice(device), "selecting device " + std::to_string(device));
    checkCuda(cudaStreamCreateWithFlags(&comm->stream, cudaStreamNonBlocking), "creating a stream");
    ncclUniqueId id;
    if (rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw CommError("nccl: cannot create the unique id: " + ncclText(r));
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store.set(prefix + "id", std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    } else {
      auto bytes = store.get(prefix + "id");
      if (bytes.size() != sizeof(id))
        throw CommError("nccl: the unique id in the store is malformed");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm->comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      throw CommError("nccl: rank " + std::to_string(rank) +
                      " cannot create its communicator: " + ncclText(r));
    }
    comm->waitReady("communicator init on device " + std::to_string(device));
    return comm;
  }

  std::unique_ptr<Request> queue(bool send, int peer, const Buffer& buf, Tag tag) {
    checkTransfer("nccl", rank(), size(), peer, buf, send, MemoryKind::kCuda);
    comm_->aborted.throwIfSet("nccl");
    if (!batch_) batch_ = std::make_shared<Batch>();
    batch_->ops.push_back({send, peer, buf});
    const std::string what = describeTransfer(rank(), peer, send, tag);
    return std::make_unique<NcclRequest>(this, comm_, batch_, what);
  }

  Store* store_ = nullptr;
  std::shared_ptr<Comm> comm_;
  std::string prefix_ = "nccl/";  // this group's store keys
  std::shared_ptr<Batch> batch_;
  int splits_ = 0;
};

void NcclRequest::wait(std::chrono::milliseconds timeout) {
  if (!batch_->flushed) backend_->flush();
  comm_->waitEvent(batch_->event, what_, timeout);
}

bool NcclRequest::test() {
  if (!batch_->flushed) backend_->flush();
  return cudaEventQuery(batch_->event) == cudaSuccess;
}

}  // namespace
}  // namespace collie::nccl

COLLIE_BACKEND_PLUGIN("nccl", "1.0.0",
                      "NCCL between processes, one GPU per rank; NCCL's collectives as native",
                      collie::nccl::NcclBackend);
