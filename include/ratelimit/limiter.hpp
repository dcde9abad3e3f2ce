// SPDX-License-Identifier: Apache-2.0
// limiter<Policy, Store, Clock>: the object application code calls per request.
#pragma once

#include <atomic>
#include <chrono>
#include <string_view>
#include <utility>

#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace ratelimit {

/// One rate applied per key. Reads its clock once per check and hands `now`
/// to the store, which applies the policy atomically.
///
/// - `try_acquire(key, cost)` decides and consumes on admission.
/// - `peek(key, cost)` returns the decision `try_acquire` would, consuming nothing.
/// - `reset(key)` forgets the key.
/// Each has an overload taking `now` from the caller (microseconds since the
/// clock's epoch), for batches that read the time once and for replay.
///
/// Bad input (empty key, key over 512 bytes, cost < 1, time out of range)
/// throws std::invalid_argument naming the value; a denial is a decision.
///
/// - `set_shadow(true)` puts the limiter in shadow mode at run time: checks
///   are recorded as admitted and never rejected; a decision the policy
///   would have rejected says so in `shadow_rejected` (docs/semantics.md,
///   "Shadow mode").
///
/// Thread safety: as safe as its store and clock; with the default
/// memory_store and steady_clock, any number of threads may share one limiter.
/// `set_shadow` may be called from any thread at any time (a relaxed atomic:
/// each check reads the switch once, with no lock).
template <policy P, class Store = memory_store<P>, class Clock = steady_clock>
  requires(clock_source<Clock> && store_for<Store, P>) ||
          (store_clock<Clock> && store_clocked_store_for<Store, P>)
class limiter {
 public:
  using policy_type = P;
  using config_type = typename P::config;
  using store_type = Store;
  using clock_type = Clock;

  /// @throws std::invalid_argument when the store refuses the config (its
  ///   `check_config(cfg)`, if it has one: the Redis stores require a name)
  explicit limiter(config_type cfg, Store store = Store{}, Clock clock = Clock{})
      : cfg_(std::move(cfg)), store_(std::move(store)), clock_(std::move(clock)) {
    if constexpr (requires { store_.check_config(cfg_); }) store_.check_config(cfg_);
  }

  /// Decides `key` now and consumes `cost` units if admitted.
  /// @param key  1..512 bytes, binary safe
  /// @param cost units this request takes, >= 1
  /// @return the decision; rejection is `allowed == false`, never an exception
  [[nodiscard]] decision try_acquire(std::string_view key, units cost = 1) {
    if (shadow()) [[unlikely]]
      return shadowed(run(key, cost, access::force));
    return run(key, cost, access::consume);
  }
  /// As above, decided at `now` (microseconds since the clock's epoch).
  [[nodiscard]] decision try_acquire(std::string_view key, timestamp now, units cost = 1)
    requires store_for<Store, P>
  {
    if (shadow()) [[unlikely]]
      return shadowed(run_at(key, now, cost, access::force));
    return run_at(key, now, cost, access::consume);
  }

  /// The decision try_acquire would return now, without consuming anything.
  [[nodiscard]] decision peek(std::string_view key, units cost = 1) {
    return run(key, cost, access::peek);
  }
  /// As above, at `now`.
  [[nodiscard]] decision peek(std::string_view key, timestamp now, units cost = 1)
    requires store_for<Store, P>
  {
    return run_at(key, now, cost, access::peek);
  }

  /// Forgets `key`: its next check sees a key never seen.
  void reset(std::string_view key) {
    detail::check_key(key);
    store_.reset(cfg_, key);
  }

  /// The clock's current time in microseconds since its epoch.
  [[nodiscard]] timestamp now() const noexcept
    requires clock_source<Clock>
  {
    return std::chrono::duration_cast<timestamp>(clock_.now().time_since_epoch());
  }

  /// Switches shadow mode on or off, effective for the next check (any
  /// thread). In shadow mode try_acquire records every request as admitted
  /// (access::force) and returns `allowed == true`, with `shadow_rejected`
  /// set when the policy would have rejected; peek is unchanged.
  void set_shadow(bool on) noexcept
    requires forcible_policy<P>
  {
    shadow_.on.store(on, std::memory_order_relaxed);
  }
  /// True in shadow mode (see set_shadow).
  [[nodiscard]] bool shadow() const noexcept { return shadow_.on.load(std::memory_order_relaxed); }

  [[nodiscard]] const config_type& config() const noexcept { return cfg_; }
  [[nodiscard]] Store& store() noexcept { return store_; }
  [[nodiscard]] const Store& store() const noexcept { return store_; }
  [[nodiscard]] Clock& clock() noexcept { return clock_; }

 private:
  decision run(std::string_view key, units cost, access a) {
    if constexpr (store_clock<Clock>) {
      detail::check_key(key);
      detail::check_cost(cost);
      return store_.apply(cfg_, key, store_time, cost, a);
    } else {
      return run_at(key, now(), cost, a);
    }
  }

  decision run_at(std::string_view key, timestamp now, units cost, access a) {
    detail::check_key(key);
    detail::check_cost(cost);
    detail::check_time(now);
    return store_.apply(cfg_, key, now, cost, a);
  }

  /// A forced check's decision as shadow mode returns it: admitted, and
  /// flagged when the policy (or a failure policy) rejected.
  static decision shadowed(decision d) noexcept {
    if (!d.allowed) {
      d.allowed = true;
      d.shadow_rejected = true;
    }
    return d;
  }

  /// The shadow switch; copied and moved by value so that the limiter stays
  /// movable (a move is not a concurrent operation).
  struct shadow_flag {
    std::atomic<bool> on{false};
    shadow_flag() = default;
    shadow_flag(const shadow_flag& o) noexcept : on(o.on.load(std::memory_order_relaxed)) {}
    shadow_flag& operator=(const shadow_flag& o) noexcept {
      on.store(o.on.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
    ~shadow_flag() = default;
  };

  config_type cfg_;
  Store store_;
  Clock clock_;
  shadow_flag shadow_;
};

}  // namespace ratelimit
