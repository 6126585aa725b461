// The host reductions (typed loops) against ATen's, which device memory still uses: the same
// values for every dtype and op, the same bits either way round (ranks reduce pairs in
// either order), NaN and signed zeros included.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "collie/backend.h"
#include "collie/buffer.h"
#include "collie/error.h"
#include "expect.h"
#include "runtime/aten.h"

namespace collie {
namespace {

const DType kDTypes[] = {DType::kF32,  DType::kF64, DType::kF16,
                         DType::kBF16, DType::kI32, DType::kI64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};

Buffer viewOf(const at::Tensor& t, DType d) {
  Buffer b;
  b.data = t.data_ptr();
  b.count = static_cast<size_t>(t.numel());
  b.dtype = d;
  return b;
}

// Values of varied sign and magnitude, with zeros of both signs, an infinity and a NaN
// among the floats.
at::Tensor values(DType d, uint32_t seed, size_t n) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-4, 4);
  at::Tensor t = at::empty({static_cast<int64_t>(n)}, at::kDouble);
  auto* p = t.data_ptr<double>();
  for (size_t i = 0; i < n; ++i) p[i] = u(gen) * (i % 3 == 0 ? 1000 : 1);
  const bool is_float = d != DType::kI32 && d != DType::kI64;
  if (is_float) {
    p[1] = seed % 2 ? 0.0 : -0.0;  // a zero against the other sign's in the other input
    p[2] = seed % 2 ? -0.0 : 0.0;
    p[3] = std::numeric_limits<double>::infinity();
    p[4] = std::numeric_limits<double>::quiet_NaN();
  } else {
    p[5] = 3e9;  // wraps for i32 sums and products
  }
  return t.to(detail::scalarType(d));
}

bool sameBytes(const at::Tensor& a, const at::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(HostReduce, MatchesATenAndIsCommutativeBitForBit) {
  constexpr size_t n = 1031;  // not a multiple of any vector width
  for (DType d : kDTypes) {
    for (ReduceOp op : kOps) {
      at::Tensor a = values(d, 1, n), b = values(d, 2, n);
      at::Tensor ab = a.clone(), ba = b.clone();
      reduceInto(viewOf(ab, d), viewOf(b, d), op);
      reduceInto(viewOf(ba, d), viewOf(a, d), op);
      const std::string what = std::string(dtypeName(d)) + " " + reduceOpName(op);
      EXPECT_TRUE(sameBytes(ab, ba)) << what << ": a op b and b op a differ";
      at::Tensor expected = op == ReduceOp::kSum    ? a + b
                            : op == ReduceOp::kProd ? a * b
                            : op == ReduceOp::kMin  ? at::minimum(a, b)
                                                    : at::maximum(a, b);
      // Equal values (NaN equal to NaN; -0 == +0 for ATen's choice between equal zeros).
      EXPECT_TRUE(at::allclose(ab.to(at::kDouble), expected.to(at::kDouble), 0, 0, true))
          << what << ": differs from ATen";
    }
  }
}

// Every float16 value against a partner, and sums that fall exactly between two float16
// values, in a buffer whose length leaves a tail of 5 past a vector of 8: each sum is the
// float sum rounded to nearest even, bit for bit as c10::Half's conversions give it
// (subnormals, overflow to infinity, signed zeros), and every NaN is the one NaN +0x7E00,
// so that a + b and b + a are the same bytes, whichever instructions the host uses.
TEST(HostReduce, Float16SumsRoundToNearestEvenAndCommuteBitForBit) {
  std::vector<c10::Half> a, b;
  auto pair = [&](float x, float y) {
    a.emplace_back(x);
    b.emplace_back(y);
  };
  auto bits = [&](uint16_t x, uint16_t y) {
    a.emplace_back(x, c10::Half::from_bits());
    b.emplace_back(y, c10::Half::from_bits());
  };
  pair(2048, 1);       // 2049: between 2048 and 2050, to the even 2048
  pair(2050, 1);       // 2051: between 2050 and 2052, to the even 2052
  pair(65504, 65504);  // past float16's largest: infinity
  pair(6e-8f, 6e-8f);  // subnormals
  std::mt19937 gen(3);
  for (uint32_t x = 0; x < 65536; ++x) bits(static_cast<uint16_t>(x), static_cast<uint16_t>(gen()));
  bits(0x7D01, 0x3C00);  // NaNs with payloads and signs of their own, in the last vector
  bits(0x3C00, 0xFE03);
  bits(0x7E00, 0xFE00);  // NaNs of both signs
  for (int tail = 0; tail < 5; ++tail) pair(1.0f + tail, 0.5f);
  bits(0xFC01, 0x7C02);  // and in the tail
  ASSERT_EQ(a.size() % 8, 5u);
  std::vector<c10::Half> ab = a, ba = b;
  reduceInto(Buffer{ab.data(), ab.size(), DType::kF16}, Buffer{b.data(), b.size(), DType::kF16},
             ReduceOp::kSum);
  reduceInto(Buffer{ba.data(), ba.size(), DType::kF16}, Buffer{a.data(), a.size(), DType::kF16},
             ReduceOp::kSum);
  EXPECT_EQ(float(ab[0]), 2048.0f);
  EXPECT_EQ(float(ab[1]), 2052.0f);
  EXPECT_TRUE(std::isinf(float(ab[2])));
  size_t wrong = 0;
  for (size_t i = 0; i < ab.size(); ++i) {
    c10::Half expected(float(a[i]) + float(b[i]));
    if (std::isnan(float(expected))) expected.x = 0x7E00;
    if (ab[i].x != expected.x || ba[i].x != expected.x) {
      if (++wrong <= 5) {
        ADD_FAILURE() << "element " << i << ": " << float(a[i]) << " + " << float(b[i])
                      << " gave bits " << ab[i].x << " (the other way round " << ba[i].x
                      << "), expected " << expected.x;
      }
    }
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(HostReduce, MinAndMaxPickTheSignedZeroAndPropagateNaN) {
  std::vector<float> a{0.0f, -0.0f, std::nanf(""), 1.0f}, b{-0.0f, 0.0f, 1.0f, std::nanf("")};
  Buffer vb{b.data(), b.size(), DType::kF32};
  auto lo = a;
  Buffer vlo{lo.data(), lo.size(), DType::kF32};
  reduceInto(vlo, vb, ReduceOp::kMin);
  EXPECT_TRUE(std::signbit(lo[0]) && std::signbit(lo[1]));
  EXPECT_TRUE(std::isnan(lo[2]) && std::isnan(lo[3]));
  auto hi = a;
  Buffer vhi{hi.data(), hi.size(), DType::kF32};
  reduceInto(vhi, vb, ReduceOp::kMax);
  EXPECT_TRUE(!std::signbit(hi[0]) && !std::signbit(hi[1]));
  EXPECT_TRUE(std::isnan(hi[2]) && std::isnan(hi[3]));
}

TEST(HostReduce, AverageDividesAndTruncatesIntegersTowardZero) {
  std::vector<int32_t> ints{7, -7, 8};
  finishAverage(Buffer{ints.data(), ints.size(), DType::kI32}, ReduceOp::kAvg, 2);
  EXPECT_EQ(ints, (std::vector<int32_t>{3, -3, 4}));
  std::vector<double> reals{3.0, -1.0};
  finishAverage(Buffer{reals.data(), reals.size(), DType::kF64}, ReduceOp::kAvg, 4);
  EXPECT_EQ(reals, (std::vector<double>{0.75, -0.25}));
}

TEST(HostReduce, ScratchBuffersAreAlignedAndCopiesExact) {
  Buffer like;
  like.dtype = DType::kBF16;
  for (size_t count : {0, 1, 3, 1000}) {
    ScratchBuffer s(like, count);
    EXPECT_EQ(s.view().count, count);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.view().data) % 64, 0u);
  }
  std::vector<int64_t> from{1, 2, 3}, to(3);
  copyInto(Buffer{to.data(), 3, DType::kI64}, Buffer{from.data(), 3, DType::kI64});
  EXPECT_EQ(to, from);
}

// Size-only buffers (a simulation without payload): every operation prices, none touches a
// byte. The reduction hook still sees the bytes reduced; a scratch buffer like one allocates
// nothing; the range they point into faults when read; a backend that moves bytes refuses
// one.
namespace {
size_t g_hooked = 0;
}

TEST(SizeOnly, OperationsTouchNothingAndTheRangeFaults) {
  const Buffer a = sizeOnlyBuffer(DType::kF32, size_t{1} << 30);
  const Buffer b = sizeOnlyBuffer(DType::kF32, size_t{1} << 30);
  EXPECT_EQ(a.memory, MemoryKind::kNone);
  EXPECT_EQ(a.bytes(), size_t{4} << 30);
  const ReductionHook previous =
      setReductionHook({[](size_t bytes, void*) { g_hooked += bytes; }, nullptr});
  reduceInto(a, b, ReduceOp::kSum);  // 4 GiB: would fault (or take seconds) if it ran
  copyInto(a.slice(1, 100), b.slice(200, 100));
  finishAverage(a, ReduceOp::kAvg, 3);
  setReductionHook(previous);
  EXPECT_EQ(g_hooked, size_t{4} << 30);
  const ScratchBuffer scratch(a, size_t{1} << 28);
  EXPECT_EQ(scratch.view().memory, MemoryKind::kNone);
  EXPECT_EQ(scratch.view().count, size_t{1} << 28);
  EXPECT_EQ(scratch.view().data, a.data) << "a size-only scratch buffer allocated memory";
  EXPECT_THROW(sizeOnlyBuffer(DType::kF64, size_t{1} << 40), InternalError);
  EXPECT_DEATH(
      { [[maybe_unused]] volatile char c = *static_cast<volatile char*>(a.slice(7, 1).data); }, "");
  EXPECT_TRUE(testing::throwsWith<CommError>(
      [&] { checkTransfer("loopback", 0, 2, 1, a, true, MemoryKind::kHost); }, {"size-only"}))
      << "a size-only buffer was accepted by a backend that moves bytes";
}

}  // namespace
}  // namespace collie
