// SPDX-License-Identifier: Apache-2.0
// GCRA (generic cell rate algorithm): one theoretical arrival time per key.
//
// Algorithm (the redis-cell formulation): emission interval T = period / limit,
// rounded to the nearest microsecond; tolerance = burst x T. A request of cost
// c at t is admitted iff max(TAT, t) + c*T - t <= burst*T, and then
// TAT := max(TAT, t) + c*T. Accuracy: the same limiter as token_bucket with the
// same rate and burst, except that T is rounded: each request's spacing is off
// by less than 0.5 us (at most 1 us). Memory: 8 bytes of state per key.
// See https://brandur.org/rate-limiting
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// GCRA policy (see file comment).
struct gcra {
  static constexpr std::string_view name = "gcra";

  /// Validated configuration. Thread safety: immutable.
  class config {
   public:
    using policy_type = gcra;
    /// @throws std::invalid_argument for a bad rate or burst, when
    ///   period / limit rounds below 1 us, or when burst x T exceeds 2^52 us
    explicit config(rate r, bucket_options o = {})
        : rate_(r), burst_(detail::checked_burst(r, o)), name_(std::move(o.name)) {
      const std::int64_t p = r.period().count();
      const std::int64_t l = r.limit();
      // Round half up: T = floor(p / l + 1/2).
      interval_us_ = (2 * p + l) / (2 * l);
      if (interval_us_ < 1) {
        throw std::invalid_argument("ratelimit: gcra emission interval of rate " +
                                    std::to_string(l) + "/" + std::to_string(p) +
                                    "us is below 1us; use token_bucket for rates above 1/us");
      }
      if (burst_ > detail::max_ticks / interval_us_) {
        throw std::invalid_argument("ratelimit: gcra burst " + std::to_string(burst_) +
                                    " x emission interval " + std::to_string(interval_us_) +
                                    "us exceeds 2^52us");
      }
    }
    explicit config(std::string_view r, bucket_options o = {})
        : config(rate::parse(r), std::move(o)) {}
    [[nodiscard]] units limit() const noexcept { return burst_; }
    /// The limiter's name (bucket_options::name), empty when unnamed.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] units burst() const noexcept { return burst_; }
    [[nodiscard]] const rate& get_rate() const noexcept { return rate_; }
    /// Emission interval T in microseconds (rounded).
    [[nodiscard]] std::int64_t interval_us() const noexcept { return interval_us_; }
    /// Tolerance burst x T in microseconds.
    [[nodiscard]] std::int64_t tolerance_us() const noexcept { return burst_ * interval_us_; }

   private:
    rate rate_;
    units burst_;
    std::string name_;
    std::int64_t interval_us_ = 1;
  };

  /// Value-initialised = key never seen (TAT in the past).
  struct state {
    std::int64_t tat = 0;  ///< theoretical arrival time, us
    friend bool operator==(const state&, const state&) = default;
  };

  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<false>(cfg, s, now, cost);
  }
  /// As step, recording the request even when rejected (access::force): the
  /// TAT runs ahead of the tolerance, by at most 2^52 us past `now` (it is
  /// never moved back).
  static decision force(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<true>(cfg, s, now, cost);
  }
  /// `step` (Forced = false) or `force` (true), one instantiation each so
  /// that a plain check carries no trace of the forced path.
  template <bool Forced>
  [[gnu::always_inline]] static decision step_as(const config& cfg, state& s, timestamp now,
                                                 units cost) noexcept {
    // No clamp needed: max(TAT, t) already makes an earlier t safe.
    const std::int64_t t = now.count();
    const std::int64_t tv = cfg.interval_us();
    const std::int64_t tol = cfg.tolerance_us();
    const std::int64_t base = std::max(s.tat, t);

    decision d;
    d.limit = cfg.burst();
    d.allowed = cost <= cfg.burst() && base + cost * tv - t <= tol;
    if (d.allowed) {
      s.tat = base + cost * tv;
      d.counted = true;
    } else if (Forced) {
      // base + cost x T, saturating at t + 2^52 (never below base).
      const std::int64_t ceiling = t + detail::max_ticks;
      s.tat = base >= ceiling ? base : cost > (ceiling - base) / tv ? ceiling : base + cost * tv;
      d.counted = true;
    }
    const std::int64_t debt = std::max<std::int64_t>(s.tat - t, 0);
    d.remaining = std::max<units>(0, (tol - debt) / tv);
    if (!d.allowed) {
      d.retry_after = cost > cfg.burst() ? never
                                         : std::chrono::microseconds{s.tat + cost * tv - tol - t};
    }
    d.reset_after = std::chrono::microseconds{debt};
    return d;
  }

  static bool idle(const config&, const state& s, timestamp now) noexcept {
    return s.tat <= now.count();
  }
};

namespace detail {
/// `gcra::step` is its `step_as<false>`, which a store may call instead.
template <>
inline constexpr bool step_is_step_as<gcra> = true;
}  // namespace detail

}  // namespace ratelimit
