// SPDX-License-Identifier: Apache-2.0
// Tests of the clocks: manual_clock sharing and moving backwards, steady and system clocks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/clock/coarse_clock.hpp"
#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::manual_clock;
using ratelimit::memory_store;

static_assert(ratelimit::clock_source<manual_clock>);
static_assert(ratelimit::clock_source<ratelimit::steady_clock>);
static_assert(ratelimit::clock_source<ratelimit::system_clock>);
static_assert(!ratelimit::clock_source<int>);
static_assert(!ratelimit::store_clock<manual_clock>);
static_assert(!ratelimit::store_clock<ratelimit::steady_clock>);

/// A clock whose now() may throw does not model clock_source.
struct throwing_clock {
  using duration = std::chrono::microseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  time_point now() const { return {}; }
};
static_assert(!ratelimit::clock_source<throwing_clock>);

template <class Clock>
using fixed_limiter =
    ratelimit::limiter<ratelimit::fixed_window, memory_store<ratelimit::fixed_window>, Clock>;

TEST(ManualClock, StartsWhereToldAndDefaultsToZero) {
  EXPECT_EQ(manual_clock{}.now().time_since_epoch(), 0us);
  EXPECT_EQ(manual_clock{42us}.now().time_since_epoch(), 42us);
}

TEST(ManualClock, CopiesShareOneTime) {
  manual_clock a{1s};
  manual_clock b = a;
  manual_clock c{0s};
  c = b;
  a.advance(250ms);
  EXPECT_EQ(b.now().time_since_epoch(), 1250ms);
  EXPECT_EQ(c.now().time_since_epoch(), 1250ms);
  c.set(7s);
  EXPECT_EQ(a.now().time_since_epoch(), 7s);
  // A clock made separately does not follow.
  manual_clock other{7s};
  a.advance(1us);
  EXPECT_EQ(other.now().time_since_epoch(), 7s);
}

TEST(ManualClock, LimiterFollowsTheCopyHeldByTheTest) {
  manual_clock clock{0s};
  fixed_limiter<manual_clock> lim{ratelimit::fixed_window::config{"1/s"},
                                  memory_store<ratelimit::fixed_window>{}, clock};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_FALSE(lim.try_acquire("k").allowed);
  clock.advance(1s);
  EXPECT_EQ(lim.now(), 1s);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  lim.clock().advance(1s);  // the limiter's own copy moves the test's too
  EXPECT_EQ(clock.now().time_since_epoch(), 2s);
}

TEST(ManualClock, SetMovesBackwardsAndAdvanceTakesNegativeSteps) {
  manual_clock clock{10s};
  clock.set(3s);
  EXPECT_EQ(clock.now().time_since_epoch(), 3s);
  clock.advance(-1s);
  EXPECT_EQ(clock.now().time_since_epoch(), 2s);
}

// Verifies SPEC "time never runs backwards inside a key": after the clock is
// set back, a fixed window decides at the start of the stored window, with
// every duration measured from there, and refunds nothing.
TEST(ManualClock, ClockSetBackDecidesAtTheStoredWindow) {
  manual_clock clock{10s};
  fixed_limiter<manual_clock> lim{ratelimit::fixed_window::config{"2/s"},
                                  memory_store<ratelimit::fixed_window>{}, clock};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  clock.set(10s + 500ms);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  clock.set(4s);
  const decision d = lim.try_acquire("k");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, 1s);  // from 10s, the stored window's start, to 11s
  EXPECT_EQ(d.reset_after, 1s);
  // A key the clock never saw is unaffected by the other key's time.
  EXPECT_TRUE(lim.try_acquire("fresh").allowed);
  clock.set(11s);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
}

// The limiter hands the store its clock reading after the key is hashed
// (memory_store::apply_reading): a reading outside 0..max_time is still
// refused with std::invalid_argument naming it, for every access and in
// shadow mode, and nothing is recorded (no key, no state).
TEST(ManualClock, ReadingOutsideTheRangeIsRefusedWithNothingRecorded) {
  manual_clock clock{-1us};
  fixed_limiter<manual_clock> lim{ratelimit::fixed_window::config{"1/s"},
                                  memory_store<ratelimit::fixed_window>{}, clock};
  const auto refused = [&](const char* why) {
    try {
      (void)lim.try_acquire("k");
      ADD_FAILURE() << why << ": try_acquire accepted the reading";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(clock.now().time_since_epoch().count())),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW((void)lim.peek("k"), std::invalid_argument) << why;
    EXPECT_EQ(lim.store().size(), 0u) << why;
  };
  refused("-1 us");
  clock.set(std::chrono::microseconds{(std::int64_t{1} << 62) + 1});
  refused("max_time + 1 us");
  lim.set_shadow(true);
  refused("max_time + 1 us, shadow mode");
  clock.set(std::chrono::microseconds{std::int64_t{1} << 62});
  EXPECT_TRUE(lim.try_acquire("k").allowed);  // max_time itself is a valid time
  EXPECT_EQ(lim.store().size(), 1u);
}

TEST(ManualClock, TokenBucketRefundsNothingWhenTimeGoesBack) {
  manual_clock clock{100s};
  ratelimit::limiter<ratelimit::token_bucket, memory_store<ratelimit::token_bucket>, manual_clock>
      lim{ratelimit::token_bucket::config{"1/s"}, memory_store<ratelimit::token_bucket>{}, clock};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  clock.set(50s);
  const decision d = lim.try_acquire("k");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 1s);
  clock.set(101s);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
}

TEST(ManualClock, GcraDecidesAnEarlierTimeAtThatTime) {
  manual_clock clock{100s};
  ratelimit::limiter<ratelimit::gcra, memory_store<ratelimit::gcra>, manual_clock> lim{
      ratelimit::gcra::config{"1/s"}, memory_store<ratelimit::gcra>{}, clock};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  clock.set(99s);
  const decision d = lim.try_acquire("k");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 2s);  // TAT is 101s; the request stands at 99s
}

TEST(ManualClock, ConcurrentAdvancesAllLand) {
  manual_clock clock{0us};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([copy = clock]() mutable {
      for (int i = 0; i < 10'000; ++i) copy.advance(1us);
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(clock.now().time_since_epoch(), 80'000us);
}

TEST(SteadyClock, NeverDecreases) {
  const ratelimit::steady_clock clock;
  static_assert(std::chrono::steady_clock::is_steady);
  auto previous = clock.now();
  for (int i = 0; i < 10'000; ++i) {
    const auto next = clock.now();
    ASSERT_GE(next, previous);
    previous = next;
  }
}

TEST(SteadyClock, LimiterReportsMicrosecondsSinceItsEpoch) {
  fixed_limiter<ratelimit::steady_clock> lim{ratelimit::fixed_window::config{"1/s"}};
  const auto before = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
  const auto reported = lim.now();
  const auto after = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
  EXPECT_LE(before, reported);
  EXPECT_LE(reported, after);
}

#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
static_assert(ratelimit::clock_source<ratelimit::steady_coarse_clock>);

// Verifies the coarse clock: never decreasing, on steady_clock's timeline,
// never ahead of it and behind it by about one tick (1 s allowed here, so a
// loaded machine cannot fail the test; a wrong epoch is off by far more).
TEST(SteadyCoarseClock, FollowsSteadyClockWithinATick) {
  const ratelimit::steady_coarse_clock coarse;
  const auto res = ratelimit::steady_coarse_clock::resolution();
  EXPECT_GT(res, 0ns);
  EXPECT_LE(res, 1s);
  auto previous = coarse.now();
  for (int i = 0; i < 1'000; ++i) {
    const auto before = std::chrono::steady_clock::now();
    const auto reading = coarse.now();
    const auto after = std::chrono::steady_clock::now();
    ASSERT_GE(reading, previous);
    ASSERT_LE(reading, after);
    ASSERT_GE(reading, before - 1s);
    previous = reading;
  }
}

TEST(SteadyCoarseClock, LimiterDecidesOnIt) {
  fixed_limiter<ratelimit::steady_coarse_clock> lim{ratelimit::fixed_window::config{"2/1h"}};
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_FALSE(lim.try_acquire("k").allowed);
  const auto steady = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
  EXPECT_LE(lim.now(), steady);
  EXPECT_GE(lim.now(), steady - 1s);
}
#endif

TEST(SystemClock, LimiterReportsMicrosecondsSinceTheUnixEpoch) {
  fixed_limiter<ratelimit::system_clock> lim{ratelimit::fixed_window::config{"1/s"}};
  const auto before = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  const auto reported = lim.now();
  const auto after = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  EXPECT_LE(before, reported);
  EXPECT_LE(reported, after);
  // 2020-01-01T00:00:00Z: a Unix-epoch reading, not uptime.
  EXPECT_GT(reported.count(), std::int64_t{1'577'836'800} * 1'000'000);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
}

}  // namespace
