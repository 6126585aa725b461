// train.device, stream order hooks, tensor buffers and host staging (runtime/device.h).
#include "runtime/device.h"

#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <map>
#include <mutex>
#include <thread>

#include "collie/error.h"
#include "core/aten.h"

namespace collie {
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

}  // namespace

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
  }
  return b;
}

// ---- host staging ------------------------------------------------------------------------

struct HostStaging::Slot {
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

HostStaging::HostStaging() = default;
HostStaging::~HostStaging() {
  for (auto& slot : slots_) {
    if (slot) slot->settle();  // a copy back may still read its memory
  }
}

bool HostStaging::needed(const CollectiveArgs& args, const Capabilities& caps, bool force) {
  if (args.coll == Collective::kBarrier) return false;
  auto device = [&](const Buffer& b) {
    return b.memory == MemoryKind::kCuda || (force && b.memory == MemoryKind::kHost);
  };
  return !caps.cuda_memory && (device(args.data) || device(args.output));
}

CollectiveArgs HostStaging::asStaged(const CollectiveArgs& args) {
  CollectiveArgs staged = args;
  staged.data.memory = staged.output.memory = MemoryKind::kHost;
  staged.data.device = staged.output.device = 0;
  return staged;
}

HostStaging::Slot& HostStaging::acquire(size_t index, size_t bytes, const Buffer& like) {
  if (slots_.size() <= index) slots_.resize(index + 1);
  if (!slots_[index]) slots_[index] = std::make_unique<Slot>();
  Slot& slot = *slots_[index];
  slot.settle();
  if (!slot.host.defined() || static_cast<size_t>(slot.host.numel()) < bytes) {
    auto options = at::TensorOptions().dtype(at::kByte);
    if (like.memory == MemoryKind::kCuda) options = options.pinned_memory(true);
    slot.host = at::empty({static_cast<int64_t>(bytes)}, options);
  }
  return slot;
}

CollectiveArgs HostStaging::stageIn(const CollectiveArgs& args) {
  CollectiveArgs staged = args;
  auto stage = [&](size_t index, const Buffer& original, bool copy) {
    Buffer host = original;
    host.memory = MemoryKind::kHost;
    host.device = 0;
    host.data = acquire(index, original.bytes(), original).host.data_ptr();
    // Blocking: the host reads it next (a copy out of device memory waits for its stream).
    if (copy && original.count > 0) detail::wrap(host).copy_(detail::wrap(original));
    return host;
  };
  const bool writes_output =
      args.coll == Collective::kReduceScatter || args.coll == Collective::kAllGather;
  staged.data = stage(0, args.data, true);
  if (writes_output) staged.output = stage(1, args.output, false);
  return staged;
}

void HostStaging::stageOut(const CollectiveArgs& original, const CollectiveArgs& staged) {
  const bool writes_output =
      original.coll == Collective::kReduceScatter || original.coll == Collective::kAllGather;
  const Buffer& to = writes_output ? original.output : original.data;
  const Buffer& from = writes_output ? staged.output : staged.data;
  if (to.count == 0) return;
  Slot& slot = *slots_[writes_output ? 1 : 0];
  const bool device = to.memory == MemoryKind::kCuda;
  // To device memory: queued on the caller's stream from pinned memory, not waited for.
  detail::wrap(to).copy_(detail::wrap(from), /*non_blocking=*/device);
  if (!device) return;
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

size_t HostStaging::heldBytes() const {
  size_t bytes = 0;
  for (const auto& slot : slots_) {
    if (slot && slot->host.defined()) bytes += static_cast<size_t>(slot->host.numel());
  }
  return bytes;
}

}  // namespace collie
