// Counts every heap allocation of the process, on any thread (a transport's own threads
// too), whoever makes it (operator new, malloc, aligned_alloc): replaces malloc and its
// family with ones that count and then call glibc's. Include it in exactly one file of an
// executable; libraries and plugins loaded later resolve malloc to these definitions.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

extern "C" {
void* __libc_malloc(size_t bytes);
void* __libc_calloc(size_t count, size_t bytes);
void* __libc_realloc(void* p, size_t bytes);
void* __libc_memalign(size_t alignment, size_t bytes);
}

namespace collie::testing {
inline std::atomic<uint64_t> g_allocations{0};
inline thread_local uint64_t t_allocations = 0;  // the executable's own: static TLS
// Allocations made so far, by every thread.
inline uint64_t allocations() { return g_allocations.load(std::memory_order_relaxed); }
// Allocations made so far by the calling thread (not by a store server or event loop).
inline uint64_t threadAllocations() { return t_allocations; }
inline void countAllocation() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  ++t_allocations;
}
}  // namespace collie::testing

extern "C" {
void* malloc(size_t bytes) {
  collie::testing::countAllocation();
  return __libc_malloc(bytes);
}
void* calloc(size_t count, size_t bytes) {
  collie::testing::countAllocation();
  return __libc_calloc(count, bytes);
}
void* realloc(void* p, size_t bytes) {
  collie::testing::countAllocation();
  return __libc_realloc(p, bytes);
}
void* aligned_alloc(size_t alignment, size_t bytes) {
  collie::testing::countAllocation();
  return __libc_memalign(alignment, bytes);
}
void* memalign(size_t alignment, size_t bytes) {
  collie::testing::countAllocation();
  return __libc_memalign(alignment, bytes);
}
int posix_memalign(void** out, size_t alignment, size_t bytes) {
  collie::testing::countAllocation();
  void* p = __libc_memalign(alignment, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}
