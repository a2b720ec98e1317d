// Replaces the global operator new/delete of a test program to record the largest single
// allocation and the number of allocations while armed, so tests can prove that a corrupt length
// read from a file is refused before anything is sized by it (a 2^62-byte request would throw, or
// worse succeed lazily on an overcommitting kernel), and that a hot path allocates nothing.
// Include it in exactly one source file of a test program.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace kvq_test {
inline std::atomic<bool> g_track_allocations{false};
inline std::atomic<size_t> g_largest_allocation{0};
inline std::atomic<int64_t> g_allocations{0};  // operator new calls while armed, any thread
}  // namespace kvq_test

// GCC 12 sees malloc inside operator new and free inside operator delete after inlining and
// reports a mismatch that is not there: these are the replacement pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t bytes) {
  if (kvq_test::g_track_allocations.load(std::memory_order_relaxed)) {
    kvq_test::g_allocations.fetch_add(1, std::memory_order_relaxed);
    size_t seen = kvq_test::g_largest_allocation.load(std::memory_order_relaxed);
    while (bytes > seen && !kvq_test::g_largest_allocation.compare_exchange_weak(seen, bytes)) {
    }
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t bytes) { return ::operator new(bytes); }
// The nothrow forms too (std::stable_sort's temporary buffer uses one): left to the sanitizer's
// runtime, their blocks would reach the free() below — an alloc-dealloc mismatch under ASan.
void* operator new(size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t bytes, const std::nothrow_t&) noexcept { return ::operator new(bytes, std::nothrow); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
