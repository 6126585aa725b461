// Reductions of host memory as typed loops: for the small buffers of a latency-bound
// collective a tensor library's dispatch (wrapping two views, choosing a kernel) costs more
// than the arithmetic. Compiled with -O3 so that the loops vectorise.
#pragma once

#include "collie/buffer.h"

namespace collie::detail {

// dst[i] = op(dst[i], src[i]) on host views of the same count and dtype. Every op is
// commutative bit for bit (min/max pick -0 / +0 between equal zeros, NaN wins), so two ranks
// that reduce the same pair in either order get the same bytes; integers wrap on overflow.
void reduceHost(const Buffer& dst, const Buffer& src, ReduceOp op);

// data[i] /= group_size (truncated toward zero for integers) on a host view.
void divideHost(const Buffer& data, int group_size);

}  // namespace collie::detail
