// SPDX-License-Identifier: Apache-2.0
// The lock of the memory store's and blocked cache's shards: spins briefly, then sleeps. Not API.
#pragma once

#include <atomic>
#include <cstdint>

namespace ratelimit::detail {

/// A lock whose holders are usually done within a few dozen instructions,
/// but not always (a shard that grows its table, a peek that copies a long
/// sliding log). A waiter first spins a bounded number of times on a relaxed
/// load, which is all it takes for the common short section; after that it
/// sleeps in `std::atomic::wait` (a futex on Linux) instead of burning a CPU
/// that the holder may need to finish.
///
/// The lock word is 0 (free), 1 (held, nobody asleep) or 2 (held, maybe
/// someone asleep). Taking a free lock is one compare-and-swap; dropping it is
/// one exchange, and only a word of 2 costs a wake-up call. (A plain store
/// cannot drop it: a waiter could announce itself between the holder's read
/// of the word and its store, and would then never be woken.)
///
/// Thread safety: meets the Lockable requirements.
class spin_lock {
 public:
  void lock() noexcept {
    std::uint32_t expected = free;
    if (word_.compare_exchange_strong(expected, held, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      return;
    }
    lock_contended();
  }

  [[nodiscard]] bool try_lock() noexcept {
    std::uint32_t expected = free;
    return word_.load(std::memory_order_relaxed) == free &&
           word_.compare_exchange_strong(expected, held, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }

  void unlock() noexcept {
    if (word_.exchange(free, std::memory_order_release) == held_with_sleepers) word_.notify_one();
  }

 private:
  static constexpr std::uint32_t free = 0;
  static constexpr std::uint32_t held = 1;
  static constexpr std::uint32_t held_with_sleepers = 2;
  /// About a microsecond or two of pause instructions: longer than the usual
  /// critical section, far shorter than a time slice.
  static constexpr unsigned spin_limit = 100;

  void lock_contended() noexcept {
    for (unsigned spins = 0; spins < spin_limit; ++spins) {
      relax();
      std::uint32_t seen = word_.load(std::memory_order_relaxed);
      if (seen == free && word_.compare_exchange_weak(seen, held, std::memory_order_acquire,
                                                      std::memory_order_relaxed)) {
        return;
      }
      // Someone already sleeps: queue behind them instead of spinning on.
      if (seen == held_with_sleepers) break;
    }
    // Mark the lock as having a sleeper; the exchange also takes it if it
    // was free. A thread that takes it this way leaves the word at 2, so its
    // unlock wakes the next sleeper (at worst one needless wake-up).
    while (word_.exchange(held_with_sleepers, std::memory_order_acquire) != free) {
      word_.wait(held_with_sleepers, std::memory_order_relaxed);
    }
  }

  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  std::atomic<std::uint32_t> word_{free};
};

}  // namespace ratelimit::detail
