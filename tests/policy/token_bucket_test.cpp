// SPDX-License-Identifier: Apache-2.0
// Edge cases of the token bucket: exact fractional refill, burst, retry_after, reset_after.
#include "ratelimit/policy/token_bucket.hpp"

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
using ratelimit::timestamp;
using ratelimit::token_bucket;
using ratelimit::units;

using state = token_bucket::state;
using config = token_bucket::config;

decision at(const config& cfg, state& s, std::int64_t t, units cost = 1) {
  return token_bucket::step(cfg, s, timestamp{t}, cost);
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

// Verifies exact fractional refill: 3 tokens per 10 us is 0.3 token per us,
// so an empty bucket holds 0.9 token at 3 us, 1.2 at 4 us, exactly 3 at 10 us.
TEST(TokenBucket, RefillsExactFractionsOfATokenPerMicrosecond) {
  const config cfg = per(3, 10us);
  state s;
  for (units i = 0; i < 3; ++i) {
    const decision d = at(cfg, s, 1'000);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 2 - i);
  }
  EXPECT_EQ(at(cfg, s, 1'000).reset_after, 10us);
  const decision empty = at(cfg, s, 1'000);
  EXPECT_FALSE(empty.allowed);
  EXPECT_EQ(empty.retry_after, 4us);  // one token takes 3.33 us
  state at3 = s;
  EXPECT_FALSE(at(cfg, at3, 1'003).allowed);
  state at10 = s;
  EXPECT_FALSE(at(cfg, at10, 1'009, 3).allowed);  // 2.7 tokens
  EXPECT_TRUE(at(cfg, at10, 1'010, 3).allowed);   // exactly 3
  const decision d = at(cfg, s, 1'004);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);       // 0.2 token left, rounded down
  EXPECT_EQ(d.reset_after, 10us);  // 2.8 tokens missing: 9.33 us
  EXPECT_EQ(at(cfg, s, 1'014, 3).remaining, 0);
}

// Verifies the burst option: capacity 5 at 1 token per second.
TEST(TokenBucket, BurstSetsTheCapacity) {
  const config cfg = per(1, 1s, 5);
  EXPECT_EQ(cfg.burst(), 5);
  EXPECT_EQ(cfg.limit(), 5);
  state s;
  for (units i = 0; i < 5; ++i) EXPECT_TRUE(at(cfg, s, 0).allowed);
  const decision d = at(cfg, s, 0);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.retry_after, 1s);
  EXPECT_EQ(d.reset_after, 5s);
  EXPECT_FALSE(at(cfg, s, 999'999).allowed);
  EXPECT_TRUE(at(cfg, s, 1'000'000).allowed);
  const decision later = at(cfg, s, 3'500'000, 2);  // 2.5 tokens, 2 taken
  EXPECT_TRUE(later.allowed);
  EXPECT_EQ(later.remaining, 0);
  EXPECT_EQ(later.reset_after, 4'500'000us);
}

TEST(TokenBucket, BurstDefaultsToTheLimit) {
  const config cfg{"5/s"};
  EXPECT_EQ(cfg.burst(), 5);
  state s;
  EXPECT_EQ(at(cfg, s, 0, 5).remaining, 0);
  EXPECT_EQ(at(cfg, s, 0).retry_after, 200'000us);
}

// Verifies retry_after exactly, for costs above 1 and fractional rates.
TEST(TokenBucket, RetryAfterIsExact) {
  const config cfg = per(7, 100us, 4);  // one token every 14.29 us
  state s;
  ASSERT_TRUE(at(cfg, s, 50, 4).allowed);
  const decision d = at(cfg, s, 60, 3);
  ASSERT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 33us);  // 3 tokens need 42.86 us from 50
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.reset_after, 48us);  // 4 tokens need 57.14 us from 50
  state sooner = s;
  state then = s;
  EXPECT_FALSE(at(cfg, sooner, 92, 3).allowed);
  EXPECT_TRUE(at(cfg, then, 93, 3).allowed);
}

TEST(TokenBucket, CostAboveBurstIsRejectedForeverAndWritesNothing) {
  const config cfg = per(10, 1s, 3);
  state s;
  ASSERT_TRUE(at(cfg, s, 0).allowed);
  const state before = s;
  const decision d = at(cfg, s, 10, 4);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after, 99'990us);
  EXPECT_EQ(s, before);
  state fresh;
  EXPECT_EQ(at(cfg, fresh, 10, 4).retry_after, ratelimit::never);
  EXPECT_EQ(fresh, state{});
}

TEST(TokenBucket, RejectedRequestWritesNothing) {
  const config cfg = per(1, 100us);
  state s;
  ASSERT_TRUE(at(cfg, s, 0).allowed);
  const state before = s;
  for (std::int64_t t = 1; t < 100; ++t) EXPECT_FALSE(at(cfg, s, t).allowed);
  EXPECT_EQ(s, before);
  EXPECT_TRUE(at(cfg, s, 100).allowed);
}

// Verifies "time never runs backwards": decided at the last admission.
TEST(TokenBucket, EarlierRequestIsDecidedAtTheLastAdmission) {
  const config cfg = per(1, 10us, 2);
  state s;
  ASSERT_TRUE(at(cfg, s, 100).allowed);
  ASSERT_TRUE(at(cfg, s, 100).allowed);
  const decision d = at(cfg, s, 50);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 10us);  // from 100, not 60 from 50
  EXPECT_EQ(d.reset_after, 20us);
  EXPECT_EQ(at(cfg, s, 0).retry_after, 10us);  // much earlier, still decided at 100
  EXPECT_EQ(at(cfg, s, 105).retry_after, 5us);
  EXPECT_EQ(s.last, 100);
}

TEST(TokenBucket, EmptyStateHoldsNoTime) {
  const config cfg = per(1, 10us);
  state s;
  ASSERT_FALSE(at(cfg, s, 500, 2).allowed);  // oversized: nothing recorded
  const decision d = at(cfg, s, 20);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(s.last, 20);
  EXPECT_EQ(d.reset_after, 10us);
}

TEST(TokenBucket, WorksThroughALimiterWithExplicitTime) {
  using limiter = ratelimit::limiter<token_bucket, ratelimit::memory_store<token_bucket>,
                                     ratelimit::manual_clock>;
  limiter lim{config{"3/10us"}};
  EXPECT_TRUE(lim.try_acquire("k", timestamp{0}, 3).allowed);
  EXPECT_EQ(lim.try_acquire("k", timestamp{0}).retry_after, 4us);
  EXPECT_TRUE(lim.try_acquire("k", timestamp{4}).allowed);
  EXPECT_FALSE(lim.try_acquire("k", timestamp{4}).allowed);
}

TEST(TokenBucket, RejectsInvalidConfigurationNamingTheValue) {
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 1s, 0); }).find("burst must be"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 1s, 0); }).find("got 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 1s, -2); }).find("got -2"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] {
              (void)per(1, 1s, ratelimit::max_units + 1);
            }).find(std::to_string(ratelimit::max_units + 1)),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(0, 1s); }).find("got 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { (void)per(1, 0us); }).find("got 0us"), std::string::npos);
  // One token of 1 per 2^46 us is 2^46 ticks: a burst of 64 is 2^52 ticks, 65 is too many.
  EXPECT_NO_THROW((void)per(1, ratelimit::max_period, 64));
  EXPECT_NE(
      invalid_argument_message([] { (void)per(1, ratelimit::max_period, 65); }).find("burst 65"),
      std::string::npos);
  // With the gcd removed, 2 per 2^46 us is one token per 2^45 ticks: 128 fit.
  EXPECT_NO_THROW((void)per(2, ratelimit::max_period, 128));
}

}  // namespace
