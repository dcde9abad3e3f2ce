// SPDX-License-Identifier: Apache-2.0
// Edge cases of the sliding-window log: the half-open window, retry_after, memory bound.
#include "ratelimit/policy/sliding_window_log.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <vector>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "support/trace.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::sliding_window_log;
using ratelimit::timestamp;
using ratelimit::units;
using ratelimit::window_options;

using state = sliding_window_log::state;
using config = sliding_window_log::config;

constexpr std::int64_t minute_us = 60'000'000;

decision at(const config& cfg, state& s, std::int64_t t, units cost = 1) {
  return sliding_window_log::step(cfg, s, timestamp{t}, cost);
}

config per(units limit, std::chrono::microseconds period, bool count_rejected = false) {
  return config{ratelimit::rate(limit, period), window_options{count_rejected}};
}

// Verifies the contract's headline example: "10 per 15 minutes" admits an
// 11th call exactly 15:00.000000 after the first, and not 1 us earlier.
TEST(SlidingWindowLog, AdmitsEleventhCallExactlyFifteenMinutesAfterTheFirst) {
  const config cfg{"10 per 15 minutes"};
  state s;
  const std::int64_t first = 1'732'950'000'000'000;  // an epoch time in microseconds
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(at(cfg, s, first + i * minute_us).allowed);
  const std::int64_t fifteen_minutes = 15 * minute_us;
  const decision early = at(cfg, s, first + fifteen_minutes - 1);
  EXPECT_FALSE(early.allowed);
  EXPECT_EQ(early.retry_after, 1us);
  EXPECT_EQ(early.remaining, 0);
  const decision on_time = at(cfg, s, first + fifteen_minutes);
  EXPECT_TRUE(on_time.allowed);
  EXPECT_EQ(on_time.remaining, 0);
  EXPECT_EQ(on_time.reset_after.count(), fifteen_minutes);
  // The 12th must wait for the second call to leave: 1 minute later.
  EXPECT_EQ(at(cfg, s, first + fifteen_minutes).retry_after.count(), minute_us);
}

// Verifies the half-open window (t - W, t]: a call exactly W ago has left,
// a call W - 1 us ago has not.
TEST(SlidingWindowLog, CallExactlyOneWindowAgoHasLeftTheWindow) {
  const config cfg = per(1, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 1'000).allowed);
  state one_us_less = s;
  const decision inside = at(cfg, one_us_less, 1'099);
  EXPECT_FALSE(inside.allowed);
  EXPECT_EQ(inside.retry_after, 1us);
  EXPECT_EQ(inside.reset_after, 1us);
  EXPECT_TRUE(at(cfg, s, 1'100).allowed);
}

// Verifies the log never admits more than `limit` in any window (t - W, t]
// on a dense burst across a window edge, where the fixed window admits 2x.
TEST(SlidingWindowLog, NeverAdmitsMoreThanTheLimitInAnyWindow) {
  const units limit = 5;
  const std::int64_t w = 1'000;
  const config log_cfg = per(limit, std::chrono::microseconds{w});
  const ratelimit::fixed_window::config fixed_cfg{
      ratelimit::rate(limit, std::chrono::microseconds{w})};
  state log_state;
  ratelimit::fixed_window::state fixed_state;
  std::vector<std::int64_t> log_admitted;
  std::vector<std::int64_t> fixed_admitted;
  for (std::int64_t t = 900; t < 3'100; t += 7) {
    if (at(log_cfg, log_state, t).allowed) log_admitted.push_back(t);
    if (ratelimit::fixed_window::step(fixed_cfg, fixed_state, timestamp{t}, 1).allowed) {
      fixed_admitted.push_back(t);
    }
  }
  const auto worst_window = [&](const std::vector<std::int64_t>& admitted) {
    std::size_t worst = 0;
    for (const std::int64_t end : admitted) {
      std::size_t n = 0;
      for (const std::int64_t t : admitted) n += (t > end - w && t <= end) ? 1 : 0;
      worst = std::max(worst, n);
    }
    return worst;
  };
  EXPECT_EQ(worst_window(log_admitted), 5u);
  EXPECT_EQ(worst_window(fixed_admitted), 10u);
  EXPECT_EQ(log_admitted.size(), 15u);  // 5 per 1000 us over 2200 us of steady demand
}

// Verifies retry_after exactly, with costs > 1 that need several entries to leave.
TEST(SlidingWindowLog, RetryAfterIsExactWithCostsAboveOne) {
  const config cfg = per(5, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 10, 2).allowed);
  ASSERT_TRUE(at(cfg, s, 30, 1).allowed);
  ASSERT_TRUE(at(cfg, s, 60, 2).allowed);
  // Cost 3 needs 3 units free: the entries at 10 (2) and 30 (1) must leave.
  const decision d = at(cfg, s, 70, 3);
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 60us);  // 30 + 100 - 70
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.reset_after, 90us);  // 60 + 100 - 70
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 70 + 59, 3).allowed);
  EXPECT_TRUE(at(cfg, then, 70 + 60, 3).allowed);
  // Cost 2 only needs the entry at 10 to leave.
  EXPECT_EQ(at(cfg, s, 70, 2).retry_after, 40us);
}

TEST(SlidingWindowLog, RemainingCountsOnlyTheWindow) {
  const config cfg = per(4, 100us);
  state s;
  EXPECT_EQ(at(cfg, s, 0, 3).remaining, 1);
  const decision d = at(cfg, s, 100);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.reset_after, 100us);
  EXPECT_EQ(s.size(), 1u);
}

TEST(SlidingWindowLog, CostAboveLimitIsRejectedForeverAndWritesNothing) {
  const config cfg = per(3, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 10).allowed);
  const state before = s;
  const decision d = at(cfg, s, 20, 4);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after, 90us);
  EXPECT_EQ(s, before);
  // Long after, the log's only entry has left: nothing is held, nothing written.
  const decision later = at(cfg, s, 5'000, 4);
  EXPECT_EQ(later.remaining, 3);
  EXPECT_EQ(later.reset_after, 0us);
  EXPECT_EQ(s, before);
}

// Verifies that a rejection writes nothing, not even the removal of entries
// that have left the window: a later request stamped earlier (another
// node's clock) must still see them.
TEST(SlidingWindowLog, RejectionKeepsExpiredEntriesForEarlierRequests) {
  const config cfg = per(2, 10us);
  state s;
  ASSERT_TRUE(at(cfg, s, 0).allowed);
  ASSERT_TRUE(at(cfg, s, 5).allowed);
  const state before = s;
  const decision rejected = at(cfg, s, 10, 2);  // the entry at 0 has left; 1 + 2 > 2
  EXPECT_FALSE(rejected.allowed);
  EXPECT_EQ(rejected.retry_after, 5us);
  EXPECT_EQ(s, before);
  // At 6 both entries, 0 and 5, are inside (-4, 6].
  const decision earlier = at(cfg, s, 6);
  EXPECT_FALSE(earlier.allowed);
  EXPECT_EQ(earlier.retry_after, 4us);
  EXPECT_EQ(earlier.remaining, 0);
}

TEST(SlidingWindowLog, RejectedRequestWritesNothingByDefault) {
  const config cfg = per(2, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 0).allowed);
  ASSERT_TRUE(at(cfg, s, 1).allowed);
  const state before = s;
  for (std::int64_t t = 2; t < 100; ++t) EXPECT_FALSE(at(cfg, s, t).allowed);
  EXPECT_EQ(s, before);
  EXPECT_EQ(s.size(), 2u);
}

// Verifies count_rejected: full cost recorded, `counted` set, and the caller
// who keeps calling stays blocked while a patient one gets through.
TEST(SlidingWindowLog, CountRejectedKeepsACallerWhoKeepsCallingBlocked) {
  const config cfg = per(2, 100us, true);
  state s;
  ASSERT_TRUE(at(cfg, s, 0).allowed);
  ASSERT_TRUE(at(cfg, s, 10).allowed);
  const decision d = at(cfg, s, 50);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(d.retry_after, 60us);  // once the entry at 10 leaves: 10 + 100 - 50
  EXPECT_EQ(d.reset_after, 100us);
  for (std::int64_t t = 100; t < 1'000; t += 40) EXPECT_FALSE(at(cfg, s, t).allowed) << t;
  const decision patient = at(cfg, s, 960 + 100);
  EXPECT_TRUE(patient.allowed);
}

// Verifies the SQL equivalence stated in the contract: with count_rejected
// and cost 1, rejected exactly when count(*) of attempts in (t - W, t],
// this one included, exceeds the limit.
TEST(SlidingWindowLog, CountRejectedMatchesTheSqlWindowCount) {
  const units limit = 3;
  const std::int64_t w = 10;
  const config cfg = per(limit, std::chrono::microseconds{w}, true);
  ratelimit_test::trace_options o;
  o.period_us = w;
  o.limit = limit;
  o.keys = 1;
  o.backwards = false;
  o.events = 200;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    state s;
    std::vector<std::int64_t> attempts;
    for (const auto& ev : ratelimit_test::make_trace(seed, o)) {
      attempts.push_back(ev.t);
      units in_window = 0;
      for (const std::int64_t a : attempts) in_window += (a > ev.t - w && a <= ev.t) ? 1 : 0;
      ASSERT_EQ(at(cfg, s, ev.t).allowed, in_window <= limit) << "seed " << seed << " t " << ev.t;
    }
  }
}

// Verifies the memory bound: never more than `limit` entries, even when
// count_rejected records thousands of rejected attempts.
TEST(SlidingWindowLog, HoldsAtMostLimitEntriesUnderCountRejected) {
  const config cfg = per(5, 1'000us, true);
  state s;
  for (std::int64_t t = 0; t < 10'000; ++t) {
    (void)at(cfg, s, t / 3, 1 + t % 2);
    ASSERT_LE(s.size(), 5u);
    ASSERT_LE(s.heap_bytes(), (5u) * sizeof(ratelimit::sliding_window_log::entry));
  }
  // Still exactly blocked. The last attempts were 1+2+1 units at 3332 and
  // 2 at 3333, plus this 1 at 3333: a retry of 1 needs the 3332 ones gone.
  const decision d = at(cfg, s, 3'333);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 999us);
}

TEST(SlidingWindowLog, HoldsAtMostLimitEntriesWhenAdmitting) {
  const config cfg = per(3, 10us);
  state s;
  for (std::int64_t t = 0; t < 1'000; ++t) {
    (void)at(cfg, s, t);
    ASSERT_LE(s.size(), 3u);
    ASSERT_LE(s.heap_bytes(), (3u) * sizeof(ratelimit::sliding_window_log::entry));
  }
}

// Verifies "time never runs backwards": decided at the newest entry.
TEST(SlidingWindowLog, EarlierRequestIsDecidedAtTheNewestEntry) {
  const config cfg = per(2, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 500).allowed);
  const decision late = at(cfg, s, 350);  // decided at 500
  EXPECT_TRUE(late.allowed);
  EXPECT_EQ(late.reset_after, 100us);
  EXPECT_EQ(s.back().ts, 500);
  const decision rejected = at(cfg, s, 0);
  EXPECT_FALSE(rejected.allowed);
  EXPECT_EQ(rejected.retry_after, 100us);
}

// Verifies that two requests in one microsecond are two entries.
TEST(SlidingWindowLog, RequestsInTheSameMicrosecondAreSeparateEntries) {
  const config cfg = per(3, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 7).allowed);
  ASSERT_TRUE(at(cfg, s, 7).allowed);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.total(), 2);
  EXPECT_EQ(at(cfg, s, 7).remaining, 0);
  EXPECT_FALSE(at(cfg, s, 7).allowed);
}

TEST(SlidingWindowLog, WorksThroughALimiterWithExplicitTime) {
  using limiter = ratelimit::limiter<
      sliding_window_log, ratelimit::memory_store<sliding_window_log>, ratelimit::manual_clock>;
  limiter lim{config{"2/10us"}};
  EXPECT_TRUE(lim.try_acquire("k", timestamp{100}).allowed);
  EXPECT_TRUE(lim.try_acquire("k", timestamp{105}).allowed);
  const decision d = lim.try_acquire("k", timestamp{109});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 1us);
  EXPECT_TRUE(lim.try_acquire("k", timestamp{110}).allowed);
  EXPECT_EQ(lim.store().state_of("k").size(), 2u);
}

}  // namespace
