// SPDX-License-Identifier: Apache-2.0
// The three seams of the library: clocks, policies and stores.
#pragma once

#include <chrono>
#include <concepts>
#include <string_view>

#include "ratelimit/decision.hpp"

namespace ratelimit {

/// What a store is asked to do with a check.
enum class access : unsigned char {
  consume,  ///< decide and record the outcome in the key's state
  peek,     ///< decide as `consume` would, but leave the state untouched
  /// Decide as `consume` would, but record the request as admitted even when
  /// the policy rejects it (shadow mode: the request really happens). The
  /// store returns the policy's own decision, so `allowed` says whether it
  /// would have been admitted; see docs/semantics.md, "Shadow mode".
  force,
};

/// Monotonic time: `c.now()` never decreases for one object (a manual clock may
/// be set backwards on purpose, to exercise SPEC "time never runs backwards").
/// Models: steady_clock (default), system_clock, manual_clock.
template <class C>
concept clock_source = requires(const C& c) {
  typename C::duration;
  typename C::time_point;
  { c.now() } noexcept -> std::same_as<typename C::time_point>;
};

/// A marker clock: the store reads its own time inside the check (the Redis
/// server's TIME), so that every node shares one clock. The limiter passes
/// `store_time` instead of a timestamp.
template <class C>
concept store_clock = requires {
  { C::reads_store_time } -> std::convertible_to<bool>;
} && C::reads_store_time;

/// Passed to a store instead of a timestamp: "read your own clock".
struct store_time_t {
  explicit constexpr store_time_t() = default;
};
inline constexpr store_time_t store_time{};

/// A pure algorithm.
/// - `P::config` validates on construction (throws std::invalid_argument) and
///   names its policy as `P::config::policy_type`.
/// - `P::state` is semiregular and equality-comparable; a value-initialised
///   state means "key never seen".
/// - `P::step(cfg, state&, now, cost)` decides and updates the state: no I/O, no
///   clock, no allocation beyond the state's own; `cost` is already validated.
///   A step whose state allocates (sliding log, compound_of) may throw
///   std::bad_alloc, and must then leave the state unchanged; the others are
///   noexcept.
/// - `P::idle(cfg, state, now)` is true when the state is equivalent to a
///   value-initialised one at `now` and later, so a store may drop it.
/// - `P::name` is the policy's stable name ("fixed_window", ...).
template <class P>
concept policy = requires(const typename P::config& cfg, typename P::state& s,
                          const typename P::state& cs, timestamp now, units cost) {
  requires std::semiregular<typename P::state>;
  requires std::equality_comparable<typename P::state>;
  requires std::copy_constructible<typename P::config>;
  requires std::same_as<typename P::config::policy_type, P>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::step(cfg, s, now, cost) } -> std::same_as<decision>;
  { P::idle(cfg, cs, now) } noexcept -> std::same_as<bool>;
  { cfg.limit() } noexcept -> std::same_as<units>;
};

/// A policy that can record a request it rejects as if admitted
/// (access::force): `P::force(cfg, state&, now, cost)` decides exactly as
/// `P::step` and records the request as admitted either way; the decision is
/// the policy's own (`allowed` false when it rejects), with `counted` true and
/// `remaining`, `retry_after` and `reset_after` measured on the recorded state.
/// Every policy of the library models it; a store asked to force a policy
/// that does not throws std::invalid_argument. A policy derived from one of
/// the library's that gives its own `step` inherits the base's `force`
/// unless it gives its own too: forced checks then decide by the base's
/// rule. Give both, or neither.
template <class P>
concept forcible_policy = policy<P> && requires(const typename P::config& cfg, typename P::state& s,
                                                timestamp now, units cost) {
  { P::force(cfg, s, now, cost) } -> std::same_as<decision>;
};

/// Applies policy P to one key atomically: the whole read-decide-write happens
/// as one indivisible step per key (a critical section in process, one script
/// in Redis), so a store may run the policy remotely instead of handing out
/// state. Keys are validated byte strings (1..512 bytes, binary safe); `cost`
/// is validated. `reset` forgets a key. Stores expire idle keys themselves.
template <class S, class P>
concept store_for = policy<P> && requires(S& s, const typename P::config& cfg, std::string_view key,
                                          timestamp now, units cost) {
  { s.apply(cfg, key, now, cost, access::consume) } -> std::same_as<decision>;
  { s.reset(cfg, key) };
};

/// A store that can also read its own clock (see `store_clock`).
template <class S, class P>
concept store_clocked_store_for = policy<P> && requires(S& s, const typename P::config& cfg,
                                                        std::string_view key, units cost) {
  { s.apply(cfg, key, store_time, cost, access::consume) } -> std::same_as<decision>;
  { s.reset(cfg, key) };
};

}  // namespace ratelimit
