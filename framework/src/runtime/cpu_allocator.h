// The shape of collie's LibTorch CPU allocators (the emulated device's, the memory ledger's).
// Needs LibTorch's C++ frontend headers (torch/version.h).
#pragma once

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>

namespace collie::detail {

// A LibTorch CPU allocator whose blocks come from `Take(bytes)` (a DataPtr whose data and
// context are the same pointer, as LibTorch's raw_allocate requires) and go back through
// `Release(data)`, over the allocator interface as LibTorch 2.3 changed it (allocate no
// longer const; copy_data added).
template <c10::DataPtr (*Take)(size_t), void (*Release)(void*)>
class CpuAllocator final : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t bytes) override { return Take(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t bytes) const override { return Take(bytes); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return Release; }
};

}  // namespace collie::detail
