// A Buffer over host memory the test owns, its dtype taken from the element type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "collie/buffer.h"

namespace collie::testing {

template <typename T>
Buffer hostView(T* data, size_t count) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>,
                "a host view of f32, f64, i32 or i64");
  Buffer b;
  b.data = data;
  b.count = count;
  b.dtype = std::is_same_v<T, float>     ? DType::kF32
            : std::is_same_v<T, double>  ? DType::kF64
            : std::is_same_v<T, int32_t> ? DType::kI32
                                         : DType::kI64;
  return b;
}

template <typename T>
Buffer hostView(std::vector<T>& v) {
  return hostView(v.data(), v.size());
}

}  // namespace collie::testing
