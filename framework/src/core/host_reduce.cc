#include "core/host_reduce.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "collie/error.h"

namespace collie::detail {
namespace {

template <typename T, typename F>
void each(const Buffer& dst, const Buffer& src, F f) {
  T* __restrict__ d = static_cast<T*>(dst.data);
  const T* __restrict__ s = static_cast<const T*>(src.data);
  for (size_t i = 0, n = dst.count; i < n; ++i) d[i] = f(d[i], s[i]);
}

// The smaller of two floats: NaN if either is, -0 between equal zeros, so min(a, b) and
// min(b, a) are the same bits.
template <typename F>
F floatMin(F a, F b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

template <typename F>
F floatMax(F a, F b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

template <typename F>
void reduceFloat(const Buffer& dst, const Buffer& src, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return each<F>(dst, src, [](F a, F b) { return a + b; });
    case ReduceOp::kProd:
      return each<F>(dst, src, [](F a, F b) { return a * b; });
    case ReduceOp::kMin:
      return each<F>(dst, src, floatMin<F>);
    case ReduceOp::kMax:
      return each<F>(dst, src, floatMax<F>);
  }
}

// A float16 sum: the pair widened to float exactly, added in float and rounded to nearest
// even (as ATen does), and any NaN written as +0x7E00. Which NaN an addition of two NaNs
// returns depends on the order the compiler put the operands in, and c10 keeps that NaN's
// sign: one NaN keeps the sum commutative bit for bit (as bfloat16's conversion does).
c10::Half sumHalf(c10::Half a, c10::Half b) {
  c10::Half sum(float(a) + float(b));
  if ((sum.x & 0x7FFF) > 0x7C00) sum.x = 0x7E00;
  return sum;
}

#if defined(__x86_64__)
// sumHalf 8 elements at a time with the CPU's conversion instructions (c10::Half's run in
// software, about 30 times slower: a fp16 codec's all-reduce spent most of its reduction
// time there), the same bits.
__attribute__((target("avx,f16c"))) void sumHalfF16c(c10::Half* __restrict__ d,
                                                     const c10::Half* __restrict__ s, size_t n) {
  const __m128i magnitude = _mm_set1_epi16(0x7FFF), infinity = _mm_set1_epi16(0x7C00);
  const __m128i quiet_nan = _mm_set1_epi16(0x7E00);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    const __m128i sum = _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(sum, magnitude), infinity);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_or_si128(_mm_and_si128(nan, quiet_nan), _mm_andnot_si128(nan, sum)));
  }
  for (; i < n; ++i) d[i] = sumHalf(d[i], s[i]);
}

bool haveF16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

// Half and bfloat16: the arithmetic in float, rounded back to nearest even (as ATen does).
template <typename H>
void reduceHalf(const Buffer& dst, const Buffer& src, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if constexpr (std::is_same_v<H, c10::Half>) {
#if defined(__x86_64__)
        if (haveF16c()) {
          return sumHalfF16c(static_cast<H*>(dst.data), static_cast<const H*>(src.data), dst.count);
        }
#endif
        return each<H>(dst, src, sumHalf);
      }
      return each<H>(dst, src, [](H a, H b) { return H(float(a) + float(b)); });
    case ReduceOp::kProd:
      return each<H>(dst, src, [](H a, H b) { return H(float(a) * float(b)); });
    case ReduceOp::kMin:
      return each<H>(dst, src, [](H a, H b) { return H(floatMin(float(a), float(b))); });
    case ReduceOp::kMax:
      return each<H>(dst, src, [](H a, H b) { return H(floatMax(float(a), float(b))); });
  }
}

// Integers wrap on overflow, computed unsigned (signed overflow is undefined in C++).
template <typename I>
void reduceInteger(const Buffer& dst, const Buffer& src, ReduceOp op) {
  using U = std::make_unsigned_t<I>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return each<I>(dst, src, [](I a, I b) { return static_cast<I>(U(a) + U(b)); });
    case ReduceOp::kProd:
      return each<I>(dst, src, [](I a, I b) { return static_cast<I>(U(a) * U(b)); });
    case ReduceOp::kMin:
      return each<I>(dst, src, [](I a, I b) { return a < b ? a : b; });
    case ReduceOp::kMax:
      return each<I>(dst, src, [](I a, I b) { return a > b ? a : b; });
  }
}

template <typename T, typename F>
void eachOne(const Buffer& data, F f) {
  T* __restrict__ d = static_cast<T*>(data.data);
  for (size_t i = 0, n = data.count; i < n; ++i) d[i] = f(d[i]);
}

}  // namespace

void reduceHost(const Buffer& dst, const Buffer& src, ReduceOp op) {
  switch (dst.dtype) {
    case DType::kF32:
      return reduceFloat<float>(dst, src, op);
    case DType::kF64:
      return reduceFloat<double>(dst, src, op);
    case DType::kF16:
      return reduceHalf<c10::Half>(dst, src, op);
    case DType::kBF16:
      return reduceHalf<c10::BFloat16>(dst, src, op);
    case DType::kI32:
      return reduceInteger<int32_t>(dst, src, op);
    case DType::kI64:
      return reduceInteger<int64_t>(dst, src, op);
  }
  throw InternalError("reduceHost: unknown dtype");
}

void divideHost(const Buffer& data, int group_size) {
  switch (data.dtype) {
    case DType::kF32:
      return eachOne<float>(data, [=](float a) { return a / static_cast<float>(group_size); });
    case DType::kF64:
      return eachOne<double>(data, [=](double a) { return a / group_size; });
    case DType::kF16:
      return eachOne<c10::Half>(
          data, [=](c10::Half a) { return c10::Half(float(a) / static_cast<float>(group_size)); });
    case DType::kBF16:
      return eachOne<c10::BFloat16>(data, [=](c10::BFloat16 a) {
        return c10::BFloat16(float(a) / static_cast<float>(group_size));
      });
    case DType::kI32:
      return eachOne<int32_t>(data, [=](int32_t a) { return a / group_size; });
    case DType::kI64:
      return eachOne<int64_t>(data, [=](int64_t a) { return a / group_size; });
  }
  throw InternalError("divideHost: unknown dtype");
}

}  // namespace collie::detail
