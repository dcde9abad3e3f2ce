// SPDX-License-Identifier: Apache-2.0
// Edge cases of the sliding-window counter: the weighting, double rounding, exact retry_after.
#include "ratelimit/policy/sliding_window_counter.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::sliding_window_counter;
using ratelimit::timestamp;
using ratelimit::units;
using ratelimit::window_options;

using state = sliding_window_counter::state;
using config = sliding_window_counter::config;

decision at(const config& cfg, state& s, std::int64_t t, units cost = 1) {
  return sliding_window_counter::step(cfg, s, timestamp{t}, cost);
}

config per(units limit, std::chrono::microseconds period, bool count_rejected = false) {
  return config{ratelimit::rate(limit, period), window_options{count_rejected}};
}

/// 8 units in window [0, 100) of a 10 per 100 us counter.
state eight_in_window_zero(const config& cfg) {
  state s;
  EXPECT_TRUE(at(cfg, s, 10, 8).allowed);
  return s;
}

// Verifies the weight of the previous window: (W - e) / W, the share of it
// still inside the sliding window. At e = 25 that is 0.75, so 8 previous
// units weigh 6 and 4 more pass. (Weighting by e / W would let 8 pass;
// counting the whole previous window, 2.)
TEST(SlidingWindowCounter, WeightsThePreviousWindowByItsShareStillInside) {
  const config cfg = per(10, 100us);
  state s = eight_in_window_zero(cfg);
  state probe = s;
  const decision five = at(cfg, probe, 125, 5);
  EXPECT_FALSE(five.allowed);
  EXPECT_EQ(five.remaining, 4);
  EXPECT_EQ(probe, s);

  const decision four = at(cfg, s, 125, 4);
  EXPECT_TRUE(four.allowed);
  EXPECT_EQ(four.remaining, 0);
  EXPECT_EQ(four.reset_after, 175us);  // end of window 2, after the newest non-empty window 1
  EXPECT_EQ(s.window, 1);
  EXPECT_EQ(s.current, 4);
  EXPECT_EQ(s.previous, 8);
}

// Verifies retry_after by hand: with 8 previous and 4 current units, one
// more passes once 8 * (100 - e) / 100 <= 5, i.e. from e = 38 (4.96) and
// not at e = 37 (5.04).
TEST(SlidingWindowCounter, RetryAfterIsExactWithinTheWindow) {
  const config cfg = per(10, 100us);
  state s = eight_in_window_zero(cfg);
  ASSERT_TRUE(at(cfg, s, 125, 4).allowed);
  const decision d = at(cfg, s, 125);
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 13us);
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 137).allowed);
  EXPECT_TRUE(at(cfg, then, 138).allowed);
}

// Verifies retry_after when the current window cannot pass: the search goes
// on into the next window, where the current count becomes the previous one.
TEST(SlidingWindowCounter, RetryAfterReachesIntoTheNextWindow) {
  const config cfg = per(4, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 190, 4).allowed);
  // In window 2 the 4 units weigh 4 * (100 - e) / 100; cost 2 passes once that is <= 2: e = 50.
  const decision d = at(cfg, s, 195, 2);
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 55us);  // 250 - 195
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 249, 2).allowed);
  EXPECT_TRUE(at(cfg, then, 250, 2).allowed);
  // Cost 4 (the whole limit) needs both windows empty: the start of window 3.
  const decision whole = at(cfg, s, 195, 4);
  EXPECT_EQ(whole.retry_after, 105us);
  state just_before = s;
  EXPECT_FALSE(at(cfg, just_before, 299, 4).allowed);
}

// Verifies "in IEEE double in exactly that order": (100 - 44) / 100 is
// 0.56000000000000005 in double, so 25 previous units weigh
// 14.000000000000002 and a request of 1 against a limit of 15 is rejected,
// although exact arithmetic (25 * 0.56 + 1 = 15) would admit it.
TEST(SlidingWindowCounter, EvaluatesTheTestInDoubleInTheDocumentedOrder) {
  const config counting = per(15, 100us, true);
  state s;
  ASSERT_TRUE(at(counting, s, 0, 15).allowed);
  ASSERT_FALSE(at(counting, s, 1, 10).allowed);  // counted: window 0 holds 25
  ASSERT_EQ(s.current, 25);
  const config cfg = per(15, 100us);
  state probe = s;
  const decision d = at(cfg, probe, 144);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, 1us);  // at e = 45: 25 * 0.55 + 1 = 14.75
  EXPECT_TRUE(at(cfg, probe, 145).allowed);
}

// Verifies remaining: the largest m that passes the same double test.
TEST(SlidingWindowCounter, RemainingIsTheLargestCostThatWouldPass) {
  const config cfg = per(10, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 50, 7).allowed);
  // At 160 (e = 60): 7 * 0.4 = 2.8 (2.8000000000000003 in double); 10 - 2.8 leaves 7.
  const decision d = at(cfg, s, 160, 11);
  EXPECT_EQ(d.remaining, 7);
  state seven = s;
  state eight = s;
  EXPECT_TRUE(at(cfg, seven, 160, 7).allowed);
  EXPECT_FALSE(at(cfg, eight, 160, 8).allowed);
}

TEST(SlidingWindowCounter, ResetAfterEndsTheWindowAfterTheNewestNonEmptyOne) {
  const config cfg = per(3, 100us);
  state s;
  EXPECT_EQ(at(cfg, s, 30).reset_after, 170us);  // window 0 non-empty: empty from 200
  // Seen from window 1 with nothing recorded there: empty from 200.
  EXPECT_EQ(at(cfg, s, 120, 4).reset_after, 80us);
  // Seen from window 2: already empty.
  const decision gone = at(cfg, s, 200, 4);
  EXPECT_EQ(gone.reset_after, 0us);
  EXPECT_EQ(gone.remaining, 3);
  EXPECT_TRUE(sliding_window_counter::idle(cfg, s, timestamp{200}));
  EXPECT_FALSE(sliding_window_counter::idle(cfg, s, timestamp{199}));
}

TEST(SlidingWindowCounter, CostAboveLimitIsRejectedForeverAndWritesNothing) {
  const config cfg = per(3, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 10).allowed);
  const state before = s;
  const decision d = at(cfg, s, 20, 4);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(s, before);
}

TEST(SlidingWindowCounter, RejectedRequestWritesNothingByDefault) {
  const config cfg = per(2, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 0, 2).allowed);
  const state before = s;
  for (std::int64_t t = 0; t < 150; t += 3) EXPECT_FALSE(at(cfg, s, t).allowed) << t;
  EXPECT_EQ(s, before);
}

// Verifies count_rejected: the full cost of each rejected attempt counts,
// also into the next window's weight.
TEST(SlidingWindowCounter, CountRejectedRecordsEveryAttemptWithItsFullCost) {
  const config cfg = per(2, 100us, true);
  state s;
  ASSERT_TRUE(at(cfg, s, 0, 2).allowed);
  const decision d = at(cfg, s, 10, 3);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(s.current, 5);
  // In window 1 at e = 80 the 5 units weigh 1.0: 1 + 1 <= 2 passes.
  const decision next = at(cfg, s, 180);
  EXPECT_TRUE(next.allowed);
  EXPECT_EQ(s.previous, 5);
  EXPECT_EQ(s.current, 1);
}

// Verifies "time never runs backwards": decided at the stored window's start.
TEST(SlidingWindowCounter, EarlierRequestIsDecidedAtTheStoredWindowStart) {
  const config cfg = per(4, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 250, 2).allowed);
  const decision late = at(cfg, s, 130, 2);  // decided at 200 (e = 0)
  EXPECT_TRUE(late.allowed);
  EXPECT_EQ(s.window, 2);
  EXPECT_EQ(s.current, 4);
  EXPECT_EQ(late.reset_after, 200us);  // from 200 to 400
  const decision rejected = at(cfg, s, 10);
  EXPECT_FALSE(rejected.allowed);
  // From 200: window 3 weighs the 4 units by (100 - e) / 100; 1 passes at e = 25.
  EXPECT_EQ(rejected.retry_after, 125us);
}

TEST(SlidingWindowCounter, WorksThroughALimiterWithExplicitTime) {
  using limiter =
      ratelimit::limiter<sliding_window_counter, ratelimit::memory_store<sliding_window_counter>,
                         ratelimit::manual_clock>;
  limiter lim{config{"10/100us"}};
  EXPECT_TRUE(lim.try_acquire("k", timestamp{10}, 8).allowed);
  EXPECT_EQ(lim.peek("k", timestamp{125}, 5).remaining, 4);
  EXPECT_TRUE(lim.try_acquire("k", timestamp{125}, 4).allowed);
  EXPECT_EQ(lim.try_acquire("k", timestamp{125}).retry_after, 13us);
}

}  // namespace
