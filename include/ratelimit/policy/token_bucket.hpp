// SPDX-License-Identifier: Apache-2.0
// Token bucket with continuous refill, computed exactly in integers.
//
// Algorithm: a bucket of capacity `burst` (default `limit`) refills `limit`
// tokens per `period`, continuously; a request of cost c is admitted iff the
// bucket holds at least c tokens after refill. Tokens are counted in exact
// fractions: with the rate reduced to L/P (gcd removed), one token is P ticks
// and the bucket gains L ticks per microsecond, so there is no rounding at all.
// Accuracy: exact. Memory: 16 bytes of state per key.
// See https://en.wikipedia.org/wiki/Token_bucket
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/detail/limiter_name.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// Options of the token bucket and GCRA.
struct bucket_options {
  /// Capacity in units (the largest burst); unset = the rate's limit.
  std::optional<units> burst = std::nullopt;
  /// The limiter's name, its identity in shared stores: 1..64 bytes of
  /// [A-Za-z0-9_.-], or empty (unnamed; the Redis stores refuse it). Two
  /// limiters with one name on one Redis share their state.
  std::string name = {};
};

namespace detail {

[[nodiscard]] inline units checked_burst(const rate& r, const bucket_options& o) {
  check_name(o.name);
  const units b = o.burst.value_or(r.limit());
  if (b < 1 || b > max_units) {
    throw std::invalid_argument("ratelimit: burst must be in 1.." + std::to_string(max_units) +
                                ", got " + std::to_string(b));
  }
  return b;
}

/// Largest tick count a bucket may hold: exact in a Lua double with headroom.
inline constexpr std::int64_t max_ticks = std::int64_t{1} << 52;

}  // namespace detail

/// Token-bucket policy (see file comment).
struct token_bucket {
  static constexpr std::string_view name = "token_bucket";

  /// Validated configuration. Thread safety: immutable.
  class config {
   public:
    using policy_type = token_bucket;
    /// @throws std::invalid_argument for a bad rate or burst, or when
    ///   burst x (period / gcd(limit, period)) exceeds 2^52 ticks
    explicit config(rate r, bucket_options o = {})
        : rate_(r), burst_(detail::checked_burst(r, o)), name_(std::move(o.name)) {
      const std::int64_t g = std::gcd(r.limit(), r.period().count());
      ticks_per_us_ = r.limit() / g;
      ticks_per_token_ = r.period().count() / g;
      if (burst_ > detail::max_ticks / ticks_per_token_) {
        throw std::invalid_argument(
            "ratelimit: token_bucket burst " + std::to_string(burst_) + " with rate " +
            std::to_string(r.limit()) + "/" + std::to_string(r.period().count()) +
            "us needs more than 2^52 exact ticks; use a smaller burst or a rounder period");
      }
    }
    explicit config(std::string_view r, bucket_options o = {})
        : config(rate::parse(r), std::move(o)) {}
    [[nodiscard]] units limit() const noexcept { return burst_; }
    /// The limiter's name (bucket_options::name), empty when unnamed.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] units burst() const noexcept { return burst_; }
    [[nodiscard]] const rate& get_rate() const noexcept { return rate_; }
    /// Ticks gained per microsecond (L).
    [[nodiscard]] std::int64_t ticks_per_us() const noexcept { return ticks_per_us_; }
    /// Ticks in one token (P).
    [[nodiscard]] std::int64_t ticks_per_token() const noexcept { return ticks_per_token_; }
    /// Ticks in a full bucket.
    [[nodiscard]] std::int64_t capacity_ticks() const noexcept { return burst_ * ticks_per_token_; }

   private:
    rate rate_;
    units burst_;
    std::string name_;
    std::int64_t ticks_per_us_ = 1;
    std::int64_t ticks_per_token_ = 1;
  };

  /// Value-initialised = key never seen (a full bucket).
  struct state {
    std::int64_t deficit = 0;  ///< ticks missing from a full bucket at `last`
    std::int64_t last = 0;     ///< time of the last admitted request, us
    friend bool operator==(const state&, const state&) = default;
  };

  /// Ticks missing at t (>= s.last), after refill.
  [[nodiscard]] static std::int64_t deficit_at(const config& cfg, const state& s,
                                               std::int64_t t) noexcept {
    if (s.deficit == 0) return 0;
    const std::int64_t elapsed = t - s.last;
    if (elapsed >= detail::ceil_div(s.deficit, cfg.ticks_per_us())) return 0;
    return s.deficit - elapsed * cfg.ticks_per_us();
  }

  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<false>(cfg, s, now, cost);
  }
  /// As step, recording the request even when rejected (access::force): the
  /// bucket goes into debt, its deficit passing the capacity (saturating at
  /// 2^52 ticks, `detail::max_ticks`).
  static decision force(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<true>(cfg, s, now, cost);
  }
  /// `step` (Forced = false) or `force` (true), one instantiation each so
  /// that a plain check carries no trace of the forced path.
  template <bool Forced>
  [[gnu::always_inline]] static decision step_as(const config& cfg, state& s, timestamp now,
                                                 units cost) noexcept {
    std::int64_t t = now.count();
    // Time never runs backwards inside a key: decide at the last update.
    if (s.deficit > 0 && t < s.last) t = s.last;
    std::int64_t deficit = deficit_at(cfg, s, t);
    const std::int64_t cap = cfg.capacity_ticks();

    decision d;
    d.limit = cfg.burst();
    d.allowed = cost <= cfg.burst() && deficit + cost * cfg.ticks_per_token() <= cap;
    if (d.allowed) {
      // deficit + cost x P <= capacity <= 2^52.
      deficit += cost * cfg.ticks_per_token();
      s = state{deficit, t};
      d.counted = true;
    } else if (Forced) {
      // Past the capacity, saturating at 2^52 (cost x P alone may not fit
      // int64). Kept off the admitted path: the division costs every check.
      const std::int64_t p = cfg.ticks_per_token();
      deficit = cost > (detail::max_ticks - deficit) / p ? detail::max_ticks : deficit + cost * p;
      s = state{deficit, t};
      d.counted = true;
    }
    d.remaining = deficit >= cap ? 0 : (cap - deficit) / cfg.ticks_per_token();
    if (!d.allowed) {
      d.retry_after = cost > cfg.burst()
                          ? never
                          : std::chrono::microseconds{detail::ceil_div(
                                deficit + cost * cfg.ticks_per_token() - cap, cfg.ticks_per_us())};
    }
    d.reset_after = std::chrono::microseconds{detail::ceil_div(deficit, cfg.ticks_per_us())};
    return d;
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    return s.deficit == 0 ||
           now.count() - s.last >= detail::ceil_div(s.deficit, cfg.ticks_per_us());
  }
};

namespace detail {
/// `token_bucket::step` is its `step_as<false>`, which a store may call instead.
template <>
inline constexpr bool step_is_step_as<token_bucket> = true;
}  // namespace detail

}  // namespace ratelimit
