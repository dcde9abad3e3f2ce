// SPDX-License-Identifier: Apache-2.0
// Property checks for the fuzz targets: a failed check prints why and aborts, which libFuzzer reports as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

/// Aborts with the failed condition and a message when `cond` is false. Kept
/// in release builds (unlike assert), since the targets are built optimised.
#define RATELIMIT_FUZZ_CHECK(cond, msg)                                                   \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz check failed: %s (%s) at %s:%d\n", msg, #cond, __FILE__, \
                   __LINE__);                                                             \
      std::abort();                                                                       \
    }                                                                                     \
  } while (false)
