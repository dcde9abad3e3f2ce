// SPDX-License-Identifier: Apache-2.0
// access::force in process: P::force when the policy has it, else a clear error. Not API.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"

namespace ratelimit::detail {

[[noreturn, gnu::noinline, gnu::cold]] inline void throw_not_forcible(std::string_view policy) {
  throw std::invalid_argument("ratelimit: policy " + std::string(policy) +
                              " does not support access::force (it has no P::force)");
}

/// P::force(cfg, s, now, cost), or std::invalid_argument (state untouched)
/// for a policy without one.
/// Out of line and cold: shadow mode is the rare case, and inlined into a
/// store's check this path took the inliner's budget from the plain step.
template <policy P>
[[gnu::noinline, gnu::cold]] decision forced_step(const typename P::config& cfg,
                                                  typename P::state& s, timestamp now, units cost) {
  if constexpr (forcible_policy<P>) {
    return P::force(cfg, s, now, cost);
  } else {
    throw_not_forcible(P::name);
  }
}

/// A forced check's decision as shadow mode returns it (a limiter's or a
/// tier's): admitted, and flagged when the policy (or a failure policy)
/// rejected; every other field as the store returned it.
[[nodiscard]] constexpr decision shadowed(decision d) noexcept {
  if (!d.allowed) {
    d.allowed = true;
    d.shadow_rejected = true;
  }
  return d;
}

}  // namespace ratelimit::detail
