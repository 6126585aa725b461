// train.device, stream order hooks, tensor buffers and host staging (runtime/device.h).
#include "runtime/device.h"

#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "collie/device_memory.h"
#include "collie/error.h"
#include "runtime/aten.h"
#include "runtime/cpu_allocator.h"

namespace collie {
namespace detail {

at::ScalarType scalarType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return at::kFloat;
    case DType::kF64:
      return at::kDouble;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI32:
      return at::kInt;
    case DType::kI64:
      return at::kLong;
  }
  throw InternalError("unknown dtype");
}

at::TensorOptions tensorOptions(const Buffer& buf) {
  auto opts = at::TensorOptions().dtype(scalarType(buf.dtype));
  if (buf.memory == MemoryKind::kCuda) opts = opts.device(at::Device(at::kCUDA, buf.device));
  return opts;
}

at::Tensor wrap(const Buffer& buf) {
  return at::from_blob(buf.data, {static_cast<int64_t>(buf.count)}, tensorOptions(buf));
}

}  // namespace detail

namespace {

const c10::impl::DeviceGuardImplInterface* cudaInterface() {
  return c10::impl::hasDeviceGuardImpl(c10::kCUDA) ? c10::impl::getDeviceGuardImpl(c10::kCUDA)
                                                   : nullptr;
}

const c10::impl::DeviceGuardImplInterface& requireCuda(const char* what) {
  const auto* cuda = cudaInterface();
  COLLIE_CHECK(cuda != nullptr, what, ": this LibTorch has no CUDA");
  return *cuda;
}

// One event per thread and device, made on its first record (LibTorch's way: the interface
// creates it lazily), destroyed when the thread ends.
struct ThreadEvents {
  std::map<int, void*> events;
  ~ThreadEvents() {
    if (const auto* cuda = cudaInterface()) {
      for (auto& [device, event] : events) {
        cuda->destroyEvent(event, static_cast<c10::DeviceIndex>(device));
      }
    }
  }
};

void* producerEvent(int device) {
  thread_local ThreadEvents mine;
  const auto& cuda = requireCuda("the stream order hook");
  const auto index = static_cast<c10::DeviceIndex>(device);
  void*& event = mine.events[device];
  cuda.record(&event, cuda.getStream(c10::Device(c10::kCUDA, index)), index,
              c10::EventFlag::PYTORCH_DEFAULT);
  return event;
}

void consumerWait(int device, void* event) {
  const auto& cuda = requireCuda("the stream order hook");
  cuda.block(event, cuda.getStream(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device))));
}

// The inverse of the core's dtype -> ATen type map (one list: the core's).
DType dtypeOf(at::ScalarType type) {
  for (auto d = static_cast<uint8_t>(DType::kF32); d <= static_cast<uint8_t>(DType::kI64); ++d) {
    if (detail::scalarType(static_cast<DType>(d)) == type) return static_cast<DType>(d);
  }
  throw InternalError(fmt::format("a tensor of {} has no collie dtype", c10::toString(type)));
}

// ---- the device memory table: CUDA through LibTorch -------------------------------------

// Device allocations, kept as tensors (LibTorch's caching allocator) until released.
std::mutex& cudaBlocksMutex() {
  static std::mutex mu;
  return mu;
}
std::map<void*, at::Tensor>& cudaBlocks() {
  static auto* blocks = new std::map<void*, at::Tensor>();
  return *blocks;
}

int cudaCount() { return cudaDeviceCount(); }

void* cudaAllocate(size_t bytes, int device) {
  if (device >= cudaDeviceCount()) {
    throw CommError(fmt::format(
        "device memory on CUDA device {}, but this process sees {} ({}). HINT: a backend that "
        "moves device memory only (nccl, loopback's memory: device) needs a GPU, or "
        "COLLIE_EMULATED_DEVICE=1 to test without one",
        device, cudaDeviceCount() == 0 ? "none" : std::to_string(cudaDeviceCount()),
        torchDescription()));
  }
  at::Tensor t = at::empty({static_cast<int64_t>(bytes)},
                           at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  std::lock_guard<std::mutex> lock(cudaBlocksMutex());
  cudaBlocks()[t.data_ptr()] = t;
  return t.data_ptr();
}

void cudaRelease(void* data, int) noexcept {
  std::lock_guard<std::mutex> lock(cudaBlocksMutex());
  cudaBlocks().erase(data);
}

void cudaCopy(const Buffer& dst, const Buffer& src) { detail::wrap(dst).copy_(detail::wrap(src)); }

void cudaReduce(const Buffer& dst, const Buffer& src, ReduceOp op) {
  at::Tensor d = detail::wrap(dst);
  at::Tensor s = detail::wrap(src);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      d.add_(s);
      break;
    case ReduceOp::kProd:
      d.mul_(s);
      break;
    case ReduceOp::kMin:
      at::minimum_out(d, d, s);
      break;
    case ReduceOp::kMax:
      at::maximum_out(d, d, s);
      break;
  }
}

void cudaDivide(const Buffer& data, int divisor) {
  at::Tensor d = detail::wrap(data);
  if (at::isIntegralType(d.scalar_type(), /*includeBool=*/false)) {
    d.div_(divisor, "trunc");
  } else {
    d.div_(divisor);
  }
}

// Records an event behind the calling thread's current stream of `device` and waits for it.
void cudaSynchronize(int device) {
  const auto& cuda = requireCuda("synchronize");
  const auto index = static_cast<c10::DeviceIndex>(device);
  void* event = nullptr;
  cuda.record(&event, cuda.getStream(c10::Device(c10::kCUDA, index)), index,
              c10::EventFlag::PYTORCH_DEFAULT);
  while (!cuda.queryEvent(event)) std::this_thread::yield();
  cuda.destroyEvent(event, index);
}

DeviceMemoryOps cudaOps() {
  DeviceMemoryOps ops;
  ops.name = "CUDA (LibTorch)";
  ops.device_count = &cudaCount;
  ops.allocate = &cudaAllocate;
  ops.release = &cudaRelease;
  ops.copy = &cudaCopy;
  ops.reduce = &cudaReduce;
  ops.divide = &cudaDivide;
  ops.synchronize = &cudaSynchronize;
  return ops;
}

// The table is installed as this library loads, in a process whose LibTorch has CUDA, unless
// the emulated device was installed first (installDeviceMemory); without either, device
// buffers are refused by the core, naming why.
const bool kCudaInstalled = cudaInterface() != nullptr && deviceMemoryOps().allocate == nullptr &&
                            (setDeviceMemoryOps(cudaOps()), true);

bool emulated() { return deviceMemoryOps().owns != nullptr; }

// ---- tensors on the emulated device ------------------------------------------------------

// LibTorch's CPU allocator once a rank's tensors go on the emulated device: every tensor the
// process allocates from then on is the emulated device's memory (ATen computes on it as on
// any CPU tensor), while host memory that is not a tensor (the framework's own messages,
// std::vector) stays host memory.
void releaseEmulated(void* p) { deviceMemoryOps().release(p, 0); }
c10::DataPtr takeEmulated(size_t bytes) {
  void* p = bytes == 0 ? nullptr : deviceMemoryOps().allocate(bytes, 0);
  return {p, p, &releaseEmulated, c10::Device(c10::kCPU)};
}
using EmulatedAllocator = detail::CpuAllocator<&takeEmulated, &releaseEmulated>;

std::atomic<bool> g_tensors_emulated{false};

void putTensorsOnTheEmulatedDevice() {
  static std::once_flag once;
  std::call_once(once, [] {
    static EmulatedAllocator allocator;
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    g_tensors_emulated = true;
  });
}

// Whether LibTorch's CPU allocator is the emulated device's (train.device: cuda on it).
bool tensorsOnTheEmulatedDevice() { return g_tensors_emulated.load(); }

}  // namespace

bool emulatedDevice() {
  (void)kCudaInstalled;
  return emulated();
}

int cudaDeviceCount() {
  const auto* cuda = cudaInterface();
  return cuda == nullptr ? 0 : static_cast<int>(cuda->deviceCount());
}

std::string torchDescription() {
  const int devices = cudaDeviceCount();
  if (cudaInterface() == nullptr) return fmt::format("LibTorch {} (CPU only)", TORCH_VERSION);
  return fmt::format("LibTorch {} with CUDA, {} device{}", TORCH_VERSION, devices,
                     devices == 1 ? "" : "s");
}

at::Device rankDevice(const std::string& kind, int local_rank) {
  if (kind == "cpu") return at::Device(at::kCPU);
  COLLIE_CHECK(kind == "cuda", "train.device ", kind);
  if (emulated()) {
    putTensorsOnTheEmulatedDevice();
    return at::Device(at::kCPU);
  }
  const int devices = cudaDeviceCount();
  if (devices == 0) {
    throw ConfigError(fmt::format(
        "train.device: cuda, but this process sees no CUDA device ({}). HINT: run on a machine "
        "with an NVIDIA GPU and build collie against a LibTorch with CUDA (docs/running.md, "
        "\"GPUs\"), or set train.device: cpu",
        torchDescription()));
  }
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % devices));
  useDevice(device);
  return device;
}

void useDevice(const at::Device& device) {
  if (device.is_cuda()) requireCuda("useDevice").setDevice(device);
}

void installDeviceStreamHooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    DeviceStreamHooks hooks;
    hooks.producer_event = &producerEvent;
    hooks.consumer_wait = &consumerWait;
    setDeviceStreamHooks(hooks);
  });
}

Buffer bufferOf(const at::Tensor& t) {
  COLLIE_CHECK(t.is_contiguous(), "a collective's tensor must be contiguous");
  Buffer b;
  b.data = t.data_ptr();
  b.count = static_cast<size_t>(t.numel());
  b.dtype = dtypeOf(t.scalar_type());
  if (t.is_cuda()) {
    b.memory = MemoryKind::kCuda;
    b.device = t.device().index();
  } else if (tensorsOnTheEmulatedDevice() &&
             (b.bytes() == 0 || deviceMemoryOps().owns(b.data, b.bytes()))) {
    b.memory = MemoryKind::kCuda;  // a tensor on the emulated device (an empty one has no bytes)
  }
  return b;
}

// ---- host staging ------------------------------------------------------------------------

namespace {

class TensorStaging final : public HostStaging {
 public:
  ~TensorStaging() override {
    for (auto& slot : slots_) {
      if (slot) slot->settle();  // a copy back may still read its memory
    }
  }

  CollectiveArgs stageIn(const CollectiveArgs& args) override {
    CollectiveArgs staged = args;
    auto stage = [&](size_t index, const Buffer& original, bool copy) {
      Buffer host = original;
      host.memory = MemoryKind::kHost;
      host.device = 0;
      host.data = acquire(index, original.bytes(), original).host.data_ptr();
      // Blocking: the host reads it next (a copy out of device memory waits for its stream).
      if (copy && original.count > 0) copyInto(host, original);
      return host;
    };
    staged.data = stage(0, args.data, true);
    if (writesOutput(args)) staged.output = stage(1, args.output, false);
    return staged;
  }

  void stageOut(const CollectiveArgs& original, const CollectiveArgs& staged) override {
    const bool output = writesOutput(original);
    const Buffer& to = output ? original.output : original.data;
    const Buffer& from = output ? staged.output : staged.data;
    if (to.count == 0) return;
    Slot& slot = *slots_[output ? 1 : 0];
    const bool gpu = to.memory == MemoryKind::kCuda && !emulated();
    if (!gpu) return copyInto(to, from);
    // To a GPU: queued on the caller's stream from pinned memory, not waited for.
    detail::wrap(to).copy_(detail::wrap(from), /*non_blocking=*/true);
    const auto& cuda = requireCuda("host staging");
    if (slot.event != nullptr && slot.event_device != to.device) {
      cuda.destroyEvent(slot.event, static_cast<c10::DeviceIndex>(slot.event_device));
      slot.event = nullptr;
    }
    const auto index = static_cast<c10::DeviceIndex>(to.device);
    cuda.record(&slot.event, cuda.getStream(c10::Device(c10::kCUDA, index)), index,
                c10::EventFlag::PYTORCH_DEFAULT);
    slot.event_device = to.device;
  }

  size_t heldBytes() const override {
    size_t bytes = 0;
    for (const auto& slot : slots_) {
      if (slot && slot->host.defined()) bytes += static_cast<size_t>(slot->host.numel());
    }
    return bytes;
  }

 private:
  struct Slot {
    at::Tensor host;        // (bytes) uint8, pinned where CUDA is there
    void* event = nullptr;  // recorded behind the last copy back from `host`
    int event_device = -1;
    ~Slot() {
      if (event != nullptr) {
        if (const auto* cuda = cudaInterface())
          cuda->destroyEvent(event, static_cast<c10::DeviceIndex>(event_device));
      }
    }
    // Blocks until the last copy back from `host` has finished.
    void settle() {
      if (event == nullptr) return;
      const auto& cuda = requireCuda("host staging");
      while (!cuda.queryEvent(event)) std::this_thread::yield();
    }
  };

  static bool writesOutput(const CollectiveArgs& args) {
    return args.coll == Collective::kReduceScatter || args.coll == Collective::kAllGather;
  }

  // A host buffer of at least `bytes` whose last copy back has finished.
  Slot& acquire(size_t index, size_t bytes, const Buffer& like) {
    if (slots_.size() <= index) slots_.resize(index + 1);
    if (!slots_[index]) slots_[index] = std::make_unique<Slot>();
    Slot& slot = *slots_[index];
    slot.settle();
    if (!slot.host.defined() || static_cast<size_t>(slot.host.numel()) < bytes) {
      auto options = at::TensorOptions().dtype(at::kByte);
      if (like.memory == MemoryKind::kCuda && !emulated()) options = options.pinned_memory(true);
      slot.host = at::empty({static_cast<int64_t>(bytes)}, options);
    }
    return slot;
  }

  std::vector<std::unique_ptr<Slot>> slots_;  // [0]: data, [1]: output
};

}  // namespace

std::unique_ptr<HostStaging> makeHostStaging() { return std::make_unique<TensorStaging>(); }

}  // namespace collie
