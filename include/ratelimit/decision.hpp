// SPDX-License-Identifier: Apache-2.0
// The value every check returns: admitted or not, and what the caller may do next.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace ratelimit {

/// Microseconds since a clock's epoch: the one time unit of every policy.
using timestamp = std::chrono::microseconds;

/// Units of a rate (requests, tokens). Signed so that arithmetic never wraps.
using units = std::int64_t;

/// `retry_after` of a request that can never be admitted (cost above capacity).
inline constexpr std::chrono::microseconds never = std::chrono::microseconds::max();

/// Who decided: the store itself, or a fallback because the store was not reached.
enum class decision_source : std::uint8_t {
  store,        ///< the configured store applied the policy
  fail_open,    ///< the store was not reached (or was full) and the failure policy admits
  fail_closed,  ///< the store was not reached (or was full) and the failure policy rejects
  fallback,     ///< the store was not reached; a local fallback limiter decided
  local_cache,  ///< a locally cached rejection, without asking the store
};

/// Name of a decision source, for logs and metrics ("store", "fail_open", ...).
[[nodiscard]] constexpr std::string_view to_string(decision_source s) noexcept {
  switch (s) {
    case decision_source::store: return "store";
    case decision_source::fail_open: return "fail_open";
    case decision_source::fail_closed: return "fail_closed";
    case decision_source::fallback: return "fallback";
    case decision_source::local_cache: return "local_cache";
  }
  return "unknown";
}

/// Outcome of one check. A denial is a value, never an exception.
struct [[nodiscard]] decision {
  /// The request is admitted.
  bool allowed = false;
  /// The attempt was recorded in the key's state: always when allowed; when
  /// rejected only under `count_rejected` (window policies).
  bool counted = false;
  /// Who decided (see `decision_source`).
  decision_source source = decision_source::store;
  /// Shadow mode: the policy would have rejected this request, but the limiter
  /// (or its tier) is in shadow mode, so it was admitted (`allowed == true`)
  /// and recorded as admitted. Always false outside shadow mode.
  bool shadow_rejected = false;
  /// Idempotent checks: this request id was already decided for this key
  /// within its retention; the fields are that first decision again and
  /// nothing was consumed. Always false for checks without a request id.
  bool repeat = false;
  /// The configured limit (the burst for token bucket and GCRA).
  units limit = 0;
  /// Units that could still be admitted right now, after this decision; >= 0.
  units remaining = 0;
  /// 0 when allowed; otherwise the smallest wait after which the same request
  /// would be admitted if nothing else arrives; `never` if it never can be.
  /// A shadow_rejected decision keeps the wait the policy would have imposed
  /// (measured on the state that recorded the request), though allowed.
  std::chrono::microseconds retry_after{0};
  /// Time until the key is back to its empty, fully available state (0 if it is).
  std::chrono::microseconds reset_after{0};

  /// True when the store was not reached and a failure policy decided.
  [[nodiscard]] constexpr bool degraded() const noexcept {
    return source == decision_source::fail_open || source == decision_source::fail_closed ||
           source == decision_source::fallback;
  }
  explicit constexpr operator bool() const noexcept { return allowed; }
  friend constexpr bool operator==(const decision&, const decision&) = default;
};

}  // namespace ratelimit
