// SPDX-License-Identifier: Apache-2.0
// The summary and sweep engine against the frozen pre-rewrite engine, on dense generated logs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "gen_trace.hpp"
#include "reference_engine.hpp"
#include "replay.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using namespace ratelimit::replay;

/// A dense log: `events` calls from `keys` keys, up to `step_us` apart.
std::string dense_log(std::uint64_t events, std::uint64_t keys, std::int64_t step_us,
                      std::uint64_t seed) {
  dense_options d;
  d.events = events;
  d.keys = keys;
  d.max_step_us = step_us;
  d.seed = seed;
  std::ostringstream out;
  write_dense_trace_csv(out, d);
  return out.str();
}

/// The same log with some neighbouring lines swapped, so keys see calls out of
/// time order (the rings then count them at the key's newest time).
std::string shuffle_neighbours(const std::string& log, std::uint64_t seed) {
  std::vector<std::string> lines;
  std::istringstream in(log);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::uint64_t x = seed;
  for (std::size_t i = 3; i + 1 < lines.size(); ++i) {
    x = x * 6364136223846793005u + 1442695040888963407u;
    if ((x >> 60) == 0) std::swap(lines[i], lines[i + 1]);
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

/// Everything the tool prints for `r`, timing figures zeroed (they are CPU
/// times, the only figures that may differ between two runs).
std::string printed(analysis_result r, const analysis_options& o) {
  r.shared_seconds = 0;
  r.total_seconds = 0;
  for (auto& p : r.policies) p.seconds = 0;
  std::ostringstream out;
  print_summary(out, r, o.settings, "log");
  if (!o.sweep_limits.empty()) print_sweep(out, r, o.settings, policy_id::sliding_log);
  return out.str();
}

struct run_case {
  const char* rate;
  bool count_rejected;
  std::vector<units> sweep;
};

// Each case: the window holds every key (15min), or keys go quiet between
// calls so rings are freed and reused (1min); rejected calls counted or not;
// with and without a sweep.
const run_case cases[] = {
    {"10/15min", false, {}},
    {"10/15min", true, {}},
    {"3/1min", false, {2, 5, 9}},
    {"25/15min", false, {}},
};

analysis_options options_for(const run_case& c) {
  analysis_options o;
  o.settings.r = rate::parse(c.rate);
  o.settings.count_rejected = c.count_rejected;
  o.sample_every = 3'000;  // several memory samples in a small log
  o.sweep_limits = c.sweep;
  if (!c.sweep.empty()) {
    o.sweep_policies.assign(std::begin(all_policies), std::end(all_policies));
  }
  return o;
}

// All five policies: the printed summary (and sweep) is byte for byte the
// reference's, on an ordered and an out-of-order dense log.
TEST(DenseReplay, AllPoliciesPrintExactlyWhatTheReferencePrints) {
  // 40,000 calls from 2,000 keys up to 30 ms apart: about 10 minutes, each
  // key calling every 30 s on average. Under TSan in CI a quarter of the
  // calls and keys, each step 4x as long: the same 10 minutes and 30 s
  // gaps, so keys still go quiet for a minute and their rings are reused.
  const auto events = static_cast<std::uint64_t>(rltest::scaled(40'000));
  const auto keys = static_cast<std::uint64_t>(rltest::scaled(2'000));
  const auto step = static_cast<std::int64_t>(30'000 * 40'000 / events);
  const std::string logs[] = {dense_log(events, keys, step, 3),
                              shuffle_neighbours(dense_log(events, keys, step, 4), 5)};
  for (const std::string& log : logs) {
    for (const run_case& c : cases) {
      const analysis_options o = options_for(c);
      std::istringstream a(log), b(log);
      const analysis_result got = analyse(a, o);
      const analysis_result want = reference::analyse(b, o);
      ASSERT_EQ(got.events, events);
      EXPECT_EQ(printed(got, o), printed(want, o)) << c.rate;
      EXPECT_EQ(got.key_peaks, want.key_peaks) << c.rate;
    }
  }
}

// One policy (what `--policy P` runs): its row, and everything else printed,
// is exactly the reference's row for P.
TEST(DenseReplay, OnePolicyPrintsExactlyTheReferenceRow) {
  // As above: fewer calls and keys under TSan, the same span of time.
  const auto events = static_cast<std::uint64_t>(rltest::scaled(30'000));
  const std::string log = dense_log(events, static_cast<std::uint64_t>(rltest::scaled(1'500)),
                                    static_cast<std::int64_t>(30'000 * 30'000 / events), 6);
  for (const run_case& c : cases) {
    if (!c.sweep.empty()) continue;
    analysis_options all = options_for(c);
    std::istringstream b(log);
    analysis_result want_all = reference::analyse(b, all);
    for (const policy_id p : all_policies) {
      analysis_options o = all;
      o.summary_policies = {p};
      std::istringstream a(log);
      const analysis_result got = analyse(a, o);
      ASSERT_EQ(got.policies.size(), 1u);
      EXPECT_EQ(got.policies[0].id, p);
      analysis_result want = want_all;
      std::erase_if(want.policies, [&](const policy_summary& s) { return s.id != p; });
      EXPECT_EQ(printed(got, o), printed(want, o)) << c.rate << " " << policy_name(p);
    }
  }
}

// A bad line or the memory budget stops the run at the same point as the
// reference, while the worker thread is busy with an earlier batch; skipped
// bad lines give the same figures.
TEST(DenseReplay, ErrorsAndSkippedLinesMatchTheReference) {
  std::string log = dense_log(20'000, 1'000, 30'000, 8);
  // A bad timestamp on physical line 10,002 (two header lines, then events).
  std::size_t at = 0;
  for (int line = 1; line < 10'002; ++line) at = log.find('\n', at) + 1;
  log.insert(at, "12x4,bad-key\n");
  const analysis_options o = options_for(cases[0]);
  for (const bool skip : {false, true}) {
    analysis_options so = o;
    so.skip_bad_lines = skip;
    std::istringstream a(log), b(log);
    if (!skip) {
      try {
        (void)analyse(a, so);
        ADD_FAILURE() << "no input_error";
      } catch (const input_error& e) {
        EXPECT_EQ(e.line(), 10'002u) << e.what();
      }
      continue;
    }
    const analysis_result got = analyse(a, so);
    const analysis_result want = reference::analyse(b, so);
    EXPECT_EQ(got.skipped, 1u);
    EXPECT_EQ(got.first_skipped, want.first_skipped);
    EXPECT_EQ(printed(got, so), printed(want, so));
  }
  // A budget that 20,000 keys pass after a few batches: same message.
  analysis_options tight = o;
  tight.sweep_limits = {2, 5, 9};
  tight.sweep_policies.assign(std::begin(all_policies), std::end(all_policies));
  tight.memory_budget = 3'000'000;
  const std::string many_keys = dense_log(20'000, 20'000, 30'000, 8);
  std::string got_message, want_message;
  std::istringstream a(many_keys), b(many_keys);
  try {
    (void)analyse(a, tight);
  } catch (const memory_budget_error& e) {
    got_message = e.what();
  } catch (const input_error&) {
    got_message = "input_error";
  }
  try {
    (void)reference::analyse(b, tight);
  } catch (const memory_budget_error& e) {
    want_message = e.what();
  } catch (const input_error&) {
    want_message = "input_error";
  }
  EXPECT_NE(want_message.find("--sweep"), std::string::npos) << want_message;
  // Not at the first batch (about 3,700 keys): the pipeline is under way.
  EXPECT_EQ(want_message.find(" at 3"), std::string::npos) << want_message;
  EXPECT_EQ(got_message, want_message);
}

// The command line: --policy P without --sweep prints P's row only.
TEST(DenseReplay, PolicyFlagPrintsOneRow) {
  std::istringstream in(dense_log(5'000, 500, 30'000, 7));
  std::ostringstream out, err;
  EXPECT_EQ(run_replay({"--rate", "10/15min", "--policy", "gcra", "-"}, in, out, err), 0)
      << err.str();
  const std::string s = out.str();
  EXPECT_NE(s.find("\ngcra "), std::string::npos) << s;
  for (const char* other : {"fixed_window ", "sliding_log ", "sliding_counter ", "token_bucket "}) {
    EXPECT_EQ(s.find(std::string("\n") + other), std::string::npos) << other << "\n" << s;
  }
  EXPECT_NE(s.find("(1 policy runs)"), std::string::npos) << s;
}

// The dense generator is deterministic and writes what it promises.
TEST(DenseReplay, GeneratorIsDeterministicAndDense) {
  const std::string a = dense_log(2'000, 50, 2'000, 9);
  EXPECT_EQ(a, dense_log(2'000, 50, 2'000, 9));
  EXPECT_NE(a, dense_log(2'000, 50, 2'000, 10));
  std::istringstream in(a);
  trace_reader reader(in);
  event e;
  std::int64_t last = 0;
  std::size_t n = 0;
  while (reader.next(e)) {
    EXPECT_GE(e.ts_us, last);
    if (n > 0) {
      EXPECT_LE(e.ts_us - last, 2'000);
    }
    EXPECT_EQ(e.key.size(), 13u);
    EXPECT_EQ(e.label, 0);
    last = e.ts_us;
    ++n;
  }
  EXPECT_EQ(n, 2'000u);
  dense_options bad;
  bad.keys = 0;
  std::ostringstream out;
  EXPECT_THROW(write_dense_trace_csv(out, bad), std::invalid_argument);
}

}  // namespace
