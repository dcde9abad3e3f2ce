// SPDX-License-Identifier: Apache-2.0
// The default clock: monotonic, so a wall-clock jump never moves a window.
#pragma once

#include <chrono>

namespace ratelimit {

/// std::chrono::steady_clock as a `clock_source`.
/// Thread safety: stateless; any number of threads.
struct steady_clock {
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;
  [[nodiscard]] time_point now() const noexcept { return std::chrono::steady_clock::now(); }
};

/// std::chrono::system_clock as a `clock_source`: windows align to the Unix
/// epoch, but a wall-clock jump moves them. Prefer steady_clock in process.
/// Thread safety: stateless; any number of threads.
struct system_clock {
  using duration = std::chrono::system_clock::duration;
  using time_point = std::chrono::system_clock::time_point;
  [[nodiscard]] time_point now() const noexcept { return std::chrono::system_clock::now(); }
};

}  // namespace ratelimit
