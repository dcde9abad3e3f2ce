// SPDX-License-Identifier: Apache-2.0
// Sliding-window counter: two fixed-window counts, the previous one weighted.
//
// Algorithm: with window k = floor(t / W) and e = t - kW, a request of cost c
// is admitted iff n_(k-1) * ((W - e) / W) + n_k + c <= limit, evaluated in IEEE
// double in exactly that order (so C++ and the Redis Lua script agree bit for
// bit). Accuracy: an approximation of the sliding log that assumes the previous
// window's requests were spread evenly; it can admit more or fewer than the log.
// Memory: 24 bytes of state per key. See
// https://blog.cloudflare.com/counting-things-a-lot-of-different-things/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// Sliding-window counter policy (see file comment).
struct sliding_window_counter {
  static constexpr std::string_view name = "sliding_counter";

  /// Validated configuration: a rate and window_options.
  using config = detail::window_config<sliding_window_counter>;

  /// Value-initialised = key never seen.
  struct state {
    std::int64_t window = 0;  ///< index k of `current`
    units current = 0;        ///< units recorded in window k
    units previous = 0;       ///< units recorded in window k - 1
    friend bool operator==(const state&, const state&) = default;
  };

  /// prev * ((W - e) / W), rounded exactly as written. The product goes
  /// through a volatile so that no compiler fuses it with the addition that
  /// follows into an FMA, which would round differently from Lua.
  [[nodiscard]] static double weighted(units prev, std::int64_t w, std::int64_t e) noexcept {
    const double weight = static_cast<double>(w - e) / static_cast<double>(w);
    const volatile double product = static_cast<double>(prev) * weight;
    return product;
  }

  /// The admission test once `weighted` is known: (weighted + cur) + m <= limit.
  [[nodiscard]] static bool fits(double weighted_prev, units cur, units m, units limit) noexcept {
    const double with_current = weighted_prev + static_cast<double>(cur);
    return with_current + static_cast<double>(m) <= static_cast<double>(limit);
  }

  /// prev * ((W - e) / W) + cur + m <= limit, in exactly that order.
  [[nodiscard]] static bool passes(units prev, units cur, std::int64_t w, std::int64_t e, units m,
                                   units limit) noexcept {
    return fits(weighted(prev, w, e), cur, m, limit);
  }

  /// Smallest offset in [lo, w - 1] at which `passes` holds, or -1. The test
  /// is monotone in the offset (the weight only shrinks), so bisect.
  [[nodiscard]] static std::int64_t first_passing(units prev, units cur, std::int64_t w,
                                                  std::int64_t lo, units cost,
                                                  units limit) noexcept {
    std::int64_t hi = w - 1;
    if (lo > hi || !passes(prev, cur, w, hi, cost, limit)) return -1;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (passes(prev, cur, w, mid, cost, limit)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<false>(cfg, s, now, cost);
  }
  /// As step, recording the request even when rejected (access::force): the
  /// current count may pass the limit (saturating at 2^52).
  static decision force(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<true>(cfg, s, now, cost);
  }
  /// `step` (Forced = false) or `force` (true), one instantiation each so
  /// that a plain check carries no trace of the forced path.
  template <bool Forced>
  [[gnu::always_inline]] static decision step_as(const config& cfg, state& s, timestamp now,
                                                 units cost) noexcept {
    const std::int64_t w = cfg.period_us();
    const units limit = cfg.limit();
    const bool seen = s.current > 0 || s.previous > 0;
    std::int64_t t = now.count();
    // The window of `now`, divided before the state is read: written after
    // the clamp below, the division waited for the key's cache miss.
    std::int64_t k = detail::floor_div(t, w);
    // Time never runs backwards inside a key: decide at the stored window's
    // start (whose index is the stored one).
    if (seen && t < s.window * w) {
      t = s.window * w;
      k = s.window;
    }
    const std::int64_t e = t - k * w;
    units cur = 0;
    units prev = 0;
    if (seen && k == s.window) {
      cur = s.current;
      prev = s.previous;
    } else if (seen && k == s.window + 1) {
      prev = s.current;
    }

    decision d;
    d.limit = limit;
    // The previous window's weighted count does not change with this
    // decision: compute it once for the test and for `remaining`.
    const double weighted_prev = weighted(prev, w, e);
    d.allowed = fits(weighted_prev, cur, cost, limit);
    if (d.allowed || Forced || cfg.count_rejected()) {
      cur = detail::add_saturated(cur, cost);
      s = state{k, cur, prev};
      d.counted = true;
    }
    d.remaining = remaining(weighted_prev, cur, limit);
    if (!d.allowed) {
      if (cost > limit) {
        d.retry_after = never;
      } else if (const auto in_k = first_passing(prev, cur, w, e + 1, cost, limit); in_k >= 0) {
        d.retry_after = std::chrono::microseconds{in_k - e};
      } else if (const auto in_next = first_passing(cur, 0, w, 0, cost, limit); in_next >= 0) {
        d.retry_after = std::chrono::microseconds{(k + 1) * w + in_next - t};
      } else {
        d.retry_after = std::chrono::microseconds{(k + 2) * w - t};
      }
    }
    if (cur > 0) {
      d.reset_after = std::chrono::microseconds{(k + 2) * w - t};
    } else if (prev > 0) {
      d.reset_after = std::chrono::microseconds{(k + 1) * w - t};
    }
    return d;
  }

  /// Largest m >= 0 that passes the admission test now (0 if none does).
  [[nodiscard]] static units remaining(double weighted_prev, units cur, units limit) noexcept {
    const double with_current = weighted_prev + static_cast<double>(cur);
    const double room = static_cast<double>(limit) - with_current;
    // Start from the real-number answer, then settle it with the exact test.
    // (room is at most limit <= 2^50 here, so truncation is floor, without
    // the call to floor() that every check would otherwise make.)
    units m = room >= 1.0 ? static_cast<units>(room) : 0;
    while (m > 0 && !fits(weighted_prev, cur, m, limit)) --m;
    while (fits(weighted_prev, cur, m + 1, limit)) ++m;
    return m;
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    if (s.current == 0 && s.previous == 0) return true;
    const std::int64_t k = detail::floor_div(now.count(), cfg.period_us());
    return k >= s.window + 2 || (k == s.window + 1 && s.current == 0);
  }
};

namespace detail {
/// `sliding_window_counter::step` is its `step_as<false>`, which a store may call instead.
template <>
inline constexpr bool step_is_step_as<sliding_window_counter> = true;
}  // namespace detail

}  // namespace ratelimit
