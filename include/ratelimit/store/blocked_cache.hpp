// SPDX-License-Identifier: Apache-2.0
// A store decorator that remembers long rejections and repeats them locally, without asking the store.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>  // std::lock_guard
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/spin_lock.hpp"
#include "ratelimit/request_id.hpp"

namespace ratelimit {

/// Options of `blocked_cache`. An aggregate; every field has a default.
struct blocked_cache_options {
  /// Only rejections whose `retry_after` is at least this long are cached, in
  /// microseconds; 0 = every rejection. Negative throws std::invalid_argument.
  std::chrono::microseconds threshold = std::chrono::seconds{1};
  /// Most keys held at once (memory is bounded by this many keys of at most
  /// 512 bytes each, plus a fixed overhead per entry); 0 = 10'000.
  std::size_t max_entries = 0;
  /// Independently locked shards, at most `max_entries`; 0 = 16.
  std::size_t shards = 0;
  /// Longest a cached block lasts, in microseconds, however long the store's
  /// `retry_after` (bounds how long a reset made on another node goes unseen
  /// here); a cached decision then reports the rest of this shorter block.
  /// 0 = no cap. Negative throws std::invalid_argument.
  std::chrono::microseconds max_block{0};
};

/// Counters of a blocked_cache, for metrics. A snapshot.
struct blocked_cache_stats {
  std::uint64_t hits = 0;     ///< checks (consume and peek) rejected locally, without the store
  std::uint64_t stored = 0;   ///< rejections written to the cache (new key or refreshed)
  std::uint64_t evicted = 0;  ///< live entries dropped to make room (the soonest to expire)
  std::uint64_t expired = 0;  ///< expired entries reclaimed
  std::uint64_t skipped = 0;  ///< rejections not stored because a reset raced with the check
};

/// Wraps a store and caches the keys it rejects for a long time: after the
/// store rejects `key` at cost `c` with `retry_after >= threshold`, every
/// check of `key` at cost `>= c` before the block ends is rejected here with
/// `source == decision_source::local_cache`, no round trip made.
///
/// Models `store_for<blocked_cache<S>, P>` whenever S models `store_for<S, P>`
/// (and `store_clocked_store_for` when S has it), so it drops into `limiter`:
/// `limiter<gcra, blocked_cache<redis::redis_store>, redis::server_clock>`.
///
/// - Only consume checks decided by the store itself (`source == store`) are
///   cached; a degraded decision (fail_open, fail_closed, fallback) and a peek
///   never are. A peek does read the cache. A forced check (access::force,
///   shadow mode) neither reads nor fills it: the request really happens, so
///   the store must record it.
/// - A cached rejection: `allowed == false`, `counted == false` (nothing is
///   recorded), `remaining == 0`, `limit` as the store said, `retry_after` the
///   rest of the block (>= 1 us, `never` stays `never`), `reset_after` the rest
///   of the store's `reset_after` at the cached decision, at least `retry_after`.
/// - With a caller-supplied `now` the block ends at `now + retry_after` of the
///   cached decision. With `store_time` the store's clock cannot be read, so
///   the block is timed on `LocalClock`, from the moment before the store was
///   called (never later than the store's own decision time).
/// - `reset` forwards to the store, then drops the key from the cache.
/// - Entries remember the policy name, the limiter's name (`cfg.name()`) and
///   `cfg.limit()` and rate(s): a check under another policy, limiter, limit
///   or rate (a tier changed at run time) misses. One
///   cache serves one configuration per policy and name, as in a limiter,
///   which holds its store by value; a cache used directly by two configs
///   never answers one with the other's rejection unless both are the same
///   named limiter.
///
/// Memory: at most `max_entries` keys; an expired entry is reclaimed when it is
/// looked up, when its shard is full, and by `sweep`; a full shard with no
/// expired entry evicts the entry that expires soonest.
///
/// Thread safety: as safe as the wrapped store; the cache itself may be used
/// from any number of threads (except construction, destruction and move).
template <class Store, clock_source LocalClock = steady_clock>
class blocked_cache {
 public:
  using store_type = Store;
  using local_clock_type = LocalClock;

  static constexpr std::size_t default_max_entries = 10'000;
  static constexpr std::size_t default_shards = 16;

  /// @param inner  the store doing the work (moved in)
  /// @param o      threshold and bounds
  /// @param clock  times blocks decided on the store's own clock
  /// @throws std::invalid_argument for a negative threshold or max_block
  explicit blocked_cache(Store inner, blocked_cache_options o = {}, LocalClock clock = LocalClock{})
      : inner_(std::move(inner)),
        clock_(std::move(clock)),
        options_(normalise(o)),
        per_shard_(options_.max_entries / options_.shards),
        shards_(std::make_unique<shard[]>(options_.shards)),
        counters_(std::make_unique<counters>()) {}

  blocked_cache()
    requires std::default_initializable<Store>
      : blocked_cache(Store{}) {}

  blocked_cache(blocked_cache&&) noexcept = default;
  blocked_cache& operator=(blocked_cache&&) noexcept = default;
  blocked_cache(const blocked_cache&) = delete;
  blocked_cache& operator=(const blocked_cache&) = delete;
  ~blocked_cache() = default;

  /// Decides `key` at the caller's `now`: locally when a cached block covers
  /// it, else by the wrapped store (caching a long rejection).
  template <class Config>
    requires requires(Store& s, const Config& c, std::string_view k, timestamp t, units u,
                      access a) {
      { s.apply(c, k, t, u, a) } -> std::same_as<decision>;
    }
  decision apply(const Config& cfg, std::string_view key, timestamp now, units cost, access a) {
    return decide(cfg, key, now.count(), false, cost, a,
                  [&] { return inner_.apply(cfg, key, now, cost, a); });
  }

  /// As above for a store that reads its own clock; blocks are timed on LocalClock.
  template <class Config>
    requires requires(Store& s, const Config& c, std::string_view k, units u, access a) {
      { s.apply(c, k, store_time, u, a) } -> std::same_as<decision>;
    }
  decision apply(const Config& cfg, std::string_view key, store_time_t, units cost, access a) {
    return decide(cfg, key, local_now(), true, cost, a,
                  [&] { return inner_.apply(cfg, key, store_time, cost, a); });
  }

  /// Forwards an idempotent check to a store that keeps request ids itself
  /// (the Redis stores), without consulting the cache: a retry must get its
  /// first decision, which a cached block could contradict.
  template <class Config, class Time>
    requires requires(Store& s, const Config& c, std::string_view k, request_id id,
                      std::chrono::microseconds r, Time t, units u, access a) {
      { s.apply_once(c, k, id, r, t, u, a) } -> std::same_as<decision>;
    }
  decision apply_once(const Config& cfg, std::string_view key, request_id id,
                      std::chrono::microseconds retention, Time now, units cost, access a) {
    return inner_.apply_once(cfg, key, id, retention, now, cost, a);
  }

  /// Forwards the wrapped store's config check (limiter's constructor calls it).
  template <class Config>
    requires requires(const Store& s, const Config& c) { s.check_config(c); }
  void check_config(const Config& cfg) const {
    inner_.check_config(cfg);
  }

  /// Forgets `key` in the wrapped store, then in the cache (also when the
  /// store throws, and a rejection racing with the reset is not cached).
  template <class Config>
    requires requires(Store& s, const Config& c, std::string_view k) { s.reset(c, k); }
  void reset(const Config& cfg, std::string_view key) {
    try {
      inner_.reset(cfg, key);
    } catch (...) {
      forget(key);
      throw;
    }
    forget(key);
  }

  /// Drops `key` from the cache only (the store is untouched): its next check
  /// goes to the store.
  void forget(std::string_view key) {
    shard& sh = shard_for(key);
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    if (const auto it = sh.map.find(key); it != sh.map.end()) sh.map.erase(it);
    sh.publish_size();
    // Any check that read the old generation and is still waiting for the
    // store must not cache what the store said before this reset.
    sh.generation.fetch_add(1, std::memory_order_release);
  }

  /// Drops every entry whose block has ended: caller-time entries at `now`,
  /// store-time entries at LocalClock's now. Returns how many were dropped.
  std::size_t sweep(timestamp now) {
    const std::int64_t local = local_now();
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < options_.shards; ++i) {
      shard& sh = shards_[i];
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      dropped += sh.drop_expired(now.count(), local);
      sh.publish_size();
    }
    counters_->expired.fetch_add(dropped, std::memory_order_relaxed);
    return dropped;
  }

  /// Drops every entry.
  void clear() {
    for (std::size_t i = 0; i < options_.shards; ++i) {
      shard& sh = shards_[i];
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      sh.map.clear();
      sh.publish_size();
      sh.generation.fetch_add(1, std::memory_order_release);
    }
  }

  /// Entries held (expired ones not yet reclaimed included); <= max_entries.
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < options_.shards; ++i) {
      n += shards_[i].size.load(std::memory_order_relaxed);
    }
    return n;
  }

  /// Counters (relaxed reads; not one atomic snapshot).
  [[nodiscard]] blocked_cache_stats stats() const noexcept {
    const auto get = [](const std::atomic<std::uint64_t>& c) {
      return c.load(std::memory_order_relaxed);
    };
    const counters& c = *counters_;
    return {get(c.hits), get(c.stored), get(c.evicted), get(c.expired), get(c.skipped)};
  }

  /// The options in force (zeros replaced by defaults).
  [[nodiscard]] const blocked_cache_options& options() const noexcept { return options_; }
  /// The wrapped store (for `stats`, `sweep` and the like).
  [[nodiscard]] Store& inner() noexcept { return inner_; }
  [[nodiscard]] const Store& inner() const noexcept { return inner_; }
  [[nodiscard]] LocalClock& local_clock() noexcept { return clock_; }

 private:
  static constexpr std::int64_t forever = std::numeric_limits<std::int64_t>::max();

  /// One cached block. Times are microseconds on the caller's clock, or on
  /// LocalClock when `local` is set; `forever` for a `never` rejection.
  /// What a later check's config must match: cfg.limit(), and the rate
  /// (limit, period us) of a config that has one, so that a config of one
  /// name and limit but another rate (a tier changed at run time) misses. A
  /// compound folds its sub-limits' rates into the last two numbers.
  struct config_id {
    units limit = 0;
    std::uint64_t rate_limit = 0;  ///< unsigned: the compound's fold wraps
    std::uint64_t period = 0;
    friend bool operator==(const config_id&, const config_id&) = default;
  };

  template <class Config>
  [[nodiscard]] static config_id id_of(const Config& cfg) noexcept {
    config_id id;
    id.limit = cfg.limit();
    fold_rate(cfg, id);
    return id;
  }

  template <class Config>
  static void fold_rate(const Config& cfg, config_id& id) noexcept {
    if constexpr (requires { cfg.get_rate().period(); }) {
      // Each rate is mixed in, so a compound's sub-limits all count.
      id.rate_limit = id.rate_limit * 1'000'003U +
                      static_cast<std::uint64_t>(cfg.get_rate().limit());
      id.period = id.period * 1'000'003U +
                  static_cast<std::uint64_t>(cfg.get_rate().period().count());
    } else if constexpr (requires { cfg.parts().begin(); }) {
      for (const auto& part : cfg.parts()) fold_rate(part, id);
    } else if constexpr (requires {
                           std::tuple_size<std::remove_cvref_t<decltype(cfg.parts())>>::value;
                         }) {
      std::apply([&](const auto&... part) { (fold_rate(part, id), ...); }, cfg.parts());
    }
  }

  struct entry {
    std::int64_t until = 0;     ///< first time the block no longer holds
    std::int64_t reset_at = 0;  ///< when the key is back to empty, per the cached decision
    units cost = 0;             ///< smallest cost known to be rejected until `until`
    units limit = 0;            ///< decision.limit of the cached rejection (reported)
    config_id config;           ///< id_of(cfg) of the check: what a later check must match
    std::string_view policy;    ///< P::name (static storage)
    std::string name;           ///< cfg.name() of the check
    bool local = false;         ///< timed on LocalClock (store_time checks)
  };

  struct key_hash {
    using is_transparent = void;
    [[nodiscard]] std::size_t operator()(std::string_view k) const noexcept {
      return std::hash<std::string_view>{}(k);
    }
  };

  struct alignas(64) shard {
    detail::spin_lock lock;
    std::unordered_map<std::string, entry, key_hash, std::equal_to<>> map;
    /// map.size(), readable without the lock (an empty shard is skipped).
    std::atomic<std::size_t> size{0};
    /// Bumped by every forget/clear, so a check that raced with a reset does
    /// not cache the pre-reset answer.
    std::atomic<std::uint64_t> generation{0};

    void publish_size() noexcept { size.store(map.size(), std::memory_order_release); }

    std::size_t drop_expired(std::int64_t caller_now, std::int64_t local_now) {
      return static_cast<std::size_t>(std::erase_if(map, [&](const auto& kv) {
        return kv.second.until <= (kv.second.local ? local_now : caller_now);
      }));
    }
  };

  struct counters {
    std::atomic<std::uint64_t> hits{0};
    std::atomic<std::uint64_t> stored{0};
    std::atomic<std::uint64_t> evicted{0};
    std::atomic<std::uint64_t> expired{0};
    std::atomic<std::uint64_t> skipped{0};
  };

  static blocked_cache_options normalise(blocked_cache_options o) {
    if (o.threshold.count() < 0) {
      throw std::invalid_argument("ratelimit: blocked_cache threshold must be >= 0 us, got " +
                                  std::to_string(o.threshold.count()) + " us");
    }
    if (o.max_block.count() < 0) {
      throw std::invalid_argument("ratelimit: blocked_cache max_block must be >= 0 us, got " +
                                  std::to_string(o.max_block.count()) + " us");
    }
    if (o.max_entries == 0) o.max_entries = default_max_entries;
    if (o.shards == 0) o.shards = default_shards;
    o.shards = std::min(o.shards, o.max_entries);
    return o;
  }

  [[nodiscard]] static std::int64_t add_sat(std::int64_t t, std::chrono::microseconds d) noexcept {
    if (d == never || d.count() > forever - t) return forever;
    return t + d.count();
  }

  [[nodiscard]] std::int64_t local_now() const noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(clock_.now().time_since_epoch())
        .count();
  }

  [[nodiscard]] shard& shard_for(std::string_view key) const noexcept {
    return shards_[key_hash{}(key) % options_.shards];
  }

  template <class Config, class Call>
  decision decide(const Config& cfg, std::string_view key, std::int64_t now, bool local, units cost,
                  access a, Call call) {
    using P = typename Config::policy_type;
    if (a == access::force) return call();
    shard& sh = shard_for(key);
    std::uint64_t generation = 0;
    if (auto hit = lookup(sh, key, P::name, cfg.name(), id_of(cfg), now, local, cost, generation)) {
      counters_->hits.fetch_add(1, std::memory_order_relaxed);
      return *hit;
    }
    decision d = call();
    if (a == access::consume && !d.allowed && d.source == decision_source::store &&
        d.retry_after >= options_.threshold) {
      store(sh, key, P::name, cfg.name(), id_of(cfg), now, local, cost, d, generation);
    }
    return d;
  }

  /// The cached rejection covering (key, cost) at `now`, if any; else reads
  /// the shard's generation into `generation` for a later `store`.
  std::optional<decision> lookup(shard& sh, std::string_view key, std::string_view policy,
                                 std::string_view name, const config_id& config, std::int64_t now,
                                 bool local, units cost, std::uint64_t& generation) {
    if (sh.size.load(std::memory_order_acquire) == 0) {
      generation = sh.generation.load(std::memory_order_acquire);
      return std::nullopt;
    }
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    generation = sh.generation.load(std::memory_order_relaxed);
    const auto it = sh.map.find(key);
    if (it == sh.map.end()) return std::nullopt;
    const entry& e = it->second;
    if (e.local != local || e.policy != policy || !(e.config == config) || e.name != name) {
      return std::nullopt;
    }
    if (now >= e.until) {
      sh.map.erase(it);
      sh.publish_size();
      counters_->expired.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    if (cost < e.cost) return std::nullopt;
    decision d;
    d.allowed = false;
    d.counted = false;
    d.source = decision_source::local_cache;
    d.limit = e.limit;
    d.remaining = 0;
    // A check stamped before the cached decision (caller time running
    // backwards) is still rejected by every policy; it is told the whole block.
    d.retry_after = e.until == forever ? never : std::chrono::microseconds{e.until - now};
    d.reset_after = e.reset_at == forever ? never : std::chrono::microseconds{e.reset_at - now};
    d.reset_after = std::max(d.reset_after, d.retry_after);
    return d;
  }

  void store(shard& sh, std::string_view key, std::string_view policy, std::string_view name,
             const config_id& config, std::int64_t now, bool local, units cost, const decision& d,
             std::uint64_t generation) {
    entry e;
    e.until = add_sat(now, options_.max_block.count() > 0
                               ? std::min(d.retry_after, options_.max_block)
                               : d.retry_after);
    e.reset_at = add_sat(now, d.reset_after);
    e.cost = cost;
    // A compound reports its binding sub-limit, which need not be cfg.limit().
    e.limit = d.limit;
    e.config = config;
    e.policy = policy;
    e.name = name;
    e.local = local;
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    if (sh.generation.load(std::memory_order_relaxed) != generation) {
      counters_->skipped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // A live entry for this key made the check miss, so its cost was above
    // `cost`, or it belonged to another policy or clock: the new one replaces it.
    if (auto it = sh.map.find(key); it != sh.map.end()) {
      it->second = e;
    } else {
      if (sh.map.size() >= per_shard_) make_room(sh, now, local);
      sh.map.emplace(std::string(key), e);
    }
    sh.publish_size();
    counters_->stored.fetch_add(1, std::memory_order_relaxed);
  }

  /// Frees one slot at least: every expired entry, else the one expiring
  /// soonest. Caller-time entries are judged at this check's `now` when it is
  /// caller time (dropping an entry early is always safe: it only costs a
  /// round trip), and kept when it is not.
  void make_room(shard& sh, std::int64_t now, bool local) {
    const std::size_t dropped = sh.drop_expired(
        local ? std::numeric_limits<std::int64_t>::min() : now, local ? now : local_now());
    if (dropped > 0) {
      counters_->expired.fetch_add(dropped, std::memory_order_relaxed);
      return;
    }
    auto soonest = sh.map.begin();
    for (auto it = sh.map.begin(); it != sh.map.end(); ++it) {
      if (it->second.until < soonest->second.until) soonest = it;
    }
    sh.map.erase(soonest);
    counters_->evicted.fetch_add(1, std::memory_order_relaxed);
  }

  Store inner_;
  LocalClock clock_;
  blocked_cache_options options_;
  std::size_t per_shard_;
  std::unique_ptr<shard[]> shards_;
  std::unique_ptr<counters> counters_;
};

}  // namespace ratelimit
