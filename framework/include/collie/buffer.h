// Element types, reduce operations and the non-owning buffer views that schedulers and
// backends exchange. Kept free of LibTorch headers so that plugins compile fast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace collie {

// The element types every scheduler must handle.
enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64 };

// The reductions every scheduler must handle. kAvg is a sum divided by the group size
// (truncated toward zero for integer types, as NCCL does).
enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProd };

// Where a buffer's bytes live. Backends declare which kinds they can move.
// kNone (ABI 6.0): a buffer with a size and no bytes, for a simulator that runs without
// payload (backends/simgrid, `payload: false`). Its views point into an address range that is
// reserved and never readable, so a stray access faults instead of reading garbage;
// reduceInto, finishAverage and copyInto do nothing to it (reduceInto still calls the
// thread's reduction hook, which prices the work), and a ScratchBuffer like it allocates
// nothing. A backend that moves bytes refuses it in checkTransfer.
enum class MemoryKind : uint8_t { kHost, kCuda, kNone };

size_t dtypeSize(DType dtype);
const char* dtypeName(DType dtype);     // "f32", "bf16", ...
const char* reduceOpName(ReduceOp op);  // "sum", "avg", ...
// Parse the names above; return false for an unknown name.
bool parseDType(const std::string& name, DType* out);
bool parseReduceOp(const std::string& name, ReduceOp* out);

// A typed, non-owning view of `count` elements. Schedulers slice it into chunks and hand
// byte spans of it to the backend; reductions go through collie::reduceInto (typed loops for
// host memory, the device memory table of collie/device_memory.h for device memory).
struct Buffer {
  void* data = nullptr;
  size_t count = 0;  // elements, not bytes
  DType dtype = DType::kF32;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;  // CUDA device ordinal when memory == kCuda

  size_t bytes() const { return count * dtypeSize(dtype); }
  // Elements [offset, offset + n) of this view. Throws collie::InternalError when out of range.
  Buffer slice(size_t offset, size_t n) const;
};

// dst[i] = op(dst[i], src[i]) for every element. Both views must have the same count,
// dtype and memory kind. kAvg reduces like kSum; call finishAverage once at the end.
void reduceInto(const Buffer& dst, const Buffer& src, ReduceOp op);

// A simulator prices the reductions its ranks do in simulated time (ABI 6.0): while a hook
// is set on a thread, every reduceInto on that thread calls hook(bytes of dst, user) after
// it has reduced. Null clears it. The thread's previous hook is returned.
struct ReductionHook {
  void (*call)(size_t bytes, void* user) = nullptr;
  void* user = nullptr;
};
ReductionHook setReductionHook(ReductionHook hook);

// For kAvg: divides every element by `group_size` (no-op for every other op).
void finishAverage(const Buffer& data, ReduceOp op, int group_size);

// Copies src into dst (same count and dtype; each side host or device memory, device memory
// through the device memory table). Nothing for a size-only side.
void copyInto(const Buffer& dst, const Buffer& src);

// A view of `count` elements of kind MemoryKind::kNone, all at the start of the reserved
// range (size-only buffers hold nothing, so they may share it). Throws InternalError when
// count * dtypeSize(dtype) exceeds the range (1 TiB).
Buffer sizeOnlyBuffer(DType dtype, size_t count);

// Storage for temporaries of the same dtype and memory kind as `like` (scratch chunks).
// Host memory up to 4 MiB comes from blocks that earlier scratch buffers gave back (at most
// 32 MiB of them kept in all), so that a small collective's scratch costs no allocation.
class ScratchBuffer {
 public:
  ScratchBuffer(const Buffer& like, size_t count);
  ~ScratchBuffer();
  ScratchBuffer(ScratchBuffer&& other) noexcept;
  ScratchBuffer& operator=(ScratchBuffer&& other) noexcept;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  const Buffer& view() const { return view_; }

 private:
  void release();

  Buffer view_;
  void* holder_ = nullptr;  // device memory: what the device memory table allocated
  size_t block_ = 0;        // host memory: the size of the block view_.data starts
};

}  // namespace collie
