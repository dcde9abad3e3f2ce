// SPDX-License-Identifier: Apache-2.0
// Fixed window: a counter per epoch-aligned window.
//
// Algorithm: window k = floor(t / W) covers [kW, (k+1)W); a request of cost c
// is admitted iff n_k + c <= limit. Accuracy: exact per window, but up to
// 2 x limit can pass within any W that straddles a window edge (inherent).
// Memory: 16 bytes of state per key. See
// https://en.wikipedia.org/wiki/Rate_limiting for the family of algorithms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/detail/limiter_name.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// Options shared by the three window policies.
struct window_options {
  /// Count rejected attempts too (anti-fraud: a caller who keeps calling while
  /// blocked stays blocked). Default false: a rejection consumes nothing.
  bool count_rejected = false;
  /// The limiter's name, its identity in shared stores: 1..64 bytes of
  /// [A-Za-z0-9_.-], or empty (unnamed; the Redis stores refuse it). Two
  /// limiters with one name on one Redis share their state.
  std::string name = {};
};

namespace detail {

/// Validated configuration shared by the three window policies.
/// Thread safety: immutable.
template <class Policy>
class window_config {
 public:
  using policy_type = Policy;
  /// @throws std::invalid_argument for a bad limit or period (via rate) or name
  explicit window_config(rate r, window_options o = {}) : rate_(r), options_(std::move(o)) {
    check_name(options_.name);
  }
  explicit window_config(std::string_view r, window_options o = {})
      : window_config(rate::parse(r), std::move(o)) {}
  [[nodiscard]] units limit() const noexcept { return rate_.limit(); }
  [[nodiscard]] std::int64_t period_us() const noexcept { return rate_.period().count(); }
  [[nodiscard]] const rate& get_rate() const noexcept { return rate_; }
  [[nodiscard]] bool count_rejected() const noexcept { return options_.count_rejected; }
  /// The limiter's name (window_options::name), empty when unnamed.
  [[nodiscard]] const std::string& name() const noexcept { return options_.name; }

 private:
  rate rate_;
  window_options options_;
};

}  // namespace detail

/// Fixed-window policy (see file comment).
struct fixed_window {
  static constexpr std::string_view name = "fixed_window";

  /// Validated configuration: a rate and window_options.
  using config = detail::window_config<fixed_window>;

  /// Value-initialised = key never seen.
  struct state {
    std::int64_t window = 0;  ///< index k of the window `count` belongs to
    units count = 0;          ///< units recorded in window k
    friend bool operator==(const state&, const state&) = default;
  };

  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<false>(cfg, s, now, cost);
  }
  /// As step, recording the request even when rejected (access::force): the
  /// count may pass the limit (saturating at 2^52).
  static decision force(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<true>(cfg, s, now, cost);
  }
  /// `step` (Forced = false) or `force` (true), one instantiation each so
  /// that a plain check carries no trace of the forced path.
  template <bool Forced>
  [[gnu::always_inline]] static decision step_as(const config& cfg, state& s, timestamp now,
                                                 units cost) noexcept {
    const std::int64_t w = cfg.period_us();
    std::int64_t t = now.count();
    // The window of `now`, divided before the state is read: written after
    // the clamp below, the division waited for the key's cache miss.
    std::int64_t k = detail::floor_div(t, w);
    // Time never runs backwards inside a key: an earlier request is decided at
    // the start of the stored window (whose index is the stored one).
    if (s.count > 0 && t < s.window * w) {
      t = s.window * w;
      k = s.window;
    }
    const std::int64_t end = (k + 1) * w;
    units n = (s.count > 0 && s.window == k) ? s.count : 0;

    decision d;
    d.limit = cfg.limit();
    d.allowed = n + cost <= cfg.limit();
    if (d.allowed || Forced || cfg.count_rejected()) {
      n = detail::add_saturated(n, cost);
      s.window = k;
      s.count = n;
      d.counted = true;
    }
    d.remaining = std::max<units>(0, cfg.limit() - n);
    if (!d.allowed) {
      d.retry_after = cost > cfg.limit() ? never : std::chrono::microseconds{end - t};
    }
    d.reset_after = std::chrono::microseconds{n > 0 ? end - t : 0};
    return d;
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    return s.count == 0 || detail::floor_div(now.count(), cfg.period_us()) > s.window;
  }
};

namespace detail {
/// `fixed_window::step` is its `step_as<false>`, which a store may call instead.
template <>
inline constexpr bool step_is_step_as<fixed_window> = true;
}  // namespace detail

}  // namespace ratelimit
