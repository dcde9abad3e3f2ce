// SPDX-License-Identifier: Apache-2.0
// Test helper: random traces mixing plain and idempotent checks (ids repeated
// across keys and times, peeks, resets), replayed through a Redis or cluster
// store and through in-process limiters, decisions compared field by field.
#pragma once

#include <gtest/gtest.h>

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

namespace rltest {

using ratelimit::access;
using ratelimit::bucket_options;
using ratelimit::decision;
using ratelimit::limiter;
using ratelimit::request_id;
using ratelimit::timestamp;
using ratelimit::units;
using ratelimit::window_options;
using std::chrono::microseconds;

inline std::string describe_id(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted
    << " source=" << ratelimit::to_string(d.source) << " repeat=" << d.repeat
    << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == ratelimit::never ? -1 : d.retry_after.count())
    << " reset_after=" << d.reset_after.count() << "}";
  return o.str();
}

struct id_event {
  std::string key;
  std::string id;  ///< empty: a plain check
  std::int64_t t = 0;
  units cost = 1;
  bool peek = false;
  bool reset = false;
};

inline std::int64_t id_uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

inline std::vector<id_event> random_id_trace(std::mt19937_64& rng, std::int64_t w,
                                             std::int64_t retention, units limit) {
  static const std::vector<std::string> keys = {"+15551234567", std::string("a\0b", 3), "}{:"};
  std::vector<std::string> ids = {"1", std::string("\0", 1), "x:y", "INVITE 7", "1#"};
  for (int i = 0; i < 4; ++i)
    ids.push_back(
        std::string(static_cast<std::size_t>(id_uniform(rng, 1, 256)), static_cast<char>('a' + i)));
  std::int64_t t = 1'700'000'000'000'000 + id_uniform(rng, 0, 1'000'000'000);
  const auto n = id_uniform(rng, 20, 100);
  std::vector<id_event> trace;
  std::int64_t latest = t;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (id_uniform(rng, 0, 7)) {
      case 0:
      case 1: break;
      case 2: t += id_uniform(rng, 1, 3); break;
      case 3: t += id_uniform(rng, 0, w); break;
      case 4: t += retention - id_uniform(rng, -1, 1); break;  // around the retention's end
      case 5: t -= id_uniform(rng, 0, w); break;               // time going backwards
      default: t += id_uniform(rng, 0, std::max<std::int64_t>(1, w / std::max<units>(1, limit)));
    }
    // Times run backwards by less than a retention from the latest one (the
    // exact rule's scope: docs/semantics.md, "Idempotent checks").
    t = std::max(t, latest - (retention - 1));
    latest = std::max(latest, t);
    id_event e;
    e.key = keys[static_cast<std::size_t>(id_uniform(rng, 0, 2))];
    const auto k = id_uniform(rng, 0, 9);
    if (k > 1)
      e.id = ids[static_cast<std::size_t>(
          id_uniform(rng, 0, static_cast<std::int64_t>(ids.size()) - 1))];
    e.t = t;
    e.cost = id_uniform(rng, 0, 5) == 0 ? id_uniform(rng, 1, limit + 2) : 1;
    e.peek = id_uniform(rng, 0, 9) == 0;
    e.reset = id_uniform(rng, 0, 39) == 0;
    trace.push_back(std::move(e));
  }
  return trace;
}

/// Replays one random trace through `store` (redis_store or cluster_store)
/// and two in-process limiters per key (over memory_store, ids in the
/// limiter's table; over idempotent_store, ids in the key's node), asserting
/// identical decisions.
template <class Config, class Store>
void compare_id_traces(const Config& cfg, std::mt19937_64& rng, Store& store, int seed) {
  using P = typename Config::policy_type;
  const std::int64_t w = ratelimit::detail::natural_period_us(cfg);
  const std::int64_t retention = id_uniform(rng, 0, 2) == 0
                                     ? w
                                     : id_uniform(rng, 1, 3) * std::max<std::int64_t>(1, w / 2);
  auto trace = random_id_trace(rng, w, retention, cfg.limit());
  for (id_event& e : trace) e.key += "#" + std::to_string(seed);  // fresh keys per trace
  // One in-process limiter per key (as differential_test.cpp: a sweep of
  // another idle key could forget state a request stamped earlier still sees).
  std::map<std::string, limiter<P>> memory;
  std::map<std::string, limiter<P, ratelimit::idempotent_store<P>>> keyed;
  for (std::size_t j = 0; j < trace.size(); ++j) {
    const id_event& e = trace[j];
    auto [it, fresh_key] = memory.try_emplace(e.key, cfg);
    if (fresh_key) it->second.set_idempotency({.retention = microseconds{retention}});
    auto& m = it->second;
    auto [kt, fresh_keyed] = keyed.try_emplace(e.key, cfg);
    if (fresh_keyed) kt->second.set_idempotency({.retention = microseconds{retention}});
    auto& k = kt->second;
    if (e.reset) {
      m.reset(e.key);
      k.reset(e.key);
      store.reset(cfg, e.key);
      continue;
    }
    const access a = e.peek ? ratelimit::access::peek : ratelimit::access::consume;
    decision want;
    decision in_node;
    decision got;
    if (e.id.empty()) {
      want = e.peek ? m.peek(e.key, timestamp{e.t}, e.cost)
                    : m.try_acquire(e.key, timestamp{e.t}, e.cost);
      in_node = e.peek ? k.peek(e.key, timestamp{e.t}, e.cost)
                       : k.try_acquire(e.key, timestamp{e.t}, e.cost);
      got = store.apply(cfg, e.key, timestamp{e.t}, e.cost, a);
    } else {
      want = e.peek ? m.peek(e.key, request_id{e.id}, timestamp{e.t}, e.cost)
                    : m.try_acquire(e.key, request_id{e.id}, timestamp{e.t}, e.cost);
      in_node = e.peek ? k.peek(e.key, request_id{e.id}, timestamp{e.t}, e.cost)
                       : k.try_acquire(e.key, request_id{e.id}, timestamp{e.t}, e.cost);
      got = store.apply_once(cfg, e.key, request_id{e.id}, microseconds{retention}, timestamp{e.t},
                             e.cost, a);
    }
    ASSERT_EQ(describe_id(got), describe_id(want))
        << P::name << " seed " << seed << " event " << j << " t=" << e.t << " id=" << e.id.size()
        << "B cost=" << e.cost << " peek=" << e.peek << " retention=" << retention;
    ASSERT_EQ(describe_id(in_node), describe_id(want))
        << "idempotent_store: " << P::name << " seed " << seed << " event " << j << " t=" << e.t
        << " id=" << e.id.size() << "B cost=" << e.cost << " peek=" << e.peek
        << " retention=" << retention;
  }
}

template <class P>
typename P::config random_id_config(std::mt19937_64& rng) {
  static const char* rates[] = {"1/10ms", "2/s", "3/7us", "5/min", "10/15min", "7/999983us"};
  const char* r = rates[id_uniform(rng, 0, 5)];
  if constexpr (std::is_same_v<P, ratelimit::token_bucket> || std::is_same_v<P, ratelimit::gcra>) {
    bucket_options o;
    o.name = "d";
    if (id_uniform(rng, 0, 2) == 0) o.burst = id_uniform(rng, 1, 6);
    return typename P::config(r, o);
  } else {
    return typename P::config(r, window_options{id_uniform(rng, 0, 2) == 0, "d"});
  }
}

}  // namespace rltest
