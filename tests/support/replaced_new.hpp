// SPDX-License-Identifier: Apache-2.0
// The global operator new and delete replaced, for the allocation-failure
// tests: every allocation asks rltest::allocation_fails() first and throws
// std::bad_alloc when it says so. Include this from exactly one source file
// of a test binary, which defines rltest::allocation_fails() (or uses
// countdown_fails() below).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace rltest {

/// True when the allocation being made should fail. Defined by the binary.
bool allocation_fails() noexcept;

/// Allocations on this thread that succeed before one fails; negative: none
/// fails. After the failing one it is negative again.
inline thread_local long allocations_before_failure = -1;

/// The usual rule: the allocation that finds allocations_before_failure at 0
/// fails.
inline bool countdown_fails() noexcept {
  if (allocations_before_failure == 0) {
    allocations_before_failure = -1;
    return true;
  }
  if (allocations_before_failure > 0) --allocations_before_failure;
  return false;
}

inline void* counted_allocation(std::size_t size) {
  if (allocation_fails()) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

}  // namespace rltest

// The array forms too: the sanitizers' runtimes define their own, which the
// standard's default (forwarding to operator new) would otherwise not reach.
void* operator new(std::size_t size) {
  return rltest::counted_allocation(size);
}
void* operator new[](std::size_t size) {
  return rltest::counted_allocation(size);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
