// SPDX-License-Identifier: Apache-2.0
// Test helper: how many random traces a differential test replays ($RATELIMIT_DIFF_TRACES or a default).
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace rltest {

/// $RATELIMIT_DIFF_TRACES when set, else `fallback`. A value that is not a
/// whole number >= 1 throws, so a typo can never make a test compare nothing.
inline int diff_traces(int fallback) {
  const char* text = std::getenv("RATELIMIT_DIFF_TRACES");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 1 || n > 1'000'000) {
    throw std::invalid_argument(
        "RATELIMIT_DIFF_TRACES must be a whole number from 1 to 1000000, got \"" +
        std::string(text) + "\"");
  }
  return static_cast<int>(n);
}

}  // namespace rltest
