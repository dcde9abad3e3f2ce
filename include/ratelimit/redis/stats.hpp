// SPDX-License-Identifier: Apache-2.0
// What a Redis store counts: the public snapshot (store_stats) and the
// live counters behind it.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>

#include "ratelimit/redis/errors.hpp"

namespace ratelimit::redis {

/// Counters of a store (and its copies), for metrics. A snapshot.
struct store_stats {
  std::uint64_t store = 0;            ///< checks decided by Redis
  std::uint64_t fail_open = 0;        ///< checks admitted by failure_policy::fail_open
  std::uint64_t fail_closed = 0;      ///< checks rejected by failure_policy::fail_closed
  std::uint64_t fallback = 0;         ///< checks decided by the in-process fallback
  std::uint64_t errors = 0;           ///< failed round trips (any store_error, timeouts included)
  std::uint64_t timeouts = 0;         ///< of which timeouts
  std::uint64_t short_circuited = 0;  ///< checks answered by the open breaker without I/O
  std::uint64_t breaker_opened = 0;   ///< times the circuit breaker opened
  std::uint64_t script_reloads = 0;   ///< NOSCRIPT answers that made a script be resent
  std::uint64_t probes = 0;  ///< background probes (PING) of a server behind an open breaker
  std::uint64_t probe_failures = 0;  ///< of which failed (the breaker stayed open)
  /// In-process fallback limiters held now, one per (policy, name, config)
  /// that degraded under failure_policy::fallback; at most 64 unless more
  /// are in use at one instant.
  std::uint64_t fallback_limiters = 0;
};

namespace detail {

struct counters {
  std::atomic<std::uint64_t> store{0}, fail_open{0}, fail_closed{0}, fallback{0}, errors{0},
      timeouts{0}, short_circuited{0}, breaker_opened{0}, script_reloads{0}, probes{0},
      probe_failures{0};
};

/// Counts one failed round trip (and whether it was a timeout).
inline void count_error(counters& c, const std::exception_ptr& e) noexcept {
  c.errors.fetch_add(1, std::memory_order_relaxed);
  try {
    std::rethrow_exception(e);
  } catch (const timeout_error&) {
    c.timeouts.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
  }
}

}  // namespace detail

}  // namespace ratelimit::redis
