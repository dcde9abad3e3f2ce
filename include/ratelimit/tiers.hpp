// SPDX-License-Identifier: Apache-2.0
// Tiers: a limiter whose config depends on the subscriber's plan, and limits
// an operator changes at runtime.
//
// Three parts:
// - `tiered<P>`, a policy wrapper whose state remembers the fingerprint of the
//   config that wrote it (the same values the Redis scripts store), so that
//   `memory_store<tiered<P>>` holds keys of different configs: a key is judged
//   idle by its own config, and a check under another config converts the
//   state or starts fresh exactly as the Redis scripts do.
// - `tier_table<P>`, the tiers (name -> config) an operator changes while
//   checks run: readers take no lock and touch no shared reference count.
// - `tiered_limiter<P, Store, Clock>`, the object application code calls:
//   key -> tier (a lookup the application supplies, or the tier per call)
//   -> config -> the store.
// The rules are docs/semantics.md, "Tiers and limits that change at runtime".
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/forced_step.hpp"
#include "ratelimit/detail/limiter_name.hpp"
#include "ratelimit/detail/printable.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/blocked_cache.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "ratelimit/store/observed_store.hpp"

namespace ratelimit {

namespace detail {

/// A config's identity as far as its state is concerned: exactly the
/// numbers the Redis script of its policy stores with the state (its ARGV
/// from ARGV[5] on, see redis/scripts/). Two configs with one fingerprint
/// read each other's state as their own. All zero = no state.
using config_fingerprint = std::array<std::int64_t, 3>;

/// What `tiered<P>` needs of a policy beyond the `policy` concept, one
/// specialisation per policy:
/// - `fingerprint(cfg)`;
/// - `idle(fp, s, now)`: `P::idle` under the config whose fingerprint is `fp`;
/// - `converts`: whether state written under another config is converted
///   (`convert(old_fp, cfg, s, now)` rewrites it in place, in the new config's
///   terms) or ignored (the check starts fresh).
template <class P>
struct tier_traits;

/// The three window policies share their fingerprint: period, limit, count_rejected.
template <class P>
struct window_tier_traits {
  [[nodiscard]] static config_fingerprint fingerprint(const typename P::config& cfg) noexcept {
    return {cfg.period_us(), cfg.limit(), cfg.count_rejected() ? 1 : 0};
  }
};

template <>
struct tier_traits<fixed_window> : window_tier_traits<fixed_window> {
  static constexpr bool converts = false;
  [[nodiscard]] static bool idle(const config_fingerprint& fp, const fixed_window::state& s,
                                 timestamp now) noexcept {
    return s.count == 0 || floor_div(now.count(), fp[0]) > s.window;
  }
};

template <>
struct tier_traits<sliding_window_counter> : window_tier_traits<sliding_window_counter> {
  static constexpr bool converts = false;
  [[nodiscard]] static bool idle(const config_fingerprint& fp,
                                 const sliding_window_counter::state& s, timestamp now) noexcept {
    if (s.current == 0 && s.previous == 0) return true;
    const std::int64_t k = floor_div(now.count(), fp[0]);
    return k >= s.window + 2 || (k == s.window + 1 && s.current == 0);
  }
};

template <>
struct tier_traits<sliding_window_log> : window_tier_traits<sliding_window_log> {
  static constexpr bool converts = true;
  [[nodiscard]] static bool idle(const config_fingerprint& fp, const sliding_window_log::state& s,
                                 timestamp now) noexcept {
    return s.empty() || s.back().ts <= now.count() - fp[0];
  }
  /// The log's entries are absolute times. At the decision time t (clamped to
  /// the newest entry): a log idle under its own window is empty; otherwise
  /// the entries at or before t - W' go and the rest is trimmed as the new
  /// limit's log would be. As the script (redis/scripts/sliding_window_log.hpp).
  static void convert(const config_fingerprint& old, const sliding_window_log::config& cfg,
                      sliding_window_log::state& s, timestamp now) noexcept {
    if (s.empty()) return;
    std::int64_t t = now.count();
    if (t < s.back().ts) t = s.back().ts;
    if (s.back().ts <= t - old[0]) {
      while (!s.empty()) s.pop_front();
      return;
    }
    const std::size_t first = sliding_window_log::first_in_window(s, t - cfg.period_us());
    for (std::size_t i = 0; i < first; ++i) s.pop_front();
    sliding_window_log::trim(s, cfg.limit());
  }
};

template <>
struct tier_traits<token_bucket> {
  static constexpr bool converts = false;
  [[nodiscard]] static config_fingerprint fingerprint(const token_bucket::config& cfg) noexcept {
    return {cfg.ticks_per_us(), cfg.ticks_per_token(), cfg.burst()};
  }
  [[nodiscard]] static bool idle(const config_fingerprint& fp, const token_bucket::state& s,
                                 timestamp now) noexcept {
    return s.deficit == 0 || now.count() - s.last >= ceil_div(s.deficit, fp[0]);
  }
};

template <>
struct tier_traits<gcra> {
  static constexpr bool converts = true;
  [[nodiscard]] static config_fingerprint fingerprint(const gcra::config& cfg) noexcept {
    return {cfg.interval_us(), cfg.burst(), 0};
  }
  [[nodiscard]] static bool idle(const config_fingerprint&, const gcra::state& s,
                                 timestamp now) noexcept {
    return s.tat <= now.count();
  }
  /// TAT is an absolute time: clamped to the most debt the new config can
  /// hold, t + burst' x T'; a TAT at or before t is at rest (empty). As the
  /// script (redis/scripts/gcra.hpp).
  static void convert(const config_fingerprint&, const gcra::config& cfg, gcra::state& s,
                      timestamp now) noexcept {
    const std::int64_t t = now.count();
    s.tat = std::min(s.tat, t + cfg.tolerance_us());
    if (s.tat <= t) s = gcra::state{};
  }
};

}  // namespace detail

/// Policy P whose state carries the fingerprint of the config that wrote it,
/// so that one `memory_store<tiered<P>>` holds keys written under different
/// configs (tiers, and tiers changed at runtime) safely:
///
/// - A check under the config that wrote the state is P's own step, after
///   one compare of 24 bytes.
/// - A check under another config does what the Redis script does with state
///   whose stored fingerprint differs: the sliding log and GCRA convert it
///   (`detail::tier_traits<P>::convert`) and any check that is not a peek
///   writes the converted state back under the new fingerprint, whatever it
///   decides; the fixed window, sliding counter and token bucket start fresh,
///   and write only what the new config's decision records (a rejection
///   leaves the old state, under its old fingerprint, as it was).
/// - `idle(cfg, s, now)` ignores `cfg`: a key is idle by the config that
///   wrote it, so `memory_store::sweep` and its reclaim judge every key by its
///   own config.
///
/// The fingerprint is the config's Redis script arguments (never a tier name
/// or index), so two tiers with one config share state as in Redis, and a
/// tier changed back to an earlier config finds its state as written.
/// memory_store itself is unchanged: a plain `memory_store<P>` keeps P's
/// state alone and is neither bigger nor slower. Cost: 24 bytes per key.
template <policy P>
  requires requires { detail::tier_traits<P>::converts; }
struct tiered {
  using traits = detail::tier_traits<P>;
  using inner_policy = P;
  static constexpr std::string_view name = P::name;

  /// P's config and its fingerprint, computed once. Thread safety: immutable.
  class config {
   public:
    using policy_type = tiered;
    explicit config(typename P::config inner)
        : inner_(std::move(inner)), fingerprint_(traits::fingerprint(inner_)) {}
    [[nodiscard]] const typename P::config& inner() const noexcept { return inner_; }
    [[nodiscard]] const detail::config_fingerprint& fingerprint() const noexcept {
      return fingerprint_;
    }
    [[nodiscard]] units limit() const noexcept { return inner_.limit(); }
    [[nodiscard]] const std::string& name() const noexcept { return inner_.name(); }

   private:
    typename P::config inner_;
    detail::config_fingerprint fingerprint_;
  };

  /// P's state and the fingerprint of the config that wrote it (all zero
  /// exactly when `inner` is empty). Value-initialised = key never seen.
  struct state {
    typename P::state inner{};
    detail::config_fingerprint written_under{};
    friend bool operator==(const state&, const state&) = default;
  };

  static decision step(const config& cfg, state& s, timestamp now,
                       units cost) noexcept(noexcept(P::step(cfg.inner(), s.inner, now, cost))) {
    if (s.written_under == cfg.fingerprint()) [[likely]] {
      return P::step(cfg.inner(), s.inner, now, cost);
    }
    return step_changed<false>(cfg, s, now, cost);
  }

  /// access::force (a tier in shadow mode): as `step`, with P::force.
  static decision force(const config& cfg, state& s, timestamp now, units cost)
    requires forcible_policy<P>
  {
    if (s.written_under == cfg.fingerprint()) [[likely]] {
      return P::force(cfg.inner(), s.inner, now, cost);
    }
    return step_changed<true>(cfg, s, now, cost);
  }

  static bool idle(const config&, const state& s, timestamp now) noexcept {
    return s.written_under == detail::config_fingerprint{} ||
           traits::idle(s.written_under, s.inner, now);
  }

 private:
  /// A key never seen, or state written under another config. Works on a
  /// copy, so that a step that throws (std::bad_alloc) leaves `s` unchanged.
  template <bool Forced>
  [[gnu::noinline]] static decision step_changed(const config& cfg, state& s, timestamp now,
                                                 units cost) {
    const auto inner_step = [&](typename P::state& st) {
      if constexpr (Forced) {
        return P::force(cfg.inner(), st, now, cost);
      } else {
        return P::step(cfg.inner(), st, now, cost);
      }
    };
    typename P::state next{};
    if constexpr (traits::converts) {
      if (s.written_under != detail::config_fingerprint{}) {
        next = s.inner;
        traits::convert(s.written_under, cfg.inner(), next, now);
        const decision d = inner_step(next);
        store(cfg, s, std::move(next));
        return d;
      }
    }
    const decision d = inner_step(next);
    // A fresh start records only what this decision records.
    if (!(next == typename P::state{})) store(cfg, s, std::move(next));
    return d;
  }

  static void store(const config& cfg, state& s, typename P::state&& next) noexcept {
    const bool empty = next == typename P::state{};
    s.inner = std::move(next);
    s.written_under = empty ? detail::config_fingerprint{} : cfg.fingerprint();
  }
};

/// One tier: its name, its config, and whether it is in shadow mode. Tiers
/// are replaced whole, so the shadow flag changes atomically with the config.
template <policy P>
struct tier {
  std::string name;
  typename P::config config;
  /// Shadow mode for this tier: its checks record every request as admitted
  /// (access::force) and return `allowed == true`, with `shadow_rejected`
  /// set where the tier's config would have rejected (as limiter::set_shadow).
  bool shadow = false;
};

namespace detail {

/// Tier names are operator-chosen identifiers: 1..64 bytes of [A-Za-z0-9_.-].
inline void check_tier_name(std::string_view name) {
  const auto ok = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  };
  bool good = !name.empty() && name.size() <= max_name_bytes;
  for (const char c : name) good = good && ok(c);
  if (!good) {
    throw std::invalid_argument("ratelimit: tier name \"" + printable(name) + "\" must be 1.." +
                                std::to_string(max_name_bytes) + " bytes of [A-Za-z0-9_.-]");
  }
}

/// Stripes of reader counts: a thread takes a stripe of its own (round
/// robin at its first check), so up to `reader_stripes` threads never write
/// one cache line in common.
inline constexpr std::size_t reader_stripes = 64;

[[nodiscard]] inline std::size_t this_thread_stripe() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine & (reader_stripes - 1);
}

/// Whether a store keeps `tiered<P>` state (and takes its configs).
template <class Store, class P>
struct keeps_tier_state : std::false_type {};
template <class Store, class P>
  requires std::same_as<typename Store::policy_type, tiered<P>>
struct keeps_tier_state<Store, P> : std::true_type {};

/// Whether `Store` is a plain `memory_store<P>`, bare or inside the store
/// wrappers (blocked_cache, observed_store): one that keeps P's state
/// without the fingerprint of the config that wrote it, so keys of
/// different tiers would read each other's state as their own.
template <class Store, class P>
struct wraps_plain_memory_store : std::false_type {};
template <class P>
struct wraps_plain_memory_store<memory_store<P>, P> : std::true_type {};
template <class S, class C, class P>
struct wraps_plain_memory_store<blocked_cache<S, C>, P> : wraps_plain_memory_store<S, P> {};
template <class S, class O, class P>
struct wraps_plain_memory_store<observed_store<S, O>, P> : wraps_plain_memory_store<S, P> {};

}  // namespace detail

/// The tiers of one limiter, changed at runtime while checks run.
///
/// Reading (every check) takes no lock: the tiers are an immutable snapshot
/// behind an atomic pointer. Reclamation: a reader announces itself on its
/// own stripe, `count[parity]` (one cache line per stripe, one stripe per
/// thread up to 64 threads), then loads the pointer, checks, and withdraws.
/// A change builds a new snapshot, swaps the pointer, then waits until no
/// reader that could have loaded the old pointer is left, and frees it: it
/// flips `parity` (new readers count on the other side), waits until every
/// stripe's old side is 0, and does the same for the other side. A reader
/// that loaded the old pointer announced itself before the swap (both are
/// sequentially consistent), so one of the two waits sees its count and
/// waits for it; the flips let each side drain while checks go on. So at
/// most two snapshots exist at any time, whatever the number of changes.
///
/// Writers are serialised by a mutex and block until the checks in flight
/// when they swapped have returned (microseconds in process; a Redis round
/// trip at most, bounded by the command timeout). A change must therefore
/// not be made from inside a check (a store's observer callback): it would
/// wait for itself.
template <policy P>
class tier_table {
 public:
  using config_type = typename P::config;
  using tiered_config = typename tiered<P>::config;

  /// A tier as held: its name, P's config, and the tiered config the
  /// memory store takes (with its fingerprint).
  struct entry {
    std::string name;
    tiered_config config;
    bool shadow = false;
  };

  /// The tiers at one moment. Sorted by name.
  struct snapshot {
    std::vector<entry> entries;
    const entry* fallback = nullptr;  ///< the default tier, if any

    /// The tier `name`, else the default tier, else nullptr. A few tiers
    /// are scanned (sizes compared first), more are bisected.
    [[nodiscard]] const entry* find(std::string_view name) const noexcept {
      if (entries.size() <= 8) {
        for (const entry& e : entries) {
          if (e.name.size() == name.size() &&
              std::memcmp(e.name.data(), name.data(), name.size()) == 0) {
            return &e;
          }
        }
        return fallback;
      }
      const auto it = std::lower_bound(
          entries.begin(), entries.end(), name,
          [](const entry& e, std::string_view n) { return std::string_view(e.name) < n; });
      if (it != entries.end() && it->name == name) return &*it;
      return fallback;
    }
  };

  /// @param tiers        at least one; unique valid names; configs of one name
  /// @param default_tier the tier of a name the table does not hold; empty:
  ///                     such a name is an error
  /// @throws std::invalid_argument naming the bad tier, name or config
  tier_table(std::vector<tier<P>> tiers, std::string default_tier)
      : default_(std::move(default_tier)) {
    if (tiers.empty()) throw std::invalid_argument("ratelimit: a tiered limiter needs a tier");
    name_ = tiers.front().config.name();
    auto s = std::make_unique<snapshot>();
    for (tier<P>& t : tiers) {
      check(t.name, t.config);
      s->entries.push_back(entry{std::move(t.name), tiered_config(std::move(t.config)), t.shadow});
    }
    finish(*s);
    current_.store(s.release(), std::memory_order_seq_cst);
    snapshots_.fetch_add(1, std::memory_order_relaxed);
  }

  tier_table(const tier_table&) = delete;
  tier_table& operator=(const tier_table&) = delete;
  ~tier_table() { delete current_.load(std::memory_order_relaxed); }

  /// Calls `f(const snapshot&)` with the current tiers, lock-free.
  template <class F>
  decltype(auto) read(F&& f) const {
    stripe& st = stripes_[detail::this_thread_stripe()];
    std::atomic<std::int64_t>& count = st.count[parity_.load(std::memory_order_relaxed) & 1U];
    count.fetch_add(1, std::memory_order_seq_cst);
    struct leave {
      std::atomic<std::int64_t>& c;
      ~leave() { c.fetch_sub(1, std::memory_order_release); }
    } guard{count};
    return std::forward<F>(f)(*current_.load(std::memory_order_seq_cst));
  }

  /// Adds tier `name` or replaces its config; the next check uses it. A
  /// replaced tier keeps its shadow flag unless `shadow` is given; a new
  /// tier is in shadow mode only if `shadow` says so.
  /// @throws std::invalid_argument for a bad name, a config of another
  ///   limiter name, or one `check` refuses
  template <class Check>
  void set(std::string name, config_type cfg, Check&& check_store,
           std::optional<bool> shadow = std::nullopt) {
    check(name, cfg);
    check_store(cfg);
    change([&](snapshot& s) {
      for (entry& e : s.entries) {
        if (e.name == name) {
          e.config = tiered_config(std::move(cfg));
          if (shadow) e.shadow = *shadow;
          return;
        }
      }
      s.entries.push_back(
          entry{std::move(name), tiered_config(std::move(cfg)), shadow.value_or(false)});
    });
  }

  /// Puts tier `name` in shadow mode, or takes it out; the next check uses it.
  /// @throws std::invalid_argument when there is no such tier
  void set_shadow(std::string_view name, bool on) {
    change([&](snapshot& s) {
      for (entry& e : s.entries) {
        if (e.name == name) {
          e.shadow = on;
          return;
        }
      }
      throw std::invalid_argument("ratelimit: no tier \"" + detail::printable(name) + "\"");
    });
  }

  /// Removes tier `name`.
  /// @throws std::invalid_argument when there is no such tier, or it is the
  ///   default tier or the last one
  void remove(std::string_view name) {
    if (!default_.empty() && name == default_) {
      throw std::invalid_argument("ratelimit: tier \"" + detail::printable(name) +
                                  "\" is the default tier and cannot be removed");
    }
    change([&](snapshot& s) {
      const auto it = std::find_if(s.entries.begin(), s.entries.end(),
                                   [&](const entry& e) { return e.name == name; });
      if (it == s.entries.end()) {
        throw std::invalid_argument("ratelimit: no tier \"" + detail::printable(name) + "\"");
      }
      if (s.entries.size() == 1) {
        throw std::invalid_argument("ratelimit: tier \"" + it->name +
                                    "\" is the last tier and cannot be removed");
      }
      s.entries.erase(it);
    });
  }

  /// The limiter name every tier's config carries.
  [[nodiscard]] const std::string& limiter_name() const noexcept { return name_; }
  [[nodiscard]] const std::string& default_tier() const noexcept { return default_; }

  /// Snapshots allocated and not yet freed: 1 at rest, 2 during a change.
  [[nodiscard]] std::size_t live_snapshots() const noexcept {
    return snapshots_.load(std::memory_order_relaxed);
  }

 private:
  struct alignas(64) stripe {
    std::atomic<std::int64_t> count[2] = {0, 0};
  };

  void check(std::string_view tier_name, const config_type& cfg) const {
    detail::check_tier_name(tier_name);
    if (cfg.name() != name_) {
      throw std::invalid_argument("ratelimit: tier \"" + std::string(tier_name) +
                                  "\" has limiter name \"" + cfg.name() + "\", not \"" + name_ +
                                  "\": the tiers of one limiter share its name");
    }
  }

  void finish(snapshot& s) const {
    std::sort(s.entries.begin(), s.entries.end(),
              [](const entry& a, const entry& b) { return a.name < b.name; });
    for (std::size_t i = 1; i < s.entries.size(); ++i) {
      if (s.entries[i].name == s.entries[i - 1].name) {
        throw std::invalid_argument("ratelimit: tier \"" + s.entries[i].name + "\" is given twice");
      }
    }
    s.fallback = nullptr;
    if (!default_.empty()) {
      s.fallback = s.find(default_);
      if (s.fallback == nullptr) {
        throw std::invalid_argument("ratelimit: default tier \"" + detail::printable(default_) +
                                    "\" is not one of the tiers");
      }
    }
  }

  /// Copies the current snapshot, edits the copy, publishes it and frees
  /// the old one once no reader can hold it (see the class comment).
  template <class Edit>
  void change(Edit&& edit) {
    std::lock_guard<std::mutex> lock(write_);
    auto next = std::make_unique<snapshot>();
    next->entries = current_.load(std::memory_order_relaxed)->entries;
    edit(*next);
    finish(*next);
    snapshots_.fetch_add(1, std::memory_order_relaxed);
    const snapshot* old = current_.exchange(next.release(), std::memory_order_seq_cst);
    for (int side = 0; side < 2; ++side) {
      const unsigned draining = parity_.load(std::memory_order_relaxed);
      parity_.store(draining ^ 1U, std::memory_order_seq_cst);
      for (stripe& st : stripes_) {
        for (int spins = 0; st.count[draining & 1U].load(std::memory_order_seq_cst) != 0; ++spins) {
          if (spins < 64) {
            std::this_thread::yield();
          } else {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
        }
      }
    }
    delete old;
    snapshots_.fetch_sub(1, std::memory_order_relaxed);
  }

  std::string name_;
  std::string default_;
  std::atomic<snapshot*> current_{nullptr};
  mutable std::array<stripe, detail::reader_stripes> stripes_{};
  std::atomic<unsigned> parity_{0};
  std::atomic<std::size_t> snapshots_{0};
  std::mutex write_;
};

/// Options of `tiered_limiter`.
struct tiered_options {
  /// The tier of a key whose lookup names no tier the limiter holds; empty
  /// (the default): such a check throws std::invalid_argument naming the tier.
  std::string default_tier = {};
};

/// A limiter whose config depends on the key's tier ("free: 10/min, pro:
/// 100/min"), with tiers changed at runtime.
///
/// - `try_acquire(key[, now], cost)` asks the application's lookup for the
///   key's tier; `try_acquire(key, tier[, now], cost)` takes it per call.
///   `peek` likewise.
/// - `set_tier(name, cfg)` adds or replaces a tier, `remove_tier(name)`
///   removes one: the next check uses the new tiers (see `tier_table` for
///   how, lock-free).
/// - Every tier's config carries the limiter's name (its identity): a key
///   has one state whatever its tier, so a subscriber changing plan, or a
///   tier changed by the operator, keeps its state under the rule of
///   docs/semantics.md ("State written under another config"): the sliding
///   log and GCRA convert it, the others start fresh.
///
/// Stores: `memory_store<tiered<P>>` (the default; it receives the tier's
/// `tiered<P>::config`, so it judges each key's idleness by its own config),
/// or a store that takes P's configs as they are (`redis::redis_store`,
/// `redis::cluster_store`, whose scripts handle another config's state).
/// A plain `memory_store<P>` is refused: it would judge idleness by the
/// caller's config.
///
/// Thread safety: checks and changes may run from any number of threads.
template <policy P, class Store = memory_store<tiered<P>>, class Clock = steady_clock>
  requires(clock_source<Clock> || store_clock<Clock>)
class tiered_limiter {
  static constexpr bool tier_state_store = detail::keeps_tier_state<Store, P>::value;
  static_assert(!detail::wraps_plain_memory_store<Store, P>::value,
                "a tiered_limiter keeps its keys in memory_store<tiered<P>>, not in a plain "
                "memory_store<P> (bare or wrapped), which would read a key written under one "
                "tier's config as the other's");

 public:
  using policy_type = P;
  using config_type = typename P::config;
  using store_type = Store;
  using clock_type = Clock;
  /// Key -> tier name. The view returned must stay valid until the check returns.
  using tier_lookup = std::function<std::string_view(std::string_view key)>;

  /// @param tiers  at least one tier; unique names; every config with one limiter name
  /// @param lookup key -> tier; may be empty if every check names its tier
  /// @throws std::invalid_argument for a bad tier or default tier, configs of
  ///   different names, or a config the store refuses (the Redis stores
  ///   require a name)
  tiered_limiter(std::vector<tier<P>> tiers, tier_lookup lookup, tiered_options o = {},
                 Store store = Store{}, Clock clock = Clock{})
      : table_(std::move(tiers), std::move(o.default_tier)),
        lookup_(std::move(lookup)),
        store_(std::move(store)),
        clock_(std::move(clock)) {
    table_.read([this](const typename tier_table<P>::snapshot& s) {
      for (const auto& e : s.entries) check_store(e.config.inner());
      return 0;
    });
  }

  /// Decides `key` in the tier its lookup names, now, consuming `cost` if admitted.
  /// @throws std::invalid_argument for a bad key or cost, or a tier the
  ///   limiter does not hold without a default tier; std::logic_error
  ///   without a lookup
  [[nodiscard]] decision try_acquire(std::string_view key, units cost = 1) {
    return run(key, tier_of(key), cost, access::consume);
  }
  [[nodiscard]] decision try_acquire(std::string_view key, timestamp now, units cost = 1)
    requires clock_source<Clock>
  {
    return run_at(key, tier_of(key), now, cost, access::consume);
  }
  /// As above, in `tier`.
  [[nodiscard]] decision try_acquire(std::string_view key, std::string_view tier, units cost = 1) {
    return run(key, tier, cost, access::consume);
  }
  [[nodiscard]] decision try_acquire(std::string_view key, std::string_view tier, timestamp now,
                                     units cost = 1)
    requires clock_source<Clock>
  {
    return run_at(key, tier, now, cost, access::consume);
  }

  /// The decision try_acquire would return, consuming nothing.
  [[nodiscard]] decision peek(std::string_view key, units cost = 1) {
    return run(key, tier_of(key), cost, access::peek);
  }
  [[nodiscard]] decision peek(std::string_view key, timestamp now, units cost = 1)
    requires clock_source<Clock>
  {
    return run_at(key, tier_of(key), now, cost, access::peek);
  }
  [[nodiscard]] decision peek(std::string_view key, std::string_view tier, units cost = 1) {
    return run(key, tier, cost, access::peek);
  }
  [[nodiscard]] decision peek(std::string_view key, std::string_view tier, timestamp now,
                              units cost = 1)
    requires clock_source<Clock>
  {
    return run_at(key, tier, now, cost, access::peek);
  }

  /// Forgets `key` (its one state, whatever its tier).
  void reset(std::string_view key) {
    detail::check_key(key);
    table_.read([&](const typename tier_table<P>::snapshot& s) {
      store_.reset(config_for_store(s.entries.front()), key);
      return 0;
    });
  }

  /// Adds tier `name`, or replaces its config; checks after this call
  /// returns use it. Blocks until checks in flight have returned.
  /// @throws std::invalid_argument for a bad tier name, a config whose
  ///   limiter name differs from the other tiers', or one the store refuses
  void set_tier(std::string name, config_type cfg) {
    table_.set(std::move(name), std::move(cfg), [this](const config_type& c) { check_store(c); });
  }
  /// Adds or replaces a tier whole: its config and its shadow flag at once.
  void set_tier(tier<P> t) {
    table_.set(
        std::move(t.name), std::move(t.config), [this](const config_type& c) { check_store(c); },
        t.shadow);
  }

  /// Puts tier `name` in shadow mode (`on`) or takes it out, at run time:
  /// checks after this call returns use it. Blocks like set_tier.
  /// @throws std::invalid_argument for a tier not held
  void set_shadow(std::string_view name, bool on) { table_.set_shadow(name, on); }

  /// Removes tier `name`; its keys keep their state, and their next check
  /// in another tier follows the change rule.
  /// @throws std::invalid_argument for a tier not held, or the default tier
  void remove_tier(std::string_view name) { table_.remove(name); }

  /// The tiers now, sorted by name.
  [[nodiscard]] std::vector<tier<P>> tiers() const {
    return table_.read([](const typename tier_table<P>::snapshot& s) {
      std::vector<tier<P>> out;
      for (const auto& e : s.entries) out.push_back(tier<P>{e.name, e.config.inner(), e.shadow});
      return out;
    });
  }

  /// The config of `tier` now (the default tier's if it is not held).
  /// @throws std::invalid_argument as a check in that tier would
  [[nodiscard]] config_type config_of(std::string_view tier) const {
    return table_.read(
        [&](const typename tier_table<P>::snapshot& s) { return find(s, tier).config.inner(); });
  }

  /// memory_store: drops every key idle at `now` by the config that wrote it.
  std::size_t sweep(timestamp now)
    requires tier_state_store
  {
    return table_.read([&](const typename tier_table<P>::snapshot& s) {
      return store_.sweep(s.entries.front().config, now);
    });
  }

  /// The clock's current time in microseconds since its epoch.
  [[nodiscard]] timestamp now() const noexcept
    requires clock_source<Clock>
  {
    return std::chrono::duration_cast<timestamp>(clock_.now().time_since_epoch());
  }

  [[nodiscard]] const tier_table<P>& table() const noexcept { return table_; }
  [[nodiscard]] Store& store() noexcept { return store_; }
  [[nodiscard]] const Store& store() const noexcept { return store_; }
  [[nodiscard]] Clock& clock() noexcept { return clock_; }

 private:
  using entry = typename tier_table<P>::entry;

  void check_store(const config_type& cfg) const {
    if constexpr (requires { store_.check_config(cfg); }) store_.check_config(cfg);
  }

  std::string_view tier_of(std::string_view key) const {
    if (!lookup_) {
      throw std::logic_error(
          "ratelimit: tiered_limiter has no tier lookup; name the tier per call");
    }
    return lookup_(key);
  }

  [[nodiscard]] static const entry& find(const typename tier_table<P>::snapshot& s,
                                         std::string_view tier) {
    if (const entry* e = s.find(tier)) return *e;
    throw_unknown(tier);
  }

  [[noreturn, gnu::noinline, gnu::cold]] static void throw_unknown(std::string_view tier) {
    throw std::invalid_argument("ratelimit: unknown tier \"" + detail::printable(tier) +
                                "\" (and no default tier)");
  }

  static const auto& config_for_store(const entry& e) noexcept {
    if constexpr (tier_state_store) {
      return e.config;
    } else {
      return e.config.inner();
    }
  }

  decision run(std::string_view key, std::string_view tier, units cost, access a) {
    if constexpr (store_clock<Clock>) {
      detail::check_key(key);
      detail::check_cost(cost);
      return table_.read([&](const typename tier_table<P>::snapshot& s) {
        const entry& e = find(s, tier);
        if (a == access::consume && e.shadow) [[unlikely]]
          return detail::shadowed(
              store_.apply(config_for_store(e), key, store_time, cost, access::force));
        return store_.apply(config_for_store(e), key, store_time, cost, a);
      });
    } else {
      return run_at(key, tier, now(), cost, a);
    }
  }

  decision run_at(std::string_view key, std::string_view tier, timestamp now, units cost,
                  access a) {
    detail::check_key(key);
    detail::check_cost(cost);
    detail::check_time(now);
    return table_.read([&](const typename tier_table<P>::snapshot& s) {
      const entry& e = find(s, tier);
      if (a == access::consume && e.shadow) [[unlikely]]
        return detail::shadowed(store_.apply(config_for_store(e), key, now, cost, access::force));
      return store_.apply(config_for_store(e), key, now, cost, a);
    });
  }

  tier_table<P> table_;
  tier_lookup lookup_;
  Store store_;
  Clock clock_;
};

}  // namespace ratelimit
