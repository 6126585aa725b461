// Device memory as the core reaches it (ABI 8.0): the copies, arithmetic and allocations on
// MemoryKind::kCuda buffers that schedulers and backends ask of the core (reduceInto,
// finishAverage, copyInto, ScratchBuffer) are done by one table that the application installs,
// so that neither the core nor any plugin links a device runtime. collie installs CUDA
// through LibTorch, or, with COLLIE_EMULATED_DEVICE=1, the emulated device below.
#pragma once

#include <cstddef>

#include "collie/buffer.h"

namespace collie {

// What a device runtime does for the core. Every function may throw collie::CommError (or
// InternalError) with what failed; a table is installed once and then shared by every thread.
struct DeviceMemoryOps {
  const char* name = "none";  // "CUDA (LibTorch)", "emulated device": for messages
  // Devices this process can use (ordinals 0 .. count - 1); 0: none.
  int (*device_count)() = nullptr;
  // `bytes` (> 0) of memory on `device`, aligned to 64 bytes at least. Throws when it cannot.
  void* (*allocate)(size_t bytes, int device) = nullptr;
  // Gives back what allocate returned (same device). Never throws.
  void (*release)(void* data, int device) noexcept = nullptr;
  // dst = src: the same count and dtype, either side host or device memory. Ordered after
  // the work queued on the calling thread's current stream; a copy into host memory has
  // finished when it returns, a copy into device memory may still be queued.
  void (*copy)(const Buffer& dst, const Buffer& src) = nullptr;
  // dst[i] = op(dst[i], src[i]) on device memory (kAvg adds, as reduceInto documents).
  void (*reduce)(const Buffer& dst, const Buffer& src, ReduceOp op) = nullptr;
  // data[i] /= divisor (truncated toward zero for integer dtypes), on device memory.
  void (*divide)(const Buffer& data, int divisor) = nullptr;
  // Blocks until the device work the calling thread queued on `device` has finished (for
  // timing it: a GPU runs a reduction after the call that queued it returns).
  void (*synchronize)(int device) = nullptr;
  // The emulated device only (null for a real one): whether [data, data + bytes) lies in one
  // allocation it made and has not released, so that host memory can tell itself apart.
  bool (*owns)(const void* data, size_t bytes) = nullptr;
};

// Installs `ops` for the whole process and returns the table it replaces. Install before
// any device buffer exists: memory allocated by one table is never released by another.
DeviceMemoryOps setDeviceMemoryOps(const DeviceMemoryOps& ops);
// The installed table; its functions are null where nothing was installed (the core then
// throws "no device memory in this process" for a device buffer).
const DeviceMemoryOps& deviceMemoryOps();

// deviceMemoryOps().synchronize(device) where a table with one is installed; nothing otherwise.
void synchronizeDevice(int device);

// The device of the rank at `local_rank` among its host's ranks: local_rank % the installed
// table's device count, or 0 where it has none. Every part of a rank that picks a device
// (the trainer, the control plane, a backend with a device per rank) picks this one.
int deviceOfLocalRank(int local_rank);

// The emulated device: host memory standing in for one GPU, for checking without a GPU that
// everything a device-only backend is handed lives in device memory. Its memory is
// aligned_alloc'd and recorded; copy, reduce and divide refuse (CommError) any device-side
// pointer that is not inside one live allocation, so host memory relabelled as device
// memory, and memory used after its release (unless the address was handed out again), fail
// at the first touch. Its speed is host memory's and means nothing.
const DeviceMemoryOps& emulatedDeviceOps();

}  // namespace collie
