// Reductions of host memory as typed loops: for the small buffers of a latency-bound
// collective a tensor library's dispatch (wrapping two views, choosing a kernel) costs more
// than the arithmetic. Compiled with -O3 so that the loops vectorise.
#pragma once

#include "collie/buffer.h"

namespace collie::detail {

// dst[i] = op(dst[i], src[i]) on host views of the same count and dtype. Every op is
// commutative bit for bit (min/max pick -0 / +0 between equal zeros, NaN wins), so two ranks
// that reduce the same pair in either order get the same bytes, except where both are NaNs:
// which NaN comes out then follows the operand order; integers wrap on overflow.
// A float16 or bfloat16 sum writes one NaN whatever NaNs went in (+0x7E00; 0x7FC0, as
// c10's bfloat16 conversion does), on every host: float16 sums use F16C where the CPU has
// it, with the scalar loop's bits.
void reduceHost(const Buffer& dst, const Buffer& src, ReduceOp op);

// data[i] /= group_size (truncated toward zero for integers) on a host view.
void divideHost(const Buffer& data, int group_size);

}  // namespace collie::detail
