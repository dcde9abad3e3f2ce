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

inline void check_key(std::string_view key) {
  if (key.empty()) throw std::invalid_argument("ratelimit: key must not be empty");
  if (key.size() > max_key_bytes) {
    throw std::invalid_argument("ratelimit: key of " + std::to_string(key.size()) +
                                " bytes exceeds the maximum of " + std::to_string(max_key_bytes) +
                                " bytes");
  }
}

inline void check_time(timestamp now) {
  if (now.count() < 0 || now > max_time) {
    throw std::invalid_argument("ratelimit: time " + std::to_string(now.count()) +
                                "us is outside 0.." + std::to_string(max_time.count()) +
                                "us since the clock's epoch");
  }
}

}  // namespace detail
}  // namespace ratelimit
