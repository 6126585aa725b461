// Buffer arithmetic for schedulers and backends. Host memory is reduced by typed loops
// (host_reduce.h) and copied by memmove; device memory through the process's device memory
// table (collie/device_memory.h), so that the core links no device runtime.
#include <sys/mman.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "collie/buffer.h"
#include "collie/device_memory.h"
#include "collie/error.h"
#include "core/host_reduce.h"

namespace collie {
namespace {

void checkSameShape(const Buffer& dst, const Buffer& src, const char* what) {
  COLLIE_CHECK(dst.count == src.count && dst.dtype == src.dtype && dst.memory == src.memory, what,
               ": buffers differ (dst ", dst.count, " x ", dtypeName(dst.dtype), ", src ",
               src.count, " x ", dtypeName(src.dtype), ")");
}

// The device memory table, with `fn` installed; throws naming what needed it otherwise.
template <typename Fn>
const DeviceMemoryOps& deviceOps(Fn DeviceMemoryOps::*fn, const char* what) {
  const DeviceMemoryOps& ops = deviceMemoryOps();
  if (ops.*fn == nullptr) {
    throw ConfigError(std::string(what) +
                      " of device memory, but no device memory is installed in this process "
                      "(collie found no LibTorch with CUDA). HINT: run collie on a machine with "
                      "a GPU and a LibTorch with CUDA, or set COLLIE_EMULATED_DEVICE=1 to test "
                      "device paths without one");
  }
  return ops;
}

}  // namespace

Buffer Buffer::slice(size_t offset, size_t n) const {
  COLLIE_CHECK(offset + n <= count, "slice [", offset, ", ", offset + n, ") of a ", count,
               "-element buffer");
  Buffer out = *this;
  out.data = static_cast<char*>(data) + offset * dtypeSize(dtype);
  out.count = n;
  return out;
}

namespace {
thread_local ReductionHook t_reduction_hook;
}  // namespace

ReductionHook setReductionHook(ReductionHook hook) {
  ReductionHook previous = t_reduction_hook;
  t_reduction_hook = hook;
  return previous;
}

namespace {
// dst = op(dst, src) where the buffers live.
void reduceOnce(const Buffer& dst, const Buffer& src, ReduceOp op) {
  if (dst.memory == MemoryKind::kHost) return detail::reduceHost(dst, src, op);
  deviceOps(&DeviceMemoryOps::reduce, "a reduction").reduce(dst, src, op);
}

}  // namespace

void reduceInto(const Buffer& dst, const Buffer& src, ReduceOp op) {
  checkSameShape(dst, src, "reduceInto");
  if (dst.count == 0) return;
  if (dst.memory != MemoryKind::kNone) reduceOnce(dst, src, op);
  if (t_reduction_hook.call != nullptr) t_reduction_hook.call(dst.bytes(), t_reduction_hook.user);
}

void finishAverage(const Buffer& data, ReduceOp op, int group_size) {
  if (op != ReduceOp::kAvg || data.count == 0 || group_size == 1) return;
  if (data.memory == MemoryKind::kNone) return;
  if (data.memory == MemoryKind::kHost) return detail::divideHost(data, group_size);
  deviceOps(&DeviceMemoryOps::divide, "an average").divide(data, group_size);
}

void copyInto(const Buffer& dst, const Buffer& src) {
  COLLIE_CHECK(dst.count == src.count && dst.dtype == src.dtype, "copyInto: buffers differ (dst ",
               dst.count, " x ", dtypeName(dst.dtype), ", src ", src.count, " x ",
               dtypeName(src.dtype), ")");
  const bool none = dst.memory == MemoryKind::kNone || src.memory == MemoryKind::kNone;
  if (dst.count == 0 || none) return;
  if (dst.memory == MemoryKind::kHost && src.memory == MemoryKind::kHost) {
    if (dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
    return;
  }
  deviceOps(&DeviceMemoryOps::copy, "a copy").copy(dst, src);
}

namespace {

// Host blocks that scratch buffers gave back, by size class (powers of two from 64 bytes to
// kLargestBlock), for the next scratch buffer of that class. Never destroyed: a scratch
// buffer may be dropped while the process ends.
class ScratchCache {
 public:
  static constexpr size_t kSmallestBlock = 64;
  static constexpr size_t kLargestBlock = size_t{4} << 20;
  static constexpr size_t kMostBytes = size_t{32} << 20;  // kept in all
  static constexpr size_t kMostPerClass = 8;

  // The size of the block that holds `bytes` (0: too large to cache).
  static size_t blockFor(size_t bytes) {
    size_t block = kSmallestBlock;
    while (block < bytes) block *= 2;
    return block <= kLargestBlock ? block : 0;
  }

  void* take(size_t block) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = free_[classOf(block)];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        bytes_ -= block;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, block);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }

  void give(void* p, size_t block) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = free_[classOf(block)];
      if (list.size() < kMostPerClass && bytes_ + block <= kMostBytes) {
        if (list.capacity() == 0) list.reserve(kMostPerClass);
        list.push_back(p);
        bytes_ += block;
        return;
      }
    }
    std::free(p);
  }

 private:
  static size_t classOf(size_t block) {
    size_t c = 0;
    for (size_t b = kSmallestBlock; b < block; b *= 2) ++c;
    return c;
  }

  std::mutex mu_;
  std::vector<void*> free_[24];  // classes 64 B .. 4 MiB: 17 used
  size_t bytes_ = 0;
};

ScratchCache& scratchCache() {
  static auto* cache = new ScratchCache();
  return *cache;
}

}  // namespace

namespace {

// The range size-only buffers point into: reserved once (PROT_NONE, no swap or memory
// committed), never mapped readable, never released.
constexpr size_t kSizeOnlyRange = size_t{1} << 40;

char* sizeOnlyRange() {
  static char* const base = [] {
    void* p = ::mmap(nullptr, kSizeOnlyRange, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<char*>(p);
  }();
  return base;
}

}  // namespace

Buffer sizeOnlyBuffer(DType dtype, size_t count) {
  COLLIE_CHECK(count <= kSizeOnlyRange / dtypeSize(dtype), "a size-only buffer of ", count, " x ",
               dtypeName(dtype), " is larger than the reserved range (1 TiB)");
  Buffer b;
  b.data = sizeOnlyRange();
  b.count = count;
  b.dtype = dtype;
  b.memory = MemoryKind::kNone;
  return b;
}

ScratchBuffer::ScratchBuffer(const Buffer& like, size_t count) {
  view_ = like;
  view_.count = count;
  if (like.memory == MemoryKind::kNone) {
    view_ = sizeOnlyBuffer(like.dtype, count);  // nothing to allocate, nothing to release
    return;
  }
  if (like.memory == MemoryKind::kHost) {
    // Plain aligned memory (holder_ stays null): a tensor's construction costs more than the
    // small collectives a scratch buffer feeds.
    const size_t bytes = std::max<size_t>(64, (count * dtypeSize(like.dtype) + 63) / 64 * 64);
    block_ = ScratchCache::blockFor(bytes);
    if (block_ != 0) {
      view_.data = scratchCache().take(block_);
      return;
    }
    view_.data = std::aligned_alloc(64, bytes);
    if (view_.data == nullptr) throw std::bad_alloc();
    return;
  }
  // Device memory from the device's table (holder_ marks it; block_ stays 0), exactly the
  // view's bytes (one for an empty view), so that a checking device sees the view's end.
  const size_t bytes = std::max<size_t>(1, count * dtypeSize(like.dtype));
  view_.data =
      deviceOps(&DeviceMemoryOps::allocate, "a scratch buffer").allocate(bytes, like.device);
  holder_ = view_.data;
}

ScratchBuffer::ScratchBuffer(ScratchBuffer&& other) noexcept
    : view_(other.view_), holder_(other.holder_), block_(other.block_) {
  other.view_.data = nullptr;
  other.holder_ = nullptr;
  other.block_ = 0;
}

ScratchBuffer& ScratchBuffer::operator=(ScratchBuffer&& other) noexcept {
  if (this != &other) {
    release();
    view_ = other.view_;
    holder_ = other.holder_;
    block_ = other.block_;
    other.view_.data = nullptr;
    other.holder_ = nullptr;
    other.block_ = 0;
  }
  return *this;
}

ScratchBuffer::~ScratchBuffer() { release(); }

void ScratchBuffer::release() {
  if (view_.memory == MemoryKind::kNone) {
    // Size-only: it points into the reserved range and owns nothing.
  } else if (holder_ != nullptr) {
    deviceMemoryOps().release(holder_, view_.device);
  } else if (view_.data != nullptr && block_ != 0) {
    scratchCache().give(view_.data, block_);
  } else {
    std::free(view_.data);
  }
  holder_ = nullptr;
  view_.data = nullptr;
  block_ = 0;
}

}  // namespace collie
