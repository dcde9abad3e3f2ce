// SPDX-License-Identifier: Apache-2.0
// Tiers on a real Redis: random traces whose keys change tier and whose tiers
// change config mid-trace give identical decisions in memory_store<tiered<P>>
// and in redis_store (the C++ conversion is the scripts'), and a
// tiered_limiter on Redis follows runtime changes while threads check.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "ratelimit/tiers.hpp"
#include "redis_server.hpp"
#include "support/tier_trace.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

template <class P>
class TiersRedisDifferential : public ::testing::Test {};
using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(TiersRedisDifferential, policies);

// Verifies identical decisions, every field, on random traces with tier
// moves and runtime tier changes (conversions, fresh starts, changes back,
// equal configs under two tiers, peeks, time going backwards).
TYPED_TEST(TiersRedisDifferential, MatchesMemoryStoreWithTierChanges) {
  using P = TypeParam;
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(std::string("tiers:") + std::string(P::name));
  redis::redis_store store(o);
  const int traces = rltest::diff_traces(250);
  std::int64_t changed = 0;
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 104729u + 3u);
    const auto tr = rltest::tiers::random_trace<P>(rng, std::to_string(seed) + ":");
    const auto expected = rltest::tiers::replay_memory<P>(tr);
    const auto got = rltest::tiers::replay_store<P>(tr, store);
    for (std::size_t i = 0; i < tr.events.size(); ++i) {
      if (tr.events[i].change_to >= 0) ++changed;
      ASSERT_EQ(rltest::tiers::describe(got[i]), rltest::tiers::describe(expected[i]))
          << P::name << " seed " << seed << " " << rltest::tiers::describe_event(tr, i);
    }
  }
  EXPECT_GT(changed, traces);  // the traces do change tiers
}

// Verifies the script's rule for a log idle under the window that wrote it:
// empty under a longer window (one microsecond either side of the edge), as
// memory_store decides whether or not it reclaimed the key.
TEST(TiersRedis, IdleLogIsEmptyUnderALongerWindow) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("tiers:idle");
  redis::redis_store store(o);
  const sliding_window_log::config second{"1/s", window_options{false, "t"}};
  const sliding_window_log::config hour{"1/1h", window_options{false, "t"}};
  ASSERT_TRUE(store.apply(second, "k1", microseconds{100}, 1).allowed);
  ASSERT_TRUE(store.apply(second, "k2", microseconds{100}, 1).allowed);
  EXPECT_FALSE(store.apply(hour, "k1", microseconds{1'000'099}, 1).allowed);
  EXPECT_TRUE(store.apply(hour, "k2", microseconds{1'000'100}, 1).allowed);
}

// Verifies a tiered_limiter on Redis end to end: the tier's config per key,
// a runtime change applied to the next check with GCRA's TAT converted, and
// an unnamed tier refused.
TEST(TiersRedis, LimiterFollowsRuntimeChanges) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("tiers:limiter");
  using tl = tiered_limiter<gcra, redis::redis_store>;
  const auto cfg = [](const char* r) { return gcra::config{r, bucket_options{{}, "plans"}}; };
  tl l(
      {{"free", cfg("2/s")}, {"pro", cfg("10/s")}},
      [](std::string_view k) { return k.substr(0, k.find(':')); }, {}, redis::redis_store(o));
  const microseconds t0{1'732'950'000'000'000};
  EXPECT_TRUE(l.try_acquire("free:1", t0).allowed);
  EXPECT_TRUE(l.try_acquire("free:1", t0).allowed);
  EXPECT_FALSE(l.try_acquire("free:1", t0).allowed);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(l.try_acquire("pro:1", t0).allowed);
  // pro becomes 1/s with a burst of 1: TAT t0 + 1 s stays (<= t0 + 1 s):
  // full, retry in exactly 1 s.
  l.set_tier("pro", gcra::config{"1/s", bucket_options{1, "plans"}});
  const decision d = l.try_acquire("pro:1", t0);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 1);
  EXPECT_EQ(d.retry_after, microseconds{1'000'000});
  // The key moves to free: same state, converted again.
  EXPECT_FALSE(l.try_acquire("pro:1", "free", t0).allowed);
  EXPECT_THROW(l.set_tier("x", gcra::config{"1/s"}), std::invalid_argument);
  EXPECT_THROW(tl({{"a", gcra::config{"1/s"}}}, {}, {}, redis::redis_store(o)),
               std::invalid_argument);
}

// Verifies a tiered_limiter on the server's clock: the tier from the lookup
// or per call, one script per check at the server's TIME.
TEST(TiersRedis, ServerClock) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("tiers:server-clock");
  const auto cfg = [](const char* r) {
    return fixed_window::config{r, window_options{false, "plans"}};
  };
  tiered_limiter<fixed_window, redis::redis_store, redis::server_clock> l(
      {{"free", cfg("1/1h")}, {"pro", cfg("3/1h")}},
      [](std::string_view) { return std::string_view("free"); }, {}, redis::redis_store(o));
  EXPECT_TRUE(l.try_acquire("k").allowed);
  const decision d = l.try_acquire("k");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 1);
  EXPECT_TRUE(l.try_acquire("k", "pro").allowed);  // starts fresh under 3/1h
  EXPECT_EQ(l.peek("k", "pro").remaining, 1);
  l.reset("k");
  EXPECT_TRUE(l.try_acquire("k").allowed);
}

// Verifies runtime changes while threads check on Redis: one shared key at
// one instant admits exactly its limit across window changes, and every
// snapshot is freed.
TEST(TiersRedis, ChangesWhileThreadsCheck) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("tiers:threads");
  const auto log = [](std::int64_t minutes) {
    return sliding_window_log::config{rate(4, std::chrono::minutes(minutes)),
                                      window_options{false, "plans"}};
  };
  tiered_limiter<sliding_window_log, redis::redis_store> l(
      {{"a", log(1)}}, [](std::string_view) { return std::string_view("a"); }, {},
      redis::redis_store(o));
  const microseconds t0{1'732'950'000'000'000};
  std::atomic<bool> stop{false};
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 3; ++th) {
    threads.emplace_back([&] {
      int i = 0;
      while (!stop.load() || i < 30) {
        const decision d = l.try_acquire("shared", t0);
        EXPECT_EQ(d.source, decision_source::store);
        if (d.allowed) admitted.fetch_add(1);
        ++i;
      }
    });
  }
  for (int i = 0; i < 60; ++i) l.set_tier("a", log(1 + i % 4));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted.load(), 4);
  EXPECT_EQ(l.table().live_snapshots(), 1U);
}

}  // namespace
