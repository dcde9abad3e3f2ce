// SPDX-License-Identifier: Apache-2.0
// The failure policy: how a check that got no answer from Redis is decided
// (throw, admit, reject, or an in-process fallback limiter per config).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/redis/keys.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/redis/stats.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace ratelimit::redis {

namespace detail {

struct fallback_base {
  virtual ~fallback_base() = default;
};

template <class P>
struct fallback_limiter final : fallback_base {
  explicit fallback_limiter(typename P::config c) : cfg(std::move(c)) {}
  typename P::config cfg;
  memory_store<P> store;
};

/// Applies the failure policy to checks that got no answer, with one
/// in-process fallback limiter per config.
/// Thread safety: any number of threads.
class degrader {
 public:
  degrader(failure_policy p, units divisor) : policy_(p), divisor_(divisor) {}

  /// At most this many fallback limiters are kept: one per (policy, name,
  /// config) that degraded. Tiers changed at run time during an outage make
  /// new configs; past the cap the least recently used limiter that no check
  /// is using is dropped (its keys start fresh if that config degrades again).
  static constexpr std::size_t max_fallbacks = 64;

  /// The fallback limiter of `cfg`, or null when none is held.
  template <class P>
  [[nodiscard]] std::shared_ptr<fallback_limiter<P>> find(const typename P::config& cfg) {
    const fallback_id id = id_of<P>(cfg);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = fallbacks_.find(id);
    if (it == fallbacks_.end()) return nullptr;
    return std::static_pointer_cast<fallback_limiter<P>>(it->second.limiter);
  }

  /// How many fallback limiters are held (at most max_fallbacks, unless more
  /// than that many are in use at once).
  [[nodiscard]] std::size_t fallbacks_held() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fallbacks_.size();
  }

  /// The decision of the failure policy for a check that got no answer.
  /// @throws the `error` under failure_policy::throw_error
  template <class Config>
  decision degrade(counters& c, const Config& cfg, std::string_view key,
                   std::optional<timestamp> now, units cost, access a,
                   const std::exception_ptr& error) {
    using P = typename Config::policy_type;
    decision d;
    d.limit = cfg.limit();
    switch (policy_) {
      case failure_policy::throw_error: std::rethrow_exception(error);
      case failure_policy::fail_open:
        c.fail_open.fetch_add(1, std::memory_order_relaxed);
        d.allowed = true;
        d.source = decision_source::fail_open;
        return d;
      case failure_policy::fail_closed:
        c.fail_closed.fetch_add(1, std::memory_order_relaxed);
        d.source = decision_source::fail_closed;
        return d;
      case failure_policy::fallback: {
        c.fallback.fetch_add(1, std::memory_order_relaxed);
        const std::shared_ptr<fallback_limiter<P>> held = fallback_for<P>(cfg);
        auto& fb = *held;
        const timestamp t = now ? *now
                                : std::chrono::duration_cast<timestamp>(
                                      std::chrono::system_clock::now().time_since_epoch());
        // A config that carries per-call data (leases: the operation and
        // lease id) lends it to the fallback's own config.
        if constexpr (requires { script_for<P>::rebind(fb.cfg, cfg); }) {
          d = fb.store.apply(script_for<P>::rebind(fb.cfg, cfg), key, t, cost, a);
        } else {
          d = fb.store.apply(fb.cfg, key, t, cost, a);
        }
        d.source = decision_source::fallback;
        return d;
      }
    }
    std::rethrow_exception(error);
  }

 private:
  /// A fallback limiter belongs to one policy type (the static_casts rely on
  /// it: compound<A, A> and compound_of<A> share config ids), one limiter
  /// name and one config.
  using fallback_id = std::pair<std::type_index, std::string>;

  template <class P>
  [[nodiscard]] static fallback_id id_of(const typename P::config& cfg) {
    std::string id = cfg.name();
    id += '/';
    if constexpr (requires { script_for<P>::fallback_id(cfg); }) {
      id += script_for<P>::fallback_id(cfg);  // without per-call data (leases)
    } else {
      id += config_id(cfg);
    }
    return fallback_id{std::type_index(typeid(P)), std::move(id)};
  }

  /// The fallback limiter of `cfg`, made on first use. The caller's
  /// shared_ptr keeps it alive while the check runs, even if it is dropped
  /// from the map meanwhile.
  template <class P>
  [[nodiscard]] std::shared_ptr<fallback_limiter<P>> fallback_for(const typename P::config& cfg) {
    fallback_id id = id_of<P>(cfg);
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t now = ++uses_;
    auto it = fallbacks_.find(id);
    if (it == fallbacks_.end()) {
      auto made = std::make_shared<fallback_limiter<P>>(script_for<P>::scaled(cfg, divisor_));
      if (fallbacks_.size() >= max_fallbacks) drop_least_recent();
      it = fallbacks_.emplace(std::move(id), slot{std::move(made), now}).first;
    }
    it->second.last_use = now;
    return std::static_pointer_cast<fallback_limiter<P>>(it->second.limiter);
  }

  /// Drops the least recently used limiter no check holds; keeps all when
  /// every one is in use. Called with mutex_ held.
  void drop_least_recent() {
    auto victim = fallbacks_.end();
    for (auto it = fallbacks_.begin(); it != fallbacks_.end(); ++it) {
      if (it->second.limiter.use_count() != 1) continue;
      if (victim == fallbacks_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim != fallbacks_.end()) fallbacks_.erase(victim);
  }

  struct slot {
    std::shared_ptr<fallback_base> limiter;
    std::uint64_t last_use = 0;
  };

  failure_policy policy_;
  units divisor_;
  mutable std::mutex mutex_;
  std::uint64_t uses_ = 0;
  std::map<fallback_id, slot> fallbacks_;
};

}  // namespace detail

}  // namespace ratelimit::redis
