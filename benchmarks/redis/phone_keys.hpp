// SPDX-License-Identifier: Apache-2.0
// The Redis benchmarks' keys: 10,000 phone numbers of 16 bytes each
// ("+1555" and 11 digits), the keys redis-benchmark's __rand_int__ rows and
// the scripts' priming use as well.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace ratelimit_bench {

/// The 10,000 keys, made once.
inline const std::vector<std::string>& phones() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (int i = 0; i < 10'000; ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "+1555%011d", i);
      k.emplace_back(buf);
    }
    return k;
  }();
  return keys;
}

}  // namespace ratelimit_bench
