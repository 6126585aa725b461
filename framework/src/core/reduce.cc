// Buffer arithmetic for schedulers: the only core file that needs ATen. Host memory is
// reduced by typed loops (host_reduce.h) and copied by memmove; device memory through ATen,
// wrapping the raw views in tensors.
#include <ATen/core/Tensor.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "collie/buffer.h"
#include "collie/error.h"
#include "core/aten.h"
#include "core/host_reduce.h"

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

using detail::wrap;

void checkSameShape(const Buffer& dst, const Buffer& src, const char* what) {
  COLLIE_CHECK(dst.count == src.count && dst.dtype == src.dtype && dst.memory == src.memory, what,
               ": buffers differ (dst ", dst.count, " x ", dtypeName(dst.dtype), ", src ",
               src.count, " x ", dtypeName(src.dtype), ")");
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

void reduceInto(const Buffer& dst, const Buffer& src, ReduceOp op) {
  checkSameShape(dst, src, "reduceInto");
  if (dst.count == 0) return;
  if (dst.memory == MemoryKind::kHost) return detail::reduceHost(dst, src, op);
  at::Tensor d = wrap(dst);
  at::Tensor s = wrap(src);
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

void finishAverage(const Buffer& data, ReduceOp op, int group_size) {
  if (op != ReduceOp::kAvg || data.count == 0 || group_size == 1) return;
  if (data.memory == MemoryKind::kHost) return detail::divideHost(data, group_size);
  at::Tensor d = wrap(data);
  if (at::isIntegralType(d.scalar_type(), /*includeBool=*/false)) {
    d.div_(group_size, "trunc");
  } else {
    d.div_(group_size);
  }
}

void copyInto(const Buffer& dst, const Buffer& src) {
  checkSameShape(dst, src, "copyInto");
  if (dst.count == 0 || dst.data == src.data) return;
  if (dst.memory == MemoryKind::kHost) {
    std::memmove(dst.data, src.data, dst.bytes());
    return;
  }
  wrap(dst).copy_(wrap(src));
}

ScratchBuffer::ScratchBuffer(const Buffer& like, size_t count) {
  view_ = like;
  view_.count = count;
  if (like.memory == MemoryKind::kHost) {
    // Plain aligned memory (holder_ stays null): a tensor's construction costs more than the
    // small collectives a scratch buffer feeds.
    const size_t bytes = std::max<size_t>(64, (count * dtypeSize(like.dtype) + 63) / 64 * 64);
    view_.data = std::aligned_alloc(64, bytes);
    if (view_.data == nullptr) throw std::bad_alloc();
    return;
  }
  auto* tensor =
      new at::Tensor(at::empty({static_cast<int64_t>(count)}, detail::tensorOptions(like)));
  holder_ = tensor;
  view_.data = tensor->data_ptr();
}

ScratchBuffer::~ScratchBuffer() {
  if (holder_ == nullptr) {
    std::free(view_.data);
  } else {
    delete static_cast<at::Tensor*>(holder_);
  }
}

}  // namespace collie
