// SPDX-License-Identifier: Apache-2.0
// Tests of blocked_cache over memory_store: exact cached decisions, cost keys, peek, reset, bounds, threads.
#include "ratelimit/store/blocked_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::blocked_cache;
using ratelimit::blocked_cache_options;
using ratelimit::decision;
using ratelimit::decision_source;
using ratelimit::fixed_window;
using ratelimit::gcra;
using ratelimit::manual_clock;
using ratelimit::memory_store;
using ratelimit::sliding_window_counter;
using ratelimit::sliding_window_log;
using ratelimit::timestamp;
using ratelimit::token_bucket;
using ratelimit::units;
using ratelimit::window_options;

using log_store = memory_store<sliding_window_log>;
using cached_log = blocked_cache<log_store>;

/// A store that reads "its own clock" (a manual clock standing in for the
/// Redis server's TIME), so the store_time path can be tested without sleeping.
template <class P>
class own_clock_store {
 public:
  explicit own_clock_store(manual_clock clock) : clock_(std::move(clock)) {}
  decision apply(const typename P::config& cfg, std::string_view key, ratelimit::store_time_t,
                 units cost, access a) {
    ++calls;
    return store_.apply(cfg, key, clock_.now().time_since_epoch(), cost, a);
  }
  void reset(const typename P::config& cfg, std::string_view key) { store_.reset(cfg, key); }
  int calls = 0;

 private:
  manual_clock clock_;
  memory_store<P> store_;
};

/// Marker clock for own_clock_store.
struct own_clock {
  static constexpr bool reads_store_time = true;
};

/// A memory store that runs a hook before each check (to interleave a reset).
template <class P>
struct hooked_store {
  decision apply(const typename P::config& cfg, std::string_view key, timestamp now, units cost,
                 access a) {
    if (hook) hook();
    return store.apply(cfg, key, now, cost, a);
  }
  void reset(const typename P::config& cfg, std::string_view key) { store.reset(cfg, key); }
  memory_store<P> store;
  std::function<void()> hook;
};

// The decorator models a store exactly when the wrapped store does.
static_assert(ratelimit::store_for<cached_log, sliding_window_log>);
static_assert(!ratelimit::store_clocked_store_for<cached_log, sliding_window_log>);
static_assert(!ratelimit::store_for<cached_log, fixed_window>);
static_assert(ratelimit::store_for<blocked_cache<memory_store<gcra>>, gcra>);
static_assert(
    ratelimit::store_clocked_store_for<blocked_cache<own_clock_store<gcra>, manual_clock>, gcra>);
static_assert(!ratelimit::store_for<blocked_cache<own_clock_store<gcra>, manual_clock>, gcra>);

constexpr timestamp t0 = 1'000'000'000us;

decision consume(cached_log& c, const sliding_window_log::config& cfg, std::string_view key,
                 timestamp now, units cost = 1) {
  return c.apply(cfg, key, now, cost, access::consume);
}

/// Fills `key` to the limit at t0 and returns the store's first rejection.
decision block(cached_log& c, const sliding_window_log::config& cfg, std::string_view key,
               timestamp at = t0) {
  for (units i = 0; i < cfg.limit(); ++i) EXPECT_TRUE(consume(c, cfg, key, at).allowed);
  return consume(c, cfg, key, at);
}

TEST(BlockedCache, RepeatsTheStoresRejectionWithTheRestOfTheBlock) {
  const sliding_window_log::config cfg{"10/15min"};
  cached_log c{log_store{}};
  const decision first = block(c, cfg, "+15550001");
  EXPECT_FALSE(first.allowed);
  EXPECT_EQ(first.source, decision_source::store);
  EXPECT_EQ(first.retry_after, 15min);
  EXPECT_EQ(c.size(), 1u);

  const decision d = consume(c, cfg, "+15550001", t0 + 1s);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.source, decision_source::local_cache);
  EXPECT_EQ(d.limit, 10);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, 15min - 1s);
  EXPECT_EQ(d.reset_after, 15min - 1s);
  EXPECT_EQ(c.stats().hits, 1u);
  EXPECT_EQ(c.stats().stored, 1u);

  // One microsecond before the end: still local; at the end: the store admits.
  const decision last = consume(c, cfg, "+15550001", t0 + 15min - 1us);
  EXPECT_EQ(last.source, decision_source::local_cache);
  EXPECT_EQ(last.retry_after, 1us);
  const decision after = consume(c, cfg, "+15550001", t0 + 15min);
  EXPECT_TRUE(after.allowed);
  EXPECT_EQ(after.source, decision_source::store);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.stats().expired, 1u);
}

// Verifies that other keys are untouched by a block.
TEST(BlockedCache, OtherKeysGoToTheStore) {
  const sliding_window_log::config cfg{"2/1min"};
  cached_log c{log_store{}};
  (void)block(c, cfg, "a");
  const decision b = consume(c, cfg, "b", t0);
  EXPECT_TRUE(b.allowed);
  EXPECT_EQ(b.source, decision_source::store);
  EXPECT_EQ(consume(c, cfg, std::string_view("a\0", 2), t0).source, decision_source::store);
}

TEST(BlockedCache, IsKeyedByCost) {
  const fixed_window::config cfg{"5/1min"};
  blocked_cache<memory_store<fixed_window>> c{memory_store<fixed_window>{}};
  const auto at = [&](units cost) { return c.apply(cfg, "k", t0, cost, access::consume); };
  EXPECT_TRUE(at(3).allowed);
  const decision big = at(3);  // 2 remain: cost 3 is rejected until the window ends
  EXPECT_FALSE(big.allowed);
  EXPECT_EQ(big.source, decision_source::store);
  EXPECT_EQ(at(4).source, decision_source::local_cache);  // a larger cost is rejected locally
  const decision small = at(2);  // a smaller one may pass: it goes to the store
  EXPECT_TRUE(small.allowed);
  EXPECT_EQ(small.source, decision_source::store);
  EXPECT_EQ(at(3).source, decision_source::local_cache);  // admissions only extend a block
  const decision one = at(1);  // the store rejects cost 1 now: the entry covers every cost
  EXPECT_FALSE(one.allowed);
  EXPECT_EQ(one.source, decision_source::store);
  EXPECT_EQ(at(1).source, decision_source::local_cache);
  EXPECT_EQ(c.size(), 1u);
}

TEST(BlockedCache, PeekReadsTheCacheButNeverFillsIt) {
  const sliding_window_log::config cfg{"1/1h"};
  cached_log c{log_store{}};
  EXPECT_TRUE(consume(c, cfg, "k", t0).allowed);
  const decision p = c.apply(cfg, "k", t0, 1, access::peek);
  EXPECT_FALSE(p.allowed);
  EXPECT_EQ(p.source, decision_source::store);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(consume(c, cfg, "k", t0).source, decision_source::store);
  const decision cached = c.apply(cfg, "k", t0 + 1s, 1, access::peek);
  EXPECT_EQ(cached.source, decision_source::local_cache);
  EXPECT_EQ(cached.retry_after, 1h - 1s);
}

TEST(BlockedCache, ResetForgetsTheKeyInStoreAndCache) {
  const sliding_window_log::config cfg{"3/1h"};
  cached_log c{log_store{}};
  (void)block(c, cfg, "k");
  EXPECT_EQ(consume(c, cfg, "k", t0 + 1s).source, decision_source::local_cache);
  c.reset(cfg, "k");
  EXPECT_EQ(c.size(), 0u);
  const decision d = consume(c, cfg, "k", t0 + 2s);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
}

TEST(BlockedCache, ForgetDropsOnlyTheCacheEntry) {
  const sliding_window_log::config cfg{"1/1h"};
  cached_log c{log_store{}};
  (void)block(c, cfg, "k");
  c.forget("k");
  const decision d = consume(c, cfg, "k", t0 + 1s);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
}

// Verifies that a rejection decided before a concurrent reset is not cached
// after it (the reset runs while the store is deciding).
TEST(BlockedCache, RejectionRacingWithResetIsNotCached) {
  const sliding_window_log::config cfg{"1/1h"};
  blocked_cache<hooked_store<sliding_window_log>> c{hooked_store<sliding_window_log>{}};
  EXPECT_TRUE(c.apply(cfg, "k", t0, 1, access::consume).allowed);
  c.inner().hook = [&] { c.forget("k"); };
  const decision d = c.apply(cfg, "k", t0, 1, access::consume);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.stats().skipped, 1u);
  c.inner().hook = nullptr;
  EXPECT_EQ(c.apply(cfg, "k", t0, 1, access::consume).source, decision_source::store);
  EXPECT_EQ(c.apply(cfg, "k", t0, 1, access::consume).source, decision_source::local_cache);
}

TEST(BlockedCache, CachesOnlyRejectionsAtLeastTheThreshold) {
  const gcra::config cfg{"1/10s"};
  blocked_cache<memory_store<gcra>> c{memory_store<gcra>{}, blocked_cache_options{.threshold = 5s}};
  const auto at = [&](timestamp t) { return c.apply(cfg, "k", t, 1, access::consume); };
  EXPECT_TRUE(at(t0).allowed);
  EXPECT_EQ(at(t0 + 6s).retry_after, 4s);  // below the threshold: not cached
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(at(t0 + 5s).retry_after, 5s);  // exactly the threshold: cached
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(at(t0 + 5s).source, decision_source::local_cache);
  EXPECT_THROW(cached_log(log_store{}, blocked_cache_options{.threshold = -1us}),
               std::invalid_argument);
}

TEST(BlockedCache, MaxBlockCapsHowLongAnEntryLives) {
  const sliding_window_log::config cfg{"1/1h"};
  cached_log c{log_store{}, blocked_cache_options{.max_block = 1min}};
  (void)block(c, cfg, "k");
  const decision hit = consume(c, cfg, "k", t0 + 10s);
  EXPECT_EQ(hit.source, decision_source::local_cache);
  EXPECT_EQ(hit.retry_after, 50s);
  EXPECT_EQ(hit.reset_after, 1h - 10s);
  const decision again = consume(c, cfg, "k", t0 + 1min);
  EXPECT_EQ(again.source, decision_source::store);  // asks again, and caches again
  EXPECT_EQ(again.retry_after, 59min);
  EXPECT_EQ(consume(c, cfg, "k", t0 + 1min).source, decision_source::local_cache);
  EXPECT_THROW(cached_log(log_store{}, blocked_cache_options{.max_block = -1us}),
               std::invalid_argument);
}

TEST(BlockedCache, NeverCachesDegradedDecisions) {
  const fixed_window::config cfg{"1/1h"};
  memory_store<fixed_window> inner{
      ratelimit::memory_store_options{.max_keys = 1, .on_full = ratelimit::when_full::fail_closed}};
  blocked_cache<memory_store<fixed_window>> c{std::move(inner),
                                              blocked_cache_options{.threshold = 0us}};
  EXPECT_TRUE(c.apply(cfg, "a", t0, 1, access::consume).allowed);
  const decision full = c.apply(cfg, "b", t0, 1, access::consume);
  EXPECT_EQ(full.source, decision_source::fail_closed);
  EXPECT_EQ(c.size(), 0u);
}

TEST(BlockedCache, CachesPermanentRejections) {
  const sliding_window_log::config cfg{"3/1min"};
  cached_log c{log_store{}};
  EXPECT_EQ(consume(c, cfg, "k", t0, 4).retry_after, ratelimit::never);
  const decision d = consume(c, cfg, "k", t0 + 100h, 5);
  EXPECT_EQ(d.source, decision_source::local_cache);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(consume(c, cfg, "k", t0, 3).source, decision_source::store);
}

// Verifies that an entry belongs to one policy and limit.
TEST(BlockedCache, OtherLimitMisses) {
  const sliding_window_log::config ten{"1/1h"};
  const sliding_window_log::config five{"5/1h"};
  cached_log c{log_store{}};
  (void)block(c, ten, "k");
  EXPECT_EQ(consume(c, ten, "k", t0).source, decision_source::local_cache);
  EXPECT_EQ(consume(c, five, "k", t0).source, decision_source::store);
}

// Verifies that a compound's rejection by a sub-limit other than the smallest
// (the day limit blocks while the per-second one would admit) is cached and
// answered locally with the binding limit's figures.
TEST(BlockedCache, CachesACompoundBlockedByItsLargerLimit) {
  using compound = ratelimit::compound_of<fixed_window>;
  using compound_store = memory_store<compound>;
  const compound::config cfg{"10/1s", "12/1h"};
  blocked_cache<compound_store> c{compound_store{}};
  for (int i = 0; i < 12; ++i) {
    const auto t = t0 + std::chrono::seconds{i};
    EXPECT_TRUE(c.apply(cfg, "k", t, 1, access::consume).allowed) << i;
  }
  const decision first = c.apply(cfg, "k", t0 + 12s, 1, access::consume);
  EXPECT_FALSE(first.allowed);
  EXPECT_EQ(first.source, decision_source::store);
  EXPECT_EQ(first.limit, 12);
  EXPECT_EQ(c.size(), 1u);
  const decision again = c.apply(cfg, "k", t0 + 13s, 1, access::consume);
  EXPECT_EQ(again.source, decision_source::local_cache);
  EXPECT_EQ(again.limit, 12);
  EXPECT_EQ(again.retry_after, first.retry_after - 1s);
  EXPECT_EQ(c.stats().hits, 1u);
}

TEST(BlockedCache, HoldsAtMostMaxEntriesAndEvictsTheSoonestToExpire) {
  const sliding_window_log::config cfg{"1/1h"};
  cached_log c{log_store{}, blocked_cache_options{.max_entries = 4, .shards = 1}};
  // Key i is admitted at t0 + i s and rejected at t0 + 10 s: its block ends at t0 + 1h + i s.
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(consume(c, cfg, std::to_string(i), t0 + std::chrono::seconds(i)).allowed);
  }
  for (int i = 0; i < 4; ++i) (void)consume(c, cfg, std::to_string(i), t0 + 10s);
  EXPECT_EQ(c.size(), 4u);
  EXPECT_TRUE(consume(c, cfg, "4", t0 + 5s).allowed);
  (void)consume(c, cfg, "4", t0 + 10s);
  EXPECT_EQ(c.size(), 4u);
  EXPECT_EQ(c.stats().evicted, 1u);
  for (int i = 1; i < 5; ++i) {
    EXPECT_EQ(consume(c, cfg, std::to_string(i), t0 + 11s).source, decision_source::local_cache)
        << i;
  }
  EXPECT_EQ(consume(c, cfg, "0", t0 + 11s).source, decision_source::store);  // evicted
}

TEST(BlockedCache, BoundsSizeUnderManyKeys) {
  const sliding_window_log::config cfg{"1/1h"};
  cached_log c{log_store{}, blocked_cache_options{.max_entries = 100, .shards = 8}};
  for (int i = 0; i < 5000; ++i) {
    const std::string k = "k" + std::to_string(i);
    (void)consume(c, cfg, k, t0);
    (void)consume(c, cfg, k, t0);
    ASSERT_LE(c.size(), 100u);
  }
  EXPECT_EQ(c.stats().stored, 5000u);
  EXPECT_GE(c.stats().evicted, 4900u);
}

TEST(BlockedCache, FullShardReclaimsExpiredEntriesFirst) {
  const sliding_window_log::config cfg{"1/1min"};
  cached_log c{log_store{}, blocked_cache_options{.max_entries = 2, .shards = 1}};
  (void)block(c, cfg, "a");
  (void)block(c, cfg, "b");
  (void)block(c, cfg, "c", t0 + 2min);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.stats().expired, 2u);
  EXPECT_EQ(c.stats().evicted, 0u);
}

TEST(BlockedCache, SweepDropsEndedBlocks) {
  const sliding_window_log::config cfg{"1/1min"};
  cached_log c{log_store{}};
  (void)block(c, cfg, "a");
  (void)block(c, cfg, "b", t0 + 30s);
  EXPECT_EQ(c.sweep(t0 + 1min - 1us), 0u);
  EXPECT_EQ(c.sweep(t0 + 1min), 1u);
  EXPECT_EQ(c.size(), 1u);
  c.clear();
  EXPECT_EQ(c.size(), 0u);
}

// Verifies that with the store's own clock the block is timed on the local
// clock, from the moment before the store was asked.
TEST(BlockedCache, StoreTimeBlocksRunOnTheLocalClock) {
  manual_clock server{t0};
  manual_clock local{5s};  // another epoch: only durations matter
  using cache = blocked_cache<own_clock_store<gcra>, manual_clock>;
  ratelimit::limiter<gcra, cache, own_clock> lim{gcra::config{"1/1min"},
                                                 cache{own_clock_store<gcra>{server}, {}, local}};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  const decision r = lim.try_acquire("k");
  EXPECT_EQ(r.retry_after, 1min);
  EXPECT_EQ(lim.store().inner().calls, 2);
  local.advance(20s);
  server.advance(20s);
  const decision hit = lim.try_acquire("k");
  EXPECT_EQ(hit.source, decision_source::local_cache);
  EXPECT_EQ(hit.retry_after, 40s);
  EXPECT_EQ(lim.peek("k").source, decision_source::local_cache);
  EXPECT_EQ(lim.store().inner().calls, 2);
  local.advance(40s);
  server.advance(40s);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_EQ(lim.store().inner().calls, 3);
}

// Verifies the composition with limiter and a caller clock.
TEST(BlockedCache, WorksInsideALimiter) {
  manual_clock clock{t0};
  ratelimit::limiter<sliding_window_log, cached_log, manual_clock> lim{
      sliding_window_log::config{"2/1min"}, cached_log{log_store{}}, clock};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_EQ(lim.try_acquire("k").source, decision_source::store);
  clock.advance(10s);
  EXPECT_EQ(lim.try_acquire("k").source, decision_source::local_cache);
  lim.reset("k");
  EXPECT_TRUE(lim.try_acquire("k").allowed);
}

// ---- Differential: the cache never changes an answer under default semantics.

template <class P>
typename P::config config_of(const char* rate) {
  return typename P::config{rate};
}

template <class P>
class BlockedCacheDifferential : public ::testing::Test {};
using all_policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(BlockedCacheDifferential, all_policies);

/// Replays a random trace (4 keys, times in order, some peeks) through the
/// store with and without the cache. Cost 1 only: every field but `source`
/// (and `counted`, false either way) must match. Mixed costs: `allowed` must
/// match and a cached `retry_after` is never longer than the store's.
template <class P>
void replay_random(const char* rate, bool cost_one, std::uint64_t seed,
                   std::chrono::microseconds threshold) {
  const typename P::config cfg = config_of<P>(rate);
  memory_store<P> plain;
  blocked_cache<memory_store<P>> cached{memory_store<P>{},
                                        blocked_cache_options{.threshold = threshold}};
  std::mt19937_64 rng(seed);
  timestamp t = t0;
  std::size_t hits = 0;
  for (int i = 0; i < 20'000; ++i) {
    t += timestamp{static_cast<std::int64_t>(rng() % 700'000)};
    const std::string key = "k" + std::to_string(rng() % 4);
    const units cost = cost_one ? 1 : static_cast<units>(1 + rng() % 3);
    const access a = rng() % 8 == 0 ? access::peek : access::consume;
    const decision want = plain.apply(cfg, key, t, cost, a);
    const decision got = cached.apply(cfg, key, t, cost, a);
    ASSERT_EQ(got.allowed, want.allowed) << "event " << i;
    if (got.source != decision_source::local_cache) {
      ASSERT_EQ(got, want) << "event " << i;
      continue;
    }
    ++hits;
    ASSERT_FALSE(got.counted);
    ASSERT_EQ(got.limit, want.limit);
    ASSERT_EQ(got.remaining, 0);
    ASSERT_GE(got.retry_after, 1us);
    ASSERT_LE(got.retry_after, want.retry_after) << "event " << i;
    if (cost_one) {
      decision same = got;
      same.source = decision_source::store;
      ASSERT_EQ(same, want) << "event " << i;
    }
  }
  EXPECT_GT(hits, 1000u);
  EXPECT_EQ(cached.stats().hits, hits);
}

TYPED_TEST(BlockedCacheDifferential, SameDecisionsAsTheStoreAtCostOne) {
  replay_random<TypeParam>("5/10s", true, 1, 0us);
  replay_random<TypeParam>("3/7s", true, 2, 1s);
}

TYPED_TEST(BlockedCacheDifferential, SameAdmissionsWithMixedCosts) {
  replay_random<TypeParam>("5/10s", false, 3, 0us);
  replay_random<TypeParam>("4/9s", false, 4, 2s);
}

// ---- count_rejected: what the cache may change, and by how much at most.

struct bound_outcome {
  std::vector<timestamp> admitted_plain;
  std::vector<timestamp> admitted_cached;
};

/// One abusive key calling every `gap` for `span`, cost 1, through the
/// store with and without the cache; checks that every admission without the
/// cache is also one with it.
template <class P>
bound_outcome abuse(const typename P::config& cfg, std::chrono::microseconds gap,
                    std::chrono::microseconds span) {
  memory_store<P> plain;
  blocked_cache<memory_store<P>> cached{memory_store<P>{}, blocked_cache_options{.threshold = 0us}};
  bound_outcome out;
  for (timestamp t = t0; t < t0 + span; t += gap) {
    const decision want = plain.apply(cfg, "abuser", t, 1, access::consume);
    const decision got = cached.apply(cfg, "abuser", t, 1, access::consume);
    EXPECT_TRUE(!want.allowed || got.allowed)
        << "admitted only without the cache at " << (t - t0).count();
    if (want.allowed) out.admitted_plain.push_back(t);
    if (got.allowed) out.admitted_cached.push_back(t);
  }
  return out;
}

/// Most admissions in any window (t - w, t].
std::size_t max_in_window(const std::vector<timestamp>& v, std::chrono::microseconds w) {
  std::size_t best = 0;
  std::size_t lo = 0;
  for (std::size_t hi = 0; hi < v.size(); ++hi) {
    while (v[lo] <= v[hi] - w) ++lo;
    best = std::max(best, hi - lo + 1);
  }
  return best;
}

// Verifies the bound stated in docs/blocked_cache.md: under count_rejected the
// sliding log with the cache still admits at most `limit` in any window, so at
// most `limit` more than without it; the bound is reached.
TEST(BlockedCacheCountRejected, SlidingLogAdmitsAtMostLimitPerWindow) {
  const sliding_window_log::config cfg{"10/15min", window_options{.count_rejected = true}};
  const bound_outcome o = abuse<sliding_window_log>(cfg, 1s, 2h);
  EXPECT_EQ(o.admitted_plain.size(), 10u);  // blocked for good once over the limit
  EXPECT_EQ(max_in_window(o.admitted_cached, 15min), 10u);
  // Each later window gives the abuser `limit` more admissions than without the cache.
  EXPECT_GE(o.admitted_cached.size(), 10u * 7u);
}

// Verifies that the fixed window gets no extra admission at all: a block ends
// with its window, and so do the attempts the cache kept from the store.
TEST(BlockedCacheCountRejected, FixedWindowIsUnchanged) {
  const fixed_window::config cfg{"10/15min", window_options{.count_rejected = true}};
  const bound_outcome o = abuse<fixed_window>(cfg, 1s, 2h);
  EXPECT_EQ(o.admitted_cached, o.admitted_plain);
  EXPECT_GE(o.admitted_plain.size(), 80u);
}

TEST(BlockedCacheCountRejected, SlidingCounterAdmitsAtMostLimitPerFixedWindow) {
  const sliding_window_counter::config cfg{"10/15min", window_options{.count_rejected = true}};
  const bound_outcome o = abuse<sliding_window_counter>(cfg, 1s, 2h);
  std::vector<std::size_t> per_window(16, 0);
  for (const timestamp t : o.admitted_cached)
    ++per_window[static_cast<std::size_t>(t / 15min) - static_cast<std::size_t>(t0 / 15min)];
  for (const std::size_t n : per_window) EXPECT_LE(n, 10u);
  EXPECT_GE(o.admitted_cached.size(), o.admitted_plain.size());
}

// Verifies that, below the threshold, count_rejected keeps its full effect.
TEST(BlockedCacheCountRejected, NoEffectWhenNothingIsCached) {
  const sliding_window_log::config cfg{"10/15min", window_options{.count_rejected = true}};
  memory_store<sliding_window_log> plain;
  cached_log cached{log_store{}, blocked_cache_options{.threshold = 1h}};
  for (timestamp t = t0; t < t0 + 1h; t += 1s) {
    ASSERT_EQ(cached.apply(cfg, "k", t, 1, access::consume),
              plain.apply(cfg, "k", t, 1, access::consume));
  }
}

// ---- Threads.

// Verifies exact totals with many threads on one hot key and on many keys.
TEST(BlockedCacheThreads, ExactTotalsOnAHotKey) {
  const fixed_window::config cfg{"100/1h"};
  blocked_cache<memory_store<fixed_window>> c{memory_store<fixed_window>{},
                                              blocked_cache_options{.threshold = 0us}};
  constexpr int threads = 8;
  constexpr int per_thread = 5000;
  std::atomic<int> admitted{0};
  std::atomic<int> local{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < per_thread; ++j) {
        const decision d = c.apply(cfg, "hot", t0, 1, access::consume);
        if (d.allowed) admitted.fetch_add(1);
        if (d.source == decision_source::local_cache) local.fetch_add(1);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  EXPECT_EQ(admitted.load(), 100);
  EXPECT_EQ(static_cast<std::uint64_t>(local.load()), c.stats().hits);
  EXPECT_GT(local.load(), threads * per_thread - 1000);
}

TEST(BlockedCacheThreads, ManyKeysWithResetsStayBounded) {
  const sliding_window_log::config cfg{"2/1h"};
  cached_log c{log_store{}, blocked_cache_options{.max_entries = 64, .shards = 4}};
  constexpr int threads = 4;
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < 4000; ++j) {
        const std::string key = "k" + std::to_string((j * 7 + i) % 300);
        if (i == 0 && j % 50 == 0) {
          c.reset(cfg, key);
          continue;
        }
        if (c.apply(cfg, key, t0, 1, access::consume).allowed) admitted.fetch_add(1);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  EXPECT_LE(c.size(), 64u);
  // Without resets each of the 300 keys admits 2; resets may only add to that.
  EXPECT_GE(admitted.load(), 600);
}

}  // namespace
