// SPDX-License-Identifier: Apache-2.0
// The HTTP header helper: exact field values, rounding at the microsecond edges, names, options.
#include "ratelimit/http_headers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

std::string field(const std::vector<http::header>& hs, const std::string& name) {
  for (const auto& h : hs) {
    if (h.name == name) return h.value;
  }
  return "<absent>";
}

decision rejected(std::int64_t retry_us, std::int64_t reset_us, units remaining = 0) {
  decision d;
  d.limit = 10;
  d.remaining = remaining;
  d.retry_after = microseconds{retry_us};
  d.reset_after = microseconds{reset_us};
  return d;
}

// Verifies rounding up to whole seconds at the microsecond edges.
TEST(HttpHeaders, CeilSecondsAtTheMicrosecondEdges) {
  EXPECT_EQ(http::ceil_seconds(microseconds{0}), 0);
  EXPECT_EQ(http::ceil_seconds(microseconds{-5}), 0);
  EXPECT_EQ(http::ceil_seconds(microseconds{1}), 1);
  EXPECT_EQ(http::ceil_seconds(microseconds{999'999}), 1);
  EXPECT_EQ(http::ceil_seconds(microseconds{1'000'000}), 1);
  EXPECT_EQ(http::ceil_seconds(microseconds{1'000'001}), 2);
  EXPECT_EQ(http::ceil_seconds(microseconds{59'999'999}), 60);
  EXPECT_EQ(http::ceil_seconds(microseconds{60'000'000}), 60);
}

// Verifies every field of an admitted decision from a real limiter: the
// IETF items with the limiter's name, w = the period, t = reset_after
// rounded up, no Retry-After.
TEST(HttpHeaders, AdmittedDecisionOfAWindowPolicy) {
  limiter<fixed_window> l{fixed_window::config{"100/1min", window_options{.name = "api"}}};
  const decision d = l.try_acquire("k", microseconds{30'000'001});
  ASSERT_TRUE(d.allowed);
  const auto hs = http::headers(d, l.config());
  ASSERT_EQ(hs.size(), 5U);
  EXPECT_EQ(hs[0], (http::header{"RateLimit-Policy", "\"api\";q=100;w=60"}));
  EXPECT_EQ(hs[1], (http::header{"RateLimit", "\"api\";r=99;t=30"}));  // 29.999999 s -> 30
  EXPECT_EQ(hs[2], (http::header{"X-RateLimit-Limit", "100"}));
  EXPECT_EQ(hs[3], (http::header{"X-RateLimit-Remaining", "99"}));
  EXPECT_EQ(hs[4], (http::header{"X-RateLimit-Reset", "30"}));
}

// Verifies a rejected decision: t and Retry-After are retry_after rounded
// up (exactly 1 s stays 1, 1 us more gives 2), X-RateLimit-Reset is
// reset_after rounded up.
TEST(HttpHeaders, RejectedDecisionRoundsRetryUp) {
  const http::policy_info p{"calls", 10, std::chrono::minutes{15}};
  auto hs = http::headers(rejected(1'000'000, 2'500'000), p);
  EXPECT_EQ(field(hs, "RateLimit-Policy"), "\"calls\";q=10;w=900");
  EXPECT_EQ(field(hs, "RateLimit"), "\"calls\";r=0;t=1");
  EXPECT_EQ(field(hs, "Retry-After"), "1");
  EXPECT_EQ(field(hs, "X-RateLimit-Reset"), "3");
  hs = http::headers(rejected(1'000'001, 1'000'001), p);
  EXPECT_EQ(field(hs, "RateLimit"), "\"calls\";r=0;t=2");
  EXPECT_EQ(field(hs, "Retry-After"), "2");
  EXPECT_EQ(field(hs, "X-RateLimit-Reset"), "2");
  hs = http::headers(rejected(1, 1), p);
  EXPECT_EQ(field(hs, "Retry-After"), "1");
  // A rejection with no wait (fail_closed) still asks for 1 s.
  hs = http::headers(rejected(0, 0), p);
  EXPECT_EQ(field(hs, "Retry-After"), "1");
  EXPECT_EQ(field(hs, "RateLimit"), "\"calls\";r=0;t=1");  // t equals Retry-After
}

// Verifies `never` (a cost above the limit): no Retry-After and no t.
TEST(HttpHeaders, NeverLeavesRetryAfterAndTOut) {
  const http::policy_info p{"calls", 10, std::chrono::seconds{10}};
  decision d = rejected(0, 4'000'000, 3);
  d.retry_after = never;
  const auto hs = http::headers(d, p);
  EXPECT_EQ(field(hs, "Retry-After"), "<absent>");
  EXPECT_EQ(field(hs, "RateLimit"), "\"calls\";r=3");
  EXPECT_EQ(field(hs, "X-RateLimit-Reset"), "4");
}

// Verifies a shadow-rejected decision: admitted, so no Retry-After; t from
// reset_after as for any admitted decision.
TEST(HttpHeaders, ShadowRejectedIsAdmitted) {
  limiter<gcra> l{gcra::config{"1/10s", bucket_options{.name = "g"}}};
  l.set_shadow(true);
  (void)l.try_acquire("k", microseconds{0});
  const decision d = l.try_acquire("k", microseconds{0});
  ASSERT_TRUE(d.shadow_rejected);
  const auto hs = http::headers(d, l.config());
  EXPECT_EQ(field(hs, "Retry-After"), "<absent>");
  EXPECT_EQ(field(hs, "RateLimit"), "\"g\";r=0;t=20");
  EXPECT_EQ(field(hs, "RateLimit-Policy"), "\"g\";q=1;w=10");
}

// Verifies the buckets' window: the time to refill a whole burst, rounded up.
TEST(HttpHeaders, BucketWindowIsTheRefillTime) {
  EXPECT_EQ(
      http::describe_policy(token_bucket::config{"10/1min", bucket_options{.burst = 25}}).window,
      microseconds{150'000'000});
  EXPECT_EQ(http::describe_policy(token_bucket::config{"3/1s", bucket_options{.burst = 1}}).window,
            microseconds{333'334});
  const auto hs = http::headers(decision{.allowed = true},
                                token_bucket::config{"3/1s", bucket_options{.burst = 1}});
  EXPECT_EQ(field(hs, "RateLimit-Policy"), "\"default\";q=1;w=1");  // unnamed, w at least 1
}

// Verifies the name's escaping (quote and backslash) and the refusal of
// bytes a Structured Field String cannot carry.
TEST(HttpHeaders, NamesAreQuotedAndStrict) {
  EXPECT_EQ(http::sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(http::sf_string("x.y-z_1"), "\"x.y-z_1\"");
  http::policy_info p{std::string("bad\nname", 8), 1, std::chrono::seconds{1}};
  EXPECT_THROW((void)http::headers(decision{}, p), std::invalid_argument);
  p.name = "caf\xc3\xa9";
  try {
    (void)http::headers(decision{}, p);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("caf\\xc3\\xa9"), std::string::npos) << e.what();
  }
}

// Verifies the options: fields switched off, X-RateLimit-Reset as Unix
// seconds rounded up, and IETF Integers clamped to 15 digits.
TEST(HttpHeaders, Options) {
  const http::policy_info p{"n", max_units, std::chrono::seconds{1}};
  decision d = rejected(500'000, 1'500'000, max_units);
  http::header_options o;
  o.ietf = false;
  o.retry_after = false;
  o.unix_now = microseconds{1'700'000'000'000'000};
  auto hs = http::headers(d, p, o);
  ASSERT_EQ(hs.size(), 3U);
  EXPECT_EQ(field(hs, "X-RateLimit-Reset"), "1700000002");
  EXPECT_EQ(field(hs, "X-RateLimit-Limit"), std::to_string(max_units));
  o.unix_now = microseconds{-1};
  EXPECT_THROW((void)http::headers(d, p, o), std::invalid_argument);
  hs = http::headers(d, p);
  EXPECT_EQ(field(hs, "RateLimit-Policy"), "\"n\";q=999999999999999;w=1");
  EXPECT_EQ(field(hs, "RateLimit"), "\"n\";r=999999999999999;t=1");
}

// Verifies that a reset time past the end of the clock saturates: a hand-made
// decision with reset_after = never and unix_now at max_time gives the
// largest whole second, not a wrapped (negative, so 0) value.
TEST(HttpHeaders, UnixResetSaturates) {
  const http::policy_info p{"n", 1, std::chrono::seconds{1}};
  decision d;
  d.allowed = true;
  d.reset_after = never;
  http::header_options o;
  o.unix_now = max_time;
  const auto hs = http::headers(d, p, o);
  EXPECT_EQ(field(hs, "X-RateLimit-Reset"), std::to_string(http::ceil_seconds(never)));
}

// Verifies that a policy_info the caller built with a negative quota or
// window is refused, naming the value (X-RateLimit-Limit would say "-5").
TEST(HttpHeaders, NegativePolicyValuesAreRefused) {
  try {
    (void)http::headers(decision{}, http::policy_info{"n", -5, std::chrono::seconds{1}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("-5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      (void)http::headers(decision{}, http::policy_info{"n", 5, std::chrono::microseconds{-1}}),
      std::invalid_argument);
}

}  // namespace
