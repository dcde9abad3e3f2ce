// SPDX-License-Identifier: Apache-2.0
// Which policies a store may step through their force-inlined step_as<false>. Not API.
#pragma once

namespace ratelimit::detail {

/// True only for the library's policies whose `step(cfg, s, now, cost)` is
/// exactly `step_as<false>(cfg, s, now, cost)`, each specialising it beside
/// its own definition: a store may then call `step_as<false>`, which is
/// forced inline, where `step` may not be inlined. False for every other
/// type, policies derived from those included: a member template
/// `step_as` is inherited (and a user's policy may have one of its own
/// meaning), while a policy's own `step` is what a store must call.
template <class P>
inline constexpr bool step_is_step_as = false;

}  // namespace ratelimit::detail
