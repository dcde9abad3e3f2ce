// SPDX-License-Identifier: Apache-2.0
// Tests of memory_store: binary keys, peek, reset, idle-key reclaim, the key cap, and threads.
#include "ratelimit/store/memory_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/rate.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::decision;
using ratelimit::decision_source;
using ratelimit::memory_store;
using ratelimit::memory_store_options;
using ratelimit::timestamp;
using ratelimit::units;
using ratelimit::when_full;

using fixed_store = memory_store<ratelimit::fixed_window>;

static_assert(ratelimit::store_for<memory_store<ratelimit::fixed_window>, ratelimit::fixed_window>);
static_assert(ratelimit::store_for<memory_store<ratelimit::sliding_window_log>,
                                   ratelimit::sliding_window_log>);
static_assert(ratelimit::store_for<memory_store<ratelimit::sliding_window_counter>,
                                   ratelimit::sliding_window_counter>);
static_assert(ratelimit::store_for<memory_store<ratelimit::token_bucket>, ratelimit::token_bucket>);
static_assert(ratelimit::store_for<memory_store<ratelimit::gcra>, ratelimit::gcra>);
// A store of one policy is not a store of another.
static_assert(!ratelimit::store_for<memory_store<ratelimit::gcra>, ratelimit::fixed_window>);
static_assert(!ratelimit::store_for<int, ratelimit::fixed_window>);

/// Keys that differ only in bytes a careless store might drop, trim or
/// terminate on. All are distinct byte strings.
std::vector<std::string> tricky_keys() {
  std::vector<std::string> keys = {
      "a",
      std::string("a\0", 2),
      std::string("\0a", 2),
      std::string("\0", 1),
      std::string("\0\0", 2),
      std::string("a\0b", 3),
      std::string("a\0c", 3),
      "a b",
      "a ",
      " a",
      "ab",
      "{a}",
      "{a",
      "a}",
      "{}",
      "rl:{a}:fixed_window",
      "\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87",  // "ключ" in UTF-8
      "\xe6\x97\xa5\xe6\x9c\xac",          // "日本" in UTF-8
      "\xff\xfe",
      "\n\r\t",
      std::string(511, 'x'),
      std::string(512, 'x'),
      std::string(511, 'x') + 'y',
      std::string(1, 'y') + std::string(511, 'x'),
  };
  return keys;
}

// Verifies that every tricky key gets its own state: each admits exactly one
// request, and the store copied the key's bytes (the caller's buffers are gone
// when the keys are read back).
// Verifies that a shard count the store cannot round up to a power of two
// (e.g. -1 converted to size_t from a configuration file) is refused naming
// it; std::bit_ceil of it is undefined behaviour, and the store then indexed
// shards it never allocated.
TEST(MemoryStore, RefusesAShardCountOverTheMaximum) {
  for (const std::size_t bad : {SIZE_MAX, (SIZE_MAX >> 1) + 2, ratelimit::max_shards + 1}) {
    try {
      fixed_store store(memory_store_options{.shards = bad});
      ADD_FAILURE() << "accepted shards = " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  const fixed_store most(memory_store_options{.shards = ratelimit::max_shards});
  EXPECT_EQ(most.options().shards, ratelimit::max_shards);
  const fixed_store rounded(memory_store_options{.shards = 5});
  EXPECT_EQ(rounded.options().shards, 8U);
}

TEST(MemoryStore, BinaryKeysNeverCollideAndRoundTrip) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{1, 1s}};
  fixed_store store;
  const timestamp now = 5s;
  {
    const std::vector<std::string> keys = tricky_keys();
    for (const std::string& k : keys) {
      const decision d = store.apply(cfg, k, now, 1, access::consume);
      EXPECT_TRUE(d.allowed) << "key of " << k.size() << " bytes";
    }
  }
  const std::vector<std::string> keys = tricky_keys();
  EXPECT_EQ(store.size(), keys.size());
  for (const std::string& k : keys) {
    const auto st = store.state_of(k);
    EXPECT_EQ(st.window, 5);
    EXPECT_EQ(st.count, 1);
    const decision d = store.apply(cfg, k, now, 1, access::consume);
    EXPECT_FALSE(d.allowed) << "key of " << k.size() << " bytes";
    EXPECT_EQ(d.retry_after, 1s);
  }
  // Prefixes and strangers of the held keys have no state.
  EXPECT_EQ(store.state_of(std::string(510, 'x')).count, 0);
  EXPECT_EQ(store.state_of("b").count, 0);
  EXPECT_EQ(store.state_of(std::string("a\0\0", 3)).count, 0);
  EXPECT_EQ(store.size(), keys.size());
}

TEST(MemoryStore, PeekDoesNotConsume) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1s}};
  fixed_store store;
  for (int i = 0; i < 5; ++i) {
    const decision d = store.apply(cfg, "k", 0s, 1, access::peek);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 1);
  }
  EXPECT_EQ(store.size(), 0u);  // a peek at a new key inserts nothing

  EXPECT_TRUE(store.apply(cfg, "k", 0s, 1, access::consume).allowed);
  for (int i = 0; i < 5; ++i) {
    const decision d = store.apply(cfg, "k", 0s, 1, access::peek);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 0);
  }
  EXPECT_EQ(store.state_of("k").count, 1);
  EXPECT_TRUE(store.apply(cfg, "k", 0s, 1, access::consume).allowed);

  const decision blocked = store.apply(cfg, "k", 250ms, 1, access::peek);
  EXPECT_FALSE(blocked.allowed);
  EXPECT_EQ(blocked.retry_after, 750ms);
  EXPECT_EQ(blocked.reset_after, 750ms);
  EXPECT_EQ(store.state_of("k").count, 2);
  EXPECT_EQ(store.size(), 1u);
}

TEST(MemoryStore, ResetForgetsOnlyThatKey) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{1, 1h}};
  fixed_store store;
  EXPECT_TRUE(store.apply(cfg, "a", 0s, 1, access::consume).allowed);
  EXPECT_TRUE(store.apply(cfg, "b", 0s, 1, access::consume).allowed);
  EXPECT_FALSE(store.apply(cfg, "a", 1s, 1, access::consume).allowed);
  EXPECT_EQ(store.size(), 2u);

  store.reset(cfg, "a");
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.state_of("a").count, 0);
  const decision d = store.apply(cfg, "a", 1s, 1, access::consume);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_FALSE(store.apply(cfg, "b", 1s, 1, access::consume).allowed);

  store.reset(cfg, "never-seen");  // forgetting an unknown key is a no-op
  EXPECT_EQ(store.size(), 2u);
}

/// A user's policy derived from a library one: the fixed window with every
/// request counting twice. It inherits fixed_window's state, `idle` and its
/// member template `step_as`, which is not its `step`.
struct double_cost_window : ratelimit::fixed_window {
  static constexpr std::string_view name = "double_cost_window";
  struct config : ratelimit::fixed_window::config {
    using policy_type = double_cost_window;
    using ratelimit::fixed_window::config::config;
  };
  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return ratelimit::fixed_window::step(cfg, s, now, 2 * cost);
  }
};
static_assert(ratelimit::policy<double_cost_window>);

/// A user's policy with a member template `step_as` of its own meaning
/// (`step_as<true>` records, `step_as<false>` only decides): `limit`
/// requests per key, ever.
struct own_step_as {
  static constexpr std::string_view name = "own_step_as";
  struct config {
    using policy_type = own_step_as;
    [[nodiscard]] units limit() const noexcept { return 3; }
  };
  struct state {
    units used = 0;
    friend bool operator==(const state&, const state&) = default;
  };
  template <bool Record>
  static decision step_as(const config& cfg, state& s, timestamp, units cost) noexcept {
    decision d;
    d.limit = cfg.limit();
    d.allowed = s.used + cost <= cfg.limit();
    if (d.allowed && Record) s.used += cost;
    d.remaining = cfg.limit() - s.used;
    return d;
  }
  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    return step_as<true>(cfg, s, now, cost);
  }
  static bool idle(const config&, const state& s, timestamp) noexcept { return s.used == 0; }
};
static_assert(ratelimit::policy<own_step_as>);

// Verifies that a check on a held key calls the policy's own `step` when it
// is not one of the library's policies, also when it has a `step_as`, its
// own or inherited from a library policy: the store steps a library
// policy through its `step_as<false>` (the same function, inlined), and
// called the inherited fixed_window::step_as here, counting each request
// once instead of twice, or a user's step_as<false>, which records nothing.
TEST(MemoryStore, HeldKeysAreSteppedByTheUsersOwnStep) {
  {
    const double_cost_window::config cfg{ratelimit::rate{5, 1s}};
    memory_store<double_cost_window> store;
    EXPECT_EQ(store.apply(cfg, "k", 1s, 1, access::consume).remaining, 3);
    EXPECT_EQ(store.apply(cfg, "k", 1s, 1, access::consume).remaining, 1);
    EXPECT_EQ(store.state_of("k").count, 4);
    EXPECT_FALSE(store.apply(cfg, "k", 1s, 1, access::consume).allowed);
    EXPECT_EQ(store.apply(cfg, "k", 1s, 1, access::peek).remaining, 1);
    EXPECT_EQ(store.state_of("k").count, 4);
  }
  {
    const own_step_as::config cfg;
    memory_store<own_step_as> store;
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(store.apply(cfg, "k", 1s, 1, access::consume).allowed) << "request " << i;
    }
    EXPECT_EQ(store.state_of("k").used, 3);
    EXPECT_FALSE(store.apply(cfg, "k", 1s, 1, access::consume).allowed);
  }
  // The library's policies, and only they, are stepped through step_as.
  static_assert(ratelimit::detail::step_is_step_as<ratelimit::fixed_window>);
  static_assert(ratelimit::detail::step_is_step_as<ratelimit::sliding_window_log>);
  static_assert(ratelimit::detail::step_is_step_as<ratelimit::sliding_window_counter>);
  static_assert(ratelimit::detail::step_is_step_as<ratelimit::token_bucket>);
  static_assert(ratelimit::detail::step_is_step_as<ratelimit::gcra>);
  static_assert(!ratelimit::detail::step_is_step_as<double_cost_window>);
  static_assert(!ratelimit::detail::step_is_step_as<own_step_as>);
}

TEST(MemoryStore, RejectedRequestOnNewKeyStoresNothing) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{3, 1s}};
  fixed_store store;
  const decision d = store.apply(cfg, "k", 0s, 4, access::consume);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(store.size(), 0u);
}

/// Checks `count` new keys "<tag>:<i>" at `now`; each must be admitted.
void insert_keys(fixed_store& store, const ratelimit::fixed_window::config& cfg,
                 const std::string& tag, std::size_t count, timestamp now) {
  for (std::size_t i = 0; i < count; ++i) {
    const decision d = store.apply(cfg, tag + ":" + std::to_string(i), now, 1, access::consume);
    ASSERT_TRUE(d.allowed) << tag << ":" << i;
  }
}

// Verifies that new keys sweep out idle ones: 100k keys go idle when their
// window ends, and 100k new keys arriving afterwards leave the store near
// 100k, not 200k. A full sweep then drops every idle key.
TEST(MemoryStore, IdleKeysAreReclaimedAsNewKeysArrive) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{10, 1s}};
  fixed_store store;
  constexpr std::size_t batch = 100'000;
  insert_keys(store, cfg, "old", batch, 0s);
  EXPECT_EQ(store.size(), batch);
  insert_keys(store, cfg, "new", batch, 1s);
  EXPECT_LE(store.size(), batch + batch / 10);
  EXPECT_GE(store.size(), batch);

  const std::size_t old_left = store.size() - batch;
  EXPECT_EQ(store.sweep(cfg, 1s + 999'999us), old_left);  // only the old ones
  EXPECT_EQ(store.size(), batch);
  EXPECT_EQ(store.sweep(cfg, 2s), batch);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.sweep(cfg, 2s), 0u);
}

// Verifies that callers who come and go do not grow the store: each window
// brings 5k new keys, and the store never holds much more than two windows'
// worth of them.
TEST(MemoryStore, ChurningCallersKeepTheStoreNearOneWindowOfKeys) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{10, 1s}};
  fixed_store store;
  constexpr std::size_t per_window = 5'000;
  for (std::int64_t w = 0; w < 30; ++w) {
    insert_keys(store, cfg, "w" + std::to_string(w), per_window, std::chrono::seconds{w});
    EXPECT_LE(store.size(), 2 * per_window) << "window " << w;
  }
}

// Verifies that the store shrinks back after a spike: 100k callers once, then
// 5k per window; within 30 windows the spike's idle keys are gone.
TEST(MemoryStore, StoreShrinksBackAfterASpike) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{10, 1s}};
  fixed_store store;
  insert_keys(store, cfg, "spike", 100'000, 0s);
  constexpr std::size_t per_window = 5'000;
  for (std::int64_t w = 1; w <= 30; ++w) {
    insert_keys(store, cfg, "w" + std::to_string(w), per_window, std::chrono::seconds{w});
  }
  EXPECT_LE(store.size(), 2 * per_window);
}

TEST(MemoryStore, SweepKeepsKeysThatAreNotIdle) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{10, 1s}};
  fixed_store store;
  for (int i = 0; i < 1000; ++i) {
    (void)store.apply(cfg, "k" + std::to_string(i), 999'999us, 1, access::consume);
  }
  EXPECT_EQ(store.sweep(cfg, 999'999us), 0u);
  EXPECT_EQ(store.size(), 1000u);
  EXPECT_EQ(store.sweep(cfg, 1s), 1000u);
  EXPECT_EQ(store.size(), 0u);
}

memory_store_options capped(std::size_t max_keys, when_full on_full) {
  memory_store_options o;
  o.max_keys = max_keys;
  o.on_full = on_full;
  return o;
}

TEST(MemoryStore, FullStoreFailsOpenForNewKeysByDefault) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{1, 1h}};
  fixed_store store{capped(4, when_full::fail_open)};
  EXPECT_EQ(store.options().on_full, when_full::fail_open);
  for (int i = 0; i < 4; ++i) {
    const decision d = store.apply(cfg, "k" + std::to_string(i), 0s, 1, access::consume);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.source, decision_source::store);
  }
  EXPECT_EQ(store.size(), 4u);

  for (int attempt = 0; attempt < 3; ++attempt) {
    const decision d = store.apply(cfg, "new", 1s, 1, access::consume);
    EXPECT_TRUE(d.allowed);
    EXPECT_FALSE(d.counted);
    EXPECT_EQ(d.source, decision_source::fail_open);
    EXPECT_TRUE(d.degraded());
    EXPECT_EQ(d.limit, 1);
    EXPECT_EQ(d.retry_after, 0us);
  }
  EXPECT_EQ(store.size(), 4u);
  EXPECT_EQ(store.state_of("new").count, 0);

  // Keys already held are decided by the policy as usual.
  const decision held = store.apply(cfg, "k0", 1s, 1, access::consume);
  EXPECT_FALSE(held.allowed);
  EXPECT_EQ(held.source, decision_source::store);
  EXPECT_EQ(held.retry_after, 1h - 1s);
}

TEST(MemoryStore, FullStoreFailsClosedWhenAsked) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1h}};
  fixed_store store{capped(3, when_full::fail_closed)};
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(store.apply(cfg, "k" + std::to_string(i), 0s, 1, access::consume).allowed);
  }
  const decision d = store.apply(cfg, "new", 1s, 1, access::consume);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.source, decision_source::fail_closed);
  EXPECT_TRUE(d.degraded());
  EXPECT_EQ(d.limit, 2);
  EXPECT_EQ(d.retry_after, 0us);
  EXPECT_EQ(store.size(), 3u);

  const decision held = store.apply(cfg, "k1", 1s, 1, access::consume);
  EXPECT_TRUE(held.allowed);
  EXPECT_EQ(held.source, decision_source::store);
  EXPECT_EQ(held.remaining, 0);

  // A peek at a new key stores nothing, so the cap does not apply to it.
  const decision peeked = store.apply(cfg, "new", 1s, 1, access::peek);
  EXPECT_TRUE(peeked.allowed);
  EXPECT_EQ(peeked.source, decision_source::store);
}

// Verifies that a full store reclaims idle keys before refusing a new one,
// wherever the idle keys live (the default 64 shards spread 4 keys over
// different shards from the new key's).
TEST(MemoryStore, FullStoreReclaimsIdleKeysFirst) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{1, 1s}};
  for (const when_full mode : {when_full::fail_open, when_full::fail_closed}) {
    fixed_store store{capped(4, mode)};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(store.apply(cfg, "k" + std::to_string(i), 0s, 1, access::consume).allowed);
    }
    // At 1s every held key is idle.
    for (int i = 0; i < 4; ++i) {
      const std::string key = "new" + std::to_string(i);
      const decision d = store.apply(cfg, key, 1s, 1, access::consume);
      EXPECT_TRUE(d.allowed) << key;
      EXPECT_EQ(d.source, decision_source::store) << key;
      EXPECT_EQ(store.state_of(key).count, 1) << key;
    }
    EXPECT_EQ(store.size(), 4u);
  }
}

TEST(MemoryStore, FullStoreWithOneShardReclaimsIdleKeysFirst) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{1, 1s}};
  memory_store_options o = capped(4, when_full::fail_closed);
  o.shards = 1;
  fixed_store store{o};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(store.apply(cfg, "k" + std::to_string(i), 0s, 1, access::consume).allowed);
  }
  EXPECT_EQ(store.apply(cfg, "new", 0s, 1, access::consume).source, decision_source::fail_closed);
  const decision d = store.apply(cfg, "new", 1s, 1, access::consume);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_LE(store.size(), 4u);
}

// Verifies that concurrent inserters on different shards never take the store
// past max_keys, and that exactly max_keys new keys are admitted by the store.
TEST(MemoryStore, CapIsNeverExceededByConcurrentInserters) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{5, 1h}};
  constexpr std::size_t cap = 1000;
  constexpr int threads = 8;
  constexpr int keys_per_thread = 500;
  fixed_store store{capped(cap, when_full::fail_closed)};
  std::atomic<std::size_t> stored{0};
  std::atomic<std::size_t> refused{0};
  std::atomic<std::size_t> over_cap{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < keys_per_thread; ++i) {
        const std::string key = std::to_string(t) + ":" + std::to_string(i);
        const decision d = store.apply(cfg, key, 0s, 1, access::consume);
        if (d.source == decision_source::store && d.allowed) stored.fetch_add(1);
        if (d.source == decision_source::fail_closed && !d.allowed) refused.fetch_add(1);
        if (store.size() > cap) over_cap.fetch_add(1);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(over_cap.load(), 0u);
  EXPECT_EQ(stored.load(), cap);
  EXPECT_EQ(refused.load(), threads * keys_per_thread - cap);
  EXPECT_EQ(store.size(), cap);
}

// The five policies with the same rate; a typed test runs each scenario on all.
template <class P>
struct policy_case;

template <>
struct policy_case<ratelimit::fixed_window> {
  static ratelimit::fixed_window::config make(ratelimit::rate r) {
    return ratelimit::fixed_window::config{r};
  }
};
template <>
struct policy_case<ratelimit::sliding_window_log> {
  static ratelimit::sliding_window_log::config make(ratelimit::rate r) {
    return ratelimit::sliding_window_log::config{r};
  }
};
template <>
struct policy_case<ratelimit::sliding_window_counter> {
  static ratelimit::sliding_window_counter::config make(ratelimit::rate r) {
    return ratelimit::sliding_window_counter::config{r};
  }
};
template <>
struct policy_case<ratelimit::token_bucket> {
  static ratelimit::token_bucket::config make(ratelimit::rate r) {
    return ratelimit::token_bucket::config{r};
  }
};
template <>
struct policy_case<ratelimit::gcra> {
  static ratelimit::gcra::config make(ratelimit::rate r) { return ratelimit::gcra::config{r}; }
};

template <class P>
class MemoryStorePolicies : public ::testing::Test {};

using all_policies =
    ::testing::Types<ratelimit::fixed_window, ratelimit::sliding_window_log,
                     ratelimit::sliding_window_counter, ratelimit::token_bucket, ratelimit::gcra>;

class policy_names {
 public:
  template <class P>
  static std::string GetName(int) {  // the name gtest looks for
    return std::string(P::name);
  }
};

TYPED_TEST_SUITE(MemoryStorePolicies, all_policies, policy_names);

/// Runs `threads` threads that each make `attempts` checks of `cost` on the
/// key picked by `key_of(thread)`, all at one fixed time; returns admissions.
template <class P, class KeyOf>
std::size_t hammer(memory_store<P>& store, const typename P::config& cfg, int threads, int attempts,
                   units cost, KeyOf key_of) {
  std::atomic<std::size_t> admitted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::string key = key_of(t);
      std::size_t mine = 0;
      for (int i = 0; i < attempts; ++i) {
        if (store.apply(cfg, key, 1000s, cost, access::consume).allowed) ++mine;
      }
      admitted.fetch_add(mine);
    });
  }
  for (std::thread& th : pool) th.join();
  return admitted.load();
}

// Verifies atomicity: 8 threads x 10k attempts on ONE key at one fixed time
// admit exactly the limit (the burst for bucket and GCRA), never one more.
TYPED_TEST(MemoryStorePolicies, ThreadsOnOneKeyAdmitExactlyTheLimit) {
  const auto cfg = policy_case<TypeParam>::make(ratelimit::rate{1000, 1h});
  memory_store<TypeParam> store;
  const std::size_t admitted = hammer(store, cfg, 8, 10'000, 1,
                                      [](int) { return std::string("hot"); });
  EXPECT_EQ(admitted, 1000u);
  EXPECT_EQ(store.size(), 1u);
  const decision after = store.apply(cfg, "hot", 1000s, 1, access::peek);
  EXPECT_FALSE(after.allowed);
  EXPECT_EQ(after.remaining, 0);
}

TYPED_TEST(MemoryStorePolicies, ThreadsOnOneKeyWithCostAdmitWholeRequestsOnly) {
  const auto cfg = policy_case<TypeParam>::make(ratelimit::rate{1000, 1h});
  memory_store<TypeParam> store;
  const std::size_t admitted = hammer(store, cfg, 8, 2'000, 7,
                                      [](int) { return std::string("hot"); });
  EXPECT_EQ(admitted, 142u);  // floor(1000 / 7)
  const decision after = store.apply(cfg, "hot", 1000s, 7, access::peek);
  EXPECT_FALSE(after.allowed);
  EXPECT_EQ(after.remaining, 6);  // 1000 - 142 * 7
}

TYPED_TEST(MemoryStorePolicies, ThreadsOnDistinctKeysEachGetTheirLimit) {
  const auto cfg = policy_case<TypeParam>::make(ratelimit::rate{100, 1h});
  memory_store<TypeParam> store;
  const std::size_t admitted = hammer(store, cfg, 8, 1'000, 1,
                                      [](int t) { return "caller-" + std::to_string(t); });
  EXPECT_EQ(admitted, 800u);
  EXPECT_EQ(store.size(), 8u);
}

// Verifies that several threads sharing a set of keys interleave safely: every
// key still admits exactly its limit.
TYPED_TEST(MemoryStorePolicies, ThreadsOnSharedKeySetAdmitExactlyPerKey) {
  const auto cfg = policy_case<TypeParam>::make(ratelimit::rate{50, 1h});
  memory_store<TypeParam> store;
  constexpr int keys = 64;
  std::atomic<std::size_t> admitted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      std::size_t mine = 0;
      for (int round = 0; round < 100; ++round) {
        for (int k = 0; k < keys; ++k) {
          const std::string key = "k" + std::to_string((k + t * 7) % keys);
          if (store.apply(cfg, key, 1000s, 1, access::consume).allowed) ++mine;
        }
      }
      admitted.fetch_add(mine);
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(admitted.load(), std::size_t{keys} * 50);
  EXPECT_EQ(store.size(), std::size_t{keys});
}

// Verifies that a key at rest is reclaimable for every policy: one request
// keeps it, and once its state is back to empty a sweep drops it, after which
// the key behaves as new.
TYPED_TEST(MemoryStorePolicies, KeyIsReclaimedOnceBackToEmpty) {
  const auto cfg = policy_case<TypeParam>::make(ratelimit::rate{4, 10s});
  memory_store<TypeParam> store;
  const decision first = store.apply(cfg, "k", 100s, 1, access::consume);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.sweep(cfg, 100s), 0u);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.sweep(cfg, 120s), 1u);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.state_of("k"), typename TypeParam::state{});
  EXPECT_EQ(store.apply(cfg, "k", 120s, 1, access::consume), first);
}

TYPED_TEST(MemoryStorePolicies, PeekMatchesTheConsumeThatFollows) {
  const auto cfg = policy_case<TypeParam>::make(ratelimit::rate{3, 1s});
  memory_store<TypeParam> store;
  for (int i = 0; i < 5; ++i) {
    const timestamp now = 10s + std::chrono::milliseconds{100 * i};
    const decision peeked = store.apply(cfg, "k", now, 1, access::peek);
    const auto before = store.state_of("k");
    EXPECT_EQ(store.apply(cfg, "k", now, 1, access::peek), peeked);
    EXPECT_EQ(store.state_of("k"), before);
    EXPECT_EQ(store.apply(cfg, "k", now, 1, access::consume), peeked) << "attempt " << i;
  }
}

}  // namespace
