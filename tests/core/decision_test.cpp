// SPDX-License-Identifier: Apache-2.0
// The decision value: defaults, names of its sources, degraded(), comparison.
#include "ratelimit/decision.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string_view>

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::decision_source;

TEST(Decision, DefaultIsARejectionFromTheStore) {
  constexpr decision d{};
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(d.limit, 0);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, 0us);
  EXPECT_EQ(d.reset_after, 0us);
  EXPECT_FALSE(static_cast<bool>(d));
}

TEST(Decision, NamesEverySource) {
  EXPECT_EQ(ratelimit::to_string(decision_source::store), "store");
  EXPECT_EQ(ratelimit::to_string(decision_source::fail_open), "fail_open");
  EXPECT_EQ(ratelimit::to_string(decision_source::fail_closed), "fail_closed");
  EXPECT_EQ(ratelimit::to_string(decision_source::fallback), "fallback");
  EXPECT_EQ(ratelimit::to_string(decision_source::local_cache), "local_cache");
  EXPECT_EQ(ratelimit::to_string(static_cast<decision_source>(200)), "unknown");
  static_assert(ratelimit::to_string(decision_source::fallback) == std::string_view{"fallback"});
}

// Verifies degraded(): true exactly when the store was not reached and a
// failure policy decided; a locally cached rejection is not degraded.
TEST(Decision, DegradedOnlyWhenAFailurePolicyDecided) {
  const auto with = [](decision_source s) {
    decision d;
    d.source = s;
    return d;
  };
  EXPECT_FALSE(with(decision_source::store).degraded());
  EXPECT_TRUE(with(decision_source::fail_open).degraded());
  EXPECT_TRUE(with(decision_source::fail_closed).degraded());
  EXPECT_TRUE(with(decision_source::fallback).degraded());
  EXPECT_FALSE(with(decision_source::local_cache).degraded());
}

TEST(Decision, ConvertsToAllowedAndComparesEveryField) {
  decision a;
  a.allowed = true;
  a.counted = true;
  a.limit = 10;
  a.remaining = 3;
  a.reset_after = 5us;
  EXPECT_TRUE(static_cast<bool>(a));
  decision b = a;
  EXPECT_EQ(a, b);
  b.reset_after = 6us;
  EXPECT_NE(a, b);
  b = a;
  b.counted = false;
  EXPECT_NE(a, b);
  b = a;
  b.source = decision_source::fallback;
  EXPECT_NE(a, b);
  b = a;
  b.retry_after = ratelimit::never;
  EXPECT_NE(a, b);
}

TEST(Decision, NeverIsTheLargestDuration) {
  EXPECT_EQ(ratelimit::never, std::chrono::microseconds::max());
  EXPECT_GT(ratelimit::never, std::chrono::microseconds{std::int64_t{1} << 62});
}

}  // namespace
