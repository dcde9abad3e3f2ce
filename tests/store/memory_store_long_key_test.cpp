// SPDX-License-Identifier: Apache-2.0
// memory_store refusing a key too long for a node (2^32 bytes or more).
// Hashing the 4 GiB key is most of the test: this file is built with -O2
// (tests/store/CMakeLists.txt), where it takes about 2 s, against 18 s
// unoptimised; under ThreadSanitizer the mapping alone takes a minute, and
// the test, one thread, is skipped there.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ratelimit/decision.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"

#if defined(__SANITIZE_THREAD__)
#define RATELIMIT_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RATELIMIT_TEST_TSAN 1
#endif
#endif

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::memory_store;
using ratelimit::timestamp;

// Verifies that a key of 2^32 bytes, whose size a node cannot keep in its
// 32 bits, is refused with std::length_error naming its size, and nothing
// is inserted (before, the size was cut to its low 32 bits, the key never
// matched its own node again, and every check inserted a new one: no limit
// and unbounded memory). The key is 4 GiB of reserved zero pages (read,
// never written: no memory is taken); hashing it takes a few seconds.
TEST(MemoryStoreNodeFailure, KeyTooLongForANodeIsRefused) {
#ifdef RATELIMIT_TEST_TSAN
  GTEST_SKIP() << "one thread; mapping 4 GiB under ThreadSanitizer takes a minute";
#endif
  if constexpr (sizeof(std::size_t) < 8) GTEST_SKIP() << "needs a 64-bit size_t";
  const std::size_t size = std::size_t{std::numeric_limits<std::uint32_t>::max()} + 1;
  void* mem = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) GTEST_SKIP() << "cannot reserve 4 GiB of address space";
  const std::string_view key(static_cast<const char*>(mem), size);
  memory_store<ratelimit::fixed_window> store;
  const ratelimit::fixed_window::config cfg{ratelimit::rate{3, 1s}};
  try {
    (void)store.apply(cfg, key, timestamp{1000}, 1, access::consume);
    ADD_FAILURE() << "a key of 2^32 bytes was accepted";
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("4294967296 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.size(), 0U);
  ::munmap(mem, size);
}

}  // namespace
