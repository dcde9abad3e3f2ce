// SPDX-License-Identifier: Apache-2.0
// Hostile bytes made safe to quote in an error message. Not API.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ratelimit::detail {

/// `bytes` for an error message: at most `max` bytes of it (then "..."),
/// printable ASCII as is except `"` and `\`, every other byte as \xNN.
[[nodiscard]] inline std::string printable(std::string_view bytes, std::size_t max = 64) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (const char ch : bytes.substr(0, max)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out += ch;
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    }
  }
  if (bytes.size() > max) out += "...";
  return out;
}

}  // namespace ratelimit::detail
