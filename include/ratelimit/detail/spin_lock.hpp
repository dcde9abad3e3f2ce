// SPDX-License-Identifier: Apache-2.0
// A small test-and-test-and-set lock for the memory store's shards. Not API.
#pragma once

#include <atomic>
#include <thread>

namespace ratelimit::detail {

/// Lock for critical sections of a few dozen instructions: one atomic
/// exchange to take it, a plain release store to drop it (std::mutex costs a
/// second locked instruction on unlock). Waiters spin briefly on a relaxed
/// load, then yield, so oversubscribed threads still make progress.
/// Thread safety: meets the Lockable requirements.
class spin_lock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (unsigned spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 64) {
          relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  [[nodiscard]] bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::atomic<bool> locked_{false};
};

}  // namespace ratelimit::detail
