// SPDX-License-Identifier: Apache-2.0
// The lock of the memory store's and blocked cache's shards: spins briefly, then sleeps. Not API.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>
#endif

namespace ratelimit::detail {

/// A lock whose holders are usually done within a few dozen instructions,
/// but not always (a shard that grows its table, a peek that copies a long
/// sliding log). A waiter first spins a bounded number of times on a relaxed
/// load, which is all the common short section takes; then it sleeps (a
/// futex on Linux) instead of burning a CPU the holder may need to finish.
///
/// The word is 0 (free), 1 (held) or 2 (held, and someone may be asleep).
/// Taking a free lock is one compare-and-swap. Dropping it is a plain load
/// and store when the word is 1: no locked instruction, so that the next
/// check's loads are not held up behind it (on x86 a locked instruction
/// waits for every earlier memory access, which on a large store costs a
/// cache miss per check). A word of 2 is dropped by an exchange and a
/// wake-up call.
///
/// The plain store can race with a waiter that turns 1 into 2 between the
/// holder's load and store; that waiter then misses its wake-up. So sleepers
/// sleep at most `nap` at a time and look again: a lost wake-up costs at most
/// one nap, and only in that narrow race.
///
/// Thread safety: meets the Lockable requirements.
class spin_lock {
 public:
  [[gnu::always_inline]] void lock() noexcept {
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

  [[gnu::always_inline]] void unlock() noexcept {
    if (word_.load(std::memory_order_relaxed) == held) {
      word_.store(free, std::memory_order_release);
      return;
    }
    unlock_and_wake();
  }

  /// One pause of a spin-wait loop (tells the core a spin is under way).
  static void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

 private:
  static constexpr std::uint32_t free = 0;
  static constexpr std::uint32_t held = 1;
  static constexpr std::uint32_t held_with_sleepers = 2;
  /// About a microsecond or two of pause instructions: longer than the usual
  /// critical section, far shorter than a time slice.
  static constexpr unsigned spin_limit = 100;
  /// The longest a sleeper sleeps before it looks at the word again.
  static constexpr std::chrono::microseconds nap{200};

  // The slow paths stay out of line, so that lock() and unlock() inline into
  // every check as a compare-and-swap and a load and store (the futex call
  // in unlock() once kept GCC from inlining it, a call on every check).
  [[gnu::noinline, gnu::cold]] void unlock_and_wake() noexcept {
    word_.store(free, std::memory_order_release);
    wake_one();
  }

  [[gnu::noinline, gnu::cold]] void lock_contended() noexcept {
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
      sleep_while_marked();
    }
  }

  /// Sleeps until woken, until the word is no longer 2, or for one nap.
  void sleep_while_marked() noexcept {
#if defined(__linux__)
    constexpr timespec timeout{0, std::chrono::nanoseconds{nap}.count()};
    // Returns at once if the word is no longer 2; errors (EINTR, EAGAIN,
    // ETIMEDOUT) all mean "look again".
    (void)syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAIT_PRIVATE,
                  held_with_sleepers, &timeout, nullptr, 0);
#else
    std::this_thread::sleep_for(nap);
#endif
  }

  void wake_one() noexcept {
#if defined(__linux__)
    (void)syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, 1,
                  nullptr, nullptr, 0);
#endif
  }

  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                std::atomic<std::uint32_t>::is_always_lock_free);
  std::atomic<std::uint32_t> word_{free};
};

}  // namespace ratelimit::detail
