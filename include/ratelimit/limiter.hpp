// SPDX-License-Identifier: Apache-2.0
// limiter<Policy, Store, Clock>: the object application code calls per request.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "ratelimit/awaitable.hpp"
#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/forced_step.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/request_id.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace ratelimit {

/// One rate applied per key. Reads its clock once per check and hands `now`
/// to the store, which applies the policy atomically.
///
/// - `try_acquire(key, cost)` decides and consumes on admission.
/// - `peek(key, cost)` returns the decision `try_acquire` would, consuming nothing.
/// - `reset(key)` forgets the key.
/// - `try_acquire(key, request_id{id}, cost)`: an idempotent check (see
///   request_id.hpp and docs/semantics.md, "Idempotent checks").
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
    set_idempotency({});
  }

  /// Decides `key` now and consumes `cost` units if admitted.
  /// @param key  1..512 bytes, binary safe
  /// @param cost units this request takes, >= 1
  /// @return the decision; rejection is `allowed == false`, never an exception
  [[nodiscard]] decision try_acquire(std::string_view key, units cost = 1) {
    if (shadow()) [[unlikely]]
      return detail::shadowed(run(key, cost, access::force));
    return run(key, cost, access::consume);
  }
  /// As above, decided at `now` (microseconds since the clock's epoch).
  [[nodiscard]] decision try_acquire(std::string_view key, timestamp now, units cost = 1)
    requires store_for<Store, P>
  {
    if (shadow()) [[unlikely]]
      return detail::shadowed(run_at(key, now, cost, access::force));
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

  /// try_acquire without blocking: `handler(decision, std::exception_ptr)` is
  /// called exactly once, with the decision (null exception_ptr) or the
  /// error try_acquire would throw. A store with `async_apply` (the Redis
  /// and cluster stores) calls it on its I/O thread; any other store decides inline, so
  /// the handler runs before this returns and code is written once for both.
  /// What the handler throws is ignored (it does not leave this call).
  /// @throws std::invalid_argument for a bad key or cost, a clock reading
  ///   outside 0..max_time, or a time the store refuses, with every store
  ///   (the handler is then not called)
  template <class Handler>
    requires std::invocable<Handler&, decision, std::exception_ptr>
  void async_try_acquire(std::string_view key, units cost, Handler handler) {
    detail::check_key(key);
    detail::check_cost(cost);
    const access a = shadow() ? access::force : access::consume;
    if constexpr (store_clock<Clock> && requires {
                    store_.async_apply(cfg_, key, store_time, cost, a, std::move(handler));
                  }) {
      async_through_store(key, store_time, cost, a, std::move(handler));
    } else if constexpr (!store_clock<Clock> && requires {
                           store_.async_apply(cfg_, key, timestamp{}, cost, a, std::move(handler));
                         }) {
      const timestamp t = now();
      detail::check_time(t);
      async_through_store(key, t, cost, a, std::move(handler));
    } else {
      async_inline([&] { return run(key, cost, a); }, a, handler);
    }
  }
  /// As above, cost 1.
  template <class Handler>
    requires std::invocable<Handler&, decision, std::exception_ptr>
  void async_try_acquire(std::string_view key, Handler handler) {
    async_try_acquire(key, units{1}, std::move(handler));
  }
  /// The C++20 coroutine form: `decision d = co_await l.async_try_acquire(key);`
  /// (see acquire_awaitable: resumes on the store's I/O thread, or without
  /// suspending for in-process stores; errors are thrown from the co_await).
  [[nodiscard]] acquire_awaitable<limiter> async_try_acquire(std::string_view key, units cost = 1) {
    return acquire_awaitable<limiter>(*this, key, cost);
  }
  /// As above, decided at `now` (microseconds since the clock's epoch).
  template <class Handler>
    requires std::invocable<Handler&, decision, std::exception_ptr> && store_for<Store, P>
  void async_try_acquire(std::string_view key, timestamp now, units cost, Handler handler) {
    detail::check_key(key);
    detail::check_cost(cost);
    detail::check_time(now);
    const access a = shadow() ? access::force : access::consume;
    if constexpr (requires { store_.async_apply(cfg_, key, now, cost, a, std::move(handler)); }) {
      async_through_store(key, now, cost, a, std::move(handler));
    } else {
      async_inline([&] { return run_at(key, now, cost, a); }, a, handler);
    }
  }

  /// Idempotent check: when `id` was decided for `key` within its retention,
  /// returns that first decision again with `repeat` set and consumes
  /// nothing; otherwise decides as `try_acquire(key, cost)` and remembers the
  /// id with the decision (not when the decision is degraded, see
  /// docs/semantics.md). Two concurrent checks with one key and id consume once.
  /// @param id 1..256 bytes, binary safe
  /// @throws std::invalid_argument for a bad key, id or cost
  [[nodiscard]] decision try_acquire(std::string_view key, request_id id, units cost = 1) {
    if (shadow()) [[unlikely]]
      return detail::shadowed(run_once(key, id, cost, access::force));
    return run_once(key, id, cost, access::consume);
  }
  /// As above, decided at `now`.
  [[nodiscard]] decision try_acquire(std::string_view key, request_id id, timestamp now,
                                     units cost = 1)
    requires store_for<Store, P>
  {
    if (shadow()) [[unlikely]]
      return detail::shadowed(run_once_at(key, id, now, cost, access::force));
    return run_once_at(key, id, now, cost, access::consume);
  }
  /// The decision `try_acquire(key, id, cost)` would return; records nothing.
  [[nodiscard]] decision peek(std::string_view key, request_id id, units cost = 1) {
    return run_once(key, id, cost, access::peek);
  }
  /// As above, at `now`.
  [[nodiscard]] decision peek(std::string_view key, request_id id, timestamp now, units cost = 1)
    requires store_for<Store, P>
  {
    return run_once_at(key, id, now, cost, access::peek);
  }

  /// Sets how long request ids are remembered (and, with the id table, how
  /// many). With a store that does not keep ids (memory_store) the limiter's
  /// id table is made anew, so ids seen so far are forgotten; a store that
  /// keeps them (idempotent_store, the Redis stores) keeps every id it holds
  /// until the end of retention it was recorded with, and ignores `max_ids`
  /// and `stripes`. Not to be called concurrently with checks.
  /// Every field is checked whatever the store; on a throw nothing changed.
  /// @throws std::invalid_argument naming the value for a bad retention or
  ///   stripe count (see idempotency_options)
  void set_idempotency(const idempotency_options& o) {
    const std::chrono::microseconds r = detail::retention_for(cfg_, o);
    if constexpr (!stores_ids) ids_ = std::make_unique<detail::id_table>(o);
    retention_ = r;
  }
  /// Request ids the in-process id table holds (0 for stores that keep ids
  /// themselves, as the Redis stores do).
  [[nodiscard]] std::size_t request_ids_held() const noexcept {
    if constexpr (stores_ids) {
      return 0;
    } else {
      return ids_->size();
    }
  }
  /// The in-process id table (null for stores that keep ids themselves).
  [[nodiscard]] const detail::id_table* request_id_table() const noexcept { return ids_.get(); }
  /// How long a request id is remembered after its first check.
  [[nodiscard]] std::chrono::microseconds retention() const noexcept { return retention_; }

  /// Forgets `key`: its next check sees a key never seen. Request ids already
  /// decided for `key` are kept (a retry still gets its first decision).
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
    } else if constexpr (requires {
                           store_.apply_reading(
                               cfg_, key, [] { return timestamp{}; }, cost, a);
                         }) {
      // A store that can read the time at its own best moment (see
      // memory_store::apply_reading) still gets one validated reading.
      detail::check_key(key);
      detail::check_cost(cost);
      return store_.apply_reading(
          cfg_, key,
          [this] {
            const timestamp t = now();
            detail::check_time(t);
            return t;
          },
          cost, a);
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

  template <class Time, class Handler>
  void async_through_store(std::string_view key, Time t, units cost, access a, Handler handler) {
    if (a == access::force) {
      store_.async_apply(cfg_, key, t, cost, a,
                         [h = std::move(handler)](decision d, std::exception_ptr e) mutable {
                           h(e ? d : detail::shadowed(d), std::move(e));
                         });
    } else {
      store_.async_apply(cfg_, key, t, cost, a, std::move(handler));
    }
  }

  template <class Decide, class Handler>
  static void async_inline(Decide&& decide, access a, Handler& handler) {
    decision d;
    std::exception_ptr e;
    try {
      d = decide();
      if (a == access::force) d = detail::shadowed(d);
    } catch (const std::invalid_argument&) {
      // Bad input (here: a clock reading out of range, or a time only the
      // store refuses) is thrown from the call, as by a store's async_apply.
      throw;
    } catch (...) {
      e = std::current_exception();
    }
    try {
      handler(d, std::move(e));
    } catch (...) {
      // What a handler throws is ignored, as on the Redis store's I/O thread.
    }
  }

  /// The store keeps request ids itself (Redis: in the check's script).
  static constexpr bool stores_ids = requires(Store& s, const config_type& c) {
    s.apply_once(c, std::string_view{}, request_id{std::string_view{}}, std::chrono::microseconds{},
                 timestamp{}, units{}, access::consume);
  };

  decision run_once(std::string_view key, request_id id, units cost, access a) {
    if constexpr (store_clock<Clock>) {
      detail::check_key(key);
      detail::check_request_id(id);
      detail::check_cost(cost);
      return store_.apply_once(cfg_, key, id, retention_, store_time, cost, a);
    } else {
      return run_once_at(key, id, now(), cost, a);
    }
  }

  decision run_once_at(std::string_view key, request_id id, timestamp now, units cost, access a) {
    detail::check_key(key);
    detail::check_request_id(id);
    detail::check_cost(cost);
    detail::check_time(now);
    if constexpr (stores_ids) {
      return store_.apply_once(cfg_, key, id, retention_, now, cost, a);
    } else {
      return ids_->check(key, id, now, retention_, a,
                         [&] { return store_.apply(cfg_, key, now, cost, a); });
    }
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
  std::chrono::microseconds retention_{0};
  std::unique_ptr<detail::id_table> ids_;  ///< in-process stores only
  shadow_flag shadow_;
};

}  // namespace ratelimit
