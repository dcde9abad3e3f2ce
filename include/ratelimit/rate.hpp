// SPDX-License-Identifier: Apache-2.0
// A rate ("10 per 15 minutes"): parsing and validation shared by every policy.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ratelimit/decision.hpp"

namespace ratelimit {

/// Largest limit, burst or cost: 2^50. Keeps every sum of units exact in a
/// Lua double (2^53) and free of int64 overflow.
inline constexpr units max_units = units{1} << 50;

/// Longest period: 2^46 us (about 814 days).
inline constexpr std::chrono::microseconds max_period{std::int64_t{1} << 46};

namespace detail {

[[nodiscard]] inline std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  out.append(s);
  out += '"';
  return out;
}

[[nodiscard]] inline bool is_space(char c) noexcept {
  return c == ' ' || c == '\t';
}

inline void skip_spaces(std::string_view s, std::size_t& i) noexcept {
  while (i < s.size() && is_space(s[i])) ++i;
}

/// Parses a run of decimal digits at s[i]; false if none or on overflow past `max`.
[[nodiscard]] inline bool parse_digits(std::string_view s, std::size_t& i, std::int64_t max,
                                       std::int64_t& out) noexcept {
  const std::size_t start = i;
  std::int64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    const int d = s[i] - '0';
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
    ++i;
  }
  out = v;
  return i > start;
}

/// Microseconds in one unit name, or 0 if the name is not a unit.
[[nodiscard]] inline std::int64_t unit_us(std::string_view u) noexcept {
  if (u == "us") return 1;
  if (u == "ms") return 1'000;
  if (u == "s" || u == "sec" || u == "second" || u == "seconds") return 1'000'000;
  if (u == "min" || u == "minute" || u == "minutes") return 60'000'000;
  if (u == "h" || u == "hour" || u == "hours") return 3'600'000'000;
  if (u == "d" || u == "day" || u == "days") return 86'400'000'000;
  return 0;
}

}  // namespace detail

/// `limit` units per `period`. Validated on construction.
/// Thread safety: immutable value type.
class rate {
 public:
  /// @param limit  units admitted per period, 1 .. max_units
  /// @param period length of the window, 1 us .. max_period
  /// @throws std::invalid_argument naming the bad value
  constexpr rate(units limit, std::chrono::microseconds period) : limit_(limit), period_(period) {
    if (limit < 1 || limit > max_units) {
      throw std::invalid_argument("ratelimit: limit must be in 1.." + std::to_string(max_units) +
                                  ", got " + std::to_string(limit));
    }
    if (period.count() < 1 || period > max_period) {
      throw std::invalid_argument("ratelimit: period must be in 1us.." +
                                  std::to_string(max_period.count()) + "us, got " +
                                  std::to_string(period.count()) + "us");
    }
  }

  /// Parses "10/15min", "10 per 15 minutes", "100/s", "5/1h", "1000 per day".
  /// Units: us, ms, s/sec/second(s), min/minute(s), h/hour(s), d/day(s).
  /// @throws std::invalid_argument quoting the input
  [[nodiscard]] static rate parse(std::string_view text) {
    const auto fail = [&](const std::string& why) -> rate {
      throw std::invalid_argument("ratelimit: invalid rate " + detail::quote(text) + ": " + why +
                                  " (expected e.g. \"10/15min\" or \"100 per second\")");
    };
    std::size_t i = 0;
    detail::skip_spaces(text, i);
    std::int64_t limit = 0;
    if (!detail::parse_digits(text, i, max_units, limit)) {
      return fail("the limit must be a whole number from 1 to " + std::to_string(max_units));
    }
    detail::skip_spaces(text, i);
    if (i < text.size() && text[i] == '/') {
      ++i;
    } else if (text.substr(i, 3) == "per") {
      i += 3;
    } else {
      return fail("expected '/' or 'per' after the limit");
    }
    detail::skip_spaces(text, i);
    std::int64_t count = 1;
    if (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (!detail::parse_digits(text, i, max_period.count(), count)) {
        return fail("the period count is too large");
      }
      detail::skip_spaces(text, i);
    }
    const std::size_t unit_start = i;
    while (i < text.size() && !detail::is_space(text[i])) ++i;
    const std::string_view unit = text.substr(unit_start, i - unit_start);
    detail::skip_spaces(text, i);
    if (i != text.size()) return fail("unexpected text after the unit");
    const std::int64_t per = detail::unit_us(unit);
    if (per == 0) {
      return fail("unknown unit " + detail::quote(unit) +
                  " (use us, ms, s, sec, second(s), min, minute(s), h, hour(s), d, day(s))");
    }
    if (count < 1) return fail("the period must be at least 1");
    if (count > max_period.count() / per) return fail("the period is too long");
    if (limit < 1) return fail("the limit must be at least 1");
    return rate(limit, std::chrono::microseconds{count * per});
  }

  [[nodiscard]] constexpr units limit() const noexcept { return limit_; }
  [[nodiscard]] constexpr std::chrono::microseconds period() const noexcept { return period_; }
  friend constexpr bool operator==(const rate&, const rate&) = default;

 private:
  units limit_;
  std::chrono::microseconds period_;
};

namespace detail {

/// Validates a request cost: 1 .. max_units.
inline void check_cost(units cost) {
  if (cost < 1 || cost > max_units) {
    throw std::invalid_argument("ratelimit: cost must be in 1.." + std::to_string(max_units) +
                                ", got " + std::to_string(cost));
  }
}

/// Floor division for possibly negative times.
[[nodiscard]] constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/// Ceiling division for a >= 0, b > 0.
[[nodiscard]] constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return a / b + (a % b != 0 ? 1 : 0);
}

/// Counts under count_rejected saturate here; far above any reachable limit.
inline constexpr units count_ceiling = units{1} << 52;

[[nodiscard]] constexpr units add_saturated(units a, units b) noexcept {
  return a + b > count_ceiling ? count_ceiling : a + b;
}

}  // namespace detail
}  // namespace ratelimit
