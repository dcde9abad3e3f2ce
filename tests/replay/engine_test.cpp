// SPDX-License-Identifier: Apache-2.0
// Tests of replay.hpp: decisions at the window edges computed by hand, and the sweep's figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gen_trace.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "replay.hpp"

namespace {

using namespace ratelimit;
using namespace ratelimit::replay;

template <class P>
std::string decisions(const std::string& trace, const std::string& rate_text,
                      bool count_rejected = false) {
  std::istringstream in(trace);
  trace_reader reader(in);
  const auto cfg = make_config<P>(limiter_settings{rate::parse(rate_text), {}, count_rejected});
  memory_store<P> store;
  std::string out(decisions_header);
  replay_decisions<P>(reader, cfg, store, out);
  return out;
}

// W = 10 s; the first call is at 1000 s, a multiple of W, so the fixed window starts there too.
const std::string edge_trace =
    "1000000000,a\n"     // first
    "1000000001,a\n"     // second: the limit of 2 is reached
    "1009999999,a\n"     // 1 us before the first leaves the window (t - W, t]
    "1010000000,a\n"     // exactly W after the first: it has left
    "1010000001,a,3\n";  // cost above the limit: never

TEST(ReplayDecisions, SlidingLogAtTheWindowEdge) {
  EXPECT_EQ(decisions<sliding_window_log>(edge_trace, "2/10s"),
            "ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us\n"
            "1000000000,a,1,1,1,0,10000000\n"
            "1000000001,a,1,1,0,0,10000000\n"
            "1009999999,a,1,0,0,1,2\n"
            "1010000000,a,1,1,0,0,10000000\n"
            "1010000001,a,3,0,1,-1,9999999\n");
}

TEST(ReplayDecisions, FixedWindowAtTheWindowEdge) {
  EXPECT_EQ(decisions<fixed_window>(edge_trace, "2/10s"),
            "ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us\n"
            "1000000000,a,1,1,1,0,10000000\n"
            "1000000001,a,1,1,0,0,9999999\n"
            "1009999999,a,1,0,0,1,1\n"
            "1010000000,a,1,1,1,0,10000000\n"
            "1010000001,a,3,0,1,-1,9999999\n");
}

// Verifies the fixed window's edge burst: 2 just before an edge and 2 just after all pass,
// while the sliding log holds the second pair back.
TEST(ReplayDecisions, FixedWindowEdgeBurst) {
  const std::string t = "1009999998,k\n1009999999,k\n1010000000,k\n1010000001,k\n";
  const std::string fw = decisions<fixed_window>(t, "2/10s");
  const std::string sl = decisions<sliding_window_log>(t, "2/10s");
  EXPECT_NE(fw.find("1010000001,k,1,1,"), std::string::npos) << fw;
  EXPECT_NE(sl.find("1010000000,k,1,0,0,9999998,"), std::string::npos) << sl;
  EXPECT_NE(sl.find("1010000001,k,1,0,0,9999997,"), std::string::npos) << sl;
}

TEST(ReplayDecisions, CountRejectedKeepsACallerBlocked) {
  // 1/10s: calls every 6 s. Not counted: every other call passes. Counted: only the first.
  const std::string t = "0,k\n6000000,k\n12000000,k\n18000000,k\n24000000,k\n";
  const std::string plain = decisions<sliding_window_log>(t, "1/10s");
  const std::string counted = decisions<sliding_window_log>(t, "1/10s", true);
  EXPECT_NE(plain.find("12000000,k,1,1,"), std::string::npos) << plain;
  EXPECT_NE(counted.find("12000000,k,1,0,"), std::string::npos) << counted;
  EXPECT_NE(counted.find("24000000,k,1,0,"), std::string::npos) << counted;
}

TEST(ReplayDecisions, KeysAreQuotedToParseBack) {
  const std::string out = decisions<gcra>("1,\"a,b\"\n2,\"x\"\"y\"\n3,\"two\nlines\"\n4,plain\n",
                                          "5/s");
  EXPECT_EQ(out,
            "ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us\n"
            "1,\"a,b\",1,1,4,0,200000\n"
            "2,\"x\"\"y\",1,1,4,0,200000\n"
            "3,\"two\nlines\",1,1,4,0,200000\n"
            "4,plain,1,1,4,0,200000\n");
}

// Verifies the sweep on a small labelled trace, computed by hand:
// normal n1 calls twice in 10 s (peak 2), normal n2 once (peak 1), abusive ab three times (peak 3).
TEST(Analyse, SweepFiguresByHand) {
  const std::string trace =
      "ts,key,cost,label\n"
      "1000000000000000,n1,1,0\n1000000001000000,n1,1,0\n"
      "1000000000000000,n2,1,0\n"
      "1000000000000000,ab,1,1\n1000000001000000,ab,1,1\n1000000002000000,ab,1,1\n";
  std::istringstream in(trace);
  analysis_options o;
  o.settings.r = rate::parse("2/10s");
  o.sweep_limits = {1, 2, 3};
  o.sweep_policies = {policy_id::sliding_log};
  const analysis_result r = analyse(in, o);
  EXPECT_EQ(r.events, 6u);
  EXPECT_EQ(r.keys, 3u);
  EXPECT_EQ(r.abusive_keys, 1u);
  EXPECT_EQ(r.normal_keys, 2u);
  ASSERT_EQ(r.sweep.size(), 3u);
  // limit 1: n1's 2nd call and ab's 2nd and 3rd are rejected.
  EXPECT_EQ(r.sweep[0].limit, 1);
  EXPECT_EQ(r.sweep[0].rejected, 3u);
  EXPECT_EQ(r.sweep[0].keys_blocked, 2u);
  EXPECT_EQ(r.sweep[0].abusive_caught, 1u);
  EXPECT_EQ(r.sweep[0].normal_blocked, 1u);
  // limit 2: only ab's 3rd call.
  EXPECT_EQ(r.sweep[1].rejected, 1u);
  EXPECT_EQ(r.sweep[1].keys_blocked, 1u);
  EXPECT_EQ(r.sweep[1].abusive_caught, 1u);
  EXPECT_EQ(r.sweep[1].normal_blocked, 0u);
  // limit 3: nothing.
  EXPECT_EQ(r.sweep[2].rejected, 0u);
  EXPECT_EQ(r.sweep[2].keys_blocked, 0u);
  // Peaks per key, and the summary at 2/10s.
  std::vector<std::uint32_t> normal, abusive;
  for (const auto& [peak, label] : r.key_peaks) (label == 1 ? abusive : normal).push_back(peak);
  std::sort(normal.begin(), normal.end());
  EXPECT_EQ(normal, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(abusive, (std::vector<std::uint32_t>{3}));
  ASSERT_EQ(r.policies.size(), 5u);
  const policy_summary& log = r.policies[static_cast<std::size_t>(policy_id::sliding_log)];
  EXPECT_EQ(log.admitted, 5u);
  EXPECT_EQ(log.rejected, 1u);
  EXPECT_EQ(log.keys_blocked, 1u);
  EXPECT_EQ(log.max_in_window, 2u);
}

// Verifies "most calls in any window": a fixed window lets 2 x limit through across an edge.
TEST(Analyse, MaxInWindowShowsTheFixedWindowEdgeBurst) {
  std::istringstream in("1009999998,k\n1009999999,k\n1010000000,k\n1010000001,k\n");
  analysis_options o;
  o.settings.r = rate::parse("2/10s");
  const analysis_result r = analyse(in, o);
  EXPECT_EQ(r.policies[static_cast<std::size_t>(policy_id::fixed_window)].max_in_window, 4u);
  EXPECT_EQ(r.policies[static_cast<std::size_t>(policy_id::sliding_log)].max_in_window, 2u);
}

// The summary's figures on the sample, as printed before the engine was
// restructured (interned keys, dense state vectors, shared window rings):
// everything but events/s must stay the same.
TEST(Analyse, SampleSummaryIsUnchanged) {
  std::ifstream in(RATELIMIT_REPLAY_SAMPLE, std::ios::binary);
  ASSERT_TRUE(in) << RATELIMIT_REPLAY_SAMPLE;
  analysis_options o;
  o.settings.r = rate::parse("10/15min");
  const analysis_result r = analyse(in, o);
  EXPECT_EQ(r.events, 34'807u);
  EXPECT_EQ(r.keys, 2'605u);
  EXPECT_EQ(r.abusive_keys, 16u);
  EXPECT_EQ(r.normal_keys, 2'589u);
  struct row {
    std::uint64_t admitted, rejected;
    std::size_t blocked;
    std::uint32_t max_in_w;
    std::size_t peak_bytes;
  };
  // fixed_window, sliding_log, sliding_counter, token_bucket, gcra
  const row want[] = {{30'147, 4'660, 22, 20, 768},
                      {29'467, 5'340, 31, 10, 0},
                      {29'416, 5'391, 29, 17, 0},
                      {30'181, 4'626, 20, 19, 96},
                      {30'181, 4'626, 20, 19, 48}};
  ASSERT_EQ(r.policies.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    const policy_summary& p = r.policies[i];
    EXPECT_EQ(p.admitted, want[i].admitted) << i;
    EXPECT_EQ(p.rejected, want[i].rejected) << i;
    EXPECT_EQ(p.keys_blocked, want[i].blocked) << i;
    EXPECT_EQ(p.max_in_window, want[i].max_in_w) << i;
    if (want[i].peak_bytes != 0) {
      EXPECT_EQ(p.state_peak_bytes, want[i].peak_bytes) << i;
    }
  }
  EXPECT_NEAR(r.policies[1].state_bytes_per_key, 139.0, 1.0);
  EXPECT_NEAR(static_cast<double>(r.policies[1].state_peak_bytes) / 1024.0, 7.5, 0.05);
  EXPECT_NEAR(static_cast<double>(r.policies[2].state_peak_bytes) / 1024.0, 2.2, 0.05);
  EXPECT_GT(r.total_seconds, 0.0);
}

// Every count of the shared window rings against a brute force over the
// admitted calls (per-key time order, random costs, several keys interleaved).
TEST(Analyse, WindowCountsMatchBruteForce) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::string trace;
    std::vector<std::pair<std::int64_t, std::string>> events;
    std::int64_t t = 1'000'000'000;
    for (int i = 0; i < 400; ++i) {
      t += static_cast<std::int64_t>(rng() % 3'000'000);
      std::string key(1, 'k');
      key += std::to_string(rng() % 5);
      events.emplace_back(t, key);
      trace += std::to_string(t) + "," + key + "," + std::to_string(1 + rng() % 2) + "\n";
    }
    analysis_options o;
    o.settings.r = rate::parse("4/10s");
    o.sample_every = 1 + rng() % 64;
    std::istringstream in(trace);
    const analysis_result r = analyse(in, o);
    // Attempts: each key's peak in any (t - W, t].
    std::map<std::string, std::uint32_t> peak;
    for (std::size_t i = 0; i < events.size(); ++i) {
      std::uint32_t c = 0;
      for (std::size_t j = 0; j <= i; ++j) {
        if (events[j].second == events[i].second && events[j].first > events[i].first - 10'000'000)
          ++c;
      }
      peak[events[i].second] = std::max(peak[events[i].second], c);
    }
    std::vector<std::uint32_t> want, got;
    for (const auto& [k, p] : peak) want.push_back(p);
    for (const auto& [p, label] : r.key_peaks) got.push_back(p);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << round;
    // Admitted calls of the sliding log never exceed the limit in a window.
    EXPECT_LE(r.policies[1].max_in_window, 4u);
  }
}

TEST(Analyse, Percentiles) {
  const std::vector<std::uint32_t> v{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(percentile(v, 0.5), 5u);
  EXPECT_EQ(percentile(v, 0.9), 9u);
  EXPECT_EQ(percentile(v, 0.99), 10u);
  EXPECT_EQ(percentile({}, 0.5), 0u);
}

TEST(Analyse, ParsesSweeps) {
  EXPECT_EQ(parse_sweep("5..8"), (std::vector<units>{5, 6, 7, 8}));
  EXPECT_EQ(parse_sweep("5..20/5"), (std::vector<units>{5, 10, 15, 20}));
  EXPECT_EQ(parse_sweep("20,5,10,5"), (std::vector<units>{5, 10, 20}));
  for (const char* bad : {"", "0..5", "5..", "..5", "9..5", "5,,6", "a", "1..5000", "5..10/0"}) {
    EXPECT_THROW((void)parse_sweep(bad), std::invalid_argument) << bad;
  }
}

// Verifies the per-key state is checked against the budget before it grows:
// a sweep that multiplies it is refused naming --sweep, a plain summary naming
// the input, and a run that fits is not disturbed.
TEST(Analyse, StateOverTheMemoryBudgetIsRefused) {
  std::string trace;
  for (int i = 0; i < 10000; ++i) trace += std::to_string(i) + ",k" + std::to_string(i) + "\n";
  analysis_options o;
  o.settings.r = rate::parse("10/s");
  o.sweep_limits = parse_sweep("1..1000");
  o.sweep_policies.assign(std::begin(all_policies), std::end(all_policies));
  o.memory_budget = std::size_t{64} << 20;
  std::istringstream in(trace);
  try {
    (void)analyse(in, o);
    FAIL() << "no error";
  } catch (const memory_budget_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--sweep: 1000 limits x 5 policies"), std::string::npos) << m;
    EXPECT_NE(m.find("at 4096 keys"), std::string::npos) << m;
    EXPECT_NE(m.find("over the memory budget of 64.0 MiB"), std::string::npos) << m;
  }
  analysis_options plain;
  plain.settings.r = o.settings.r;
  plain.memory_budget = std::size_t{256} << 10;
  std::istringstream again(trace);
  try {
    (void)analyse(again, plain);
    FAIL() << "no error";
  } catch (const memory_budget_error& e) {
    EXPECT_NE(std::string(e.what()).find("the input has too many keys"), std::string::npos)
        << e.what();
  }
  plain.memory_budget = std::size_t{64} << 20;
  std::istringstream fits(trace);
  EXPECT_EQ(analyse(fits, plain).keys, 10000u);
}

// Verifies the sliding log's rings count against the budget too: one key with
// every call in one window and a large limit holds them all.
TEST(Analyse, SlidingLogRingsCountAgainstTheBudget) {
  std::string trace;
  for (int i = 0; i < 200000; ++i) trace += std::to_string(i) + ",k\n";
  analysis_options o;
  o.settings.r = rate::parse("1000000/1h");
  o.memory_budget = std::size_t{2} << 20;  // the ring of 200,000 entries alone is 3 MiB
  std::istringstream in(trace);
  EXPECT_THROW((void)analyse(in, o), memory_budget_error);
  o.memory_budget = std::size_t{64} << 20;
  std::istringstream fits(trace);
  EXPECT_EQ(analyse(fits, o).events, 200000u);
}

TEST(GenTrace, EstimateBoundsTheLogAndGenerationStopsAtMaxCalls) {
  gen_options o;
  const gen_estimate e = estimate_trace(o);
  const gen_trace t = generate_trace(o);
  EXPECT_GE(e.calls, static_cast<double>(t.events.size()));
  EXPECT_LE(e.calls, 2.0 * static_cast<double>(t.events.size()));
  EXPECT_EQ(e.callers, static_cast<double>(t.keys.size()));
  gen_options big = o;
  big.calls_per_day = 1e6;
  EXPECT_THROW(check_trace_budget(big, std::size_t{1} << 30), memory_budget_error);
  check_trace_budget(o, std::size_t{1} << 30);
  EXPECT_GT(o.max_calls, t.events.size());
  o.max_calls = 1000;
  EXPECT_THROW((void)generate_trace(o), memory_budget_error);
}

}  // namespace
