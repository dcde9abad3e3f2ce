// SPDX-License-Identifier: Apache-2.0
// Edge cases of GCRA: the rounded emission interval, burst tolerance, retry_after, earlier times.
#include "ratelimit/policy/gcra.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::bucket_options;
using ratelimit::decision;
using ratelimit::gcra;
using ratelimit::timestamp;
using ratelimit::units;

using state = gcra::state;
using config = gcra::config;

decision at(const config& cfg, state& s, std::int64_t t, units cost = 1) {
  return gcra::step(cfg, s, timestamp{t}, cost);
}

config per(units limit, std::chrono::microseconds period, std::optional<units> burst = {}) {
  return config{ratelimit::rate(limit, period), bucket_options{burst}};
}

template <class F>
std::string invalid_argument_message(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Verifies T = period / limit rounded to the nearest microsecond, halves up.
TEST(Gcra, EmissionIntervalRoundsToTheNearestMicrosecondHalvesUp) {
  EXPECT_EQ(per(2, 7us).interval_us(), 4);   // 3.5
  EXPECT_EQ(per(2, 5us).interval_us(), 3);   // 2.5
  EXPECT_EQ(per(3, 10us).interval_us(), 3);  // 3.33
  EXPECT_EQ(per(3, 5us).interval_us(), 2);   // 1.67
  EXPECT_EQ(per(5, 7us).interval_us(), 1);   // 1.4
  EXPECT_EQ(per(2, 1us).interval_us(), 1);   // 0.5
  EXPECT_EQ(per(1, 1us).interval_us(), 1);
  EXPECT_EQ(config{"10 per 15 minutes"}.interval_us(), 90'000'000);
  EXPECT_EQ(per(3, 10us, 4).tolerance_us(), 12);
}

// Verifies the burst tolerance: burst requests back to back, then one per T.
TEST(Gcra, AdmitsABurstThenOnePerEmissionInterval) {
  const config cfg = per(1, 10us, 3);
  state s;
  for (units i = 0; i < 3; ++i) {
    const decision d = at(cfg, s, 1'000);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.limit, 3);
    EXPECT_EQ(d.remaining, 2 - i);
    EXPECT_EQ(d.reset_after.count(), 10 * (i + 1));
  }
  const decision d = at(cfg, s, 1'000);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, 10us);
  EXPECT_EQ(d.reset_after, 30us);
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 1'009).allowed);
  EXPECT_TRUE(at(cfg, then, 1'010).allowed);
  EXPECT_EQ(s.tat, 1'030);
}

// Verifies retry_after exactly for a cost above 1.
TEST(Gcra, RetryAfterIsExactForCostsAboveOne) {
  const config cfg = per(1, 10us, 4);
  state s;
  ASSERT_TRUE(at(cfg, s, 0, 3).allowed);  // TAT 30
  const decision d = at(cfg, s, 5, 3);
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 15us);  // 30 + 30 - 40 - 5
  EXPECT_EQ(d.remaining, 1);       // debt 25 of 40: 1.5 units, rounded down
  EXPECT_EQ(d.reset_after, 25us);
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 19, 3).allowed);
  EXPECT_TRUE(at(cfg, then, 20, 3).allowed);
}

TEST(Gcra, RemainingIsWholeUnitsRoundedDown) {
  const config cfg = per(3, 10us);  // T = 3, tolerance 9
  state s;
  EXPECT_EQ(at(cfg, s, 100).remaining, 2);
  EXPECT_EQ(at(cfg, s, 101).remaining, 1);  // TAT 106: debt 5 of 9 leaves 1.33
  EXPECT_EQ(s.tat, 106);
}

TEST(Gcra, CostAboveBurstIsRejectedForeverAndWritesNothing) {
  const config cfg = per(2, 10us);
  state s;
  ASSERT_TRUE(at(cfg, s, 0).allowed);
  const state before = s;
  const decision d = at(cfg, s, 1, 3);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_EQ(d.reset_after, 4us);
  EXPECT_EQ(s, before);
}

TEST(Gcra, RejectedRequestWritesNothing) {
  const config cfg = per(1, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 1'000).allowed);
  const state before = s;
  for (std::int64_t t = 1'001; t < 1'100; ++t) EXPECT_FALSE(at(cfg, s, t).allowed);
  EXPECT_EQ(s, before);
  EXPECT_TRUE(at(cfg, s, 1'100).allowed);
}

// Verifies that GCRA decides an earlier request at its own time t: its test
// uses max(TAT, t), so nothing is clamped, and durations count from t.
TEST(Gcra, EarlierRequestIsDecidedAtItsOwnTime) {
  const config cfg = per(1, 10us, 3);
  state s;
  ASSERT_TRUE(at(cfg, s, 1'000).allowed);  // TAT 1010
  const decision late = at(cfg, s, 995);   // 1010 + 10 - 995 = 25 <= 30
  EXPECT_TRUE(late.allowed);
  EXPECT_EQ(s.tat, 1'020);
  EXPECT_EQ(late.reset_after, 25us);
  EXPECT_EQ(late.remaining, 0);  // debt 25 of 30
  const decision early = at(cfg, s, 900);
  EXPECT_FALSE(early.allowed);
  EXPECT_EQ(early.retry_after, 100us);  // 1020 + 10 - 30 - 900
  EXPECT_EQ(early.reset_after, 120us);
  EXPECT_EQ(early.remaining, 0);
}

TEST(Gcra, WorksThroughALimiterWithExplicitTime) {
  using limiter = ratelimit::limiter<gcra, ratelimit::memory_store<gcra>, ratelimit::manual_clock>;
  limiter lim{config{"1/10us"}};
  EXPECT_TRUE(lim.try_acquire("k", timestamp{50}).allowed);
  const decision d = lim.try_acquire("k", timestamp{55});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 5us);
  EXPECT_TRUE(lim.try_acquire("k", timestamp{60}).allowed);
}

TEST(Gcra, RejectsInvalidConfigurationNamingTheValue) {
  const std::string fast = invalid_argument_message([] { (void)per(3, 1us); });
  EXPECT_NE(fast.find("3/1us"), std::string::npos) << fast;
  EXPECT_NE(invalid_argument_message([] { (void)per(5, 2us); }).find("5/2us"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 1s, 0); }).find("got 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 1s, -4); }).find("got -4"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(0, 1s); }).find("got 0"), std::string::npos);
  // T = 2^46 us: a burst of 64 makes a tolerance of 2^52 us, 65 is too much.
  EXPECT_NO_THROW((void)per(1, ratelimit::max_period, 64));
  EXPECT_NE(
      invalid_argument_message([] { (void)per(1, ratelimit::max_period, 65); }).find("burst 65"),
      std::string::npos);
}

}  // namespace
