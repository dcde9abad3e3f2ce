// SPDX-License-Identifier: Apache-2.0
// Compound limits: several rates on one key ("10 per 15 minutes and 100 per day"), all or nothing.
//
// Algorithm: every sub-limit decides the request on a copy of its own state.
// If every one admits, all copies are committed; otherwise the request is
// rejected and only the sub-limits that count rejected attempts
// (`count_rejected()` in their config) record it, each with its full cost, as
// they record any attempt. Accuracy: each sub-limit is exactly as accurate as
// alone. Memory: the sum of the sub-states (`compound_of` adds a std::vector).
// CPU: one step per sub-limit, plus a bisection in two rare cases (see
// `detail::settle`).
//
// `compound<Ps...>` fixes the sub-policies at compile time (any mix of
// policies); `compound_of<P>` holds any number of sub-limits of one policy,
// chosen at run time (`{"10/15min", "100/day"}`). Both model `policy`, so
// every store runs them unchanged, atomically per key.
//
// Why `retry_after` is exact. A rejected compound request is admitted at
// t + d (nothing else arriving) iff every sub-limit admits it at t + d on its
// committed state. For a fixed state every policy here is monotone in time:
// once a request is admitted at some time it is admitted at every later time
// (window counts only lose entries, the sliding counter's weight only shrinks
// and a new window starts from the old window's count alone, buckets only
// refill, GCRA's test only loosens as t grows). So the set of admitting d is
// [d_i, infinity) for each sub-limit and the compound's answer is max d_i.
// A sub-limit that admitted on its copy and was not committed keeps the very
// state on which it admitted, so it admits at every later time: d_i = 0. A
// sub-limit that rejected reports its own exact d_i, measured on the state it
// keeps (including the attempt under count_rejected). The one remaining case,
// a count_rejected sub-limit that admitted on its copy and records the
// attempt, is settled by bisection on that recorded state.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/limiter_name.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// Options of a compound limit as a whole.
struct compound_options {
  /// The compound limiter's name, its identity in shared stores: 1..64 bytes
  /// of [A-Za-z0-9_.-], or empty (unnamed; the Redis stores refuse it). The
  /// sub-limits' own names play no part in a compound.
  std::string name = {};
};

namespace detail {

/// What one sub-limit contributes to a compound decision, measured on the
/// state it keeps after the compound's outcome.
struct compound_part {
  units limit = 0;
  units remaining = 0;
  /// False for a sub-limit that admitted on its copy and was not committed:
  /// its real remaining is at least the cost, above every rejecting
  /// sub-limit's, so it is never the binding limit (and is not computed).
  bool binding_candidate = true;
  bool counted = false;
  std::chrono::microseconds retry_after{0};
  std::chrono::microseconds reset_after{0};
};

/// True when the sub-limit records rejected attempts (window policies with
/// `window_options{.count_rejected = true}`); policies without a
/// `count_rejected()` member never do.
template <class Config>
[[nodiscard]] constexpr bool counts_rejected(const Config& cfg) noexcept {
  if constexpr (requires {
                  { cfg.count_rejected() } -> std::convertible_to<bool>;
                }) {
    return static_cast<bool>(cfg.count_rejected());
  } else {
    return false;
  }
}

/// True when P::step cannot throw (the sliding log's can, on std::bad_alloc).
template <class P>
inline constexpr bool nothrow_step = noexcept(P::step(std::declval<const typename P::config&>(),
                                                      std::declval<typename P::state&>(),
                                                      timestamp{}, units{}));

/// True when stepping a copy of P's state cannot throw: the retry search of
/// `settle` copies the state for every probe, so a state whose copy may
/// allocate makes it throwing even when P::step itself is noexcept.
template <class P>
inline constexpr bool nothrow_probe = nothrow_step<P> &&
                                      std::is_nothrow_copy_constructible_v<typename P::state>;

/// Smallest d in [lo, infinity) with pred(d), for pred false-then-true,
/// starting the search at `guess`; `never` if none is found below 2^50 us.
template <class Pred>
[[nodiscard]] std::chrono::microseconds first_true(std::int64_t lo, std::int64_t guess,
                                                   Pred pred) noexcept(noexcept(pred(lo))) {
  constexpr std::int64_t ceiling = std::int64_t{1} << 50;  // far past any reset (2^46 us periods)
  std::int64_t hi = std::max(lo, guess);
  // The guess (the state's reset time) always holds for the policies here;
  // widen anyway, so that a policy whose reset_after is off stays correct.
  while (!pred(hi)) {
    if (hi >= ceiling) return never;
    lo = hi + 1;
    hi = std::min(ceiling, std::max<std::int64_t>(hi, 1) * 2);
  }
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  // A guess past the ceiling may find a wait past it: that is `never` too
  // (the Lua driver's FAR), however the search got there.
  return lo > ceiling ? never : std::chrono::microseconds{lo};
}

/// Settles sub-limit P after every sub-limit decided on a copy: says
/// whether the copy is to be committed (`counted`: when the compound admits
/// or when P records rejected attempts) and returns P's contribution measured
/// on the state P will keep. Writes nothing, so that the caller can settle
/// every sub-limit, which may throw std::bad_alloc, before committing any:
/// a compound step then changes all of its sub-states or none.
/// @param kept  P's state in the key
/// @param trial P's copy, after P::step at `now` returned `d`
/// @param all   every sub-limit admitted
/// @param forced the compound check is forced (access::force): every
///   sub-limit stepped with P::force and records the request, as one that
///   counts rejected attempts would
template <policy P>
[[nodiscard]] compound_part settle(const typename P::config& cfg, const typename P::state& kept,
                                   const typename P::state& trial, const decision& d, bool all,
                                   timestamp now, units cost,
                                   bool forced = false) noexcept(nothrow_probe<P>) {
  compound_part out;
  out.limit = d.limit;
  out.remaining = d.remaining;
  out.reset_after = d.reset_after;
  if (all) {
    out.counted = true;
    return out;
  }
  if (!d.allowed) {
    // P rejected: its decision was taken on the state it keeps (the copy
    // holds the attempt exactly when P counted it).
    out.counted = d.counted;
    out.retry_after = d.retry_after;
    return out;
  }
  if (forced || counts_rejected(cfg)) {
    // P admitted, but the compound rejects and P records every attempt: keep
    // the copy. The copy's remaining and reset_after are exact for it; the
    // same request admits again as soon as P admits it on that state.
    out.counted = true;
    if (d.remaining < cost) {
      const auto admits = [&](std::int64_t after) noexcept(nothrow_probe<P>) {
        typename P::state probe = trial;
        return P::step(cfg, probe, now + timestamp{after}, cost).allowed;
      };
      out.retry_after = first_true(1, d.reset_after.count(), admits);
    }
    return out;
  }
  // P admitted on a copy that is dropped: its state is untouched and admits
  // this request now and later (retry 0). Its reset time is that of the
  // untouched state, when P::idle first holds; the copy's is an upper bound.
  out.binding_candidate = false;
  const auto idle_after = [&](std::int64_t after) noexcept {
    return P::idle(cfg, kept, now + timestamp{after});
  };
  out.reset_after = idle_after(0) ? std::chrono::microseconds{0}
                                  : first_true(1, d.reset_after.count(), idle_after);
  return out;
}

/// Combines the parts: allowed iff all admitted; limit and remaining from the
/// binding part (smallest remaining, the first on ties); retry_after and
/// reset_after the largest.
[[nodiscard]] inline decision combine(const compound_part* parts, std::size_t n,
                                      bool all) noexcept {
  decision out;
  out.allowed = all;
  const compound_part* binding = nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    const compound_part& p = parts[i];
    out.counted = out.counted || p.counted;
    out.retry_after = std::max(out.retry_after, p.retry_after);
    out.reset_after = std::max(out.reset_after, p.reset_after);
    if (p.binding_candidate && (binding == nullptr || p.remaining < binding->remaining)) {
      binding = &p;
    }
  }
  if (binding != nullptr) {
    out.limit = binding->limit;
    out.remaining = binding->remaining;
  }
  if (all) out.retry_after = std::chrono::microseconds{0};
  return out;
}

/// The smallest limit of a tuple of configs (by index: types may repeat).
template <class Tuple, std::size_t... I>
[[nodiscard]] units smallest_limit(const Tuple& t, std::index_sequence<I...>) noexcept {
  return std::min({std::get<I>(t).limit()...});
}

}  // namespace detail

/// All of several limits, fixed at compile time, on one key:
/// `compound<sliding_window_log, fixed_window>`. A request is admitted iff
/// every sub-limit admits it; it then consumes from every one. A rejected
/// request consumes from none, except that sub-limits with `count_rejected`
/// record the attempt (full cost), whether they themselves admitted it or not.
///
/// The decision: `allowed` iff all admit; `counted` iff any sub-limit
/// recorded the attempt; `limit` and `remaining` of the binding sub-limit
/// (smallest remaining after the decision, the first on ties); `retry_after`
/// the smallest wait after which every sub-limit admits the same request
/// (exact, `never` if the cost exceeds any sub-limit); `reset_after` the
/// largest. For a request stamped earlier than a sub-state's time, each
/// sub-limit measures its durations from its own decision time (see
/// docs/compound_and_metrics.md).
///
/// Thread safety: stateless; a store serialises steps per key.
template <policy... Ps>
  requires(sizeof...(Ps) >= 1)
struct compound {
  static constexpr std::string_view name = "compound";
  static constexpr std::size_t size = sizeof...(Ps);

  /// One validated config per sub-limit. Thread safety: immutable.
  class config {
   public:
    using policy_type = compound;
    /// @param parts one config per sub-limit, in the order of `Ps`; each was
    ///   validated by its own constructor
    explicit config(typename Ps::config... parts)
        : config(compound_options{}, std::move(parts)...) {}
    /// As above, named by `o.name`.
    /// @throws std::invalid_argument for a bad name
    explicit config(compound_options o, typename Ps::config... parts)
        : parts_(std::move(parts)...),
          limit_(detail::smallest_limit(parts_, std::index_sequence_for<Ps...>{})),
          name_(std::move(o.name)) {
      detail::check_name(name_);
    }
    /// The smallest sub-limit: a cost above it is never admitted.
    [[nodiscard]] units limit() const noexcept { return limit_; }
    /// The compound's name (compound_options::name), empty when unnamed.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] const std::tuple<typename Ps::config...>& parts() const noexcept {
      return parts_;
    }
    template <std::size_t I>
    [[nodiscard]] const auto& part() const noexcept {
      return std::get<I>(parts_);
    }

   private:
    std::tuple<typename Ps::config...> parts_;
    units limit_;
    std::string name_;
  };

  /// One state per sub-limit. Value-initialised = key never seen.
  struct state {
    std::tuple<typename Ps::state...> parts{};
    friend bool operator==(const state&, const state&) = default;
  };

  /// Decides and records. Throws only when a sub-state's copy or step does
  /// (std::bad_alloc, sliding log); every sub-state is then unchanged.
  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept(nothrow) {
    return step_each(cfg, s, now, cost, false, std::index_sequence_for<Ps...>{});
  }

  /// As step, recording the request in every sub-limit even when the
  /// compound rejects (access::force): each sub-limit is forced (Ps::force),
  /// and the decision is measured on the recorded states.
  static decision force(const config& cfg, state& s, timestamp now, units cost) noexcept(nothrow)
    requires(forcible_policy<Ps> && ...)
  {
    return step_each(cfg, s, now, cost, true, std::index_sequence_for<Ps...>{});
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    return idle_each(cfg, s, now, std::index_sequence_for<Ps...>{});
  }

 private:
  static constexpr bool nothrow = (detail::nothrow_probe<Ps> && ...);

  template <std::size_t... I>
  static decision step_each(const config& cfg, state& s, timestamp now, units cost, bool forced,
                            std::index_sequence<I...>) noexcept(nothrow) {
    std::tuple<typename Ps::state...> trial = s.parts;
    // Braced lists evaluate left to right: sub-limits decide in order.
    const std::array<decision, size> sub{
        sub_step<Ps>(std::get<I>(cfg.parts()), std::get<I>(trial), now, cost, forced)...};
    const bool all = (sub[I].allowed && ...);
    const std::array<detail::compound_part, size> parts{
        detail::settle<Ps>(std::get<I>(cfg.parts()), std::get<I>(s.parts), std::get<I>(trial),
                           sub[I], all, now, cost, forced)...};
    // Nothing below throws: states move without allocating.
    ((parts[I].counted ? void(std::get<I>(s.parts) = std::move(std::get<I>(trial))) : void()), ...);
    return detail::combine(parts.data(), size, all);
  }

  template <class P>
  static decision sub_step(const typename P::config& cfg, typename P::state& s, timestamp now,
                           units cost, bool forced) noexcept(nothrow) {
    if constexpr (forcible_policy<P>) {
      if (forced) return P::force(cfg, s, now, cost);
    }
    return P::step(cfg, s, now, cost);
  }

  template <std::size_t... I>
  static bool idle_each(const config& cfg, const state& s, timestamp now,
                        std::index_sequence<I...>) noexcept {
    return (Ps::idle(std::get<I>(cfg.parts()), std::get<I>(s.parts), now) && ...);
  }
};

/// Builds the config of `compound<P...>` from sub-configs, deducing the
/// policies: `make_compound(sliding_window_log::config{"10/15min"},
/// fixed_window::config{"100/day"})`.
template <class... Configs>
  requires(sizeof...(Configs) >= 1 && (policy<typename Configs::policy_type> && ...))
[[nodiscard]] auto make_compound(Configs... parts) {
  return typename compound<typename Configs::policy_type...>::config(std::move(parts)...);
}

/// As above, named: `make_compound(compound_options{.name = "logins"}, ...)`.
template <class... Configs>
  requires(sizeof...(Configs) >= 1 && (policy<typename Configs::policy_type> && ...))
[[nodiscard]] auto make_compound(compound_options o, Configs... parts) {
  return typename compound<typename Configs::policy_type...>::config(std::move(o),
                                                                     std::move(parts)...);
}

/// Any number of limits of one policy P, chosen at run time, on one key:
/// `compound_of<sliding_window_log>::config{"10/15min", "100/day"}`. Same
/// semantics as `compound` (all or nothing; count_rejected sub-limits record
/// rejected attempts). The state is a std::vector of sub-states, empty for a
/// key never seen (and emptied again whenever every sub-state is back to its
/// initial value), so it suits the in-process store.
///
/// Thread safety: stateless; a store serialises steps per key.
template <policy P>
struct compound_of {
  static constexpr std::string_view name = "compound";

  /// One validated config of P per sub-limit, at least one.
  /// Thread safety: immutable.
  class config {
   public:
    using policy_type = compound_of;
    /// @throws std::invalid_argument when `parts` is empty or the name is bad
    explicit config(std::vector<typename P::config> parts, compound_options o = {})
        : parts_(std::move(parts)), name_(std::move(o.name)) {
      detail::check_name(name_);
      if (parts_.empty()) {
        throw std::invalid_argument("ratelimit: a compound limit needs at least one sub-limit");
      }
      limit_ = parts_.front().limit();
      for (const auto& p : parts_) limit_ = std::min(limit_, p.limit());
    }
    /// Parses each rate ("10/15min", "100 per day") with P's default options.
    /// @throws std::invalid_argument for an empty list or a bad rate
    config(std::initializer_list<std::string_view> rates)
      requires std::constructible_from<typename P::config, std::string_view>
        : config(parse(rates)) {}
    /// As above, named by `o.name`.
    config(std::initializer_list<std::string_view> rates, compound_options o)
      requires std::constructible_from<typename P::config, std::string_view>
        : config(parse(rates), std::move(o)) {}
    /// Parses each rate with the same options (`window_options`,
    /// `bucket_options`); the compound takes their `name`.
    /// @throws std::invalid_argument for an empty list or a bad rate or option
    template <class Options>
      requires std::constructible_from<typename P::config, std::string_view, const Options&>
    config(std::initializer_list<std::string_view> rates, const Options& options)
        : config(parse(rates, options), compound_options{options.name}) {}

    /// The smallest sub-limit: a cost above it is never admitted.
    [[nodiscard]] units limit() const noexcept { return limit_; }
    /// The compound's name (compound_options::name), empty when unnamed.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] const std::vector<typename P::config>& parts() const noexcept { return parts_; }
    [[nodiscard]] std::size_t size() const noexcept { return parts_.size(); }

   private:
    template <class... Options>
    static std::vector<typename P::config> parse(std::initializer_list<std::string_view> rates,
                                                 const Options&... options) {
      std::vector<typename P::config> out;
      out.reserve(rates.size());
      for (const std::string_view r : rates) out.emplace_back(r, options...);
      return out;
    }
    std::vector<typename P::config> parts_;
    units limit_ = 0;
    std::string name_;
  };

  /// One state per sub-limit, or none for a key never seen.
  struct state {
    std::vector<typename P::state> parts;
    friend bool operator==(const state&, const state&) = default;
  };

  /// Decides and records. Allocates (copies of the sub-states and the
  /// per-sub-limit results), so it may throw std::bad_alloc; the state is
  /// then unchanged: everything is computed on copies first and committed
  /// by moves that cannot throw.
  static decision step(const config& cfg, state& s, timestamp now, units cost) {
    return step_as(cfg, s, now, cost, false);
  }

  /// As step, recording the request in every sub-limit even when the
  /// compound rejects (access::force): each sub-limit is forced (P::force),
  /// and the decision is measured on the recorded states.
  static decision force(const config& cfg, state& s, timestamp now, units cost)
    requires forcible_policy<P>
  {
    return step_as(cfg, s, now, cost, true);
  }

  static decision step_as(const config& cfg, state& s, timestamp now, units cost, bool forced) {
    const std::size_t n = cfg.size();
    // A key never seen (or held under a config with another number of
    // sub-limits) starts from initial sub-states, built aside.
    std::vector<typename P::state> fresh;
    if (s.parts.size() != n) {
      fresh = s.parts;
      fresh.resize(n);
    }
    std::vector<typename P::state>& kept = s.parts.size() == n ? s.parts : fresh;
    std::vector<typename P::state> trial = kept;
    std::vector<decision> sub;
    sub.reserve(n);
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (forcible_policy<P>) {
        sub.push_back(forced ? P::force(cfg.parts()[i], trial[i], now, cost)
                             : P::step(cfg.parts()[i], trial[i], now, cost));
      } else {
        sub.push_back(P::step(cfg.parts()[i], trial[i], now, cost));
      }
      all = all && sub.back().allowed;
    }
    std::vector<detail::compound_part> parts;
    parts.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      parts.push_back(
          detail::settle<P>(cfg.parts()[i], kept[i], trial[i], sub[i], all, now, cost, forced));
    }
    // Nothing below throws: states and vectors move without allocating.
    for (std::size_t i = 0; i < n; ++i) {
      if (parts[i].counted) kept[i] = std::move(trial[i]);
    }
    if (&kept == &fresh) s.parts.swap(fresh);
    // A key whose sub-states are all initial must compare equal to a
    // value-initialised state (stores then record nothing for it).
    const bool initial = std::all_of(
        s.parts.begin(), s.parts.end(),
        [](const typename P::state& p) { return p == typename P::state{}; });
    if (initial) std::vector<typename P::state>().swap(s.parts);
    return detail::combine(parts.data(), n, all);
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    for (std::size_t i = 0; i < s.parts.size() && i < cfg.size(); ++i) {
      if (!P::idle(cfg.parts()[i], s.parts[i], now)) return false;
    }
    return true;
  }
};

}  // namespace ratelimit
