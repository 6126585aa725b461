// The closed forms behind pattern.h, vectorised with ATen.
#include "bench/pattern.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/where.h>

#include "collie/error.h"
#include "core/aten.h"

namespace collie::pattern {
namespace {

using detail::wrap;

// The value rank `r` contributes at global index i (i: int64 tensor), as doubles.
at::Tensor input(ReduceOp op, int r, const at::Tensor& i) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return (at::remainder(i, 5) + (r + 1)).to(at::kDouble);
    case ReduceOp::kProd:
      return at::where(at::remainder(i + r, 3) == 0, 2.0, 1.0).to(at::kDouble);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return (at::remainder(i + 7 * r, 11) - 5).to(at::kDouble);
  }
  throw InternalError("unknown op");
}

// The reduction over all ranks at global index i, as doubles.
at::Tensor reduced(ReduceOp op, DType dtype, int size, const at::Tensor& i) {
  at::Tensor acc = input(op, 0, i);
  for (int r = 1; r < size; ++r) {
    at::Tensor v = input(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = acc + v;
        break;
      case ReduceOp::kProd:
        acc = acc * v;
        break;
      case ReduceOp::kMin:
        acc = at::minimum(acc, v);
        break;
      case ReduceOp::kMax:
        acc = at::maximum(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    bool integral = dtype == DType::kI32 || dtype == DType::kI64;
    acc = integral ? acc.div(size, "trunc") : acc / size;
  }
  return acc;
}

at::Tensor indices(int64_t begin, size_t count) {
  return at::arange(begin, begin + static_cast<int64_t>(count), at::kLong);
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return 1e-12;
    case DType::kF32:
      return 1e-6;
    case DType::kF16:
      return 1e-3;
    case DType::kBF16:
      return 8e-3;
    default:
      return 0;
  }
}

uint64_t mismatches(const Buffer& got, const at::Tensor& expected) {
  if (got.count == 0) return 0;
  at::Tensor diff = at::abs(wrap(got).to(at::kDouble) - expected);
  at::Tensor limit = at::abs(expected).clamp_min(1.0) * tolerance(got.dtype);
  return static_cast<uint64_t>((diff > limit).sum().item<int64_t>());
}

void store(const Buffer& buf, const at::Tensor& values) {
  if (buf.count > 0) wrap(buf).copy_(values);
}

}  // namespace

void fillInput(const CollectiveArgs& args, int rank, int /*size*/) {
  const Buffer& in = args.data;
  switch (args.coll) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
      return store(in, input(args.op, rank, indices(0, in.count)));
    case Collective::kAllGather:
      store(args.output, at::full({static_cast<int64_t>(args.output.count)}, -1.0, at::kDouble));
      return store(in, input(ReduceOp::kSum, rank, indices(0, in.count)));
    case Collective::kBroadcast: {
      if (rank == args.root) return store(in, input(ReduceOp::kSum, rank, indices(0, in.count)));
      return store(in, at::full({static_cast<int64_t>(in.count)}, -1.0, at::kDouble));
    }
    case Collective::kBarrier:
      return;
  }
}

uint64_t countWrong(const CollectiveArgs& args, int rank, int size) {
  switch (args.coll) {
    case Collective::kAllReduce:
      return mismatches(args.data,
                        reduced(args.op, args.data.dtype, size, indices(0, args.data.count)));
    case Collective::kReduceScatter: {
      int64_t begin = static_cast<int64_t>(rank * args.output.count);
      return mismatches(args.output, reduced(args.op, args.output.dtype, size,
                                             indices(begin, args.output.count)));
    }
    case Collective::kAllGather: {
      const size_t k = args.data.count;
      uint64_t wrong = 0;
      for (int src = 0; src < size; ++src) {
        wrong +=
            mismatches(args.output.slice(src * k, k), input(ReduceOp::kSum, src, indices(0, k)));
      }
      return wrong;
    }
    case Collective::kBroadcast:
      return mismatches(args.data, input(ReduceOp::kSum, args.root, indices(0, args.data.count)));
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

}  // namespace collie::pattern
