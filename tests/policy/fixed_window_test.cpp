// SPDX-License-Identifier: Apache-2.0
// Edge cases of the fixed-window policy, to the microsecond.
#include "ratelimit/policy/fixed_window.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::fixed_window;
using ratelimit::timestamp;
using ratelimit::units;
using ratelimit::window_options;

using state = fixed_window::state;
using config = fixed_window::config;

decision at(const config& cfg, state& s, std::int64_t t, units cost = 1) {
  return fixed_window::step(cfg, s, timestamp{t}, cost);
}

config per(units limit, std::chrono::microseconds period, bool count_rejected = false) {
  return config{ratelimit::rate(limit, period), window_options{count_rejected}};
}

/// Message of the std::invalid_argument thrown by `f` ("" if none).
template <class F>
std::string invalid_argument_message(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(FixedWindow, AdmitsUpToTheLimitThenRejectsUntilTheWindowEnds) {
  const config cfg = per(3, 100us);
  state s;
  for (units i = 0; i < 3; ++i) {
    const decision d = at(cfg, s, 1'000 + i * 10);
    EXPECT_TRUE(d.allowed);
    EXPECT_TRUE(d.counted);
    EXPECT_EQ(d.limit, 3);
    EXPECT_EQ(d.remaining, 2 - i);
    EXPECT_EQ(d.retry_after, 0us);
    EXPECT_EQ(d.reset_after.count(), 1'100 - (1'000 + i * 10));
  }
  const decision d = at(cfg, s, 1'050);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, 50us);
  EXPECT_EQ(d.reset_after, 50us);
}

// Verifies epoch alignment: window k covers [kW, (k+1)W), so kW - 1 and kW
// are in different windows however close.
TEST(FixedWindow, WindowsAlignToTheEpoch) {
  const config cfg = per(1, 100us);
  state s;
  EXPECT_TRUE(at(cfg, s, 199).allowed);
  const decision last_us = at(cfg, s, 199);
  EXPECT_FALSE(last_us.allowed);
  EXPECT_EQ(last_us.retry_after, 1us);
  EXPECT_TRUE(at(cfg, s, 200).allowed);
  EXPECT_EQ(s.window, 2);
  EXPECT_EQ(s.count, 1);
}

// Verifies the inherent edge burst: 2 x limit within 2 us across an edge.
TEST(FixedWindow, AdmitsTwiceTheLimitAcrossAWindowEdge) {
  const config cfg = per(5, 60s);
  state s;
  const std::int64_t edge = 60'000'000 * 10;
  int admitted = 0;
  for (int i = 0; i < 5; ++i) admitted += at(cfg, s, edge - 1).allowed ? 1 : 0;
  for (int i = 0; i < 5; ++i) admitted += at(cfg, s, edge).allowed ? 1 : 0;
  EXPECT_EQ(admitted, 10);
  EXPECT_FALSE(at(cfg, s, edge + 1).allowed);
}

// Verifies retry_after exactly: admitted at t + retry_after, not 1 us sooner.
TEST(FixedWindow, RetryAfterIsExact) {
  const config cfg = per(2, 1'000us);
  state s;
  ASSERT_TRUE(at(cfg, s, 5'250, 2).allowed);
  const decision d = at(cfg, s, 5'400);
  ASSERT_FALSE(d.allowed);
  ASSERT_EQ(d.retry_after, 600us);
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 5'400 + 599).allowed);
  EXPECT_TRUE(at(cfg, then, 5'400 + 600).allowed);
}

TEST(FixedWindow, CostAboveOneTakesThatManyUnits) {
  const config cfg = per(10, 100us);
  state s;
  EXPECT_EQ(at(cfg, s, 0, 4).remaining, 6);
  EXPECT_EQ(at(cfg, s, 1, 6).remaining, 0);
  const decision d = at(cfg, s, 2, 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 98us);
  EXPECT_EQ(s.count, 10);
}

// Verifies that a rejected cost that fits the limit is still rejected when it
// does not fit what is left, and that smaller costs still pass.
TEST(FixedWindow, LargeCostRejectedWhileSmallerOnesPass) {
  const config cfg = per(10, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 0, 7).allowed);
  const decision big = at(cfg, s, 1, 4);
  EXPECT_FALSE(big.allowed);
  EXPECT_EQ(big.remaining, 3);
  EXPECT_EQ(big.retry_after, 99us);
  EXPECT_TRUE(at(cfg, s, 1, 3).allowed);
}

TEST(FixedWindow, CostAboveLimitIsRejectedForeverAndWritesNothing) {
  const config cfg = per(3, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 10).allowed);
  const state before = s;
  const decision d = at(cfg, s, 20, 4);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after, 80us);
  EXPECT_EQ(s, before);

  state fresh;
  const decision on_fresh = at(cfg, fresh, 20, 4);
  EXPECT_EQ(on_fresh.retry_after, ratelimit::never);
  EXPECT_EQ(on_fresh.remaining, 3);
  EXPECT_EQ(on_fresh.reset_after, 0us);
  EXPECT_EQ(fresh, state{});
}

TEST(FixedWindow, RejectedRequestWritesNothingByDefault) {
  const config cfg = per(1, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 100).allowed);
  const state before = s;
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(at(cfg, s, 150 + i).allowed);
  EXPECT_EQ(s, before);
}

// Verifies count_rejected: every attempt adds its full cost, so a caller
// who keeps calling stays blocked until the window ends, and no longer.
TEST(FixedWindow, CountRejectedRecordsEveryAttemptWithItsFullCost) {
  const config cfg = per(2, 100us, true);
  state s;
  EXPECT_TRUE(at(cfg, s, 0).allowed);
  EXPECT_TRUE(at(cfg, s, 1).allowed);
  const decision third = at(cfg, s, 2, 2);
  EXPECT_FALSE(third.allowed);
  EXPECT_TRUE(third.counted);
  EXPECT_EQ(third.remaining, 0);
  EXPECT_EQ(third.retry_after, 98us);
  EXPECT_EQ(s.count, 4);
  const decision oversized = at(cfg, s, 3, 7);
  EXPECT_FALSE(oversized.allowed);
  EXPECT_TRUE(oversized.counted);
  EXPECT_EQ(oversized.retry_after, ratelimit::never);
  EXPECT_EQ(s.count, 11);
  EXPECT_TRUE(at(cfg, s, 100).allowed);  // the next window starts empty
  EXPECT_EQ(s.count, 1);
}

// Verifies "time never runs backwards": a request stamped before the stored
// window's start is decided at that start, and durations count from there.
TEST(FixedWindow, EarlierRequestIsDecidedAtTheStoredWindowStart) {
  const config cfg = per(2, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 550).allowed);
  const decision late = at(cfg, s, 420);  // window 4, but the state holds window 5
  EXPECT_TRUE(late.allowed);
  EXPECT_EQ(s.window, 5);
  EXPECT_EQ(s.count, 2);
  EXPECT_EQ(late.reset_after, 100us);  // from 500, not from 420
  const decision rejected = at(cfg, s, 10);
  EXPECT_FALSE(rejected.allowed);
  EXPECT_EQ(rejected.retry_after, 100us);
  EXPECT_EQ(rejected.reset_after, 100us);
  // Within the stored window an earlier time is not moved.
  const decision inside = at(cfg, s, 520);
  EXPECT_EQ(inside.retry_after, 80us);
}

TEST(FixedWindow, EmptyStateHoldsNoTime) {
  const config cfg = per(2, 100us);
  state s;
  ASSERT_FALSE(at(cfg, s, 900, 3).allowed);  // oversized: nothing recorded
  const decision d = at(cfg, s, 30);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(s.window, 0);
  EXPECT_EQ(d.reset_after, 70us);
}

TEST(FixedWindow, ResetAfterIsZeroOnceTheWindowHasPassed) {
  const config cfg = per(2, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 50).allowed);
  const decision later = at(cfg, s, 250, 3);  // oversized, decided on a stale state
  EXPECT_EQ(later.remaining, 2);
  EXPECT_EQ(later.reset_after, 0us);
  EXPECT_TRUE(fixed_window::idle(cfg, s, timestamp{100}));
  EXPECT_FALSE(fixed_window::idle(cfg, s, timestamp{99}));
}

TEST(FixedWindow, WorksThroughALimiterWithExplicitTime) {
  ratelimit::manual_clock clock;
  ratelimit::limiter<fixed_window, ratelimit::memory_store<fixed_window>, ratelimit::manual_clock>
      lim{config{"2/s"}, ratelimit::memory_store<fixed_window>{}, clock};
  EXPECT_TRUE(lim.try_acquire("a", timestamp{999'999}).allowed);
  EXPECT_TRUE(lim.try_acquire("a", timestamp{999'999}).allowed);
  const decision d = lim.try_acquire("a", timestamp{999'999});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 1us);
  EXPECT_TRUE(lim.try_acquire("b", timestamp{999'999}).allowed);
  clock.set(1s);
  EXPECT_TRUE(lim.try_acquire("a").allowed);
  EXPECT_EQ(lim.try_acquire("a", 3).retry_after, ratelimit::never);
}

TEST(FixedWindow, RejectsInvalidConfigurationNamingTheValue) {
  EXPECT_NE(invalid_argument_message([] { (void)per(0, 1s); }).find("got 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(-7, 1s); }).find("-7"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 0us); }).find("got 0us"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, -3us); }).find("-3us"), std::string::npos);
  EXPECT_NE(
      invalid_argument_message([] { (void)config{"ten per minute"}; }).find("\"ten per minute\""),
      std::string::npos);
  EXPECT_NO_THROW((void)per(ratelimit::max_units, ratelimit::max_period));
  EXPECT_NE(invalid_argument_message([] {
              (void)per(ratelimit::max_units + 1, 1s);
            }).find(std::to_string(ratelimit::max_units + 1)),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] {
              (void)per(1, ratelimit::max_period + 1us);
            }).find(std::to_string(ratelimit::max_period.count() + 1)),
            std::string::npos);
}

}  // namespace
