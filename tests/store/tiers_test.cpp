// SPDX-License-Identifier: Apache-2.0
// Tiers in process: a key's config from its tier, tiers changed at runtime,
// the convert-or-start-fresh rule on a change, idleness judged by each key's
// own config, bad input, and changes made while other threads check.
#include "ratelimit/tiers.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "support/tier_trace.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;
using std::chrono::seconds;

constexpr microseconds at(std::int64_t us) {
  return microseconds{us};
}

window_options named(bool count_rejected = false) {
  return window_options{count_rejected, "plans"};
}

bucket_options bucket(std::optional<units> burst = std::nullopt) {
  return bucket_options{burst, "plans"};
}

/// A lookup from a map the test edits (single-threaded tests only).
struct plans {
  std::map<std::string, std::string, std::less<>> of;
  std::string_view operator()(std::string_view key) const { return of.find(key)->second; }
};

// Verifies that each key is decided by its tier's config, looked up per key.
TEST(Tiers, KeyIsDecidedByItsTiersConfig) {
  auto lookup = std::make_shared<plans>();
  lookup->of = {{"alice", "free"}, {"bob", "pro"}};
  tiered_limiter<fixed_window> l({{"free", fixed_window::config{"2/s", named()}},
                                  {"pro", fixed_window::config{"5/s", named()}}},
                                 [lookup](std::string_view k) { return (*lookup)(k); });
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(l.try_acquire("alice", at(10)).allowed);
  const decision a = l.try_acquire("alice", at(10));
  EXPECT_FALSE(a.allowed);
  EXPECT_EQ(a.limit, 2);
  EXPECT_EQ(a.retry_after, at(1'000'000 - 10));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(l.try_acquire("bob", at(10)).allowed);
  EXPECT_FALSE(l.try_acquire("bob", at(10)).allowed);
  // The tier per call overrides the lookup.
  EXPECT_EQ(l.peek("carol", "pro", at(10)).limit, 5);
  EXPECT_EQ(l.config_of("free").limit(), 2);
}

// Verifies that an operator's change applies to the very next check, and
// that a fixed window starts fresh under the new config.
TEST(Tiers, RuntimeChangeAppliesToTheNextCheck) {
  tiered_limiter<fixed_window> l({{"free", fixed_window::config{"2/s", named()}}},
                                 [](std::string_view) { return std::string_view("free"); });
  EXPECT_TRUE(l.try_acquire("k", at(100)).allowed);
  EXPECT_TRUE(l.try_acquire("k", at(100)).allowed);
  EXPECT_FALSE(l.try_acquire("k", at(100)).allowed);
  l.set_tier("free", fixed_window::config{"3/s", named()});
  // Start fresh: the count of 2 under 2/s means nothing under 3/s.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(l.try_acquire("k", at(200)).allowed) << i;
  const decision d = l.try_acquire("k", at(200));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 3);
}

// Verifies that a blocked_cache (as a tiered_limiter on Redis puts in front
// of its store) does not answer a check under a changed tier with the old
// config's cached rejection: same name and limit, another rate (2/1h ->
// 2/1s) must be decided by the store under the new config.
TEST(Tiers, BlockedCacheMissesAfterATierChange) {
  blocked_cache<memory_store<fixed_window>> c;
  const fixed_window::config hour{"2/1h", named()};
  const fixed_window::config second{"2/1s", named()};
  EXPECT_TRUE(c.apply(hour, "k", at(100), 1, access::consume).allowed);
  EXPECT_TRUE(c.apply(hour, "k", at(100), 1, access::consume).allowed);
  ASSERT_FALSE(c.apply(hour, "k", at(100), 1, access::consume).allowed);
  ASSERT_EQ(c.apply(hour, "k", at(200), 1, access::consume).source, decision_source::local_cache);
  const decision d = c.apply(second, "k", at(5'000'000), 1, access::consume);  // second 5, hour 0
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
  // The same for a bucket: burst 2 at 1/1h -> burst 2 at 1/1s.
  blocked_cache<memory_store<gcra>> g;
  const gcra::config slow{"1/1h", bucket_options{.burst = 2, .name = "t"}};
  const gcra::config fast{"1/1s", bucket_options{.burst = 2, .name = "t"}};
  EXPECT_TRUE(g.apply(slow, "k", at(100), 1, access::consume).allowed);
  EXPECT_TRUE(g.apply(slow, "k", at(100), 1, access::consume).allowed);
  ASSERT_FALSE(g.apply(slow, "k", at(100), 1, access::consume).allowed);
  EXPECT_EQ(g.apply(fast, "k", at(102), 1, access::consume).source, decision_source::store);
  // A compound whose binding sub-limit changed rate: every sub-limit counts.
  blocked_cache<memory_store<compound_of<fixed_window>>> m;
  const compound_of<fixed_window>::config before({"2/1h", "5/1d"}, named());
  const compound_of<fixed_window>::config after({"2/1s", "5/1d"}, named());
  EXPECT_TRUE(m.apply(before, "k", at(100), 1, access::consume).allowed);
  EXPECT_TRUE(m.apply(before, "k", at(100), 1, access::consume).allowed);
  ASSERT_FALSE(m.apply(before, "k", at(100), 1, access::consume).allowed);
  EXPECT_EQ(m.apply(after, "k", at(5'000'000), 1, access::consume).source, decision_source::store);
}

// Verifies that a tiered_limiter refuses a plain memory_store<P> inside the
// store wrappers too (it would read one tier's state as another's: a
// bucket's deficit in the old config's ticks), as it refuses it bare.
static_assert(detail::wraps_plain_memory_store<memory_store<token_bucket>, token_bucket>::value);
static_assert(detail::wraps_plain_memory_store<blocked_cache<memory_store<token_bucket>>,
                                               token_bucket>::value);
static_assert(detail::wraps_plain_memory_store<
              observed_store<blocked_cache<memory_store<gcra>>, basic_metrics*>, gcra>::value);
static_assert(
    !detail::wraps_plain_memory_store<memory_store<tiered<token_bucket>>, token_bucket>::value);

// Verifies "start fresh writes only what the new decision records": a
// rejection under the new config leaves the old state, which a change back
// finds as written.
TEST(Tiers, StartFreshKeepsOldStateUntilTheNewConfigRecords) {
  tiered_limiter<fixed_window> l(
      {{"a", fixed_window::config{"2/s", named()}}, {"b", fixed_window::config{"1/s", named()}}},
      {});
  EXPECT_TRUE(l.try_acquire("k", "a", at(0)).allowed);
  // Under b a cost above the limit is rejected: nothing recorded.
  EXPECT_FALSE(l.try_acquire("k", "b", at(1), 2).allowed);
  const decision back = l.try_acquire("k", "a", at(2));
  EXPECT_TRUE(back.allowed);
  EXPECT_EQ(back.remaining, 0);  // a's count of 1 survived
  // Now b records: a's state is replaced.
  EXPECT_TRUE(l.try_acquire("k", "b", at(3)).allowed);
  EXPECT_EQ(l.try_acquire("k", "a", at(4)).remaining, 1);
}

// Verifies that two tiers of one config share state (the fingerprint is
// the config, not the tier), as in Redis.
TEST(Tiers, TiersOfOneConfigShareState) {
  tiered_limiter<token_bucket> l({{"gold", token_bucket::config{"3/s", bucket()}},
                                  {"silver", token_bucket::config{"3/s", bucket()}}},
                                 {});
  EXPECT_TRUE(l.try_acquire("k", "gold", at(0), 2).allowed);
  const decision d = l.try_acquire("k", "silver", at(0));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
}

// Verifies the sliding log's conversion: entries inside the new window stay
// (exactly W' ago has left), then the new limit's trim.
TEST(Tiers, SlidingLogConvertsItsEntries) {
  tiered_limiter<sliding_window_log> l({{"small", sliding_window_log::config{"3/10s", named()}},
                                        {"short", sliding_window_log::config{"3/5s", named()}}},
                                       {});
  EXPECT_TRUE(l.try_acquire("k", "small", at(0)).allowed);
  EXPECT_TRUE(l.try_acquire("k", "small", at(1)).allowed);
  EXPECT_TRUE(l.try_acquire("k", "small", at(5'000'000)).allowed);
  // At t = 5 s + 1 under a 5 s window: the entry at 0 left, the one at 1 is
  // exactly 5 s ago and has left too; the one at 5 s stays.
  const decision d = l.try_acquire("k", "short", at(5'000'001));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
  // Back to 10 s: the dropped entries stay dropped (the log was converted
  // and written back under 3/5s), so two entries are held and one more fits.
  const decision e = l.peek("k", "small", at(5'000'001));
  EXPECT_TRUE(e.allowed);
  EXPECT_EQ(e.remaining, 0);
  EXPECT_EQ(e.reset_after, at(10'000'000));
}

// Verifies that a log idle under the window that wrote it is empty under a
// longer one (as if reclaimed), one microsecond either side of the edge.
TEST(Tiers, SlidingLogIdleUnderItsOwnWindowIsEmpty) {
  for (const std::int64_t t : {1'000'000 + 100 - 1, 1'000'000 + 100}) {
    tiered_limiter<sliding_window_log> l({{"a", sliding_window_log::config{"1/s", named()}},
                                          {"b", sliding_window_log::config{"1/1h", named()}}},
                                         {});
    EXPECT_TRUE(l.try_acquire("k", "a", at(100)).allowed);
    const decision d = l.try_acquire("k", "b", at(t));
    // Still inside a's window: the entry converts into b's and blocks.
    EXPECT_EQ(d.allowed, t == 1'000'000 + 100) << t;
  }
}

// Verifies GCRA's conversion: TAT' = min(TAT, t + burst' x T').
TEST(Tiers, GcraClampsItsTat) {
  tiered_limiter<gcra> l(
      {{"big", gcra::config{"10/s", bucket()}}, {"tiny", gcra::config{"1/s", bucket(2)}}}, {});
  // 10 admissions at t = 0 under T = 100 ms: TAT = 1 s.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(l.try_acquire("k", "big", at(0)).allowed);
  // Under T' = 1 s, burst 2: tolerance 2 s; TAT 1 s <= 0 + 2 s stays.
  // Admitted iff max(TAT, t) + T' - t <= 2 s: 1 s + 1 s - 0 <= 2 s.
  const decision d = l.try_acquire("k", "tiny", at(0));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reset_after, at(2'000'000));
  // Back under "big": TAT 2 s clamps to 0 + 10 x 100 ms = 1 s: full, and a
  // retry is due in exactly 100 ms.
  const decision e = l.try_acquire("k", "big", at(0));
  EXPECT_FALSE(e.allowed);
  EXPECT_EQ(e.retry_after, at(100'000));
  EXPECT_EQ(e.reset_after, at(1'000'000));
}

// Verifies that a peek decides on the converted state but writes nothing.
TEST(Tiers, PeekConvertsWithoutWriting) {
  tiered_limiter<gcra> l(
      {{"a", gcra::config{"10/s", bucket()}}, {"b", gcra::config{"1/s", bucket(1)}}}, {});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(l.try_acquire("k", "a", at(0)).allowed);
  EXPECT_FALSE(l.peek("k", "b", at(0)).allowed);
  // Under a the state is as a wrote it: TAT = 1 s, under a's fingerprint.
  const decision d = l.peek("k", "a", at(0));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reset_after, at(1'000'000));
  const auto s = l.store().state_of("k");
  EXPECT_EQ(s.inner.tat, 1'000'000);
  EXPECT_EQ(s.written_under,
            detail::tier_traits<gcra>::fingerprint(gcra::config{"10/s", bucket()}));
}

// Verifies that the store judges each key idle by the config that wrote it:
// a key of a 1 s window is dropped at 2 s while a key of a 1 h window is kept,
// whichever tier's config the sweep is handed.
TEST(Tiers, SweepJudgesEachKeyByItsOwnConfig) {
  tiered_limiter<fixed_window> l({{"hour", fixed_window::config{"5/1h", named()}},
                                  {"second", fixed_window::config{"5/s", named()}}},
                                 {});
  EXPECT_TRUE(l.try_acquire("long", "hour", at(0)).allowed);
  EXPECT_TRUE(l.try_acquire("short", "second", at(0)).allowed);
  EXPECT_EQ(l.store().size(), 2U);
  EXPECT_EQ(l.sweep(at(999'999)), 0U);
  EXPECT_EQ(l.sweep(at(1'000'000)), 1U);
  EXPECT_EQ(l.store().size(), 1U);
  EXPECT_EQ(l.store().state_of("long").inner.count, 1);
  EXPECT_EQ(l.sweep(at(3'600'000'000 - 1)), 0U);
  EXPECT_EQ(l.sweep(at(3'600'000'000)), 1U);
  // The memory store's own sweep with any tiered config does the same.
  memory_store<tiered<sliding_window_log>> m;
  const tiered<sliding_window_log>::config w1(sliding_window_log::config{"1/s", named()});
  const tiered<sliding_window_log>::config w60(sliding_window_log::config{"1/min", named()});
  (void)m.apply(w60, "a", at(0), 1, access::consume);
  (void)m.apply(w1, "b", at(0), 1, access::consume);
  EXPECT_EQ(m.sweep(w60, at(1'000'000)), 1U);  // b, by its 1 s window
  EXPECT_EQ(m.sweep(w1, at(59'999'999)), 0U);  // not a, though w1 would drop it
  EXPECT_EQ(m.sweep(w1, at(60'000'000)), 1U);
}

// Verifies that the full store's reclaim judges keys by their own config:
// with the caller's 1 h window, the 1 s key would not be idle and the new key
// would be refused.
TEST(Tiers, FullStoreReclaimsByEachKeysConfig) {
  memory_store<tiered<fixed_window>> m(
      memory_store_options{.shards = 1, .max_keys = 2, .on_full = when_full::fail_closed});
  const tiered<fixed_window>::config hour(fixed_window::config{"1/1h", named()});
  const tiered<fixed_window>::config second(fixed_window::config{"1/s", named()});
  EXPECT_TRUE(m.apply(hour, "a", at(0), 1, access::consume).allowed);
  EXPECT_TRUE(m.apply(second, "b", at(0), 1, access::consume).allowed);
  const decision d = m.apply(hour, "c", at(1'000'000), 1, access::consume);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(m.size(), 2U);
  EXPECT_EQ(m.state_of("a").inner.count, 1);
  EXPECT_EQ(m.state_of("b").inner.count, 0);
  // The plain store judges b by the caller's config and refuses c.
  memory_store<fixed_window> plain(
      memory_store_options{.shards = 1, .max_keys = 2, .on_full = when_full::fail_closed});
  (void)plain.apply(hour.inner(), "a", at(0), 1, access::consume);
  (void)plain.apply(second.inner(), "b", at(0), 1, access::consume);
  EXPECT_EQ(plain.apply(hour.inner(), "c", at(1'000'000), 1, access::consume).source,
            decision_source::fail_closed);
}

// Verifies tiered<P>::idle against P::idle under the writer's config, on
// random states of every policy (the traits restate each policy's idle).
template <class P>
class TierIdle : public ::testing::Test {};
using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(TierIdle, policies);

TYPED_TEST(TierIdle, MatchesThePolicysIdleUnderTheWritersConfig) {
  using P = TypeParam;
  std::int64_t compared = 0;
  for (int seed = 0; seed < 60; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) + 5);
    const auto tr = rltest::tiers::random_trace<P>(rng, "");
    std::vector<typename tiered<P>::config> tiers;
    for (const std::size_t c : tr.initial) tiers.emplace_back(tr.configs[c]);
    typename tiered<P>::state s{};
    for (const auto& e : tr.events) {
      if (e.change_to >= 0) {
        tiers[e.tier] = typename tiered<P>::config(
            tr.configs[static_cast<std::size_t>(e.change_to)]);
      }
      (void)tiered<P>::step(tiers[e.tier], s, at(e.t), e.cost);
      if (s.written_under == detail::config_fingerprint{}) continue;
      const auto writer = std::find_if(tr.configs.begin(), tr.configs.end(), [&](const auto& c) {
        return detail::tier_traits<P>::fingerprint(c) == s.written_under;
      });
      ASSERT_NE(writer, tr.configs.end());
      for (const std::int64_t d :
           {std::int64_t{0}, std::int64_t{1}, std::int64_t{999}, std::int64_t{1'000'000},
            std::int64_t{60'000'000}, std::int64_t{3'600'000'000}}) {
        for (const std::int64_t t : {e.t + d, e.t + d - 1}) {
          if (t < 0) continue;
          ASSERT_EQ(tiered<P>::idle(tiers[0], s, at(t)), P::idle(*writer, s.inner, at(t)))
              << "seed " << seed << " t=" << t;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

// Verifies per-tier shadow mode: a tier in shadow admits what its config
// would reject, flags it and records it as admitted (the next peek sees the
// forced count); other tiers are untouched; the flag is switched at run time,
// kept by set_tier(name, cfg) and replaced by set_tier(tier).
TEST(Tiers, ShadowTierAdmitsAndRecordsWhatItWouldReject) {
  tiered_limiter<fixed_window> l({{"free", fixed_window::config{"2/s", named()}, true},
                                  {"pro", fixed_window::config{"2/s", named()}}},
                                 {});
  for (int i = 0; i < 2; ++i) {
    const decision d = l.try_acquire("alice", "free", at(10));
    EXPECT_TRUE(d.allowed);
    EXPECT_FALSE(d.shadow_rejected);
  }
  const decision shadowed = l.try_acquire("alice", "free", at(10));
  EXPECT_TRUE(shadowed.allowed);
  EXPECT_TRUE(shadowed.shadow_rejected);
  EXPECT_TRUE(shadowed.counted);
  EXPECT_EQ(shadowed.remaining, 0);
  EXPECT_EQ(shadowed.retry_after, at(1'000'000 - 10));
  // Recorded as admitted: 3 of 2 used, so a cost of 1 waits for the window.
  const decision peeked = l.peek("alice", "free", at(10));
  EXPECT_FALSE(peeked.allowed);
  EXPECT_FALSE(peeked.shadow_rejected);
  // The other tier rejects for real.
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(l.try_acquire("bob", "pro", at(10)).allowed);
  const decision real = l.try_acquire("bob", "pro", at(10));
  EXPECT_FALSE(real.allowed);
  EXPECT_FALSE(real.shadow_rejected);
  // Shadow off at run time: the next check rejects for real.
  l.set_shadow("free", false);
  EXPECT_FALSE(l.try_acquire("alice", "free", at(20)).allowed);
  l.set_shadow("pro", true);
  EXPECT_TRUE(l.try_acquire("bob", "pro", at(20)).shadow_rejected);
  // set_tier(name, cfg) keeps the flag; set_tier(tier) sets both at once.
  l.set_tier("pro", fixed_window::config{"3/s", named()});
  EXPECT_TRUE(l.tiers().back().shadow);
  l.set_tier(tier<fixed_window>{"pro", fixed_window::config{"3/s", named()}, false});
  EXPECT_FALSE(l.tiers().back().shadow);
  l.set_tier(tier<fixed_window>{"gold", fixed_window::config{"1/s", named()}, true});
  EXPECT_TRUE(l.try_acquire("carol", "gold", at(30)).allowed);
  EXPECT_TRUE(l.try_acquire("carol", "gold", at(30)).shadow_rejected);
  try {
    l.set_shadow("nope", true);
    FAIL() << "set_shadow accepted an unknown tier";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"nope\""), std::string::npos) << e.what();
  }
}

// Verifies that a tier in shadow mode converts another config's state as a
// plain check does, then forces: GCRA's TAT is clamped to the new tolerance,
// and the forced request runs it ahead by one emission interval (the wait it
// reports is measured after recording, as for any forced rejection).
TEST(Tiers, ShadowTierConvertsThenForces) {
  tiered_limiter<gcra> l({{"a", gcra::config{"1/s", bucket(10)}}}, {});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(l.try_acquire("k", "a", at(0)).allowed);
  // TAT = 10 s. Now 1/s with a burst of 1, in shadow: the TAT is clamped to
  // 0 + 1 s, then the forced request runs it to 2 s (11 s without the clamp).
  l.set_tier(tier<gcra>{"a", gcra::config{"1/s", bucket(1)}, true});
  const decision d = l.try_acquire("k", "a", at(0));
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.shadow_rejected);
  EXPECT_EQ(d.retry_after, at(2'000'000));
  l.set_shadow("a", false);
  const decision after = l.try_acquire("k", "a", at(0));
  EXPECT_FALSE(after.allowed);
  EXPECT_EQ(after.retry_after, at(2'000'000));
  EXPECT_TRUE(l.try_acquire("k", "a", at(2'000'000)).allowed);
}

// Verifies bad input: unknown tiers, bad names, configs of another limiter,
// duplicate tiers, removing the default or the last tier, a missing lookup.
TEST(Tiers, BadInputThrowsNamingTheValue) {
  const auto cfg = [](const char* r) { return fixed_window::config{r, named()}; };
  tiered_limiter<fixed_window> l({{"free", cfg("2/s")}, {"pro", cfg("9/s")}},
                                 [](std::string_view k) { return k; });
  try {
    (void)l.try_acquire(std::string_view("gold\n\xff", 6), at(0));
    FAIL() << "unknown tier accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tier \"gold\\x0a\\xff\""), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)l.try_acquire("k", "gold", at(0)), std::invalid_argument);
  EXPECT_THROW((void)l.config_of("gold"), std::invalid_argument);
  EXPECT_THROW(l.set_tier("", cfg("1/s")), std::invalid_argument);
  EXPECT_THROW(l.set_tier("a:b", cfg("1/s")), std::invalid_argument);
  EXPECT_THROW(l.set_tier(std::string(65, 'x'), cfg("1/s")), std::invalid_argument);
  try {
    l.set_tier("gold", fixed_window::config{"1/s", window_options{false, "other"}});
    FAIL() << "config of another limiter accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"other\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(l.remove_tier("gold"), std::invalid_argument);
  l.remove_tier("pro");
  EXPECT_THROW(l.remove_tier("free"), std::invalid_argument);  // the last one
  EXPECT_EQ(l.tiers().size(), 1U);
  // Bad keys and costs as in every limiter; a bad rate as in every config.
  EXPECT_THROW((void)l.try_acquire("", "free", at(0)), std::invalid_argument);
  EXPECT_THROW((void)l.try_acquire("k", "free", at(0), 0), std::invalid_argument);
  EXPECT_THROW((void)l.try_acquire("k", "free", at(-1)), std::invalid_argument);
  EXPECT_THROW(l.set_tier("free", cfg("0/s")), std::invalid_argument);
  // Construction.
  using tl = tiered_limiter<fixed_window>;
  EXPECT_THROW(tl({}, {}), std::invalid_argument);
  EXPECT_THROW(tl({{"a", cfg("1/s")}, {"a", cfg("2/s")}}, {}), std::invalid_argument);
  EXPECT_THROW(tl({{"a", cfg("1/s")}, {"b", fixed_window::config{"1/s"}}}, {}),
               std::invalid_argument);
  EXPECT_THROW(tl({{"a", cfg("1/s")}}, {}, tiered_options{"b"}), std::invalid_argument);
  tl no_lookup({{"a", cfg("1/s")}}, {});
  EXPECT_THROW((void)no_lookup.try_acquire("k", at(0)), std::logic_error);
  EXPECT_TRUE(no_lookup.try_acquire("k", "a", at(0)).allowed);
}

// Verifies the documented default tier: an unknown tier is decided by it,
// and it cannot be removed.
TEST(Tiers, DefaultTierTakesUnknownTiers) {
  tiered_limiter<fixed_window> l(
      {{"free", fixed_window::config{"1/s", named()}},
       {"pro", fixed_window::config{"9/s", named()}}},
      [](std::string_view) { return std::string_view("lapsed"); }, tiered_options{"free"});
  EXPECT_TRUE(l.try_acquire("k", at(0)).allowed);
  const decision d = l.try_acquire("k", at(0));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 1);
  EXPECT_EQ(l.config_of("nonesuch").limit(), 1);
  EXPECT_THROW(l.remove_tier("free"), std::invalid_argument);
  l.set_tier("lapsed", fixed_window::config{"3/s", named()});
  EXPECT_EQ(l.try_acquire("k", at(0)).limit, 3);
}

// Verifies reclamation: however many changes, at most the current snapshot
// is left once they return.
TEST(Tiers, ChangesDoNotGrowMemory) {
  tiered_limiter<gcra> l({{"a", gcra::config{"10/s", bucket()}}}, {});
  EXPECT_EQ(l.table().live_snapshots(), 1U);
  for (int i = 1; i <= 2000; ++i) {
    l.set_tier("a", gcra::config{rate(i, seconds(1)), bucket()});
    if (i % 2 == 0) l.set_tier("b", gcra::config{"1/s", bucket()});
    if (i % 2 == 0) l.remove_tier("b");
    ASSERT_EQ(l.table().live_snapshots(), 1U);
  }
  EXPECT_EQ(l.config_of("a").limit(), 2000);
}

// Verifies runtime changes from one thread while four threads check (run
// under TSan in CI): no check ever sees a half-made table, every snapshot is
// freed, and on one shared key at one instant the sliding log admits exactly
// its limit although its window changes all the time (the entries carry over
// every conversion).
TEST(Tiers, ChangesWhileThreadsCheck) {
  const auto log = [](std::int64_t hours) {
    return sliding_window_log::config{rate(3, std::chrono::hours(hours)), named()};
  };
  tiered_limiter<sliding_window_log> l(
      {{"a", log(1)}, {"b", log(2)}}, [](std::string_view k) { return k.substr(0, 1); },
      tiered_options{"a"});
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> admitted_shared{0};
  std::atomic<std::int64_t> checks{0};
  std::vector<std::thread> checkers;
  for (int th = 0; th < 4; ++th) {
    checkers.emplace_back([&, th] {
      std::int64_t i = 0;
      while (!stop.load(std::memory_order_relaxed) || i < 200) {
        // Every check on the shared key at one instant: nothing leaves any window.
        if (l.try_acquire("a-shared", at(1'000'000)).allowed) admitted_shared.fetch_add(1);
        const std::string mine = (th % 2 == 0 ? "a" : "b") + std::to_string(th) + ":" +
                                 std::to_string(i % 64);
        EXPECT_EQ(l.try_acquire(mine, at(1'000'000 + i)).limit, 3);
        checks.fetch_add(2, std::memory_order_relaxed);
        ++i;
      }
    });
  }
  for (int i = 0; i < 300; ++i) {
    l.set_tier(i % 2 == 0 ? "a" : "b", log(1 + i % 3));
    if (i % 10 == 0) l.set_tier("c", log(4));
    if (i % 10 == 5) l.remove_tier("c");
  }
  stop = true;
  for (auto& t : checkers) t.join();
  EXPECT_EQ(admitted_shared.load(), 3);
  EXPECT_EQ(l.table().live_snapshots(), 1U);
  EXPECT_GE(checks.load(), 1600);
}

}  // namespace
