// SPDX-License-Identifier: Apache-2.0
// Test helper: random traces of checks whose tier (config) changes from event
// to event, replayed through memory_store<tiered<P>> and through any store that
// takes P's configs (redis_store, cluster_store), for differential tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/tiers.hpp"

namespace rltest::tiers {

using namespace ratelimit;

inline std::string describe(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted << " source=" << to_string(d.source)
    << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == never ? -1 : d.retry_after.count())
    << " reset_after=" << d.reset_after.count() << "}";
  return o.str();
}

inline std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

/// A config of P named "tiers"; the periods of one trace are drawn from a
/// few related values so that windows overlap and conversions keep entries.
template <class P>
typename P::config random_config(std::mt19937_64& rng, std::int64_t base_period) {
  for (;;) {
    try {
      static constexpr std::int64_t limits[] = {1, 2, 3, 5, 8, 13};
      const units limit = uniform(rng, 0, 7) == 0 ? uniform(rng, 1, 300)
                                                  : limits[uniform(rng, 0, 5)];
      static constexpr std::int64_t scale[] = {1, 2, 3, 4, 8};
      std::int64_t period = base_period * scale[uniform(rng, 0, 4)] / 2;
      if (uniform(rng, 0, 5) == 0) period += uniform(rng, 1, 999);
      const rate r(limit, std::chrono::microseconds{std::max<std::int64_t>(1, period)});
      if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
        bucket_options o;
        o.name = "tiers";
        if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 2 * limit + 3);
        return typename P::config(r, o);
      } else {
        return typename P::config(r, window_options{uniform(rng, 0, 3) == 0, "tiers"});
      }
    } catch (const std::invalid_argument&) {
      // e.g. GCRA faster than 1/us: draw again
    }
  }
}

struct event {
  std::string key;
  std::int64_t t = 0;
  units cost = 1;
  std::size_t tier = 0;  ///< index into the trace's tiers
  bool peek = false;
  /// Before this check: tier `tier` gets config `configs[change_to]`
  /// (an operator's change at runtime); -1 = none.
  std::ptrdiff_t change_to = -1;
};

template <class P>
struct trace {
  std::vector<typename P::config> configs;  ///< every config the trace uses
  std::vector<std::size_t> initial;         ///< tier i starts with configs[initial[i]]
  std::vector<event> events;
};

/// Up to three tiers over up to five configs; keys move between tiers and
/// tiers change config mid-trace; time mostly moves forward, sometimes back.
/// Keys start with `key_prefix` (one per trace on a shared server).
template <class P>
trace<P> random_trace(std::mt19937_64& rng, const std::string& key_prefix) {
  trace<P> tr;
  const std::int64_t base = std::vector<std::int64_t>{
      4, 10, 1000, 1'000'000, 60'000'000}[static_cast<std::size_t>(uniform(rng, 0, 4))];
  const auto nconfigs = static_cast<std::size_t>(uniform(rng, 2, 5));
  for (std::size_t i = 0; i < nconfigs; ++i) tr.configs.push_back(random_config<P>(rng, base));
  // Sometimes two configs are equal: a change between them is no change.
  if (uniform(rng, 0, 3) == 0) tr.configs.push_back(tr.configs.front());
  const auto ntiers = static_cast<std::size_t>(uniform(rng, 1, 3));
  const auto pick_config = [&] {
    return static_cast<std::size_t>(
        uniform(rng, 0, static_cast<std::int64_t>(tr.configs.size()) - 1));
  };
  for (std::size_t i = 0; i < ntiers; ++i) tr.initial.push_back(pick_config());
  const auto nkeys = uniform(rng, 1, 3);
  std::int64_t t = uniform(rng, 0, 1) == 0 ? uniform(rng, 0, 3 * base)
                                           : 1'732'950'000'000'000 + uniform(rng, 0, 1'000'000'000);
  const auto n = uniform(rng, 30, 150);
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 9)) {
      case 0:
      case 1: break;
      case 2:
      case 3: t += uniform(rng, 1, 3); break;
      case 4: t += uniform(rng, 1, std::max<std::int64_t>(1, base / 4)); break;
      case 5: t += uniform(rng, 0, base); break;
      case 6: t += base * uniform(rng, 1, 4) / 2 + uniform(rng, -1, 1); break;
      case 7: t += uniform(rng, 0, 3 * base); break;
      case 8: t -= uniform(rng, 0, base); break;  // time going backwards
      default: t += uniform(rng, 0, 1000); break;
    }
    t = std::clamp<std::int64_t>(t, 0, std::int64_t{1} << 52);
    event e;
    e.key = key_prefix + "+1555" + std::to_string(uniform(rng, 0, nkeys - 1));
    e.t = t;
    e.tier = static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(ntiers) - 1));
    e.cost = uniform(rng, 0, 7) == 0 ? uniform(rng, 1, 6) : 1;
    e.peek = uniform(rng, 0, 11) == 0;
    if (uniform(rng, 0, 6) == 0) e.change_to = static_cast<std::ptrdiff_t>(pick_config());
    tr.events.push_back(std::move(e));
  }
  return tr;
}

/// Replays `tr` through a memory_store<tiered<P>> per key (a store's reclaim
/// of another key cannot then move a decision time), returning the decisions.
template <class P>
std::vector<decision> replay_memory(const trace<P>& tr) {
  std::vector<typename tiered<P>::config> tiers;
  for (const std::size_t c : tr.initial) tiers.emplace_back(tr.configs[c]);
  std::map<std::string, memory_store<tiered<P>>> memory;
  std::vector<decision> out;
  for (const event& e : tr.events) {
    if (e.change_to >= 0) {
      tiers[e.tier] = typename tiered<P>::config(tr.configs[static_cast<std::size_t>(e.change_to)]);
    }
    out.push_back(memory[e.key].apply(tiers[e.tier], e.key, std::chrono::microseconds{e.t}, e.cost,
                                      e.peek ? access::peek : access::consume));
  }
  return out;
}

/// Replays `tr` through `store` with P's configs.
template <class P, class Store>
std::vector<decision> replay_store(const trace<P>& tr, Store& store) {
  std::vector<typename P::config> tiers;
  for (const std::size_t c : tr.initial) tiers.push_back(tr.configs[c]);
  std::vector<decision> out;
  for (const event& e : tr.events) {
    if (e.change_to >= 0) tiers[e.tier] = tr.configs[static_cast<std::size_t>(e.change_to)];
    out.push_back(store.apply(tiers[e.tier], e.key, std::chrono::microseconds{e.t}, e.cost,
                              e.peek ? access::peek : access::consume));
  }
  return out;
}

/// The fingerprint-free description of an event, for failure messages.
template <class P>
std::string describe_event(const trace<P>& tr, std::size_t i) {
  const event& e = tr.events[i];
  std::ostringstream o;
  o << "event " << i << " key=" << e.key << " t=" << e.t << " cost=" << e.cost << " tier=" << e.tier
    << (e.peek ? " peek" : "") << (e.change_to >= 0 ? " (tier changed)" : "");
  return o.str();
}

}  // namespace rltest::tiers
