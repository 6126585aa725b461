// The gloo backend: Gloo's TCP transport between processes. Point-to-point uses unbound
// buffers with the collie tag as the slot; `native` runs Gloo's own all-reduce algorithms
// (the algorithm classes: ring, ring_chunked, halving_doubling, bcube).
//
// Every blocking wait has the group's timeout. A peer that dies closes its sockets, which
// Gloo reports as an I/O error at once; a peer that stops leaves them open, so the wait runs
// into the timeout. Either way the error names the peer, the tag (collective sequence number,
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
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>

#include "collie/log.h"
#include "collie/plugin.h"
#include "collie/store.h"

namespace collie::gloo_backend {
namespace {

// Gloo's algorithm classes number their own slots from a small counter; collie's tags go in
// the upper half of the slot space so that the two never meet.
constexpr uint64_t kTagSlotBit = 1ull << 63;

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

// What every group of one backend shares: the device (one event loop thread), the store and
// the registry of pending buffers that abort() wakes.
struct Shared {
  std::shared_ptr<gloo::transport::Device> device;
  collie::Store* store = nullptr;
  std::chrono::milliseconds timeout{30000};
  std::string algorithm = "ring";
  std::mutex mu;
  std::set<gloo::transport::UnboundBuffer*> pending;
  AbortFlag aborted;  // set before the pending buffers are woken, under `mu`
};

using Transfer = TransferInfo;

class GlooRequest : public Request {
 public:
  GlooRequest(std::shared_ptr<Shared> shared, std::unique_ptr<gloo::transport::UnboundBuffer> buf,
              Transfer transfer)
      : shared_(std::move(shared)), buf_(std::move(buf)), transfer_(transfer) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->pending.insert(buf_.get());
  }
  ~GlooRequest() override { forget(); }

  void wait(std::chrono::milliseconds timeout) override {
    if (done_) return;
    bool completed = false;
    try {
      completed = transfer_.sending ? buf_->waitSend(timeout) : buf_->waitRecv(timeout);
    } catch (const std::exception& e) {
      forget();
      std::string message = glooMessage(e);
      bool timed_out = message.find("imeout") != std::string::npos ||
                       message.find("imed out") != std::string::npos;
      throw CommError("gloo: " + transfer_.describe() +
                      (timed_out ? " timed out after " + std::to_string(timeout.count()) + " ms: "
                                 : " failed: ") +
                      message +
                      (timed_out ? ". HINT: the peer never matched it; is it stopped, stuck or "
                                   "running a different collective?"
                                 : ". HINT: the peer process died or closed its connection"));
    }
    forget();
    if (!completed) {
      throw CommError("gloo: " + transfer_.describe() + " aborted: " + shared_->aborted.reason());
    }
    done_ = true;
  }

  bool test() override { return done_; }

 private:
  void forget() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->pending.erase(buf_.get());
  }

  std::shared_ptr<Shared> shared_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  Transfer transfer_;
  bool done_ = false;
};

// A cached instance of one of Gloo's all-reduce algorithm classes, bound to one buffer.
struct NativeKey {
  void* data;
  size_t count;
  DType dtype;
  ReduceOp op;
  bool operator<(const NativeKey& o) const {
    return std::tie(data, count, dtype, op) < std::tie(o.data, o.count, o.dtype, o.op);
  }
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
    try {
      LoopThreadPolicy policy(loop_thread == "batch");
      shared_->device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw ConfigError("backend gloo: cannot open a TCP device" +
                        (interface.empty() ? std::string() : " on interface '" + interface + "'") +
                        ": " + glooMessage(e) +
                        ". HINT: params.interface names a NIC (`ip -brief addr` lists them)");
    }
    connect(ctx.rank, ctx.size, "gloo/");
  }

  GlooBackend(std::shared_ptr<Shared> shared, int rank, int size, const std::string& prefix)
      : shared_(std::move(shared)) {
    connect(rank, size, prefix);
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
    if (args.data.count > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return Decision::no("Gloo's algorithms count elements in an int");
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
      algorithmFor(args.data, args.op, &first_run).run();
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
    for (auto* buf : shared_->pending) {
      buf->abortWaitSend();
      buf->abortWaitRecv();
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
    std::unique_ptr<gloo::transport::UnboundBuffer> ub;
    try {
      ub = context_->createUnboundBuffer(buf.data, buf.bytes());
      if (sending) {
        ub->send(peer, tag | kTagSlotBit);
      } else {
        ub->recv(peer, tag | kTagSlotBit);
      }
    } catch (const std::exception& e) {
      throw CommError("gloo: " + transfer.describe() + " failed: " + glooMessage(e) +
                      ". HINT: the peer process died or closed its connection");
    }
    return std::make_unique<GlooRequest>(shared_, std::move(ub), transfer);
  }

  // Gloo's algorithm objects bind their buffer when built; the bench and the trainer reuse
  // buffers, so the last few are kept (every rank makes the same calls in the same order,
  // so every rank builds and evicts the same ones).
  gloo::Algorithm& algorithmFor(const Buffer& data, ReduceOp op, bool* created) {
    *created = false;
    NativeKey key{data.data, data.count, data.dtype, op};
    for (auto it = natives_.begin(); it != natives_.end(); ++it) {
      if (!(it->first < key) && !(key < it->first)) {
        natives_.splice(natives_.begin(), natives_, it);
        return *natives_.front().second;
      }
    }
    std::unique_ptr<gloo::Algorithm> algorithm;
    const auto& name = shared_->algorithm;
    switch (data.dtype) {
      case DType::kF32:
        algorithm = makeAlgorithm<float>(name, context_, data.data, data.count, op);
        break;
      case DType::kF64:
        algorithm = makeAlgorithm<double>(name, context_, data.data, data.count, op);
        break;
      case DType::kF16:
        algorithm = makeAlgorithm<gloo::float16>(name, context_, data.data, data.count, op);
        break;
      case DType::kI32:
        algorithm = makeAlgorithm<int32_t>(name, context_, data.data, data.count, op);
        break;
      case DType::kI64:
        algorithm = makeAlgorithm<int64_t>(name, context_, data.data, data.count, op);
        break;
      case DType::kBF16:
        break;
    }
    *created = true;
    natives_.emplace_front(key, std::move(algorithm));
    if (natives_.size() > kCachedAlgorithms) natives_.pop_back();
    return *natives_.front().second;
  }

  static constexpr size_t kCachedAlgorithms = 8;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<gloo::Context> context_;
  std::string prefix_;
  int splits_ = 0;
  std::list<std::pair<NativeKey, std::unique_ptr<gloo::Algorithm>>> natives_;
};

}  // namespace
}  // namespace collie::gloo_backend

COLLIE_BACKEND_PLUGIN("gloo", "1.0.0",
                      "Gloo's TCP transport between processes; Gloo's own all-reduce as native",
                      collie::gloo_backend::GlooBackend);
