// SPDX-License-Identifier: Apache-2.0
// HTTP response header fields from a decision: RateLimit, RateLimit-Policy, Retry-After, X-RateLimit-*.
//
// No HTTP library: the helper returns (name, value) pairs for the caller's
// framework. The IETF fields follow draft-ietf-httpapi-ratelimit-headers-11
// (23 May 2026): `RateLimit-Policy: "name";q=<quota>;w=<window s>` and
// `RateLimit: "name";r=<remaining>;t=<seconds>`, each item a Structured
// Field String (RFC 9651) with Integer parameters. The exact mapping is in
// docs/semantics.md, "HTTP headers".
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"

namespace ratelimit::http {

/// One response header field.
struct header {
  std::string name;
  std::string value;
  friend bool operator==(const header&, const header&) = default;
};

/// The policy a decision is reported against: the name in the IETF fields,
/// the quota and the window in which the quota is granted.
struct policy_info {
  /// The policy's name; empty is reported as "default". Printable ASCII only.
  std::string name;
  /// Units granted per window (X-RateLimit-Limit, `q`), >= 0.
  units quota = 0;
  /// The window `q` is granted in (`w`, whole seconds rounded up, at least 1).
  std::chrono::microseconds window{0};
};

/// Which fields `headers` writes.
struct header_options {
  /// `RateLimit-Policy` and `RateLimit` (the IETF draft fields).
  bool ietf = true;
  /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
  bool x_ratelimit = true;
  /// `Retry-After` on a rejected decision.
  bool retry_after = true;
  /// Unset: `X-RateLimit-Reset` is a number of seconds from now (rounded
  /// up). Set to the current Unix time: it is the Unix time in whole
  /// seconds (rounded up) at which the key is fully available again.
  std::optional<std::chrono::microseconds> unix_now = std::nullopt;
};

/// Largest Integer a Structured Field may carry (15 digits, RFC 9651).
inline constexpr std::int64_t sf_integer_max = 999'999'999'999'999;

/// Whole seconds in `d`, rounded up: 0 -> 0, 1 us -> 1, 1 s -> 1, 1 s + 1 us
/// -> 2. Negative durations count as 0; `never` gives its own rounded value.
[[nodiscard]] constexpr std::int64_t ceil_seconds(std::chrono::microseconds d) noexcept {
  const std::int64_t us = d.count();
  if (us <= 0) return 0;
  return us / 1'000'000 + (us % 1'000'000 != 0 ? 1 : 0);
}

/// `s` as a Structured Field String: in double quotes, with `"` and `\`
/// escaped by a backslash.
/// @throws std::invalid_argument when `s` holds a byte outside printable
///   ASCII (0x20..0x7E), which a Structured Field String cannot carry
[[nodiscard]] inline std::string sf_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b > 0x7E) {
      static constexpr char hex[] = "0123456789abcdef";
      std::string shown;
      for (const char x : s.substr(0, 64)) {
        const auto y = static_cast<unsigned char>(x);
        if (y >= 0x20 && y <= 0x7E) {
          shown += x;
        } else {
          shown += "\\x";
          shown += hex[y >> 4];
          shown += hex[y & 0xF];
        }
      }
      throw std::invalid_argument("ratelimit: http: policy name \"" + shown +
                                  "\" holds a byte outside printable ASCII");
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

namespace detail {

[[nodiscard]] constexpr std::int64_t sf_integer(std::int64_t v) noexcept {
  return v < 0 ? 0 : (v > sf_integer_max ? sf_integer_max : v);
}

/// burst x period / limit microseconds, rounded up (the time a bucket takes
/// to refill from empty), without overflow.
[[nodiscard]] inline std::chrono::microseconds refill_time(units burst, std::int64_t period_us,
                                                           units limit) noexcept {
  __extension__ typedef __int128 wide;  // exact product, GCC and Clang
  const wide num = static_cast<wide>(burst) * period_us;
  wide q = num / limit + (num % limit != 0 ? 1 : 0);
  const wide top = std::chrono::microseconds::max().count();
  if (q > top) q = top;
  return std::chrono::microseconds{static_cast<std::int64_t>(q)};
}

}  // namespace detail

/// The policy of a limiter's config: its name, `quota = cfg.limit()` (the
/// burst for token_bucket and GCRA) and the window that quota is granted in:
/// the period for the window policies, the time to refill a whole burst
/// (burst x period / limit, rounded up to 1 us) for the buckets.
template <class Config>
  requires requires(const Config& c) {
    { c.name() } -> std::convertible_to<std::string_view>;
    { c.limit() } -> std::convertible_to<units>;
    c.get_rate();
  }
[[nodiscard]] policy_info describe_policy(const Config& cfg) {
  policy_info p;
  p.name = std::string(cfg.name());
  p.quota = cfg.limit();
  if constexpr (requires { cfg.burst(); }) {
    p.window = detail::refill_time(cfg.burst(), cfg.get_rate().period().count(),
                                   cfg.get_rate().limit());
  } else {
    p.window = cfg.get_rate().period();
  }
  return p;
}

/// The response header fields for decision `d` under policy `p`, in this
/// order: RateLimit-Policy, RateLimit, X-RateLimit-Limit,
/// X-RateLimit-Remaining, X-RateLimit-Reset, Retry-After (each as enabled
/// in `o`). Rules (docs/semantics.md, "HTTP headers"):
/// - `q` and X-RateLimit-Limit: `p.quota`; `w`: `p.window` in whole seconds
///   rounded up, at least 1;
/// - `r` and X-RateLimit-Remaining: `d.remaining`;
/// - `t`: rounded-up seconds of `d.reset_after` when admitted, of
///   `d.retry_after` when rejected; left out when `retry_after` is `never`;
/// - X-RateLimit-Reset: rounded-up seconds of `d.reset_after` (or the Unix
///   time then, see header_options::unix_now);
/// - Retry-After: only when rejected (a shadow-rejected decision is
///   admitted), the rounded-up seconds of `retry_after`, at least 1 (and so
///   is `t` of a rejected decision); left out when `retry_after` is `never`
///   (waiting never helps);
/// - IETF Integers are clamped to 0 .. 999,999,999,999,999.
/// @throws std::invalid_argument for a name that is not printable ASCII, a
///   negative `p.quota` or `p.window`, or a `unix_now` outside 0 .. max_time
[[nodiscard]] inline std::vector<header> headers(const decision& d, const policy_info& p,
                                                 const header_options& o = {}) {
  if (o.unix_now) ratelimit::detail::check_time(*o.unix_now);
  if (p.quota < 0) {
    throw std::invalid_argument("ratelimit: http: policy quota " + std::to_string(p.quota) +
                                " is negative");
  }
  if (p.window.count() < 0) {
    throw std::invalid_argument("ratelimit: http: policy window " +
                                std::to_string(p.window.count()) + "us is negative");
  }
  std::vector<header> out;
  const bool rejected = !d.allowed;
  const bool no_retry = rejected && d.retry_after == never;
  if (o.ietf) {
    const std::string name = sf_string(p.name.empty() ? std::string_view("default") : p.name);
    const std::int64_t w = std::max<std::int64_t>(1, ceil_seconds(p.window));
    out.push_back({"RateLimit-Policy", name + ";q=" + std::to_string(detail::sf_integer(p.quota)) +
                                           ";w=" + std::to_string(detail::sf_integer(w))});
    std::string limit = name + ";r=" + std::to_string(detail::sf_integer(d.remaining));
    if (!no_retry) {
      // Rejected: t equals Retry-After (at least 1 s, as Retry-After is).
      const std::int64_t t = rejected ? std::max<std::int64_t>(1, ceil_seconds(d.retry_after))
                                      : ceil_seconds(d.reset_after);
      limit += ";t=" + std::to_string(detail::sf_integer(t));
    }
    out.push_back({"RateLimit", std::move(limit)});
  }
  if (o.x_ratelimit) {
    out.push_back({"X-RateLimit-Limit", std::to_string(p.quota)});
    out.push_back({"X-RateLimit-Remaining", std::to_string(d.remaining)});
    const std::int64_t reset = ceil_seconds(d.reset_after);
    std::int64_t at = reset;
    if (o.unix_now) {
      // unix_now + reset_after, saturating (a decision may carry up to `never`).
      const std::int64_t now_us = o.unix_now->count();
      const std::int64_t after = std::max<std::int64_t>(0, d.reset_after.count());
      at = ceil_seconds(std::chrono::microseconds{
          after > std::chrono::microseconds::max().count() - now_us ? never.count()
                                                                    : now_us + after});
    }
    out.push_back({"X-RateLimit-Reset", std::to_string(at)});
  }
  if (o.retry_after && rejected && !no_retry) {
    out.push_back(
        {"Retry-After", std::to_string(std::max<std::int64_t>(1, ceil_seconds(d.retry_after)))});
  }
  return out;
}

/// As above, for the policy of a limiter's config (describe_policy).
template <class Config>
  requires requires(const Config& c) { describe_policy(c); }
[[nodiscard]] std::vector<header> headers(const decision& d, const Config& cfg,
                                          const header_options& o = {}) {
  return headers(d, describe_policy(cfg), o);
}

}  // namespace ratelimit::http
