// SPDX-License-Identifier: Apache-2.0
// An opt-in coarse monotonic clock (Linux CLOCK_MONOTONIC_COARSE): cheaper to read, less exact.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

namespace ratelimit {

#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)

/// CLOCK_MONOTONIC_COARSE as a `clock_source`: the time of the kernel's last
/// timer tick, read from memory the kernel shares with the process (no TSC
/// read). Opt-in: `limiter<P, memory_store<P>, steady_coarse_clock>`.
///
/// Why: on x86 the default clock reads the TSC in a way that waits for every
/// earlier load to complete, so on a large store it keeps a check from
/// overlapping the previous one's cache misses; this clock costs about as
/// much as a load and does not.
///
/// Exactness: the reading lags the true time by up to one tick
/// (`resolution()`, 1 to 10 ms; 4 ms on a common kernel), and every check
/// within one tick is decided at the same time. The library's rules hold
/// exactly on this clock's timeline; measured against real time, a window
/// or interval may end up to one resolution earlier or later than on
/// `steady_clock`, and so may `retry_after` and `reset_after`. So under
/// sliding_window_log (the policy that bounds every window) a limit of N per
/// W is never exceeded in any real-time interval of length W minus one
/// resolution; the other policies' bounds shift by up to one resolution
/// likewise. Use it where that is acceptable (windows of seconds or more)
/// and the check's cost matters.
///
/// Shares its epoch with `steady_clock` on Linux (CLOCK_MONOTONIC, since
/// boot), and so its `time_point` type.
/// Thread safety: stateless; any number of threads.
struct steady_coarse_clock {
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;

  [[nodiscard]] time_point now() const noexcept {
    timespec ts{};
    (void)::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // cannot fail for this clock id
    return time_point{std::chrono::duration_cast<duration>(std::chrono::seconds{ts.tv_sec} +
                                                           std::chrono::nanoseconds{ts.tv_nsec})};
  }

  /// The clock's tick: how far a reading may lag the true time.
  [[nodiscard]] static std::chrono::nanoseconds resolution() noexcept {
    timespec ts{};
    (void)::clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
    return std::chrono::seconds{ts.tv_sec} + std::chrono::nanoseconds{ts.tv_nsec};
  }
};

#endif

}  // namespace ratelimit
