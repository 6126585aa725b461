// The process's device memory table, and the emulated device (collie/device_memory.h).
#include "collie/device_memory.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <sstream>

#include "collie/error.h"
#include "core/host_reduce.h"

namespace collie {
namespace {

std::mutex& tableMutex() {
  static std::mutex mu;
  return mu;
}

DeviceMemoryOps& table() {
  static DeviceMemoryOps ops;
  return ops;
}

// ---- the emulated device -----------------------------------------------------------------

// Every live allocation: its start and its size. Never destroyed (memory may be released
// while the process ends).
class Allocations {
 public:
  void add(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    live_[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  void remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(reinterpret_cast<uintptr_t>(p));
  }
  // Whether [p, p + bytes) lies in one live allocation; for bytes == 0, whether p lies in one
  // or at its end (an empty view of it).
  bool holds(const void* p, size_t bytes) const {
    const auto start = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(start);
    if (it == live_.begin()) return false;
    --it;
    const uintptr_t end = it->first + it->second;
    return start >= it->first && start <= end && bytes <= end - start;
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> live_;
};

Allocations& allocations() {
  static auto* live = new Allocations();
  return *live;
}

bool emulatedOwns(const void* data, size_t bytes) { return allocations().holds(data, bytes); }

// Throws unless `buf` is host memory, or device memory the emulated device holds (an empty
// view too must point into one of its allocations, or be null).
void requireEmulated(const Buffer& buf, const char* what) {
  if (buf.memory == MemoryKind::kHost) return;
  if (buf.memory == MemoryKind::kCuda && buf.bytes() == 0 && buf.data == nullptr) return;
  if (buf.memory == MemoryKind::kCuda && emulatedOwns(buf.data, buf.bytes())) return;
  std::ostringstream out;
  out << "emulated device: " << what << " of " << buf.bytes() << " bytes at " << buf.data
      << " labelled device memory, but the emulated device did not allocate it (host memory "
         "labelled as device memory, or memory used after its release). HINT: a device-only "
         "backend is handed only device memory: allocate it through the device (a "
         "ScratchBuffer like a device buffer, or a tensor on the rank's device)";
  throw CommError(out.str());
}

// A host view of a buffer the emulated device holds (its memory is host memory).
Buffer onHost(Buffer buf) {
  buf.memory = MemoryKind::kHost;
  buf.device = 0;
  return buf;
}

int emulatedCount() { return 1; }

void* emulatedAllocate(size_t bytes, int device) {
  COLLIE_CHECK(device == 0, "emulated device: device ", device, " asked for; it has device 0");
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);  // the padding is not its memory
  if (p == nullptr) throw std::bad_alloc();
  allocations().add(p, bytes);
  return p;
}

void emulatedRelease(void* data, int) noexcept {
  if (data == nullptr) return;
  allocations().remove(data);
  std::free(data);
}

void emulatedCopy(const Buffer& dst, const Buffer& src) {
  requireEmulated(dst, "a copy's destination");
  requireEmulated(src, "a copy's source");
  if (dst.bytes() > 0 && dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
}

void emulatedReduce(const Buffer& dst, const Buffer& src, ReduceOp op) {
  requireEmulated(dst, "a reduction's destination");
  requireEmulated(src, "a reduction's source");
  detail::reduceHost(onHost(dst), onHost(src), op);
}

void emulatedDivide(const Buffer& data, int divisor) {
  requireEmulated(data, "an average's buffer");
  detail::divideHost(onHost(data), divisor);
}

}  // namespace

DeviceMemoryOps setDeviceMemoryOps(const DeviceMemoryOps& ops) {
  std::lock_guard<std::mutex> lock(tableMutex());
  DeviceMemoryOps previous = table();
  table() = ops;
  return previous;
}

const DeviceMemoryOps& deviceMemoryOps() { return table(); }

void synchronizeDevice(int device) {
  const DeviceMemoryOps& ops = deviceMemoryOps();
  if (ops.synchronize != nullptr) ops.synchronize(device);
}

int deviceOfLocalRank(int local_rank) {
  const DeviceMemoryOps& ops = deviceMemoryOps();
  const int count = ops.device_count == nullptr ? 0 : ops.device_count();
  return count > 0 ? local_rank % count : 0;
}

const DeviceMemoryOps& emulatedDeviceOps() {
  static const DeviceMemoryOps ops = [] {
    DeviceMemoryOps o;
    o.name = "emulated device";
    o.device_count = &emulatedCount;
    o.allocate = &emulatedAllocate;
    o.release = &emulatedRelease;
    o.copy = &emulatedCopy;
    o.reduce = &emulatedReduce;
    o.divide = &emulatedDivide;
    o.owns = &emulatedOwns;
    return o;
  }();
  return ops;
}

}  // namespace collie
