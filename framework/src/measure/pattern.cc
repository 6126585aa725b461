// The closed forms behind pattern.h, as typed loops (ATen temporaries cost ~100 ms per
// million elements; these loops a few). Rank r's value at element i depends on i only
// through a residue, key(i) = mix(i) mod period, so the reduction over ranks is computed once
// per residue and looked up. The residue is of a hash of i, not of i: the sequence has no
// period, so two equal-size blocks of a result that a scheduler swapped (or put at the
// wrong offset) differ, whatever the block size.
#include "measure/pattern.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <map>
#include <mutex>
#include <vector>

#include "collie/error.h"

namespace collie::pattern {
namespace {

// Calls f(T{}) with the C++ type of `dtype`.
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kF64:
      return f(double{});
    case DType::kF16:
      return f(c10::Half{});
    case DType::kBF16:
      return f(c10::BFloat16{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kI64:
      return f(int64_t{});
  }
  throw InternalError("unknown dtype");
}

// The period of rank contributions for `op`, and the value rank r puts at index i.
int period(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd:
      return 3;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return 11;
    default:
      return 5;
  }
}

double value(ReduceOp op, int r, uint64_t i) {
  switch (op) {
    case ReduceOp::kProd:
      return (i + r) % 3 == 0 ? 2.0 : 1.0;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<double>((i + 7 * static_cast<uint64_t>(r)) % 11) - 5.0;
    default:
      return static_cast<double>(i % 5) + r + 1;
  }
}

// The contribution of rank r, one value per residue.
std::vector<double> contribution(ReduceOp op, int r) {
  std::vector<double> table(period(op));
  for (int k = 0; k < period(op); ++k) table[k] = value(op, r, k);
  return table;
}

// The reduction over all ranks, one value per residue.
std::vector<double> reduction(ReduceOp op, DType dtype, int size) {
  std::vector<double> acc = contribution(op, 0);
  for (int r = 1; r < size; ++r) {
    std::vector<double> v = contribution(op, r);
    for (size_t k = 0; k < acc.size(); ++k) {
      switch (op) {
        case ReduceOp::kProd:
          acc[k] *= v[k];
          break;
        case ReduceOp::kMin:
          acc[k] = std::min(acc[k], v[k]);
          break;
        case ReduceOp::kMax:
          acc[k] = std::max(acc[k], v[k]);
          break;
        default:
          acc[k] += v[k];
          break;
      }
    }
  }
  if (op == ReduceOp::kAvg) {
    const bool integral = dtype == DType::kI32 || dtype == DType::kI64;
    for (double& a : acc) a = integral ? std::trunc(a / size) : a / size;
  }
  return acc;
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

// Host-side work on a buffer that may live on a device: run `f` on a host view and copy
// back (`write`) or from (`!write`) the device around it.
template <typename F>
void onHost(const Buffer& buf, bool write, F&& f) {
  if (buf.memory == MemoryKind::kHost) return f(buf);
  Buffer host_like = buf;
  host_like.memory = MemoryKind::kHost;
  ScratchBuffer host(host_like, buf.count);
  if (!write) copyInto(host.view(), buf);
  f(host.view());
  if (write) copyInto(buf, host.view());
}

// SplitMix64's finaliser: consecutive indices map to unrelated 64-bit values.
uint64_t mix(uint64_t i) {
  i += 0x9E3779B97F4A7C15ull;
  i = (i ^ (i >> 30)) * 0xBF58476D1CE4E5B9ull;
  i = (i ^ (i >> 27)) * 0x94D049BB133111EBull;
  return i ^ (i >> 31);
}

// The residue element `index` of a buffer uses in a table of `m` entries.
size_t key(uint64_t index, size_t m) { return m == 1 ? 0 : static_cast<size_t>(mix(index) % m); }

// key(i, m) for the first kCachedKeys indices, computed once per m: filling and checking a
// million elements per rank and case spent most of a conformance run in the hash.
constexpr size_t kCachedKeys = size_t{1} << 21;

const std::vector<uint8_t>& cachedKeys(size_t m) {
  static std::mutex mu;
  static std::map<size_t, std::vector<uint8_t>> tables;  // nodes never move
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables.find(m);
  if (it == tables.end()) {
    std::vector<uint8_t> keys(kCachedKeys);
    for (size_t i = 0; i < kCachedKeys; ++i) keys[i] = static_cast<uint8_t>(key(i, m));
    it = tables.emplace(m, std::move(keys)).first;
  }
  return it->second;
}

// Calls f(j, table index) for j in [0, count), the index being key(first + j, m).
template <typename F>
void forEachKey(uint64_t first, size_t count, size_t m, F&& f) {
  if (m == 1) {
    for (size_t j = 0; j < count; ++j) f(j, size_t{0});
    return;
  }
  if (m > 256 || first + count > kCachedKeys) {
    for (size_t j = 0; j < count; ++j) f(j, key(first + j, m));
    return;
  }
  const uint8_t* keys = cachedKeys(m).data() + first;
  for (size_t j = 0; j < count; ++j) f(j, size_t{keys[j]});
}

// buf[j] = table[key(first + j)].
void store(const Buffer& buf, const std::vector<double>& table, uint64_t first) {
  onHost(buf, true, [&](const Buffer& host) {
    dispatch(host.dtype, [&](auto zero) {
      using T = decltype(zero);
      std::vector<T> typed;
      for (double v : table) typed.push_back(static_cast<T>(v));
      auto* p = static_cast<T*>(host.data);
      forEachKey(first, host.count, table.size(), [&](size_t j, size_t k) { p[j] = typed[k]; });
    });
  });
}

void storeConstant(const Buffer& buf, double v) { store(buf, {v}, 0); }

// Elements of buf that differ from table[key(first + j)].
uint64_t mismatches(const Buffer& buf, const std::vector<double>& table, uint64_t first) {
  uint64_t wrong = 0;
  onHost(buf, false, [&](const Buffer& host) {
    const double tol = tolerance(host.dtype);
    dispatch(host.dtype, [&](auto zero) {
      using T = decltype(zero);
      const auto* p = static_cast<const T*>(host.data);
      forEachKey(first, host.count, table.size(), [&](size_t j, size_t k) {
        const double expected = table[k];
        const double got = static_cast<double>(p[j]);
        // Integers compare exactly (tol 0); NaN never passes.
        if (!(std::fabs(got - expected) <= tol * std::max(1.0, std::fabs(expected)))) ++wrong;
      });
    });
  });
  return wrong;
}

// Rank r's rounding input at element i: (1 + u)·2^e, u in [0, 1), e in [-8, 7], from a hash.
double roundingValue(int rank, uint64_t i) {
  const uint64_t h = mix(i * 0x100000001B3ull + static_cast<uint64_t>(rank) * 0x9E3779B9ull + 1);
  const double u = static_cast<double>(h >> 11) * 0x1p-53;
  return std::ldexp(1.0 + u, static_cast<int>(h & 15) - 8);
}

// The unit roundoff of a float dtype.
double roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return 0x1p-53;
    case DType::kF32:
      return 0x1p-24;
    case DType::kF16:
      return 0x1p-11;
    case DType::kBF16:
      return 0x1p-8;
    default:
      throw InternalError("rounding inputs are for float dtypes");
  }
}

}  // namespace

void fillRounding(const CollectiveArgs& args, int rank) {
  onHost(args.data, true, [&](const Buffer& host) {
    dispatch(host.dtype, [&](auto zero) {
      using T = decltype(zero);
      auto* p = static_cast<T*>(host.data);
      for (size_t j = 0; j < host.count; ++j) p[j] = static_cast<T>(roundingValue(rank, j));
    });
  });
}

uint64_t countWrongRounding(const CollectiveArgs& args, int size) {
  uint64_t wrong = 0;
  const double u = roundoff(args.data.dtype);
  onHost(args.data, false, [&](const Buffer& host) {
    dispatch(host.dtype, [&](auto zero) {
      using T = decltype(zero);
      const auto* p = static_cast<const T*>(host.data);
      for (size_t j = 0; j < host.count; ++j) {
        double exact = 0;  // every addend is positive: the bound is relative to the sum
        for (int r = 0; r < size; ++r)
          exact += static_cast<double>(static_cast<T>(roundingValue(r, j)));
        if (args.op == ReduceOp::kAvg) exact /= size;
        const double got = static_cast<double>(p[j]);
        if (!(std::fabs(got - exact) <= (size + 1) * u * exact)) ++wrong;
      }
    });
  });
  return wrong;
}

void fillInput(const CollectiveArgs& args, int rank, int /*size*/) {
  switch (args.coll) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
      return store(args.data, contribution(args.op, rank), 0);
    case Collective::kAllGather:
      storeConstant(args.output, -1.0);
      return store(args.data, contribution(ReduceOp::kSum, rank), 0);
    case Collective::kBroadcast:
      if (rank == args.root) return store(args.data, contribution(ReduceOp::kSum, rank), 0);
      return storeConstant(args.data, -1.0);
    case Collective::kBarrier:
      return;
  }
}

uint64_t countWrong(const CollectiveArgs& args, int rank, int size) {
  switch (args.coll) {
    case Collective::kAllReduce:
      return mismatches(args.data, reduction(args.op, args.data.dtype, size), 0);
    case Collective::kReduceScatter:
      return mismatches(args.output, reduction(args.op, args.output.dtype, size),
                        static_cast<uint64_t>(rank) * args.output.count);
    case Collective::kAllGather: {
      const size_t k = args.data.count;
      uint64_t wrong = 0;
      for (int src = 0; src < size; ++src) {
        wrong += mismatches(args.output.slice(src * k, k), contribution(ReduceOp::kSum, src), 0);
      }
      return wrong;
    }
    case Collective::kBroadcast:
      return mismatches(args.data, contribution(ReduceOp::kSum, args.root), 0);
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

}  // namespace collie::pattern
