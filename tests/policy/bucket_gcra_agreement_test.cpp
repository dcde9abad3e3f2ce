// SPDX-License-Identifier: Apache-2.0
// Token bucket and GCRA are one limiter: identical decisions, up to GCRA's rounded interval.
//
// What is asserted, on traces whose times never decrease per key:
// 1. When period is a multiple of limit, GCRA's T = period / limit is exact
//    and every field of every decision equals the token bucket's.
// 2. Otherwise GCRA with rate limit/period and burst b decides exactly as
//    the token bucket with rate 1 per T us and burst b, where T is period /
//    limit rounded to the nearest microsecond, so |T - period / limit| <= 0.5
//    us: the only difference from the exact bucket is that per-unit spacing.
//    For a single request of cost c on a key at rest the two limiters'
//    reset_after (their time to drain) then differ by at most c/2 + 1 us,
//    i.e. at most 1 us for cost 1.
// Requests stamped earlier than a key's newest one are excluded on purpose:
// the bucket decides them at its last admission, GCRA at their own time (see
// "Time never runs backwards"), so there the two legitimately differ; the
// last test pins that difference down.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "support/reference.hpp"
#include "support/trace.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::bucket_options;
using ratelimit::decision;
using ratelimit::gcra;
using ratelimit::timestamp;
using ratelimit::token_bucket;
using ratelimit::units;

struct agreement_case {
  units limit;
  std::int64_t period_us;
  std::optional<units> burst;
};

void PrintTo(const agreement_case& c, std::ostream* out) {
  *out << c.limit << " per " << c.period_us << "us, burst "
       << (c.burst ? std::to_string(*c.burst) : "default");
}

std::string case_name(const testing::TestParamInfo<agreement_case>& info) {
  return std::to_string(info.param.limit) + "per" + std::to_string(info.param.period_us) + "us" +
         (info.param.burst ? "Burst" + std::to_string(*info.param.burst) : "");
}

ratelimit::rate rate_of(units limit, std::int64_t period_us) {
  return ratelimit::rate(limit, std::chrono::microseconds{period_us});
}

/// Runs `traces` monotone traces through both policies; every decision must match.
void expect_identical(const token_bucket::config& bucket_cfg, const gcra::config& gcra_cfg,
                      std::int64_t period_us, std::uint64_t traces, std::uint64_t salt) {
  ratelimit_test::trace_options o;
  o.period_us = period_us;
  o.limit = gcra_cfg.burst();
  o.backwards = false;
  o.events = 60;
  for (std::uint64_t i = 0; i < traces; ++i) {
    const std::uint64_t seed = salt * 1'000'003 + i;
    std::map<std::string, token_bucket::state> buckets;
    std::map<std::string, gcra::state> cells;
    const auto trace = ratelimit_test::make_trace(seed, o);
    for (std::size_t n = 0; n < trace.size(); ++n) {
      const auto& ev = trace[n];
      const decision b = token_bucket::step(bucket_cfg, buckets[ev.key], timestamp{ev.t}, ev.cost);
      const decision g = gcra::step(gcra_cfg, cells[ev.key], timestamp{ev.t}, ev.cost);
      ASSERT_EQ(b, g) << "seed " << seed << ", event " << n << " " << ev
                      << "\n  token_bucket: " << ratelimit_test::reference::describe(b)
                      << "\n  gcra:         " << ratelimit_test::reference::describe(g);
    }
  }
}

class BucketGcraExactAgreement : public testing::TestWithParam<agreement_case> {};

// Verifies claim 1: period a multiple of limit => identical decisions.
TEST_P(BucketGcraExactAgreement, DecideIdenticallyWhenPeriodIsAMultipleOfLimit) {
  const agreement_case c = GetParam();
  ASSERT_EQ(c.period_us % c.limit, 0);
  const token_bucket::config bucket_cfg(rate_of(c.limit, c.period_us), bucket_options{c.burst});
  const gcra::config gcra_cfg(rate_of(c.limit, c.period_us), bucket_options{c.burst});
  ASSERT_EQ(gcra_cfg.interval_us() * c.limit, c.period_us);
  expect_identical(bucket_cfg, gcra_cfg, c.period_us, 500, 11);
}

INSTANTIATE_TEST_SUITE_P(Rates, BucketGcraExactAgreement,
                         testing::Values(agreement_case{1, 1, {}}, agreement_case{1, 7, {}},
                                         agreement_case{2, 10, {}}, agreement_case{5, 10, {}},
                                         agreement_case{3, 9, {}}, agreement_case{4, 100, {}},
                                         agreement_case{10, 1000, {}}, agreement_case{1, 10, 1},
                                         agreement_case{2, 10, 5}, agreement_case{5, 10, 1},
                                         agreement_case{3, 9, 7}),
                         case_name);

class BucketGcraRoundedAgreement : public testing::TestWithParam<agreement_case> {};

// Verifies claim 2: GCRA is exactly the bucket of 1 unit per rounded T, and
// T is within half a microsecond of period / limit.
TEST_P(BucketGcraRoundedAgreement, GcraIsTheBucketOfOneUnitPerRoundedInterval) {
  const agreement_case c = GetParam();
  const gcra::config gcra_cfg(rate_of(c.limit, c.period_us), bucket_options{c.burst});
  const std::int64_t t = gcra_cfg.interval_us();
  EXPECT_EQ(t, ratelimit_test::reference::gcra_model::emission_interval(c.limit, c.period_us));
  EXPECT_LE(2 * std::abs(t * c.limit - c.period_us), c.limit) << "T = " << t;
  const token_bucket::config bucket_cfg(rate_of(1, t), bucket_options{c.burst.value_or(c.limit)});
  expect_identical(bucket_cfg, gcra_cfg, c.period_us, 500, 12);
}

// Verifies the stated tolerance against the exact bucket for one request of
// cost c on a key at rest: reset_after differs by at most c/2 + 1 us.
TEST_P(BucketGcraRoundedAgreement, DrainTimeDiffersFromTheExactBucketByAtMostHalfAUsPerUnit) {
  const agreement_case c = GetParam();
  const token_bucket::config bucket_cfg(rate_of(c.limit, c.period_us), bucket_options{c.burst});
  const gcra::config gcra_cfg(rate_of(c.limit, c.period_us), bucket_options{c.burst});
  for (units cost = 1; cost <= gcra_cfg.burst(); ++cost) {
    token_bucket::state b;
    gcra::state g;
    const decision db = token_bucket::step(bucket_cfg, b, timestamp{1'000}, cost);
    const decision dg = gcra::step(gcra_cfg, g, timestamp{1'000}, cost);
    ASSERT_TRUE(db.allowed);
    ASSERT_TRUE(dg.allowed);
    const std::int64_t diff = db.reset_after.count() - dg.reset_after.count();
    EXPECT_LE(2 * std::abs(diff), cost + 2)
        << "cost " << cost << ": bucket " << db.reset_after.count() << "us, gcra "
        << dg.reset_after.count() << "us";
    if (cost == 1) {
      EXPECT_LE(std::abs(diff), 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rates, BucketGcraRoundedAgreement,
                         testing::Values(agreement_case{3, 10, {}}, agreement_case{2, 7, {}},
                                         agreement_case{2, 5, {}}, agreement_case{3, 5, {}},
                                         agreement_case{5, 7, {}}, agreement_case{4, 2, {}},
                                         agreement_case{7, 100, {}}, agreement_case{3, 1000, {}},
                                         agreement_case{3, 10, 1}, agreement_case{2, 7, 6},
                                         agreement_case{7, 100, 20}, agreement_case{2, 10, {}}),
                         case_name);

// Verifies where the two part ways by design: a request stamped before the
// bucket's last admission is decided there, while GCRA decides it at t.
TEST(BucketGcraAgreement, DifferOnRequestsStampedEarlierThanTheLastAdmission) {
  const token_bucket::config bucket_cfg(rate_of(1, 10), bucket_options{3});
  const gcra::config gcra_cfg(rate_of(1, 10), bucket_options{3});
  token_bucket::state b;
  gcra::state g;
  ASSERT_EQ(token_bucket::step(bucket_cfg, b, timestamp{1'000}, 1),
            gcra::step(gcra_cfg, g, timestamp{1'000}, 1));
  const decision db = token_bucket::step(bucket_cfg, b, timestamp{995}, 1);
  const decision dg = gcra::step(gcra_cfg, g, timestamp{995}, 1);
  EXPECT_TRUE(db.allowed);
  EXPECT_TRUE(dg.allowed);
  EXPECT_EQ(db.reset_after, 20us);  // measured from 1000
  EXPECT_EQ(dg.reset_after, 25us);  // measured from 995
  EXPECT_EQ(db.remaining, 1);
  EXPECT_EQ(dg.remaining, 0);
  // Far enough back, GCRA rejects what the bucket admits.
  EXPECT_TRUE(token_bucket::step(bucket_cfg, b, timestamp{970}, 1).allowed);
  EXPECT_FALSE(gcra::step(gcra_cfg, g, timestamp{970}, 1).allowed);
}

}  // namespace
