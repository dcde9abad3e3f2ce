// SPDX-License-Identifier: Apache-2.0
// Seeded random request traces that hit window edges, bursts, oversized costs and backward time.
//
// A trace is a list of (time, key, cost) events. The same seed and options
// give the same trace on every compiler and standard library: the generator
// is a self-contained splitmix64, not <random>'s distributions, so a failing
// seed printed by one build reproduces on any other (and against Redis).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "ratelimit/decision.hpp"

namespace ratelimit_test {

/// One request of a trace.
struct trace_event {
  std::int64_t t = 0;  ///< decision time, microseconds since the epoch (>= 0)
  std::string key;     ///< one of a few keys
  ratelimit::units cost = 1;
};

inline std::ostream& operator<<(std::ostream& out, const trace_event& e) {
  return out << "{t=" << e.t << "us key=\"" << e.key << "\" cost=" << e.cost << "}";
}

/// Shape of a trace. Steps and costs are drawn relative to the rate under
/// test, so that edges are hit often whatever the period.
struct trace_options {
  std::int64_t period_us = 10;        ///< the rate's period (window length), >= 1
  ratelimit::units limit = 3;         ///< the rate's limit, or the burst for bucket and GCRA
  std::size_t events = 50;            ///< number of events
  std::size_t keys = 3;               ///< distinct keys, 1..8
  bool backwards = true;              ///< sometimes step time backwards (several nodes' clocks)
  bool oversized = true;              ///< sometimes ask for limit + 1 units (never admitted)
  bool exotic_keys = false;           ///< keys with NUL, space, braces, UTF-8 instead of "a".."h"
  std::int64_t start_us = 1'000'000;  ///< roughly where the trace starts
};

/// splitmix64: tiny, fast, and identical everywhere.
class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi] (hi - lo far below 2^63; the modulo bias is irrelevant here).
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>(next() % span);
  }
  /// True with probability percent / 100.
  bool chance(int percent) { return between(0, 99) < percent; }

 private:
  std::uint64_t state_;
};

/// The keys a trace draws from.
[[nodiscard]] inline std::vector<std::string> trace_keys(const trace_options& o) {
  std::vector<std::string> all;
  if (o.exotic_keys) {
    all = {"user:1",        std::string("nul\0byte", 8),
           "two words",     "{braces}",
           "caf\xC3\xA9",   "rl:{x}:y",
           ",comma\"quote", "#hash"};
  } else {
    all = {"a", "b", "c", "d", "e", "f", "g", "h"};
  }
  all.resize(std::clamp<std::size_t>(o.keys, 1, all.size()));
  return all;
}

/// A reproducible trace for `seed`: same microsecond bursts, steps of 1-3 us,
/// jumps to just before / at / just after a window edge, steps of W - 1, W,
/// W + 1, idle gaps of several windows, occasional backward steps of up to
/// W + 1 us (when `backwards`), costs mostly 1, sometimes 2-3, exactly
/// `limit`, or `limit + 1` (when `oversized`). Times never go below 0.
[[nodiscard]] inline std::vector<trace_event> make_trace(std::uint64_t seed,
                                                         const trace_options& o) {
  splitmix64 rng(seed);
  const std::vector<std::string> keys = trace_keys(o);
  const std::int64_t w = std::max<std::int64_t>(1, o.period_us);
  std::vector<trace_event> out;
  out.reserve(o.events);
  std::int64_t t = o.start_us + rng.between(0, w);
  for (std::size_t i = 0; i < o.events; ++i) {
    if (i > 0) {
      const std::int64_t r = rng.between(0, 99);
      if (r < 25) {
        // same microsecond
      } else if (r < 45) {
        t += rng.between(1, 3);
      } else if (r < 57) {
        const std::int64_t edge = (t / w + 1) * w;
        t = std::max(t, edge + rng.between(-1, 1));
      } else if (r < 67) {
        t += w + rng.between(-1, 1);
      } else if (r < 77) {
        t += rng.between(0, w);
      } else if (r < 83) {
        t += rng.between(2 * w, 4 * w);
      } else if (r < 91 && o.backwards) {
        t = std::max<std::int64_t>(0, t - rng.between(1, w + 1));
      } else {
        t += rng.between(0, std::max<std::int64_t>(1, w / 2));
      }
    }
    ratelimit::units cost = 1;
    const std::int64_t c = rng.between(0, 99);
    if (c < 20) {
      cost = rng.between(2, 3);
    } else if (c < 25) {
      cost = o.limit;
    } else if (c < 29 && o.oversized) {
      cost = o.limit + 1;
    }
    const auto key_index = static_cast<std::size_t>(
        rng.between(0, static_cast<std::int64_t>(keys.size()) - 1));
    out.push_back(trace_event{t, keys[key_index], cost});
  }
  return out;
}

}  // namespace ratelimit_test
