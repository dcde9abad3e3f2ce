// SPDX-License-Identifier: Apache-2.0
// Test helper: how many random traces a differential or model test replays ($RATELIMIT_DIFF_TRACES, $RATELIMIT_TRACE_DIVISOR).
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace rltest {

/// The whole number in environment variable `name`, or 0 when it is unset
/// or empty. A value that is not a whole number from 1 to 1,000,000 throws,
/// so a typo can never make a test compare nothing.
inline int trace_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 1 || n > 1'000'000) {
    throw std::invalid_argument(std::string(name) +
                                " must be a whole number from 1 to 1000000, got \"" + text + "\"");
  }
  return static_cast<int>(n);
}

/// `n` (a count of random traces, seeds or bursts) divided by
/// $RATELIMIT_TRACE_DIVISOR (1 when unset), at least 1. CI's
/// ThreadSanitizer stage sets 4: the model and differential tests check
/// decisions, not races, and run 5-10x slower under TSan; the plain and
/// ASan stages run them whole.
inline int scaled(int n) {
  const int divisor = trace_env("RATELIMIT_TRACE_DIVISOR");
  const int m = divisor == 0 ? n : n / divisor;
  return m < 1 ? 1 : m;
}

/// $RATELIMIT_DIFF_TRACES when set, else scaled(fallback).
inline int diff_traces(int fallback) {
  const int n = trace_env("RATELIMIT_DIFF_TRACES");
  return n != 0 ? n : scaled(fallback);
}

}  // namespace rltest
