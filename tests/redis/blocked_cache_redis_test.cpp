// SPDX-License-Identifier: Apache-2.0
// Tests of blocked_cache over a real Redis: round trips saved, unchanged decisions, reset, failures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "ratelimit/store/blocked_cache.hpp"
#include "redis_server.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;

using cached_redis = blocked_cache<redis::redis_store>;

static_assert(store_for<cached_redis, sliding_window_log>);
static_assert(store_for<cached_redis, gcra>);
static_assert(store_clocked_store_for<cached_redis, sliding_window_log>);
static_assert(store_clocked_store_for<cached_redis, fixed_window>);
static_assert(!store_clocked_store_for<blocked_cache<memory_store<gcra>>, gcra>);

redis::options fresh_options(std::string_view what) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  return o;
}

/// `calls=` of one line of INFO commandstats (0 if the command never ran).
std::uint64_t command_calls(const redis::options& o, std::string_view command) {
  const auto r = rltest::command(o, {"INFO", "commandstats"});
  const std::string info(r->str, r->len);
  const std::string tag = "cmdstat_" + std::string(command) + ":calls=";
  const auto at = info.find(tag);
  if (at == std::string::npos) return 0;
  return std::stoull(info.substr(at + tag.size()));
}

std::uint64_t script_calls(const redis::options& o) {
  return command_calls(o, "evalsha") + command_calls(o, "eval");
}

// Verifies that cached rejections make no round trip, counted both by the
// store's own stats and by the server (a server of its own, so nothing else
// runs scripts on it).
TEST(BlockedCacheRedis, CachedRejectionsMakeNoRoundTrip) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = "cache:";
  limiter<sliding_window_log, cached_redis, redis::server_clock> lim(
      sliding_window_log::config("3/1h", window_options{.name = "t"}),
      cached_redis(redis::redis_store(o)));
  const std::uint64_t before = script_calls(o);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(lim.try_acquire("+15550001").allowed);
  const decision first = lim.try_acquire("+15550001");
  EXPECT_FALSE(first.allowed);
  EXPECT_EQ(first.source, decision_source::store);
  for (int i = 0; i < 500; ++i) {
    const decision d = lim.try_acquire("+15550001");
    ASSERT_EQ(d.source, decision_source::local_cache);
    ASSERT_FALSE(d.allowed);
    ASSERT_EQ(d.limit, 3);
    ASSERT_GT(d.retry_after, 59min);
    ASSERT_LE(d.retry_after, first.retry_after);
  }
  EXPECT_EQ(lim.peek("+15550001").source, decision_source::local_cache);
  EXPECT_EQ(lim.store().inner().stats().store, 4u);
  EXPECT_EQ(lim.store().stats().hits, 501u);
  // A script's first run on a fresh server is resent once with EVAL (NOSCRIPT).
  const std::uint64_t reloads = lim.store().inner().stats().script_reloads;
  EXPECT_EQ(script_calls(o) - before, 4u + reloads);
  // Another key still goes to Redis.
  EXPECT_TRUE(lim.try_acquire("+15550002").allowed);
  EXPECT_EQ(script_calls(o) - before, 5u + reloads);
}

TEST(BlockedCacheRedis, ResetDeletesTheKeyAndTheEntry) {
  const redis::options o = fresh_options("cache-reset");
  limiter<gcra, cached_redis, redis::server_clock> lim(
      gcra::config("1/1h", bucket_options{.name = "t"}), cached_redis(redis::redis_store(o)));
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_EQ(lim.try_acquire("k").source, decision_source::store);
  EXPECT_EQ(lim.try_acquire("k").source, decision_source::local_cache);
  lim.reset("k");
  EXPECT_EQ(lim.store().size(), 0u);
  EXPECT_EQ(rltest::command(o, {"EXISTS", lim.store().inner().key_for(lim.config(), "k")})->integer,
            0);
  const decision d = lim.try_acquire("k");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
}

// Verifies that a degraded decision (Redis unreachable, fail_closed) is never cached.
TEST(BlockedCacheRedis, FailClosedIsNotCached) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.on_failure = redis::failure_policy::fail_closed;
  o.connect_timeout = 200ms;
  o.command_timeout = 200ms;
  cached_redis c(redis::redis_store(o), blocked_cache_options{.threshold = 0us});
  server.stop();
  const gcra::config cfg("1/1h", bucket_options{.name = "t"});
  for (int i = 0; i < 5; ++i) {
    const decision d = c.apply(cfg, "k", store_time, 1, ratelimit::access::consume);
    EXPECT_EQ(d.source, decision_source::fail_closed);
  }
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.stats().hits, 0u);
}

template <class P>
class BlockedCacheRedisTrace : public ::testing::Test {};
using all_policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(BlockedCacheRedisTrace, all_policies);

// Verifies, on a random trace at caller time under default semantics, that the
// cached Redis store decides exactly as the uncached one (every field but
// `source` at cost 1; `allowed` with mixed costs) and saves the round trips
// it claims to.
TYPED_TEST(BlockedCacheRedisTrace, SameDecisionsAsTheUncachedStore) {
  using P = TypeParam;
  const typename P::config cfg = [] {
    if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
      return typename P::config("4/10s", bucket_options{.name = "t"});
    } else {
      return typename P::config("4/10s", window_options{.name = "t"});
    }
  }();
  redis::redis_store plain(fresh_options("plain"));
  cached_redis cached(redis::redis_store(fresh_options("cached")),
                      blocked_cache_options{.threshold = 500ms});
  std::mt19937_64 rng(7);
  timestamp t{1'700'000'000'000'000};
  std::uint64_t hits = 0;
  constexpr int events = 3000;
  for (int i = 0; i < events; ++i) {
    t += timestamp{static_cast<std::int64_t>(rng() % 600'000)};
    const std::string key = "+1555000" + std::to_string(rng() % 3);
    const units cost = i < events / 2 ? 1 : static_cast<units>(1 + rng() % 3);
    const ratelimit::access a = rng() % 10 == 0 ? ratelimit::access::peek
                                                : ratelimit::access::consume;
    const decision want = plain.apply(cfg, key, t, cost, a);
    const decision got = cached.apply(cfg, key, t, cost, a);
    ASSERT_EQ(want.source, decision_source::store);
    ASSERT_EQ(got.allowed, want.allowed) << "event " << i;
    if (got.source != decision_source::local_cache) {
      ASSERT_EQ(got, want) << "event " << i;
      continue;
    }
    ++hits;
    ASSERT_LE(got.retry_after, want.retry_after) << "event " << i;
    if (cost == 1) {
      decision same = got;
      same.source = decision_source::store;
      ASSERT_EQ(same, want) << "event " << i;
    }
  }
  EXPECT_GT(hits, 300u);
  EXPECT_EQ(cached.stats().hits, hits);
  EXPECT_EQ(plain.stats().store, static_cast<std::uint64_t>(events));
  EXPECT_EQ(cached.inner().stats().store, events - hits);
}

}  // namespace
