// SPDX-License-Identifier: Apache-2.0
// Exact parsing of replay timestamps (integer us, decimal seconds, ISO-8601 UTC) into microseconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ratelimit::replay {

/// Latest accepted timestamp: 2^62 us since the Unix epoch (the library's range).
inline constexpr std::int64_t max_timestamp_us = std::int64_t{1} << 62;

namespace detail {

[[nodiscard]] constexpr bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}

/// Parses exactly `n` digits at s[i]; false if any is not a digit.
[[nodiscard]] constexpr bool fixed_digits(std::string_view s, std::size_t i, std::size_t n,
                                          std::int64_t& out) noexcept {
  std::int64_t v = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (i + j >= s.size() || !is_digit(s[i + j])) return false;
    v = v * 10 + (s[i + j] - '0');
  }
  out = v;
  return true;
}

/// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar
/// (H. Hinnant's days_from_civil), integer arithmetic only.
[[nodiscard]] constexpr std::int64_t days_from_civil(std::int64_t y, std::int64_t m,
                                                     std::int64_t d) noexcept {
  y -= m <= 2 ? 1 : 0;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const std::int64_t yoe = y - era * 400;
  const std::int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const std::int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

[[nodiscard]] constexpr std::int64_t days_in_month(std::int64_t y, std::int64_t m) noexcept {
  constexpr std::int64_t days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : days[m - 1];
}

[[nodiscard]] constexpr const char* parse_iso(std::string_view s, std::int64_t& out) noexcept {
  // YYYY-MM-DDTHH:MM:SS[.fff|.ffffff]Z
  constexpr const char* shape =
      "ISO-8601 timestamps must look like 2026-11-30T04:52:46Z, with 0, 3 or 6 fractional "
      "digits, in UTC ending in Z";
  if (s.size() != 20 && s.size() != 24 && s.size() != 27) return shape;
  std::int64_t y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, frac = 0;
  if (!fixed_digits(s, 0, 4, y) || s[4] != '-' || !fixed_digits(s, 5, 2, mo) || s[7] != '-' ||
      !fixed_digits(s, 8, 2, d) || s[10] != 'T' || !fixed_digits(s, 11, 2, h) || s[13] != ':' ||
      !fixed_digits(s, 14, 2, mi) || s[16] != ':' || !fixed_digits(s, 17, 2, sec) ||
      s.back() != 'Z') {
    return shape;
  }
  if (s.size() > 20) {
    const std::size_t n = s.size() - 21;  // 3 or 6
    if (s[19] != '.' || !fixed_digits(s, 20, n, frac)) return shape;
    if (n == 3) frac *= 1000;
  }
  if (y < 1970) return "ISO-8601 timestamps before 1970 are out of range";
  if (mo < 1 || mo > 12) return "month out of range (01..12)";
  if (d < 1 || d > days_in_month(y, mo)) return "day out of range for its month";
  if (h > 23) return "hour out of range (00..23)";
  if (mi > 59) return "minute out of range (00..59)";
  if (sec > 59) return "second out of range (00..59; leap seconds are not accepted)";
  const std::int64_t days = days_from_civil(y, mo, d);
  const std::int64_t secs = ((days * 24 + h) * 60 + mi) * 60 + sec;
  if (secs > max_timestamp_us / 1'000'000) return "timestamp out of range";
  out = secs * 1'000'000 + frac;
  return out > max_timestamp_us ? "timestamp out of range" : nullptr;
}

}  // namespace detail

/// Parses one timestamp into microseconds since the Unix epoch, exactly.
///
/// Accepted forms (nothing else, no surrounding spaces):
/// - integer microseconds: `1732950000250000`
/// - decimal seconds with 1 to 6 fractional digits: `1732950000.25`
/// - ISO-8601 UTC ending in `Z` with 0, 3 or 6 fractional digits:
///   `2026-11-30T04:52:46Z`, `...46.123Z`, `...46.123456Z`
/// Range: 0 .. 2^62 us.
///
/// @return nullptr on success (and `out` set), otherwise a static message saying what is wrong.
/// Thread safety: pure function.
[[nodiscard]] constexpr const char* parse_timestamp(std::string_view s,
                                                    std::int64_t& out) noexcept {
  // Fast path for the common forms: up to 18 digits of microseconds, or up to
  // 12 digits of seconds with 1 to 6 fractional digits. Neither can exceed
  // 2^62 (10^18 - 1 < 2^62), so no overflow check is needed per digit; any
  // other shape falls through to the general parser below, which gives the
  // same value for these and the error message for the rest.
  if (!s.empty() && s.size() <= 19) {
    std::int64_t v = 0;
    std::size_t i = 0;
    // At most 18 digits are summed: 19 could pass INT64_MAX (undefined).
    while (i < s.size() && i < 18 && detail::is_digit(s[i])) v = v * 10 + (s[i++] - '0');
    if (i == s.size()) {
      out = v;
      return nullptr;
    }
    if (i >= 1 && i <= 12 && s[i] == '.' && s.size() - i - 1 >= 1 && s.size() - i - 1 <= 6) {
      std::int64_t f = 0;
      std::size_t j = i + 1;
      while (j < s.size() && detail::is_digit(s[j])) f = f * 10 + (s[j++] - '0');
      if (j == s.size()) {
        for (std::size_t n = s.size() - i - 1; n < 6; ++n) f *= 10;
        out = v * 1'000'000 + f;
        return nullptr;
      }
    }
  }
  if (s.empty()) return "empty timestamp";
  if (s.find('T') != std::string_view::npos || s.find('-') != std::string_view::npos) {
    return detail::parse_iso(s, out);
  }
  const std::size_t dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  if (whole.empty() || whole.size() > 19) {
    return "expected integer microseconds, decimal seconds or an ISO-8601 UTC time";
  }
  std::int64_t v = 0;
  for (const char c : whole) {
    if (!detail::is_digit(c)) {
      return "expected integer microseconds, decimal seconds or an ISO-8601 UTC time";
    }
    const int digit = c - '0';
    if (v > (max_timestamp_us - digit) / 10) return "timestamp out of range";
    v = v * 10 + digit;
  }
  if (dot == std::string_view::npos) {
    out = v;
    return nullptr;
  }
  const std::string_view frac = s.substr(dot + 1);
  if (frac.empty() || frac.size() > 6) {
    return "decimal seconds need 1 to 6 fractional digits";
  }
  std::int64_t f = 0;
  for (const char c : frac) {
    if (!detail::is_digit(c)) return "decimal seconds need 1 to 6 fractional digits";
    f = f * 10 + (c - '0');
  }
  for (std::size_t n = frac.size(); n < 6; ++n) f *= 10;
  if (v > (max_timestamp_us - f) / 1'000'000) return "timestamp out of range";
  out = v * 1'000'000 + f;
  return nullptr;
}

/// Formats microseconds since the Unix epoch as ISO-8601 UTC with 6 fractional
/// digits (`2026-11-30T04:52:46.123456Z`), for human-readable output.
[[nodiscard]] inline std::string format_iso(std::int64_t us) {
  const std::int64_t secs_total = us / 1'000'000;
  const std::int64_t frac = us % 1'000'000;
  std::int64_t z = secs_total / 86400 + 719468;
  const std::int64_t sod = secs_total % 86400;
  // civil_from_days (H. Hinnant).
  const std::int64_t era = z / 146097;
  const std::int64_t doe = z - era * 146097;
  const std::int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  std::int64_t y = yoe + era * 400;
  const std::int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const std::int64_t mp = (5 * doy + 2) / 153;
  const std::int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const std::int64_t m = mp + (mp < 10 ? 3 : -9);
  y += m <= 2 ? 1 : 0;
  char buf[40];
  auto put = [&](std::size_t at, std::int64_t v, int width) {
    for (int i = width - 1; i >= 0; --i) {
      buf[at + static_cast<std::size_t>(i)] = static_cast<char>('0' + v % 10);
      v /= 10;
    }
  };
  put(0, y, 4);
  buf[4] = '-';
  put(5, m, 2);
  buf[7] = '-';
  put(8, d, 2);
  buf[10] = 'T';
  put(11, sod / 3600, 2);
  buf[13] = ':';
  put(14, sod / 60 % 60, 2);
  buf[16] = ':';
  put(17, sod % 60, 2);
  buf[19] = '.';
  put(20, frac, 6);
  buf[26] = 'Z';
  return std::string(buf, 27);
}

/// Formats a duration in microseconds compactly for people: "15min", "1h", "90s", "250ms".
[[nodiscard]] inline std::string format_duration(std::int64_t us) {
  struct unit {
    std::int64_t size;
    const char* name;
  };
  constexpr unit units[] = {{86'400'000'000, "d"}, {3'600'000'000, "h"}, {60'000'000, "min"},
                            {1'000'000, "s"},      {1'000, "ms"},        {1, "us"}};
  for (const unit& u : units) {
    if (us >= u.size && us % u.size == 0) return std::to_string(us / u.size) + u.name;
  }
  return std::to_string(us) + "us";
}

}  // namespace ratelimit::replay
