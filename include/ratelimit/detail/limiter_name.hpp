// SPDX-License-Identifier: Apache-2.0
// Validation of a limiter's name, the identity its state is stored under. Not API.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ratelimit {

/// Longest limiter name in bytes.
inline constexpr std::size_t max_name_bytes = 64;

namespace detail {

/// Accepts "" (unnamed) or 1..64 bytes of [A-Za-z0-9_.-]: the name is part of
/// Redis keys, and the key format relies on it holding no ':', '{', '}' or '!'
/// (see redis::detail::redis_key).
/// @throws std::invalid_argument naming the bad name
inline void check_name(std::string_view name) {
  const auto ok = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  };
  bool good = name.size() <= max_name_bytes;
  for (const char c : name) good = good && ok(c);
  if (!good) {
    throw std::invalid_argument("ratelimit: limiter name \"" +
                                std::string(name.substr(0, 2 * max_name_bytes)) + "\" must be 1.." +
                                std::to_string(max_name_bytes) + " bytes of [A-Za-z0-9_.-]");
  }
}

}  // namespace detail
}  // namespace ratelimit
