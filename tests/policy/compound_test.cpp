// SPDX-License-Identifier: Apache-2.0
// Compound limits: hand-computed scenarios, a brute-force all-or-nothing model, and threads.
#include "ratelimit/policy/compound.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "support/reference.hpp"
#include "support/trace.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::bucket_options;
using ratelimit::compound;
using ratelimit::compound_of;
using ratelimit::decision;
using ratelimit::fixed_window;
using ratelimit::gcra;
using ratelimit::sliding_window_counter;
using ratelimit::sliding_window_log;
using ratelimit::timestamp;
using ratelimit::token_bucket;
using ratelimit::units;
using ratelimit::window_options;
namespace ref = ratelimit_test::reference;

constexpr std::int64_t second = 1'000'000;
constexpr std::int64_t minute = 60 * second;
constexpr std::int64_t day = 1'440 * minute;

using two_logs = compound<sliding_window_log, sliding_window_log>;
using window_and_log = compound<fixed_window, sliding_window_log>;
using log_list = compound_of<sliding_window_log>;

static_assert(ratelimit::policy<two_logs>);
static_assert(ratelimit::policy<compound<gcra>>);
static_assert(
    ratelimit::policy<compound<fixed_window, sliding_window_counter, token_bucket, gcra>>);
static_assert(ratelimit::policy<log_list>);
static_assert(ratelimit::policy<compound_of<token_bucket>>);
static_assert(ratelimit::store_for<ratelimit::memory_store<two_logs>, two_logs>);
static_assert(ratelimit::store_for<ratelimit::memory_store<log_list>, log_list>);
static_assert(!ratelimit::store_for<ratelimit::memory_store<fixed_window>, compound<fixed_window>>);

template <class P>
decision at(const typename P::config& cfg, typename P::state& s, std::int64_t t, units cost = 1) {
  return P::step(cfg, s, timestamp{t}, cost);
}

/// The decision a request at `t` would get, leaving `s` untouched.
template <class P>
decision peek_at(const typename P::config& cfg, const typename P::state& s, std::int64_t t,
                 units cost = 1) {
  typename P::state copy = s;
  return P::step(cfg, copy, timestamp{t}, cost);
}

/// Admitted at t + retry_after and not 1 us earlier.
template <class P>
void expect_retry_exact(const typename P::config& cfg, const typename P::state& s, std::int64_t t,
                        const decision& d, units cost = 1) {
  ASSERT_FALSE(d.allowed);
  ASSERT_NE(d.retry_after, ratelimit::never);
  const std::int64_t then = t + d.retry_after.count();
  EXPECT_TRUE(peek_at<P>(cfg, s, then, cost).allowed) << "at t + retry_after";
  EXPECT_FALSE(peek_at<P>(cfg, s, then - 1, cost).allowed) << "1us before t + retry_after";
}

two_logs::config minute_and_day() {
  return two_logs::config{sliding_window_log::config{"3/15min"},
                          sliding_window_log::config{"5/day"}};
}

TEST(Compound, AdmitsWhileEverySubLimitAdmitsAndConsumesFromAll) {
  const auto cfg = minute_and_day();
  two_logs::state s;
  for (units i = 0; i < 3; ++i) {
    const decision d = at<two_logs>(cfg, s, 0);
    EXPECT_TRUE(d.allowed);
    EXPECT_TRUE(d.counted);
    EXPECT_EQ(d.limit, 3);  // the 15-minute limit binds
    EXPECT_EQ(d.remaining, 2 - i);
    EXPECT_EQ(d.retry_after, 0us);
    EXPECT_EQ(d.reset_after.count(), day);
  }
  EXPECT_EQ(std::get<0>(s.parts).size(), 3U);
  EXPECT_EQ(std::get<1>(s.parts).size(), 3U);
}

// Verifies the headline rule: a request the 15-minute limit admits but the
// daily limit refuses consumes from neither.
TEST(Compound, MinuteAdmitsButDayFullConsumesNeither) {
  const auto cfg = minute_and_day();
  two_logs::state s;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(at<two_logs>(cfg, s, 15 * minute).allowed);
  const two_logs::state before = s;

  const std::int64_t t = 30 * minute;  // the 15-minute window is empty again
  ASSERT_TRUE(peek_at<sliding_window_log>(cfg.part<0>(), std::get<0>(s.parts), t).allowed);
  const decision d = at<two_logs>(cfg, s, t);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(s, before);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after.count(), day - t);  // the first three leave the day at `day`
  // The 15-minute log is idle already; the daily one empties a day after 15min.
  EXPECT_EQ(d.reset_after.count(), 15 * minute + day - t);
  expect_retry_exact<two_logs>(cfg, s, t, d);
}

TEST(Compound, DayAdmitsButMinuteFullConsumesNeither) {
  const auto cfg = minute_and_day();
  two_logs::state s;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  const decision d = at<two_logs>(cfg, s, 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(std::get<1>(s.parts).total(), 3);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after.count(), 15 * minute - 1);
  EXPECT_EQ(d.reset_after.count(), day - 1);
  expect_retry_exact<two_logs>(cfg, s, 1, d);

  const decision later = at<two_logs>(cfg, s, 15 * minute);
  EXPECT_TRUE(later.allowed);
  EXPECT_EQ(std::get<1>(s.parts).total(), 4);
  EXPECT_EQ(later.limit, 5);  // 15-minute: 2 left, day: 1 left
  EXPECT_EQ(later.remaining, 1);
}

TEST(Compound, RetryAfterIsTheLargestAmongRejectingSubLimits) {
  const window_and_log::config cfg{fixed_window::config{"2/1s"},
                                   sliding_window_log::config{"2/10s"}};
  window_and_log::state s;
  ASSERT_TRUE(at<window_and_log>(cfg, s, 0, 2).allowed);
  const std::int64_t t = 500'000;
  const decision d = at<window_and_log>(cfg, s, t);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after.count(), 10 * second - t);  // not the window's 500ms
  EXPECT_EQ(d.reset_after.count(), 10 * second - t);
  expect_retry_exact<window_and_log>(cfg, s, t, d);
}

// Verifies retry_after when the rejecting sub-limit frees up before an
// admitting one could take the request... which it always can: the admitting
// token bucket keeps the state it admitted on.
TEST(Compound, RetryAfterIsExactForMixedPolicies) {
  using mixed = compound<fixed_window, token_bucket>;
  const mixed::config cfg{fixed_window::config{"5/1s"}, token_bucket::config{"2/100ms"}};
  mixed::state s;
  ASSERT_TRUE(at<mixed>(cfg, s, 0).allowed);
  ASSERT_TRUE(at<mixed>(cfg, s, 0).allowed);
  const decision d = at<mixed>(cfg, s, 10'000);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after.count(), 40'000);  // 0.2 token at 10ms; one token per 50ms
  expect_retry_exact<mixed>(cfg, s, 10'000, d);
  ASSERT_TRUE(at<mixed>(cfg, s, 50'000).allowed);
  ASSERT_TRUE(at<mixed>(cfg, s, 100'000).allowed);
  ASSERT_TRUE(at<mixed>(cfg, s, 150'000).allowed);
  const decision window_full = at<mixed>(cfg, s, 999'999);  // bucket full again, window not
  EXPECT_FALSE(window_full.allowed);
  EXPECT_EQ(window_full.retry_after, 1us);
  EXPECT_EQ(window_full.limit, 5);
  expect_retry_exact<mixed>(cfg, s, 999'999, window_full);
}

TEST(Compound, RemainingComesFromTheBindingLimitFirstOnTies) {
  const window_and_log::config cfg{fixed_window::config{"3/1s"},
                                   sliding_window_log::config{"4/1d"}};
  window_and_log::state s;
  decision d = at<window_and_log>(cfg, s, 0);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 2);
  d = at<window_and_log>(cfg, s, second);  // window 2 left, log 2 left: the first wins
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 2);
  d = at<window_and_log>(cfg, s, second);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 1);
  d = at<window_and_log>(cfg, s, 2 * second);  // window 2 left, log 0 left
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 4);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(cfg.limit(), 3);
}

TEST(Compound, CostAboveAnySubLimitIsNeverAdmitted) {
  const window_and_log::config cfg{fixed_window::config{"10/s"},
                                   sliding_window_log::config{"3/min"}};
  window_and_log::state s;
  for (const units cost : {units{4}, units{10}, units{11}}) {
    const decision d = at<window_and_log>(cfg, s, 0, cost);
    EXPECT_FALSE(d.allowed);
    EXPECT_FALSE(d.counted);
    EXPECT_EQ(d.retry_after, ratelimit::never);
    EXPECT_EQ(d.reset_after, 0us);
    EXPECT_EQ(d.limit, 3);
    EXPECT_EQ(d.remaining, 3);
    EXPECT_EQ(s, window_and_log::state{});
  }
  EXPECT_TRUE(at<window_and_log>(cfg, s, 0, 3).allowed);
}

// Verifies the count_rejected rule: a rejected compound request is recorded
// by exactly the sub-limits that count rejected attempts, even one that
// admitted it, and retry_after accounts for that record.
TEST(Compound, CountRejectedSubLimitsRecordRejectedAttempts) {
  const two_logs::config cfg{sliding_window_log::config{"2/min"},
                             sliding_window_log::config{"3/day", window_options{true}}};
  two_logs::state s;
  ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  const decision d = at<two_logs>(cfg, s, 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(std::get<0>(s.parts).total(), 2);  // the minute limit does not count rejections
  EXPECT_EQ(std::get<1>(s.parts).total(), 3);  // the day limit recorded the attempt
  EXPECT_EQ(d.limit, 2);                       // both have 0 left: the first wins
  EXPECT_EQ(d.remaining, 0);
  // The minute frees up at 1min, but the day is now full until the entries
  // at 0 leave it.
  EXPECT_EQ(d.retry_after.count(), day - 1);
  EXPECT_EQ(d.reset_after.count(), day);
  expect_retry_exact<two_logs>(cfg, s, 1, d);
}

TEST(Compound, CountRejectedSubLimitThatRejectsRecordsOnlyItself) {
  const two_logs::config cfg{sliding_window_log::config{"2/min", window_options{true}},
                             sliding_window_log::config{"10/day"}};
  two_logs::state s;
  ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  const decision d = at<two_logs>(cfg, s, 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(std::get<1>(s.parts).total(), 2);
  // The log keeps the newest entries that reach the limit, (0, 1) and (1, 1):
  // the one at 0 leaves at 1min, and then one unit fits again.
  EXPECT_EQ(d.retry_after.count(), minute - 1);
  expect_retry_exact<two_logs>(cfg, s, 1, d);
}

TEST(Compound, IdleOnlyWhenEverySubLimitIsIdle) {
  const auto cfg = minute_and_day();
  two_logs::state s;
  EXPECT_TRUE(two_logs::idle(cfg, s, timestamp{0}));
  ASSERT_TRUE(at<two_logs>(cfg, s, 0).allowed);
  EXPECT_FALSE(two_logs::idle(cfg, s, timestamp{15 * minute}));
  EXPECT_FALSE(two_logs::idle(cfg, s, timestamp{day - 1}));
  EXPECT_TRUE(two_logs::idle(cfg, s, timestamp{day}));
}

TEST(Compound, MakeCompoundDeducesThePolicies) {
  const auto cfg = ratelimit::make_compound(fixed_window::config{"10/s"},
                                            gcra::config{"100/min", bucket_options{20}});
  static_assert(
      std::is_same_v<std::remove_cvref_t<decltype(cfg)>, compound<fixed_window, gcra>::config>);
  EXPECT_EQ(cfg.limit(), 10);
  EXPECT_EQ(cfg.part<1>().burst(), 20);
}

TEST(CompoundOf, ParsesRatesAndValidates) {
  const log_list::config cfg{"10/15min", "100/day"};
  EXPECT_EQ(cfg.size(), 2U);
  EXPECT_EQ(cfg.limit(), 10);
  EXPECT_EQ(cfg.parts()[1].period_us(), day);

  const compound_of<fixed_window>::config counted({"3/s", "5/min"}, window_options{true});
  EXPECT_TRUE(counted.parts()[0].count_rejected());
  EXPECT_TRUE(counted.parts()[1].count_rejected());

  try {
    const log_list::config bad{"10/15min", "ten/day"};
    ADD_FAILURE() << "a bad rate was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"ten/day\""), std::string::npos) << e.what();
  }
  try {
    const log_list::config empty{std::vector<sliding_window_log::config>{}};
    ADD_FAILURE() << "an empty compound was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("at least one"), std::string::npos) << e.what();
  }
}

TEST(CompoundOf, DecidesExactlyAsTheFixedCompound) {
  const log_list::config list{"3/15min", "5/day"};
  const auto fixed = minute_and_day();
  ratelimit_test::trace_options o;
  o.period_us = 15 * minute;
  o.limit = 3;
  o.events = 200;
  o.keys = 1;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    log_list::state a;
    two_logs::state b;
    for (const auto& ev : ratelimit_test::make_trace(seed, o)) {
      const decision da = at<log_list>(list, a, ev.t, ev.cost);
      const decision db = at<two_logs>(fixed, b, ev.t, ev.cost);
      ASSERT_EQ(da, db) << "seed " << seed << " " << ev << "\n  compound_of: " << ref::describe(da)
                        << "\n  compound:    " << ref::describe(db);
    }
  }
}

TEST(CompoundOf, ValueInitialisedStateAfterANoOpStep) {
  const log_list::config cfg{"3/15min", "5/day"};
  log_list::state s;
  const decision d = at<log_list>(cfg, s, 0, 6);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(s, log_list::state{});
  EXPECT_TRUE(log_list::idle(cfg, s, timestamp{0}));
}

TEST(CompoundOf, RunsOnTheMemoryStoreAndStoresNothingForRejectedNewKeys) {
  ratelimit::limiter<log_list, ratelimit::memory_store<log_list>> lim(
      log_list::config{"2/min", "3/day"});
  EXPECT_FALSE(lim.try_acquire("k", timestamp{0}, 4).allowed);
  EXPECT_EQ(lim.store().size(), 0U);
  EXPECT_TRUE(lim.try_acquire("k", timestamp{0}, 2).allowed);
  const decision d = lim.try_acquire("k", timestamp{minute});
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 0);
  const decision full = lim.try_acquire("k", timestamp{2 * minute});
  EXPECT_FALSE(full.allowed);
  EXPECT_EQ(full.retry_after.count(), day - 2 * minute);
  EXPECT_EQ(lim.store().size(), 1U);
  EXPECT_EQ(lim.store().sweep(lim.config(), timestamp{day + minute}), 1U);
}

// ---------------------------------------------------------------------------
// Against a brute-force model: the reference models of each sub-limit, run
// all or nothing.

using any_model = std::function<decision(std::int64_t, units)>;

template <class Model>
any_model wrap(Model m) {
  return [m](std::int64_t t, units cost) mutable { return m.step(t, cost); };
}

struct sub_spec {
  any_model fresh;  ///< a model of a key never seen
  units limit;      ///< the limit, or the burst
  bool count_rejected;
};

/// One key of the brute-force compound.
class compound_model {
 public:
  explicit compound_model(const std::vector<sub_spec>* specs) : specs_(specs) {
    for (const sub_spec& s : *specs) subs_.push_back(s.fresh);
  }

  /// Decides as docs/compound_and_metrics.md says, from the definitions:
  /// durations by searching time on copies of the kept sub-models.
  /// `monotone_ok` is cleared if the admission test is seen not to be
  /// monotone around the answer. retry_after is searched only `in_order`:
  /// for a request stamped before a sub-state's time, each sub-limit measures
  /// from its own decision time, which a search from `t` does not model.
  decision step(std::int64_t t, units cost, bool in_order, bool& monotone_ok) {
    const std::vector<sub_spec>& spec = *specs_;
    const std::size_t n = subs_.size();
    std::vector<any_model> trial = subs_;
    std::vector<decision> sub(n);
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) {
      sub[i] = trial[i](t, cost);
      all = all && sub[i].allowed;
    }
    decision out;
    out.allowed = all;
    // Each sub-limit's view of the state it keeps: its own decision when it
    // keeps the trial, else a probe that cannot be admitted nor recorded.
    std::vector<decision> kept(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (all || spec[i].count_rejected) {
        subs_[i] = trial[i];
        kept[i] = sub[i];
        out.counted = true;
      } else {
        any_model probe = subs_[i];
        kept[i] = probe(t, spec[i].limit + 1);
      }
    }
    std::size_t binding = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (kept[i].remaining < kept[binding].remaining) binding = i;
      out.reset_after = std::max(out.reset_after, kept[i].reset_after);
    }
    out.limit = kept[binding].limit;
    out.remaining = kept[binding].remaining;
    if (!all && in_order) {
      const bool impossible = std::any_of(spec.begin(), spec.end(),
                                          [&](const sub_spec& s) { return cost > s.limit; });
      if (impossible) {
        out.retry_after = ratelimit::never;
      } else {
        const auto admits = [&](std::int64_t d) {
          for (const any_model& m : subs_) {
            any_model probe = m;
            if (!probe(t + d, cost).allowed) return false;
          }
          return true;
        };
        const std::int64_t hi = std::max<std::int64_t>(1, out.reset_after.count());
        if (!admits(hi)) monotone_ok = false;
        const std::int64_t d = ref::bisect_first(1, hi, admits);
        for (std::int64_t below = d - 1; below >= 1; below /= 2) {
          if (admits(below)) monotone_ok = false;
        }
        out.retry_after = std::chrono::microseconds{d};
      }
    }
    return out;
  }

 private:
  const std::vector<sub_spec>* specs_;
  std::vector<any_model> subs_;
};

/// Runs seeded traces through compound policy P and the brute-force model.
/// Every decision must agree on allowed, counted, limit and remaining; for
/// requests in time order (not stamped before the key's newest request) on
/// every field, with retry_after also checked exact on P itself.
template <class P>
void compare_with_model(const typename P::config& cfg, const std::vector<sub_spec>& specs,
                        const ratelimit_test::trace_options& options, std::uint64_t traces,
                        std::uint64_t salt) {
  int failures = 0;
  traces = static_cast<std::uint64_t>(rltest::scaled(static_cast<int>(traces)));
  for (std::uint64_t i = 0; i < traces && failures < 5; ++i) {
    const std::uint64_t seed = salt * 1'000'003 + i;
    std::map<std::string, typename P::state> states;
    std::map<std::string, compound_model> models;
    std::map<std::string, std::int64_t> newest;
    const auto trace = ratelimit_test::make_trace(seed, options);
    for (std::size_t n = 0; n < trace.size(); ++n) {
      const auto& ev = trace[n];
      typename P::state& s = states[ev.key];
      auto model = models.try_emplace(ev.key, &specs).first;
      const bool in_order = !newest.contains(ev.key) || ev.t >= newest[ev.key];
      newest[ev.key] = std::max(ev.t, newest.contains(ev.key) ? newest[ev.key] : ev.t);

      const typename P::state before = s;
      const decision got = P::step(cfg, s, timestamp{ev.t}, ev.cost);
      bool monotone_ok = true;
      const decision want = model->second.step(ev.t, ev.cost, in_order, monotone_ok);
      const bool same = in_order ? got == want
                                 : got.allowed == want.allowed && got.counted == want.counted &&
                                       got.limit == want.limit && got.remaining == want.remaining;
      std::string problem;
      if (!same) problem = "differs from the model";
      if (!monotone_ok) problem = "the model found a non-monotone admission test";
      if (!got.counted && !(s == before)) problem = "an uncounted rejection changed the state";
      if (problem.empty() && in_order && !got.allowed && got.retry_after != ratelimit::never) {
        const std::int64_t then = ev.t + got.retry_after.count();
        if (!peek_at<P>(cfg, s, then, ev.cost).allowed ||
            (got.retry_after > 1us && peek_at<P>(cfg, s, then - 1, ev.cost).allowed)) {
          problem = "retry_after is not exact";
        }
      }
      if (!problem.empty()) {
        ADD_FAILURE() << problem << ": seed " << seed << ", event " << n << " " << ev
                      << (in_order ? "" : " (out of order)") << "\n  policy: " << ref::describe(got)
                      << "\n  model:  " << ref::describe(want);
        ++failures;
        break;
      }
    }
  }
}

ratelimit::rate rate_of(units limit, std::int64_t period_us) {
  return ratelimit::rate(limit, std::chrono::microseconds{period_us});
}

ratelimit_test::trace_options trace_for(units limit, std::int64_t period_us) {
  ratelimit_test::trace_options o;
  o.period_us = period_us;
  o.limit = limit;
  o.events = 60;
  return o;
}

TEST(CompoundProperty, WindowAndLogMatchTheModel) {
  struct row {
    units window_limit;
    std::int64_t window_us;
    bool window_counts;
    units log_limit;
    std::int64_t log_us;
    bool log_counts;
  };
  const row rows[] = {{2, 10, false, 5, 40, false},  {3, 7, true, 4, 30, false},
                      {3, 10, false, 4, 50, true},   {2, 5, true, 6, 60, true},
                      {5, 100, false, 2, 20, false}, {1, 3, false, 1, 3, true}};
  std::uint64_t salt = 100;
  for (const row& r : rows) {
    const window_and_log::config cfg{
        fixed_window::config{rate_of(r.window_limit, r.window_us), window_options{r.window_counts}},
        sliding_window_log::config{rate_of(r.log_limit, r.log_us), window_options{r.log_counts}}};
    const std::vector<sub_spec> specs{
        {wrap(ref::fixed_window_model(r.window_limit, r.window_us, r.window_counts)),
         r.window_limit, r.window_counts},
        {wrap(ref::sliding_log_model(r.log_limit, r.log_us, r.log_counts)), r.log_limit,
         r.log_counts}};
    SCOPED_TRACE("row " + std::to_string(salt - 100));
    compare_with_model<window_and_log>(
        cfg, specs, trace_for(std::min(r.window_limit, r.log_limit), r.window_us), 200, salt);
    compare_with_model<window_and_log>(cfg, specs, trace_for(r.log_limit, r.log_us), 100,
                                       salt + 50);
    ++salt;
  }
}

TEST(CompoundProperty, CounterBucketAndGcraMatchTheModel) {
  using mixed = compound<sliding_window_counter, token_bucket, gcra>;
  struct row {
    units counter_limit;
    std::int64_t counter_us;
    bool counter_counts;
    units bucket_limit;
    std::int64_t bucket_us;
    units bucket_burst;
    units gcra_limit;
    std::int64_t gcra_us;
    units gcra_burst;
  };
  const row rows[] = {{3, 20, false, 2, 10, 3, 5, 50, 2},
                      {4, 50, true, 3, 30, 3, 2, 10, 4},
                      {2, 10, false, 1, 7, 2, 3, 21, 3},
                      {6, 100, true, 5, 100, 6, 4, 100, 4}};
  std::uint64_t salt = 200;
  for (const row& r : rows) {
    const mixed::config cfg{
        sliding_window_counter::config{rate_of(r.counter_limit, r.counter_us),
                                       window_options{r.counter_counts}},
        token_bucket::config{rate_of(r.bucket_limit, r.bucket_us), bucket_options{r.bucket_burst}},
        gcra::config{rate_of(r.gcra_limit, r.gcra_us), bucket_options{r.gcra_burst}}};
    const std::vector<sub_spec> specs{
        {wrap(ref::sliding_counter_model(r.counter_limit, r.counter_us, r.counter_counts)),
         r.counter_limit, r.counter_counts},
        {wrap(ref::token_bucket_model(r.bucket_limit, r.bucket_us, r.bucket_burst)), r.bucket_burst,
         false},
        {wrap(ref::gcra_model(r.gcra_limit, r.gcra_us, r.gcra_burst)), r.gcra_burst, false}};
    SCOPED_TRACE("row " + std::to_string(salt - 200));
    compare_with_model<mixed>(cfg, specs, trace_for(r.bucket_burst, r.counter_us), 200, salt);
    ++salt;
  }
}

TEST(CompoundProperty, CompoundOfLogsMatchesTheModel) {
  struct row {
    std::vector<std::pair<units, std::int64_t>> rates;
    bool counts;
  };
  const row rows[] = {{{{2, 10}, {4, 40}, {6, 100}}, false},
                      {{{2, 10}, {4, 40}, {6, 100}}, true},
                      {{{3, 7}, {3, 20}}, false},
                      {{{1, 5}, {2, 30}, {3, 31}}, true}};
  std::uint64_t salt = 300;
  for (const row& r : rows) {
    std::vector<sliding_window_log::config> parts;
    std::vector<sub_spec> specs;
    for (const auto& [limit, period] : r.rates) {
      parts.emplace_back(rate_of(limit, period), window_options{r.counts});
      specs.push_back({wrap(ref::sliding_log_model(limit, period, r.counts)), limit, r.counts});
    }
    const log_list::config cfg{parts};
    SCOPED_TRACE("row " + std::to_string(salt - 300));
    compare_with_model<log_list>(
        cfg, specs, trace_for(r.rates.front().first, r.rates.front().second), 300, salt);
    ++salt;
  }
}

TEST(CompoundProperty, CompoundOfMixedCountRejectedMatchesTheModel) {
  // Only some sub-limits count rejected attempts.
  const compound_of<fixed_window>::config cfg{std::vector<fixed_window::config>{
      fixed_window::config{rate_of(2, 10), window_options{true}},
      fixed_window::config{rate_of(5, 40), window_options{false}},
      fixed_window::config{rate_of(7, 70), window_options{true}}}};
  const std::vector<sub_spec> specs{{wrap(ref::fixed_window_model(2, 10, true)), 2, true},
                                    {wrap(ref::fixed_window_model(5, 40, false)), 5, false},
                                    {wrap(ref::fixed_window_model(7, 70, true)), 7, true}};
  compare_with_model<compound_of<fixed_window>>(cfg, specs, trace_for(2, 10), 400, 400);
}

// ---------------------------------------------------------------------------

// Verifies atomicity on the in-process store: threads racing on one key get
// exactly the smallest sub-limit admitted, and every sub-limit recorded
// exactly the admitted requests.
TEST(Compound, ThreadsOnTheMemoryStoreAdmitExactlyTheSmallestLimit) {
  ratelimit::limiter<window_and_log, ratelimit::memory_store<window_and_log>> lim(
      window_and_log::config{fixed_window::config{"300/1d"}, sliding_window_log::config{"100/1d"}});
  constexpr int threads = 4;
  constexpr int attempts = 250;
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < attempts; ++j) {
        if (lim.try_acquire("hot", timestamp{second}).allowed) {
          admitted.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(admitted.load(), 100);
  const window_and_log::state s = lim.store().state_of("hot");
  EXPECT_EQ(std::get<0>(s.parts).count, 100);
  EXPECT_EQ(std::get<1>(s.parts).total(), 100);
}

TEST(CompoundOf, ThreadsOnTheMemoryStoreAdmitExactlyTheSmallestLimit) {
  ratelimit::limiter<compound_of<gcra>, ratelimit::memory_store<compound_of<gcra>>> lim(
      compound_of<gcra>::config{"50/1s", "80/1min"});
  constexpr int threads = 4;
  constexpr int attempts = 100;
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < attempts; ++j) {
        if (lim.try_acquire("hot", timestamp{minute}).allowed) {
          admitted.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(admitted.load(), 50);
}

/// A user policy whose step cannot throw but whose state's copy can (it
/// would allocate): a counter that never refills, counting rejected attempts.
/// `copies_before_failure` makes the n-th copy from now throw std::bad_alloc.
struct copy_throws {
  static constexpr std::string_view name = "copy_throws";
  static inline int copies_before_failure = -1;
  struct config {
    using policy_type = copy_throws;
    units max = 2;
    [[nodiscard]] units limit() const noexcept { return max; }
    [[nodiscard]] bool count_rejected() const noexcept { return true; }
  };
  struct state {
    units used = 0;
    state() = default;
    state(const state& o) : used(o.used) {
      if (copies_before_failure == 0) {
        copies_before_failure = -1;
        throw std::bad_alloc();
      }
      if (copies_before_failure > 0) --copies_before_failure;
    }
    state& operator=(const state&) = default;
    friend bool operator==(const state&, const state&) = default;
  };
  static decision step(const config& cfg, state& s, timestamp, units cost) noexcept {
    decision d;
    d.limit = cfg.max;
    d.allowed = s.used + cost <= cfg.max;
    s.used += cost;
    d.counted = true;
    d.remaining = cfg.max > s.used ? cfg.max - s.used : 0;
    d.reset_after = 1s;
    if (!d.allowed) d.retry_after = ratelimit::never;
    return d;
  }
  static bool idle(const config&, const state& s, timestamp) noexcept { return s.used == 0; }
};
static_assert(ratelimit::policy<copy_throws>);
static_assert(!noexcept(compound<copy_throws, fixed_window>::step(
    std::declval<const compound<copy_throws, fixed_window>::config&>(),
    std::declval<compound<copy_throws, fixed_window>::state&>(), timestamp{}, units{})));

// Verifies that a sub-state copy that throws while the compound looks for
// retry_after (the sub-limit admitted, counts rejected attempts, and the
// compound rejects) reaches the caller with the state unchanged. It used to
// happen inside a noexcept function (the step itself is noexcept), which
// terminated the process.
TEST(Compound, ASubStateCopyThatThrowsInTheRetrySearchReachesTheCaller) {
  using P = compound<copy_throws, fixed_window>;
  const P::config cfg{copy_throws::config{}, fixed_window::config{"1/1s"}};
  P::state s;
  ASSERT_TRUE(P::step(cfg, s, timestamp{0}, 1).allowed);
  const P::state before = s;
  // Copy 0 is the compound's trial copy; copy 1 the first retry probe's.
  copy_throws::copies_before_failure = 1;
  EXPECT_THROW((void)P::step(cfg, s, timestamp{1}, 1), std::bad_alloc);
  copy_throws::copies_before_failure = -1;
  EXPECT_EQ(s, before);
  // Without failures the same step rejects (the fixed window is full).
  EXPECT_FALSE(P::step(cfg, s, timestamp{1}, 1).allowed);
}

}  // namespace
