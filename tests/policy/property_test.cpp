// SPDX-License-Identifier: Apache-2.0
// Every policy against its brute-force reference on thousands of seeded random traces.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "support/reference.hpp"
#include "support/trace.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::timestamp;
using ratelimit::units;
namespace ref = ratelimit_test::reference;

constexpr int max_reported_failures = 5;

/// Traces per case are multiplied by RATELIMIT_TEST_TRACE_SCALE (default 1),
/// e.g. 20 for a soak run; seeds stay the same, only more of them run.
std::uint64_t trace_scale() {
  const char* env = std::getenv("RATELIMIT_TEST_TRACE_SCALE");
  const long long v = env != nullptr ? std::atoll(env) : 1;
  return v >= 1 ? static_cast<std::uint64_t>(v) : 1;
}

/// Runs `traces` seeded traces through policy P and the reference model,
/// comparing every field of every decision. Also checks on the real policy
/// alone that a rejection's retry_after is exact (admitted at t + retry_after,
/// rejected 1 us earlier) whenever the request was not stamped earlier than
/// its key's newest request, and calls `check_state` after every step.
template <class P, class Model>
void compare_with_reference(
    const typename P::config& cfg, const std::function<Model()>& make_model,
    const ratelimit_test::trace_options& options, std::uint64_t traces, std::uint64_t salt,
    const std::function<void(const typename P::state&)>& check_state = nullptr) {
  int failures = 0;
  traces *= trace_scale();
  for (std::uint64_t i = 0; i < traces && failures < max_reported_failures; ++i) {
    const std::uint64_t seed = salt * 1'000'003 + i;
    const auto trace = ratelimit_test::make_trace(seed, options);
    std::map<std::string, typename P::state> states;
    std::map<std::string, std::int64_t> newest;
    ref::keyed<Model> reference(make_model);
    for (std::size_t n = 0; n < trace.size(); ++n) {
      const auto& ev = trace[n];
      typename P::state& s = states[ev.key];
      const typename P::state before = s;
      const decision got = P::step(cfg, s, timestamp{ev.t}, ev.cost);
      const decision want = reference.step(ev.key, ev.t, ev.cost);
      if (got != want) {
        ADD_FAILURE() << P::name << " differs from the reference: seed " << seed << ", event " << n
                      << " " << ev << "\n  policy:    " << ref::describe(got)
                      << "\n  reference: " << ref::describe(want);
        ++failures;
        break;
      }
      if (check_state) check_state(s);
      const bool in_order = !newest.contains(ev.key) || ev.t >= newest[ev.key];
      newest[ev.key] = std::max(ev.t, newest.contains(ev.key) ? newest[ev.key] : ev.t);
      if (!got.allowed && got.retry_after != ratelimit::never && in_order) {
        const std::int64_t at = ev.t + got.retry_after.count();
        typename P::state later = s;
        typename P::state sooner = s;
        const bool admitted_then = P::step(cfg, later, timestamp{at}, ev.cost).allowed;
        const bool admitted_sooner = got.retry_after > 1us &&
                                     P::step(cfg, sooner, timestamp{at - 1}, ev.cost).allowed;
        if (!admitted_then || admitted_sooner) {
          ADD_FAILURE() << P::name << " retry_after " << got.retry_after.count()
                        << "us is not exact: seed " << seed << ", event " << n << " " << ev
                        << ", admitted at t+retry_after: " << admitted_then
                        << ", admitted 1us sooner: " << admitted_sooner;
          ++failures;
          break;
        }
      }
      // A rejection that is not counted writes nothing.
      if (!got.counted && !(s == before)) {
        ADD_FAILURE() << P::name << " changed its state on an uncounted rejection: seed " << seed
                      << ", event " << n << " " << ev;
        ++failures;
        break;
      }
    }
  }
}

struct window_case {
  units limit;
  std::int64_t period_us;
  bool count_rejected;
  std::uint64_t traces;
};

void PrintTo(const window_case& c, std::ostream* out) {
  *out << c.limit << " per " << c.period_us << "us, count_rejected " << c.count_rejected << ", "
       << c.traces << " traces";
}

std::string window_case_name(const testing::TestParamInfo<window_case>& info) {
  return std::to_string(info.param.limit) + "per" + std::to_string(info.param.period_us) + "us" +
         (info.param.count_rejected ? "CountRejected" : "");
}

std::vector<window_case> window_cases() {
  struct rate_row {
    units limit;
    std::int64_t period_us;
    std::uint64_t traces;
  };
  const rate_row rows[] = {{1, 1, 500},   {1, 7, 1000}, {3, 7, 1000},   {2, 10, 1000},
                           {5, 10, 1000}, {4, 60, 500}, {10, 100, 300}, {3, 1000, 100}};
  std::vector<window_case> out;
  for (const bool counted : {false, true}) {
    for (const auto& r : rows) out.push_back({r.limit, r.period_us, counted, r.traces});
  }
  return out;
}

ratelimit_test::trace_options window_trace(const window_case& c) {
  ratelimit_test::trace_options o;
  o.period_us = c.period_us;
  o.limit = c.limit;
  o.events = 50;
  return o;
}

ratelimit::rate rate_of(units limit, std::int64_t period_us) {
  return ratelimit::rate(limit, std::chrono::microseconds{period_us});
}

class FixedWindowProperty : public testing::TestWithParam<window_case> {};
class SlidingWindowLogProperty : public testing::TestWithParam<window_case> {};
class SlidingWindowCounterProperty : public testing::TestWithParam<window_case> {};

// Verifies every decision field against the brute-force fixed-window model.
TEST_P(FixedWindowProperty, MatchesReferenceOnRandomTraces) {
  const window_case c = GetParam();
  const ratelimit::fixed_window::config cfg(rate_of(c.limit, c.period_us),
                                            ratelimit::window_options{c.count_rejected});
  compare_with_reference<ratelimit::fixed_window, ref::fixed_window_model>(
      cfg, [&] { return ref::fixed_window_model(c.limit, c.period_us, c.count_rejected); },
      window_trace(c), c.traces, 1);
}

// Verifies every decision field against the keep-everything log, and the
// memory bound: never more than `limit` entries (nor heap slots) per key.
TEST_P(SlidingWindowLogProperty, MatchesReferenceOnRandomTraces) {
  const window_case c = GetParam();
  const ratelimit::sliding_window_log::config cfg(rate_of(c.limit, c.period_us),
                                                  ratelimit::window_options{c.count_rejected});
  compare_with_reference<ratelimit::sliding_window_log, ref::sliding_log_model>(
      cfg, [&] { return ref::sliding_log_model(c.limit, c.period_us, c.count_rejected); },
      window_trace(c), c.traces, 2,
      [&](const ratelimit::sliding_window_log::state& s) {
        ASSERT_LE(s.size(), static_cast<std::size_t>(c.limit));
        ASSERT_LE(s.heap_bytes(), (static_cast<std::size_t>(c.limit)) *
                                      sizeof(ratelimit::sliding_window_log::entry));
      });
}

// Verifies every decision field, retry_after included (the reference scans
// every microsecond), against counts recomputed from the full history.
TEST_P(SlidingWindowCounterProperty, MatchesReferenceOnRandomTraces) {
  const window_case c = GetParam();
  const ratelimit::sliding_window_counter::config cfg(rate_of(c.limit, c.period_us),
                                                      ratelimit::window_options{c.count_rejected});
  compare_with_reference<ratelimit::sliding_window_counter, ref::sliding_counter_model>(
      cfg, [&] { return ref::sliding_counter_model(c.limit, c.period_us, c.count_rejected); },
      window_trace(c), c.traces, 3);
}

INSTANTIATE_TEST_SUITE_P(Rates, FixedWindowProperty, testing::ValuesIn(window_cases()),
                         window_case_name);
INSTANTIATE_TEST_SUITE_P(Rates, SlidingWindowLogProperty, testing::ValuesIn(window_cases()),
                         window_case_name);
INSTANTIATE_TEST_SUITE_P(Rates, SlidingWindowCounterProperty, testing::ValuesIn(window_cases()),
                         window_case_name);

struct bucket_case {
  units limit;
  std::int64_t period_us;
  std::optional<units> burst;
  std::uint64_t traces;
};

void PrintTo(const bucket_case& c, std::ostream* out) {
  *out << c.limit << " per " << c.period_us << "us, burst "
       << (c.burst ? std::to_string(*c.burst) : "default") << ", " << c.traces << " traces";
}

std::string bucket_case_name(const testing::TestParamInfo<bucket_case>& info) {
  return std::to_string(info.param.limit) + "per" + std::to_string(info.param.period_us) + "us" +
         (info.param.burst ? "Burst" + std::to_string(*info.param.burst) : "");
}

std::vector<bucket_case> bucket_cases() {
  struct rate_row {
    units limit;
    std::int64_t period_us;
    std::uint64_t traces;
  };
  // 3/10us and 2/7us refill by fractions of a token per us; 4/2us is two
  // tokens per us (GCRA rounds its 0.5us interval up to 1us).
  const rate_row rows[] = {{1, 1, 500},  {1, 7, 1000}, {3, 10, 1000}, {2, 10, 1000},  {5, 10, 1000},
                           {2, 7, 1000}, {4, 2, 500},  {7, 100, 500}, {10, 1000, 300}};
  std::vector<bucket_case> out;
  for (const std::optional<units> burst :
       {std::optional<units>{}, std::optional<units>{1}, std::optional<units>{5}}) {
    for (const auto& r : rows) out.push_back({r.limit, r.period_us, burst, r.traces});
  }
  return out;
}

ratelimit_test::trace_options bucket_trace(const bucket_case& c) {
  ratelimit_test::trace_options o;
  o.period_us = c.period_us;
  o.limit = c.burst.value_or(c.limit);
  o.events = 50;
  return o;
}

class TokenBucketProperty : public testing::TestWithParam<bucket_case> {};
class GcraProperty : public testing::TestWithParam<bucket_case> {};

// Verifies every decision field against exact rational token counting.
TEST_P(TokenBucketProperty, MatchesReferenceOnRandomTraces) {
  const bucket_case c = GetParam();
  const ratelimit::token_bucket::config cfg(rate_of(c.limit, c.period_us),
                                            ratelimit::bucket_options{c.burst});
  const units burst = c.burst.value_or(c.limit);
  compare_with_reference<ratelimit::token_bucket, ref::token_bucket_model>(
      cfg, [&] { return ref::token_bucket_model(c.limit, c.period_us, burst); }, bucket_trace(c),
      c.traces, 4);
}

TEST_P(GcraProperty, MatchesReferenceOnRandomTraces) {
  const bucket_case c = GetParam();
  const ratelimit::gcra::config cfg(rate_of(c.limit, c.period_us),
                                    ratelimit::bucket_options{c.burst});
  const units burst = c.burst.value_or(c.limit);
  compare_with_reference<ratelimit::gcra, ref::gcra_model>(
      cfg, [&] { return ref::gcra_model(c.limit, c.period_us, burst); }, bucket_trace(c), c.traces,
      5);
}

INSTANTIATE_TEST_SUITE_P(Rates, TokenBucketProperty, testing::ValuesIn(bucket_cases()),
                         bucket_case_name);
INSTANTIATE_TEST_SUITE_P(Rates, GcraProperty, testing::ValuesIn(bucket_cases()), bucket_case_name);

// Verifies that the traces themselves reach the cases the properties are
// about, so that a quietly degenerate generator cannot make them vacuous.
TEST(TraceGenerator, CoversEdgesBackwardTimeAndOversizedCosts) {
  ratelimit_test::trace_options o;
  o.period_us = 10;
  o.limit = 3;
  int backwards = 0;
  int same_us = 0;
  int oversized = 0;
  int on_edge = 0;
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    const auto trace = ratelimit_test::make_trace(seed, o);
    ASSERT_EQ(trace.size(), o.events);
    for (std::size_t i = 1; i < trace.size(); ++i) {
      ASSERT_GE(trace[i].t, 0);
      if (trace[i].t < trace[i - 1].t) ++backwards;
      if (trace[i].t == trace[i - 1].t) ++same_us;
      if (trace[i].t % o.period_us == 0) ++on_edge;
      if (trace[i].cost > o.limit) ++oversized;
    }
  }
  EXPECT_GT(backwards, 100);
  EXPECT_GT(same_us, 500);
  EXPECT_GT(oversized, 100);
  EXPECT_GT(on_edge, 200);
  const auto first = ratelimit_test::make_trace(42, o);
  const auto again = ratelimit_test::make_trace(42, o);
  const auto other = ratelimit_test::make_trace(43, o);
  bool differs = false;
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].t, again[i].t);
    EXPECT_EQ(first[i].key, again[i].key);
    EXPECT_EQ(first[i].cost, again[i].cost);
    differs = differs || first[i].t != other[i].t || first[i].cost != other[i].cost;
  }
  EXPECT_TRUE(differs);
  o.backwards = false;
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    const auto trace = ratelimit_test::make_trace(seed, o);
    for (std::size_t i = 1; i < trace.size(); ++i) ASSERT_GE(trace[i].t, trace[i - 1].t);
  }
}

}  // namespace
