// SPDX-License-Identifier: Apache-2.0
// A clock moved by hand, for tests and for replaying recorded history.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

namespace ratelimit {

/// A settable clock counting microseconds from an arbitrary epoch (0 at start).
/// Copies share one time, so a test can hold a copy and move the limiter's clock.
/// Thread safety: any number of threads may read and move it.
class manual_clock {
 public:
  using duration = std::chrono::microseconds;
  struct epoch_clock {
    using duration = std::chrono::microseconds;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<epoch_clock>;
    static constexpr bool is_steady = false;
  };
  using time_point = epoch_clock::time_point;

  /// @param start initial time, microseconds since the clock's epoch
  explicit manual_clock(duration start = duration{0})
      : now_(std::make_shared<std::atomic<std::int64_t>>(start.count())) {}

  [[nodiscard]] time_point now() const noexcept {
    return time_point{duration{now_->load(std::memory_order_acquire)}};
  }
  /// Sets the time; may move backwards (tests of SPEC "time never runs backwards").
  void set(duration since_epoch) noexcept {
    now_->store(since_epoch.count(), std::memory_order_release);
  }
  /// Moves the time by `d` (may be negative).
  void advance(duration d) noexcept { now_->fetch_add(d.count(), std::memory_order_acq_rel); }

 private:
  std::shared_ptr<std::atomic<std::int64_t>> now_;
};

}  // namespace ratelimit
