// The bridge between collie's buffer views and ATen, for the application files that use ATen
// on them (runtime/device.cc defines it).
#pragma once

#include <ATen/core/Tensor.h>

#include "collie/buffer.h"

namespace collie::detail {

at::ScalarType scalarType(DType dtype);
// Tensor options matching the buffer's dtype, memory kind and device.
at::TensorOptions tensorOptions(const Buffer& buf);
// A 1-D tensor aliasing the buffer's memory (no copy, no ownership).
at::Tensor wrap(const Buffer& buf);

}  // namespace collie::detail
