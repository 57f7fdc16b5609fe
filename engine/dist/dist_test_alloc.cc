// A counting global operator new for the dist_test binary, so tests can assert that steady-state
// encoding, decoding, Send and Recv never allocate (dist_test::AllocationCount). In its own
// translation unit so the replaced operators are never inlined into their callers.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "engine/dist/dist_test_util.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

int64_t specd::dist_test::AllocationCount() {
  return g_allocations.load(std::memory_order_relaxed);
}
