// SPDX-License-Identifier: Apache-2.0
// Validation of keys and times shared by the limiter and the stores. Not API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ratelimit/decision.hpp"

namespace ratelimit {

/// Longest key in bytes (binary safe: NUL, spaces, braces, UTF-8 allowed).
inline constexpr std::size_t max_key_bytes = 512;

/// Latest accepted time, 2^62 us since the clock's epoch: leaves headroom for
/// window arithmetic without overflow.
inline constexpr timestamp max_time{std::int64_t{1} << 62};

namespace detail {

/// Throws the error for a key check_key refused. Out of line and cold, so
/// that the check itself inlines as two compares into every check.
[[noreturn, gnu::noinline, gnu::cold]] inline void throw_bad_key(std::size_t size) {
  if (size == 0) throw std::invalid_argument("ratelimit: key must not be empty");
  throw std::invalid_argument("ratelimit: key of " + std::to_string(size) +
                              " bytes exceeds the maximum of " + std::to_string(max_key_bytes) +
                              " bytes");
}

[[noreturn, gnu::noinline, gnu::cold]] inline void throw_bad_time(timestamp now) {
  throw std::invalid_argument("ratelimit: time " + std::to_string(now.count()) +
                              "us is outside 0.." + std::to_string(max_time.count()) +
                              "us since the clock's epoch");
}

inline void check_key(std::string_view key) {
  // One unsigned compare: size - 1 wraps around for an empty key.
  if (key.size() - 1 >= max_key_bytes) throw_bad_key(key.size());
}

inline void check_time(timestamp now) {
  if (now.count() < 0 || now > max_time) throw_bad_time(now);
}

}  // namespace detail
}  // namespace ratelimit
