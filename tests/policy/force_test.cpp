// SPDX-License-Identifier: Apache-2.0
// access::force in process: the exact rules of docs/semantics.md ("Shadow mode") per policy,
// the sliding log's memory bound, saturation, and brute-force models under mixed traces.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using ratelimit_test::reference::bisect_first;
using ratelimit_test::reference::describe;
using std::chrono::microseconds;

constexpr std::int64_t s = 1'000'000;

template <class P>
decision force(const typename P::config& cfg, typename P::state& st, std::int64_t t,
               units cost = 1) {
  return P::force(cfg, st, microseconds{t}, cost);
}

template <class P>
decision consume(const typename P::config& cfg, typename P::state& st, std::int64_t t,
                 units cost = 1) {
  return P::step(cfg, st, microseconds{t}, cost);
}

// Verifies that a forced check the fixed window admits is a plain consume,
// and that a rejected one is recorded: the count passes the limit, the
// decision stays the policy's (allowed false, counted true), remaining 0,
// retry and reset at the window's end; the next window starts from zero.
TEST(Force, FixedWindowCountsPastTheLimit) {
  const fixed_window::config cfg("3/10s");
  fixed_window::state a;
  fixed_window::state b;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(force<fixed_window>(cfg, a, 1 * s), consume<fixed_window>(cfg, b, 1 * s));
  }
  ASSERT_EQ(a, b);
  const decision d = force<fixed_window>(cfg, a, 4 * s, 2);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, microseconds{6 * s});
  EXPECT_EQ(d.reset_after, microseconds{6 * s});
  EXPECT_EQ(a.count, 5);
  // The cost above the limit: never, and still recorded.
  const decision big = force<fixed_window>(cfg, a, 4 * s, 4);
  EXPECT_EQ(big.retry_after, never);
  EXPECT_EQ(a.count, 9);
  EXPECT_FALSE(consume<fixed_window>(cfg, a, 10 * s - 1).allowed);
  EXPECT_TRUE(consume<fixed_window>(cfg, a, 10 * s).allowed);
}

// Verifies saturation: counts stop at 2^52 however many huge costs are forced.
TEST(Force, CountsSaturateAt2Pow52) {
  const fixed_window::config fw("10/1h");
  fixed_window::state f;
  const sliding_window_counter::config sc("10/1h");
  sliding_window_counter::state c;
  for (int i = 0; i < 5000; ++i) {
    (void)force<fixed_window>(fw, f, 5, max_units);
    (void)force<sliding_window_counter>(sc, c, 5, max_units);
  }
  EXPECT_EQ(f.count, units{1} << 52);
  EXPECT_EQ(c.current, units{1} << 52);
}

// Verifies the sliding counter under force: the current count passes the
// limit, the next window weighs it as the previous one, and retry_after is
// exact on the recorded state (the microsecond before is still rejected).
TEST(Force, SlidingCounterCarriesTheExcessIntoTheNextWindow) {
  const sliding_window_counter::config cfg("4/10s");
  sliding_window_counter::state st;
  for (int i = 0; i < 8; ++i) (void)force<sliding_window_counter>(cfg, st, 1 * s);
  EXPECT_EQ(st.current, 8);
  const decision d = force<sliding_window_counter>(cfg, st, 2 * s);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(st.current, 9);
  // In window 1 the weighted 9 must fall to 3: 9 (W - e) / W <= 3 at e = 2/3 W.
  const std::int64_t at = 2 * s + d.retry_after.count();
  sliding_window_counter::state probe = st;
  EXPECT_TRUE(consume<sliding_window_counter>(cfg, probe, at).allowed);
  probe = st;
  EXPECT_FALSE(consume<sliding_window_counter>(cfg, probe, at - 1).allowed);
  EXPECT_EQ(at, 10 * s + 6'666'667);
}

// Verifies the token bucket's debt: forced checks take the deficit past the
// capacity; the retry and reset wait for the debt to be refilled.
TEST(Force, TokenBucketGoesIntoDebt) {
  const token_bucket::config cfg("10/10s");  // one token per second, burst 10
  token_bucket::state st;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(force<token_bucket>(cfg, st, 0).allowed);
  const decision d = force<token_bucket>(cfg, st, 0, 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(d.remaining, 0);
  // 15 owed: the same request (5 tokens) waits 10 s, a 1-token one 6 s.
  EXPECT_EQ(d.retry_after, microseconds{10 * s});
  EXPECT_EQ(d.reset_after, microseconds{15 * s});
  token_bucket::state probe = st;
  EXPECT_FALSE(consume<token_bucket>(cfg, probe, 10 * s - 1, 5).allowed);
  probe = st;
  EXPECT_TRUE(consume<token_bucket>(cfg, probe, 10 * s, 5).allowed);
  probe = st;
  EXPECT_FALSE(consume<token_bucket>(cfg, probe, 6 * s - 1).allowed);
  probe = st;
  EXPECT_TRUE(consume<token_bucket>(cfg, probe, 6 * s).allowed);
  EXPECT_FALSE(token_bucket::idle(cfg, st, microseconds{15 * s - 1}));
  EXPECT_TRUE(token_bucket::idle(cfg, st, microseconds{15 * s}));
}

// Verifies that the bucket's debt saturates at 2^52 ticks (cost x ticks per
// token alone may not fit an int64) and stays decidable.
TEST(Force, TokenBucketDebtSaturates) {
  const token_bucket::config cfg("3/7us");
  token_bucket::state st;
  for (int i = 0; i < 3; ++i) (void)force<token_bucket>(cfg, st, 100, max_units);
  EXPECT_EQ(st.deficit, std::int64_t{1} << 52);
  const decision d = force<token_bucket>(cfg, st, 100, 1);
  EXPECT_EQ(d.reset_after, microseconds{(std::int64_t{1} << 52) / 3 + 1});
  EXPECT_EQ(d.remaining, 0);
}

// Verifies GCRA under force: the TAT runs ahead of the tolerance; retry is
// TAT + T - tolerance - t, reset the whole debt; it saturates at t + 2^52 us
// and never moves back for a request stamped earlier.
TEST(Force, GcraTatRunsAhead) {
  const gcra::config cfg("10/10s");  // T = 1 s, tolerance 10 s
  gcra::state st;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(force<gcra>(cfg, st, 0).allowed);
  const decision d = force<gcra>(cfg, st, 0, 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(st.tat, 15 * s);
  EXPECT_EQ(d.retry_after, microseconds{10 * s});  // TAT + 5T - tolerance - t
  EXPECT_EQ(d.reset_after, microseconds{15 * s});
  gcra::state probe = st;
  EXPECT_FALSE(consume<gcra>(cfg, probe, 10 * s - 1, 5).allowed);
  probe = st;
  EXPECT_TRUE(consume<gcra>(cfg, probe, 10 * s, 5).allowed);
  probe = st;
  EXPECT_FALSE(consume<gcra>(cfg, probe, 6 * s - 1).allowed);
  probe = st;
  EXPECT_TRUE(consume<gcra>(cfg, probe, 6 * s).allowed);

  gcra::state far;
  for (int i = 0; i < 3; ++i) (void)force<gcra>(cfg, far, 1000, max_units);
  EXPECT_EQ(far.tat, 1000 + (std::int64_t{1} << 52));
  (void)force<gcra>(cfg, far, 0, max_units);  // stamped earlier: TAT unchanged
  EXPECT_EQ(far.tat, 1000 + (std::int64_t{1} << 52));
}

// Verifies the compound under force: every sub-limit records the request,
// the one that admitted too; retry_after is the wait until every sub-limit
// admits the same request on the recorded states.
TEST(Force, CompoundRecordsInEverySubLimit) {
  const compound_of<fixed_window>::config cfg{"2/10s", "5/100s"};
  compound_of<fixed_window>::state st;
  ASSERT_TRUE(force<compound_of<fixed_window>>(cfg, st, 1 * s).allowed);
  ASSERT_TRUE(force<compound_of<fixed_window>>(cfg, st, 1 * s).allowed);
  const decision d = force<compound_of<fixed_window>>(cfg, st, 1 * s);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.counted);
  ASSERT_EQ(st.parts.size(), 2U);
  EXPECT_EQ(st.parts[0].count, 3);
  EXPECT_EQ(st.parts[1].count, 3);
  EXPECT_EQ(d.retry_after, microseconds{9 * s});
  // Plain consume rejects with nothing recorded in the admitting sub-limit.
  compound_of<fixed_window>::state plain = st;
  EXPECT_FALSE(consume<compound_of<fixed_window>>(cfg, plain, 2 * s).allowed);
  EXPECT_EQ(plain.parts[1].count, 3);
}

// Verifies a bucket sub-limit that admits on its own but is recorded in a
// rejected forced compound: the compound's retry waits for it too.
TEST(Force, CompoundRetryWaitsForARecordedAdmittingBucket) {
  const auto cfg = make_compound(fixed_window::config("1/2s"),
                                 token_bucket::config("2/10s"));  // 5 s/token
  using C = compound<fixed_window, token_bucket>;
  C::state st;
  ASSERT_TRUE(force<C>(cfg, st, 0).allowed);
  const decision d = force<C>(cfg, st, 0);  // the window rejects; the bucket's last token goes
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(std::get<1>(st.parts).deficit, 10'000'000);  // both tokens owed (5e6 ticks each)
  EXPECT_EQ(d.retry_after, microseconds{5 * s});  // the window passes at 2 s, the bucket at 5 s
  C::state probe = st;
  EXPECT_FALSE(consume<C>(cfg, probe, 5 * s - 1).allowed);
  probe = st;
  EXPECT_TRUE(consume<C>(cfg, probe, 5 * s).allowed);
}

// Verifies the sliding log's memory bound under force: however many
// requests are forced past the limit, at most `limit` entries are kept.
TEST(Force, SlidingLogKeepsAtMostLimitEntries) {
  const sliding_window_log::config cfg("5/1h");
  sliding_window_log::state st;
  for (int i = 0; i < 10'000; ++i) {
    (void)force<sliding_window_log>(cfg, st, i, i % 3 == 0 ? 2 : 1);
    ASSERT_LE(st.size(), 5U) << i;
  }
  EXPECT_LE(st.capacity(), 5U);
}

// A brute-force model of one key under consume and force, every recorded
// request kept forever (no trimming, no saturation): the oracle for the
// sliding log's trimming and for the buckets' debt.
class log_model {
 public:
  log_model(units limit, std::int64_t w) : limit_(limit), w_(w) {}
  decision step(std::int64_t now, units cost, bool forced) {
    std::int64_t t = now;
    if (!h_.empty()) t = std::max(t, h_.back().first);
    const auto admits_at = [&](std::int64_t x) { return sum(x) + cost <= limit_; };
    decision d;
    d.limit = limit_;
    d.allowed = admits_at(t);
    if (d.allowed || forced) {
      h_.emplace_back(t, cost);
      d.counted = true;
    }
    d.remaining = std::max<units>(0, limit_ - sum(t));
    if (!d.allowed) {
      d.retry_after = never;
      if (cost <= limit_) {
        std::vector<std::int64_t> xs;
        for (const auto& e : h_) {
          if (e.first + w_ > t) xs.push_back(e.first + w_);
        }
        std::sort(xs.begin(), xs.end());
        for (const std::int64_t x : xs) {
          if (admits_at(x)) {
            d.retry_after = microseconds{x - t};
            break;
          }
        }
      }
    }
    if (!h_.empty())
      d.reset_after = microseconds{std::max<std::int64_t>(0, h_.back().first + w_ - t)};
    return d;
  }

 private:
  units sum(std::int64_t x) const {
    units n = 0;
    for (const auto& e : h_) {
      if (e.first > x - w_ && e.first <= x) n += e.second;
    }
    return n;
  }
  units limit_;
  std::int64_t w_;
  std::vector<std::pair<std::int64_t, units>> h_;
};

/// GCRA with an unbounded TAT: admits iff max(TAT, t) + cT - t <= tolerance.
class gcra_model {
 public:
  gcra_model(std::int64_t interval, units burst) : tv_(interval), burst_(burst) {}
  decision step(std::int64_t t, units cost, bool forced) {
    const std::int64_t tol = burst_ * tv_;
    const auto admits = [&](std::int64_t x, units c) {
      return c <= burst_ && std::max(tat_, x) + c * tv_ - x <= tol;
    };
    decision d;
    d.limit = burst_;
    d.allowed = admits(t, cost);
    if (d.allowed || forced) {
      tat_ = std::max(tat_, t) + cost * tv_;
      d.counted = true;
    }
    if (admits(t, 1)) {
      d.remaining = bisect_first(1, burst_, [&](std::int64_t m) { return !admits(t, m + 1); });
    }
    if (!d.allowed) {
      d.retry_after = never;
      if (cost <= burst_) {
        d.retry_after = microseconds{
            bisect_first(1, std::max<std::int64_t>(1, tat_ - t + 1),
                         [&](std::int64_t dt) { return admits(t + dt, cost); })};
      }
    }
    d.reset_after = microseconds{std::max<std::int64_t>(0, tat_ - t)};
    return d;
  }

 private:
  std::int64_t tv_;
  units burst_;
  std::int64_t tat_ = 0;
};

/// Token bucket in exact fractions (tokens x period), allowed to go negative.
class bucket_model {
 public:
  bucket_model(units limit, std::int64_t period, units burst)
      : limit_(limit), period_(period), burst_(burst), scaled_(burst * period) {}
  decision step(std::int64_t now, units cost, bool forced) {
    std::int64_t t = now;
    if (scaled_ < cap()) t = std::max(t, last_);
    const std::int64_t need = cost * period_;
    decision d;
    d.limit = burst_;
    d.allowed = cost <= burst_ && at(t) >= need;
    if (d.allowed || forced) {
      scaled_ = at(t) - need;
      last_ = t;
      d.counted = true;
    }
    d.remaining = std::max<std::int64_t>(0, at(t)) / period_;
    if (!d.allowed) {
      d.retry_after = never;
      if (cost <= burst_) {
        d.retry_after = microseconds{
            bisect_first(1, far(), [&](std::int64_t dt) { return at(t + dt) >= need; })};
      }
    }
    d.reset_after = microseconds{
        bisect_first(0, far(), [&](std::int64_t dt) { return at(t + dt) >= cap(); })};
    return d;
  }

 private:
  std::int64_t cap() const { return burst_ * period_; }
  /// A wait that certainly refills the bucket from its lowest level.
  std::int64_t far() const { return (cap() - scaled_) / limit_ + 1; }
  std::int64_t at(std::int64_t x) const {
    if (scaled_ >= cap()) return cap();
    return std::min(cap(), scaled_ + (x - last_) * limit_);
  }
  units limit_;
  std::int64_t period_;
  units burst_;
  std::int64_t scaled_;
  std::int64_t last_ = 0;
};

template <class P, class Model>
void against_model(const typename P::config& cfg, Model model, std::uint64_t seed, std::int64_t w) {
  std::mt19937_64 rng(seed);
  typename P::state st;
  std::int64_t t = 0;
  for (int i = 0; i < 300; ++i) {
    const auto r = rng() % 10;
    if (r < 3) t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 3 + 1));
    if (r == 3) t -= static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 2 + 1));
    t = std::max<std::int64_t>(t, 0);
    const units cost = rng() % 6 == 0 ? static_cast<units>(2 + rng() % 4) : 1;
    const bool forced = rng() % 3 != 0;
    const decision got = forced ? P::force(cfg, st, microseconds{t}, cost)
                                : P::step(cfg, st, microseconds{t}, cost);
    const decision want = model.step(t, cost, forced);
    ASSERT_EQ(describe(got), describe(want))
        << P::name << " seed " << seed << " step " << i << " t=" << t << " cost=" << cost
        << " forced=" << forced;
  }
}

// Verifies every decision of the sliding log (trimmed to `limit` entries),
// GCRA and the token bucket against models that keep everything, on random
// mixes of forced and plain checks with time going backwards.
TEST(Force, MatchesUnboundedModels) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const units limit = static_cast<units>(1 + seed % 7);
    const std::int64_t w = 1000 + static_cast<std::int64_t>(seed) * 37;
    against_model<sliding_window_log>(sliding_window_log::config(rate(limit, microseconds{w})),
                                      log_model(limit, w), seed, w);
    const gcra::config g(rate(limit, microseconds{w}));
    against_model<gcra>(g, gcra_model(g.interval_us(), limit), seed, w);
    against_model<token_bucket>(token_bucket::config(rate(limit, microseconds{w})),
                                bucket_model(limit, w, limit), seed, w);
  }
}

// A policy without P::force.
struct plain_policy {
  static constexpr std::string_view name = "plain";
  struct config {
    using policy_type = plain_policy;
    [[nodiscard]] units limit() const noexcept { return 1; }
  };
  struct state {
    int n = 0;
    friend bool operator==(const state&, const state&) = default;
  };
  static decision step(const config&, state& st, timestamp, units) noexcept {
    ++st.n;
    decision d;
    d.allowed = true;
    d.counted = true;
    return d;
  }
  static bool idle(const config&, const state& st, timestamp) noexcept { return st.n == 0; }
};

// Verifies that forcing a policy without P::force is refused with
// std::invalid_argument naming the policy, and records nothing.
TEST(Force, StoreRefusesAPolicyWithoutForce) {
  static_assert(!forcible_policy<plain_policy>);
  static_assert(forcible_policy<gcra> && forcible_policy<compound_of<sliding_window_log>>);
  memory_store<plain_policy> store;
  try {
    (void)store.apply({}, "k", microseconds{0}, 1, access::force);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("plain"), std::string::npos);
  }
  EXPECT_EQ(store.size(), 0U);
}

}  // namespace
