// A counting global operator new for the distributed_test binary, so tests can assert that
// steady-state encoding, decoding, Send and Recv never allocate
// (distributed_test::AllocationCount). In its own translation unit so the replaced operators are
// never inlined into their callers.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "engine/distributed/distributed_test_util.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SPECD_DISTRIBUTED_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPECD_DISTRIBUTED_TEST_SANITIZED 1
#endif

#ifdef SPECD_DISTRIBUTED_TEST_SANITIZED
// ASan and TSan builds (tools/ci/sanitizers.sh): the sanitizer runtime defines operator new, so
// count through its allocation hook instead (every heap allocation, malloc included).
#include <sanitizer/allocator_interface.h>
namespace {
void CountAllocation(const volatile void*, size_t) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
}
void IgnoreFree(const volatile void*) {}
[[maybe_unused]] const int g_hooks_installed =
    __sanitizer_install_malloc_and_free_hooks(CountAllocation, IgnoreFree);
}  // namespace
#else
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
#endif  // SPECD_DISTRIBUTED_TEST_SANITIZED

int64_t specd::distributed_test::AllocationCount() {
  return g_allocations.load(std::memory_order_relaxed);
}
