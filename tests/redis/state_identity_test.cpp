// SPDX-License-Identifier: Apache-2.0
// Verifies that Redis state belongs to the limiter that reads it: limiters are
// named and keyed by name, state written under another config is converted or
// ignored as documented, foreign values are script errors, and the sliding
// log's rebase keeps the log.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using ratelimit_test::reference::describe;
using namespace std::chrono_literals;
using std::chrono::microseconds;

redis::options fresh(std::string_view what,
                     redis::failure_policy p = redis::failure_policy::throw_error) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  o.on_failure = p;
  return o;
}

/// A store whose server does not exist (nothing listens on the port).
redis::options unreachable(redis::failure_policy p) {
  redis::options o;
  o.host = "127.0.0.1";
  o.port = rltest::free_port();
  o.connect_timeout = 100ms;
  o.command_timeout = 100ms;
  o.on_failure = p;
  return o;
}

// ---- names ------------------------------------------------------------------

TEST(LimiterName, BadNamesAreRejectedAtConfigConstruction) {
  for (const std::string& bad :
       std::vector<std::string>{"has space", "a:b", "{x}", "x!", std::string(65, 'a'), "\xc3\xa9",
                                std::string("n\0ul", 4)}) {
    EXPECT_THROW(gcra::config("1/1s", bucket_options{.name = bad}), std::invalid_argument) << bad;
    EXPECT_THROW(fixed_window::config("1/1s", window_options{.name = bad}), std::invalid_argument);
    EXPECT_THROW(compound_of<fixed_window>::config({"1/1s"}, compound_options{bad}),
                 std::invalid_argument);
  }
  const gcra::config ok("1/1s", bucket_options{.name = "api.v2_search-1"});
  EXPECT_EQ(ok.name(), "api.v2_search-1");
  EXPECT_EQ(fixed_window::config("1/1s", window_options{true}).name(), "");
  EXPECT_EQ(
      fixed_window::config("1/1s", window_options{.count_rejected = true, .name = "x"}).name(),
      "x");
  const compound_of<sliding_window_log>::config c({"1/1s", "5/1min"},
                                                  window_options{.name = "logins"});
  EXPECT_EQ(c.name(), "logins");
  const auto mc = make_compound(compound_options{"both"}, gcra::config("1/1s"),
                                fixed_window::config("5/1min"));
  EXPECT_EQ(mc.name(), "both");
}

// Verifies that the Redis store refuses unnamed configs everywhere, and that a
// limiter over it fails at construction rather than at its first check.
TEST(RedisIdentity, UnnamedConfigIsRefused) {
  redis::redis_store store(fresh("unnamed"));
  const gcra::config unnamed("10/1s");
  EXPECT_THROW((void)store.apply(unnamed, "k", microseconds{1}, 1), std::invalid_argument);
  EXPECT_THROW((void)store.apply(unnamed, "k", store_time, 1), std::invalid_argument);
  const redis::batch_item items[] = {{"k", 1, microseconds{1}}};
  EXPECT_THROW((void)store.apply_batch(unnamed, std::span<const redis::batch_item>(items)),
               std::invalid_argument);
  EXPECT_THROW(store.reset(unnamed, "k"), std::invalid_argument);
  using server_limiter = limiter<gcra, redis::redis_store, redis::server_clock>;
  EXPECT_THROW(server_limiter(unnamed, store), std::invalid_argument);
  using cached = limiter<gcra, blocked_cache<redis::redis_store>, redis::server_clock>;
  EXPECT_THROW(cached(unnamed, blocked_cache<redis::redis_store>(store)), std::invalid_argument);
  try {
    server_limiter l(unnamed, store);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(".name = "), std::string::npos) << e.what();
  }
  const compound_of<fixed_window>::config unnamed_compound{"1/1s", "5/1min"};
  EXPECT_THROW((void)store.apply(unnamed_compound, "k", microseconds{1}, 1), std::invalid_argument);
  // In process, no name is needed: a memory_store belongs to one limiter.
  limiter<gcra> local(unnamed);
  EXPECT_TRUE(local.try_acquire("k").allowed);
}

// Verifies that two limiters of one policy and rate on one subscriber
// ("api" and "search") keep separate state, on one store and on two.
TEST(RedisIdentity, TwoNamesNeverShareState) {
  const auto o = fresh("names");
  redis::redis_store store(o);
  const gcra::config api("3/1h", bucket_options{.name = "api"});
  const gcra::config search("3/1h", bucket_options{.name = "search"});
  const microseconds t{1'000'000};
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(store.apply(api, "+1555", t, 1).allowed);
  EXPECT_FALSE(store.apply(api, "+1555", t, 1).allowed);
  redis::redis_store other(o);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(other.apply(search, "+1555", t, 1).allowed) << i;
  EXPECT_NE(store.key_for(api, "+1555"), store.key_for(search, "+1555"));
  EXPECT_EQ(store.key_for(api, "+1555"), o.prefix + "{+1555}:gcra:api");
  EXPECT_EQ(store.keys_for(compound_of<gcra>::config({"1/1s", "2/1s"}, compound_options{"c"}), "u"),
            (std::vector<std::string>{o.prefix + "{u}:compound:c:0:gcra",
                                      o.prefix + "{u}:compound:c:1:gcra"}));
  EXPECT_EQ(store.key_for(api, "}x"),
            o.prefix + "{~" + std::to_string(redis::key_slot("}x")) + "}{}x}:gcra:api!");
}

// Verifies item 14: compound<A, A> and compound_of<A> with equal sub-limits
// (equal config ids) get separate fallback limiters: the second used to get
// the first's memory_store through a static_cast.
TEST(RedisIdentity, FallbackLimitersAreKeyedByTypeNameAndConfig) {
  redis::redis_store store(unreachable(redis::failure_policy::fallback));
  using pair = compound<fixed_window, fixed_window>;
  const pair::config fixed(compound_options{"c"}, fixed_window::config("2/1h"),
                           fixed_window::config("5/1h"));
  const compound_of<fixed_window>::config dynamic({"2/1h", "5/1h"}, compound_options{"c"});
  ASSERT_EQ(redis::detail::config_id(fixed), redis::detail::config_id(dynamic));
  const microseconds t{1'000'000};
  for (int i = 0; i < 3; ++i) {
    const decision a = store.apply(fixed, "k", t, 1);
    const decision b = store.apply(dynamic, "k", t, 1);
    EXPECT_EQ(a.source, decision_source::fallback);
    EXPECT_EQ(b.source, decision_source::fallback);
    EXPECT_EQ(a.allowed, i < 2) << i;
    EXPECT_EQ(b.allowed, i < 2) << i;
  }
  // Two names, one config: two fallback limiters.
  const gcra::config x("1/1h", bucket_options{.name = "x"});
  const gcra::config y("1/1h", bucket_options{.name = "y"});
  EXPECT_TRUE(store.apply(x, "k", t, 1).allowed);
  EXPECT_TRUE(store.apply(y, "k", t, 1).allowed);
  EXPECT_FALSE(store.apply(x, "k", t, 1).allowed);
}

// Verifies that a blocked_cache used directly with two configs of one policy
// and limit never answers one limiter with the other's cached rejection.
TEST(RedisIdentity, BlockedCacheMatchesTheLimiterName) {
  blocked_cache<memory_store<gcra>> cache(memory_store<gcra>{}, blocked_cache_options{});
  const gcra::config a("1/1h", bucket_options{.name = "a"});
  const gcra::config b("1/1h", bucket_options{.name = "b"});
  const microseconds t{1'000'000};
  EXPECT_TRUE(cache.apply(a, "k", t, 1, access::consume).allowed);
  EXPECT_FALSE(cache.apply(a, "k", t, 1, access::consume).allowed);
  EXPECT_EQ(cache.apply(a, "k", t, 1, access::consume).source, decision_source::local_cache);
  // The memory_store is keyed by user key only (it belongs to one limiter),
  // so b is decided by it, never answered from a's cached block.
  EXPECT_EQ(cache.apply(b, "k", t, 1, access::consume).source, decision_source::store);
}

// ---- state written under another config ------------------------------------

struct event {
  std::int64_t t = 0;
  units cost = 1;
  bool peek = false;
};

/// Runs `events` on Redis and on `state` (in process, with P::step), asserting
/// equal decisions.
template <class P>
void run_both(redis::redis_store& store, const typename P::config& cfg, std::string_view key,
              typename P::state& state, const std::vector<event>& events, const std::string& what) {
  for (std::size_t i = 0; i < events.size(); ++i) {
    const event& e = events[i];
    decision want;
    if (e.peek) {
      typename P::state copy = state;
      want = P::step(cfg, copy, microseconds{e.t}, e.cost);
    } else {
      want = P::step(cfg, state, microseconds{e.t}, e.cost);
    }
    const decision got = store.apply(cfg, key, microseconds{e.t}, e.cost,
                                     e.peek ? access::peek : access::consume);
    ASSERT_EQ(describe(got), describe(want))
        << what << " event " << i << " t=" << e.t << " cost=" << e.cost << " peek=" << e.peek;
  }
}

/// The in-process state a config change leaves, per policy (see
/// docs/semantics.md): the log keeps the entries the new window holds, trimmed
/// as the new limit would (none if it was idle under the old window); GCRA
/// clamps TAT to t + burst' x T'; the others start fresh. `t` is the time of
/// the first check after the change.
template <class P>
typename P::state converted(const typename P::state& old, const typename P::config& old_cfg,
                            const typename P::config& cfg, std::int64_t t) {
  if constexpr (std::is_same_v<P, gcra>) {
    gcra::state s{std::min(old.tat, t + cfg.tolerance_us())};
    if (s.tat <= t) s = gcra::state{};
    return s;
  } else if constexpr (std::is_same_v<P, sliding_window_log>) {
    if (!old.empty()) t = std::max(t, old.back().ts);
    sliding_window_log::state s;
    if (sliding_window_log::idle(old_cfg, old, microseconds{t})) return s;
    // Room for every old entry while building; trim then keeps at most limit.
    const std::size_t max_entries = std::max(old.size(), static_cast<std::size_t>(cfg.limit()));
    for (std::size_t i = 0; i < old.size(); ++i) {
      if (old.at(i).ts > t - cfg.period_us()) s.push_back(old.at(i).ts, old.cost(i), max_entries);
    }
    sliding_window_log::trim(s, cfg.limit());
    return s;
  } else {
    (void)old_cfg;
    return typename P::state{};
  }
}

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

template <class P>
typename P::config random_config(std::mt19937_64& rng) {
  for (;;) {
    try {
      const units limit = uniform(rng, 1, 12);
      const std::int64_t period = std::vector<std::int64_t>{
          10, 1000, 999'983, 1'000'000, 60'000'000}[static_cast<std::size_t>(uniform(rng, 0, 4))];
      const rate r(limit, microseconds{period});
      if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
        bucket_options o;
        o.name = "same";
        if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 2 * limit + 3);
        return typename P::config(r, o);
      } else {
        return typename P::config(r, window_options{uniform(rng, 0, 2) == 0, "same"});
      }
    } catch (const std::invalid_argument&) {
      // GCRA faster than 1/us: draw again
    }
  }
}

std::vector<event> random_events(std::mt19937_64& rng, std::int64_t& t, std::int64_t period,
                                 units limit) {
  std::vector<event> out;
  const auto n = uniform(rng, 5, 40);
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 5)) {
      case 0: break;
      case 1: t += uniform(rng, 1, 5); break;
      case 2: t += uniform(rng, 0, period); break;
      case 3: t -= uniform(rng, 0, period); break;
      default: t += uniform(rng, 0, std::max<std::int64_t>(1, period / limit)); break;
    }
    t = std::max<std::int64_t>(t, 1);
    out.push_back(
        {t, uniform(rng, 0, 4) == 0 ? uniform(rng, 1, limit + 1) : 1, uniform(rng, 0, 9) == 0});
  }
  return out;
}

template <class P>
class RedisConfigChange : public ::testing::Test {};
using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(RedisConfigChange, policies);

// Verifies that after a config change on the same named key, every decision
// on Redis is the one an in-process limiter with the new config makes on the
// state the change leaves (fresh, or converted for the log and GCRA), and that
// switching back and forth (a rolling deploy) keeps that true each time.
TYPED_TEST(RedisConfigChange, DecisionsAfterAChangeAreThoseOfTheNewConfig) {
  using P = TypeParam;
  redis::redis_store store(fresh(std::string("change-") + std::string(P::name)));
  for (int seed = 0; seed < 150; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 31u + 7u);
    const std::string key = "k" + std::to_string(seed);
    std::int64_t t = uniform(rng, 1, 1'000'000'000);
    typename P::config cfg = random_config<P>(rng);
    typename P::config old_cfg = cfg;
    typename P::state state{};
    bool changed = false;
    for (int phase = 0; phase < 4; ++phase) {
      auto events = random_events(rng, t, cfg.get_rate().period().count(), cfg.limit());
      if (phase > 0) {
        // The first check after a change is a consume: it converts the state
        // (a peek decides on the converted state without writing it).
        events.front().peek = false;
        if (changed) state = converted<P>(state, old_cfg, cfg, events.front().t);
      }
      run_both<P>(store, cfg, key, state, events,
                  "seed " + std::to_string(seed) + " phase " + std::to_string(phase) + " config " +
                      redis::detail::config_id(cfg));
      if (::testing::Test::HasFatalFailure()) return;
      const typename P::config next = random_config<P>(rng);
      changed = redis::detail::config_id(next) != redis::detail::config_id(cfg);
      old_cfg = cfg;
      cfg = next;
    }
  }
}

// Verifies two changes a deploy makes: a token bucket 3/s that becomes 100/s, a
// fixed window 10/s that becomes 10/min (both start fresh), and a GCRA whose
// burst shrinks (TAT clamped to what the new config can hold).
TEST(RedisConfigChange, IssueExamples) {
  redis::redis_store store(fresh("examples"));
  const microseconds t{1'000'000'000};

  const token_bucket::config slow("3/1s", bucket_options{.name = "calls"});
  const token_bucket::config fast("100/1s", bucket_options{.name = "calls"});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(store.apply(slow, "a", t, 1).allowed);
  const decision d = store.apply(fast, "a", t + 1ms, 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 99);
  EXPECT_EQ(d.retry_after, 0us);

  const fixed_window::config per_second("10/1s", window_options{.name = "calls"});
  const fixed_window::config per_minute("10/1min", window_options{.name = "calls"});
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(store.apply(per_second, "b", t, 1).allowed);
  const decision f = store.apply(per_minute, "b", t + 1s, 1);
  EXPECT_TRUE(f.allowed) << describe(f);
  EXPECT_EQ(f.remaining, 9);

  const gcra::config wide("100/1s", bucket_options{.burst = 100, .name = "calls"});
  const gcra::config narrow("100/1s", bucket_options{.burst = 2, .name = "calls"});
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(store.apply(wide, "c", t, 1).allowed);
  // TAT was t + 1 s; narrow holds at most 2 x 10 ms of debt: 20 ms from now.
  const decision g = store.apply(narrow, "c", t, 1);
  EXPECT_FALSE(g.allowed);
  EXPECT_EQ(g.retry_after, 10ms);
  EXPECT_EQ(g.reset_after, 20ms);
  EXPECT_TRUE(store.apply(narrow, "c", t + 10ms, 1).allowed);
}

// Verifies that reordering a compound's sub-limits is a config change for
// each sub-key: decisions after it are those of a fresh compound.
TEST(RedisConfigChange, CompoundReorderStartsEachMovedSubLimitFresh) {
  redis::redis_store store(fresh("reorder"));
  using C = compound_of<fixed_window>;
  const C::config before({"3/1s", "100/1min"}, compound_options{"calls"});
  const C::config after({"100/1min", "3/1s"}, compound_options{"calls"});
  const microseconds t{1'000'000'000};
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(store.apply(before, "u", t, 1).allowed);
  EXPECT_FALSE(store.apply(before, "u", t, 1).allowed);
  memory_store<C> fresh_after;
  for (int i = 0; i < 5; ++i) {
    const microseconds at = t + microseconds{i * 100};
    EXPECT_EQ(describe(store.apply(after, "u", at, 1)),
              describe(fresh_after.apply(after, "u", at, 1, access::consume)))
        << i;
  }
  // And a compound of converting policies keeps each sub-limit's state
  // when its own config is unchanged.
  using G = compound_of<gcra>;
  const G::config g1({"2/1h", "5/1h"}, compound_options{"g"});
  const G::config g2({"2/1h", "7/1h"}, compound_options{"g"});
  EXPECT_TRUE(store.apply(g1, "v", t, 1).allowed);
  EXPECT_TRUE(store.apply(g1, "v", t, 1).allowed);
  EXPECT_FALSE(store.apply(g2, "v", t, 1).allowed);
}

// ---- item 7: the sliding log's rebase ------------------------------------------

// Verifies that a rebase of running totals past 2^52 keeps every entry of a
// long log (the script used to DEL the list and then read entries it had not
// read yet: an error after the DEL, so the limit was bypassed), deciding as
// the in-process store does.
TEST(RedisLogRebase, LongLogPastTwoToThe52MatchesMemoryStore) {
  const auto o = fresh("rebase");
  redis::redis_store store(o);
  const sliding_window_log::config cfg(rate(max_units, std::chrono::hours(1)),
                                       window_options{.name = "bytes"});
  memory_store<sliding_window_log> memory;
  std::int64_t t = 1'000'000;
  const auto both = [&](units cost, const std::string& what) {
    const auto want = memory.apply(cfg, "k", microseconds{t}, cost, access::consume);
    const auto got = store.apply(cfg, "k", microseconds{t}, cost, access::consume);
    ASSERT_EQ(describe(got), describe(want)) << what << " t=" << t;
  };
  // Running totals to 2^52 - 100: 2^49 each half hour, so the window always
  // holds the previous entry (an emptied log would restart its totals at 0).
  for (int i = 0; i < 8; ++i) {
    t += 1'800'000'000;
    both(i < 7 ? max_units / 2 : max_units / 2 - 100, "big " + std::to_string(i));
  }
  const std::int64_t last_big = t;
  // Thirty entries in one window, most never read by the bisections...
  t += 1'800'000'000;
  for (int i = 0; i < 30; ++i) {
    both(1, "small " + std::to_string(i));
    t += 1;
  }
  // ...then the push that rebases.
  both(100, "rebase");
  const std::string key = store.key_for(cfg, "k");
  EXPECT_EQ(rltest::command(o, {"LLEN", key})->integer, 33);  // header, the last big, 31 more
  // Rebased: the oldest entry's running total is its own cost again.
  const auto oldest = rltest::command(o, {"LINDEX", key, "1"});
  EXPECT_EQ(std::string(oldest->str, oldest->len), std::to_string(last_big) + ":" +
                                                       std::to_string(max_units / 2 - 100) + ":" +
                                                       std::to_string(max_units / 2 - 100));
  for (int i = 0; i < 20; ++i) {
    t += 7;
    both(i % 2 == 0 ? max_units / 4 : 3, "after " + std::to_string(i));
  }
}

/// Calls of `command` the server counted (INFO commandstats), scripts' included.
std::int64_t calls_of(const redis::options& o, const std::string& command) {
  const auto r = rltest::command(o, {"INFO", "commandstats"});
  const std::string info(r->str, r->len);
  const std::string tag = "cmdstat_" + command + ":calls=";
  const auto at = info.find(tag);
  return at == std::string::npos ? 0 : std::stoll(info.substr(at + tag.size()));
}

// Verifies that trimming a long log (a config change to a much smaller
// limit) reads O(log n) entries, not one per entry dropped: the script popped
// one entry at a time, each read with LINDEX, which on a log of a few 100 000
// entries blocks Redis, every other limiter included, for seconds. The
// decision is the in-process one on the converted log.
TEST(RedisLogRebase, TrimAfterAChangeReadsFewEntries) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("trim");
  redis::redis_store store(o);
  constexpr int n = 20'000;
  const sliding_window_log::config wide(rate(n, std::chrono::hours(1)),
                                        window_options{.name = "trim"});
  const sliding_window_log::config narrow(rate(2, std::chrono::hours(1)),
                                          window_options{.name = "trim"});
  const std::int64_t t0 = 1'000'000'000;
  sliding_window_log::state state{};
  const std::string key = store.key_for(wide, "u");
  std::vector<std::string> list{
      "RPUSH", key, "#" + std::to_string(wide.period_us()) + "," + std::to_string(n) + ",0"};
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(sliding_window_log::step(wide, state, microseconds{t0 + i}, 1).allowed);
    list.push_back(std::to_string(t0 + i) + ":1:" + std::to_string(i + 1));
  }
  {
    std::vector<std::string_view> args(list.begin(), list.end());
    redis::connection c(o);
    ASSERT_EQ(c.command(args.data(), args.size(), redis::deadline_clock::now() + 10s)->integer,
              n + 1);
  }
  // The log as the store wrote it: a check under `wide` agrees with step().
  {
    sliding_window_log::state copy = state;
    EXPECT_EQ(describe(store.apply(wide, "u", microseconds{t0 + n}, 1, access::peek)),
              describe(sliding_window_log::step(wide, copy, microseconds{t0 + n}, 1)));
  }
  const std::int64_t t = t0 + n + 5;
  const std::int64_t before = calls_of(o, "lindex");
  const decision got = store.apply(narrow, "u", microseconds{t}, 1);
  const std::int64_t reads = calls_of(o, "lindex") - before;
  sliding_window_log::state converted_state = converted<sliding_window_log>(state, wide, narrow, t);
  EXPECT_EQ(describe(got),
            describe(sliding_window_log::step(narrow, converted_state, microseconds{t}, 1)));
  EXPECT_LT(reads, 200) << "LINDEX calls for one check";
  EXPECT_EQ(rltest::command(o, {"LLEN", key})->integer, 3);  // the header and two entries
}

// ---- item 8: values the script did not write -----------------------------------

/// A fresh Redis key's raw value (DUMP), for "unchanged" checks.
std::string dump(const redis::options& o, const std::string& key) {
  auto r = rltest::command(o, {"DUMP", key});
  return r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string("(none)");
}

/// Checks `key` under both failure policies and asserts a script error,
/// never a decision, and the key left as it was.
template <class Config>
void expect_refused(const redis::options& o, const Config& cfg, const std::string& user,
                    const std::string& what) {
  redis::redis_store thrower(o);
  auto closed_opts = o;
  closed_opts.on_failure = redis::failure_policy::fail_closed;
  redis::redis_store closed(closed_opts);
  const std::string key = thrower.key_for(cfg, user);
  const std::string before = dump(o, key);
  try {
    (void)thrower.apply(cfg, user, microseconds{2'000'000'000}, 1);
    ADD_FAILURE() << what << ": decided";
  } catch (const redis::script_error& e) {
    // Redis's own WRONGTYPE for a key of another type; ours names the key.
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("WRONGTYPE") != std::string::npos ||
                msg.find("foreign or corrupt state in " + key) != std::string::npos)
        << what << ": " << msg;
  }
  EXPECT_THROW((void)thrower.apply(cfg, user, store_time, 1, access::peek), redis::script_error)
      << what;
  const decision d = closed.apply(cfg, user, microseconds{2'000'000'000}, 1);
  EXPECT_EQ(d.source, decision_source::fail_closed) << what << " " << describe(d);
  EXPECT_EQ(dump(o, key), before) << what;
}

const std::vector<std::string>& bad_numbers() {
  static const std::vector<std::string> v = {
      "1e300", "nan", "inf", "-inf", "99999999999999999999999", "-5", "abc", "", "0x10",
      " 5",    "5 ",  "1.5", "+3"};
  return v;
}

/// Every way of spoiling one field of a state string "<f>:<f>...;<fp>".
std::vector<std::string> spoiled(const std::string& good) {
  std::vector<std::string> out = {"abc", "", "1e300", "nan", "-5", "99999999999999999999999"};
  const auto sep = good.find(';');
  const std::string body = good.substr(0, sep);
  const std::string fp = good.substr(sep + 1);
  std::vector<std::string> fields;
  std::stringstream ss(body);
  for (std::string f; std::getline(ss, f, ':');) fields.push_back(f);
  for (std::size_t i = 0; i < fields.size(); ++i) {
    for (const std::string& b : bad_numbers()) {
      std::string v;
      for (std::size_t j = 0; j < fields.size(); ++j) {
        if (j > 0) v += ':';
        v += j == i ? b : fields[j];
      }
      out.push_back(v + ";" + fp);
    }
  }
  out.push_back(body);                       // no fingerprint
  out.push_back(body + ";");                 // empty fingerprint
  out.push_back(body + ";x");                // foreign fingerprint
  out.push_back(body + ";" + fp + ",");      // a fingerprint with an empty field
  out.push_back(body + ":7;" + fp);          // one field too many
  out.push_back(fields.front() + ";" + fp);  // too few (all but GCRA)
  return out;
}

template <class P>
class RedisForeignValue : public ::testing::Test {};
using string_policies = ::testing::Types<fixed_window, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(RedisForeignValue, string_policies);

// Verifies that a foreign, corrupt or wrong-typed value in a policy's key is
// answered by the failure policy (script_error under throw_error, a
// fail_closed decision under fail_closed) and left untouched, never decided.
TYPED_TEST(RedisForeignValue, IsAScriptErrorAndLeftUntouched) {
  using P = TypeParam;
  const auto o = fresh(std::string("foreign-") + std::string(P::name));
  typename P::config cfg = [] {
    if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
      return typename P::config("10/1s", bucket_options{.name = "f"});
    } else {
      return typename P::config("10/1s", window_options{.name = "f"});
    }
  }();
  redis::redis_store store(o);
  (void)store.apply(cfg, "good", microseconds{2'000'000'000}, 1);
  const std::string key = store.key_for(cfg, "good");
  const auto good = rltest::command(o, {"GET", key});
  ASSERT_EQ(good->type, REDIS_REPLY_STRING);
  const std::string value(good->str, good->len);
  const std::string target = store.key_for(cfg, "bad");
  for (const std::string& v : spoiled(value)) {
    if (v == value) continue;  // "too few fields" is GCRA's one field
    rltest::command(o, {"SET", target, v});
    expect_refused(o, cfg, "bad", "value \"" + v + "\"");
  }
  rltest::command(o, {"DEL", target});
  rltest::command(o, {"RPUSH", target, "1", "2"});
  expect_refused(o, cfg, "bad", "a list");
  rltest::command(o, {"DEL", target});
  rltest::command(o, {"HSET", target, "tat", "5"});
  expect_refused(o, cfg, "bad", "a hash");
}

// Verifies the same for the sliding log's list: a bad header, entries that
// are not "<ts>:<cost>:<total>" integers in range, and keys of other types.
TEST(RedisForeignValue, SlidingLogIsAScriptErrorAndLeftUntouched) {
  const auto o = fresh("foreign-log");
  const sliding_window_log::config cfg("10/1s", window_options{.name = "f"});
  redis::redis_store store(o);
  (void)store.apply(cfg, "good", microseconds{1'999'999'000}, 1);
  const std::string key = store.key_for(cfg, "good");
  const auto header_reply = rltest::command(o, {"LINDEX", key, "0"});
  const std::string header(header_reply->str, header_reply->len);
  const std::string target = store.key_for(cfg, "bad");
  const auto with = [&](std::initializer_list<std::string_view> elems, const std::string& what) {
    rltest::command(o, {"DEL", target});
    std::vector<std::string_view> args{"RPUSH", target};
    args.insert(args.end(), elems.begin(), elems.end());
    redis::connection c(o);
    (void)c.command(args.data(), args.size(), redis::deadline_clock::now() + 5s);
    expect_refused(o, cfg, "bad", what);
  };
  with({header}, "header alone");
  with({"#x", "1999999000:1:1"}, "bad header");
  with({"1999999000:1:1"}, "no header");
  for (const std::string& b : bad_numbers()) {
    const std::string e1 = b + ":1:1", e2 = "1999999000:" + b + ":5", e3 = "1999999000:1:" + b;
    with({header, e1}, "entry " + e1);
    with({header, e2}, "entry " + e2);
    with({header, e3}, "entry " + e3);
  }
  with({header, "1999999000:5:3"}, "cost above its running total");
  with({header, "1999999000:1"}, "two fields");
  with({header, "1999999000:1:100", "1999999000:1:1"}, "running totals going down");
  with({header, "1999999000:1:1", "1999999000:1:1"}, "a running total that does not grow");
  with({header, "1999999000:1:5", "1999999000:1:9"}, "a running total grown by more than the cost");
  with({header, "1999999500:1:1", "1999999000:1:2"}, "times going down");
  rltest::command(o, {"DEL", target});
  rltest::command(o, {"SET", target, "1:1:1"});
  expect_refused(o, cfg, "bad", "a string");
}

// ---- a peek under another config ---------------------------------------------

template <class P>
typename P::config named_config(std::string_view r) {
  if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
    return typename P::config(r, bucket_options{.name = "peek"});
  } else {
    return typename P::config(r, window_options{.name = "peek"});
  }
}

/// The value and the absolute expiry of every key of `keys`.
std::string snapshot(const redis::options& o, const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) {
    const auto at = rltest::command(o, {"PEXPIRETIME", k});
    out += dump(o, k) + "@" + std::to_string(at->integer) + ";";
  }
  return out;
}

template <class P>
class RedisPeekAfterChange : public ::testing::Test {};
TYPED_TEST_SUITE(RedisPeekAfterChange, policies);

// Verifies that a peek under a new config writes nothing (neither the
// converted state of the log and GCRA nor a fresh one), while a consume under
// it does write: the state and its expiry stay as the old config left them.
TYPED_TEST(RedisPeekAfterChange, WritesNothing) {
  using P = TypeParam;
  const auto o = fresh(std::string("peek-") + std::string(P::name));
  redis::redis_store store(o);
  const auto before_cfg = named_config<P>("5/1s");
  const auto after_cfg = named_config<P>("3/2s");
  const microseconds t{3'000'000'000};
  for (int i = 0; i < 3; ++i) (void)store.apply(before_cfg, "u", t + microseconds{i}, 1);
  const std::vector<std::string> keys{store.key_for(before_cfg, "u")};
  const std::string left = snapshot(o, keys);
  const decision peeked = store.apply(after_cfg, "u", t + 10ms, 1, access::peek);
  EXPECT_EQ(peeked.source, decision_source::store);
  EXPECT_EQ(snapshot(o, keys), left);
  (void)store.apply(after_cfg, "u", t + 10ms, 1, access::consume);
  EXPECT_NE(snapshot(o, keys), left) << "a consume under the new config should write";
}

// Verifies the same for a compound whose sub-limits all changed.
TEST(RedisPeekAfterChange, CompoundWritesNothing) {
  const auto o = fresh("peek-compound");
  redis::redis_store store(o);
  using C = compound<sliding_window_log, gcra>;
  const C::config before_cfg(compound_options{"peek"}, sliding_window_log::config("5/1s"),
                             gcra::config("5/1s"));
  const C::config after_cfg(compound_options{"peek"}, sliding_window_log::config("3/2s"),
                            gcra::config("3/2s"));
  const microseconds t{3'000'000'000};
  for (int i = 0; i < 3; ++i) (void)store.apply(before_cfg, "u", t + microseconds{i}, 1);
  const std::vector<std::string> keys = store.keys_for(before_cfg, "u");
  ASSERT_EQ(keys.size(), 2u);
  ASSERT_EQ(rltest::command(o, {"EXISTS", keys[0], keys[1]})->integer, 2);
  const std::string left = snapshot(o, keys);
  (void)store.apply(after_cfg, "u", t + 10ms, 1, access::peek);
  EXPECT_EQ(snapshot(o, keys), left);
  (void)store.apply(after_cfg, "u", t + 10ms, 1, access::consume);
  EXPECT_NE(snapshot(o, keys), left);
}

// ---- parse_reply ------------------------------------------------------------------

// Verifies that a reply no script of this library gives is a script_error.
TEST(RedisParseReply, RejectsOutOfRangeReplies) {
  const gcra::config cfg("10/1s", bucket_options{.name = "p"});
  const auto parse = [&](std::vector<long long> v) {
    std::vector<redisReply> elems(v.size());
    std::vector<redisReply*> ptrs;
    for (std::size_t i = 0; i < v.size(); ++i) {
      elems[i] = redisReply{};
      elems[i].type = REDIS_REPLY_INTEGER;
      elems[i].integer = v[i];
      ptrs.push_back(&elems[i]);
    }
    redisReply arr{};
    arr.type = REDIS_REPLY_ARRAY;
    arr.elements = v.size();
    arr.element = ptrs.data();
    return redis::detail::parse_reply(cfg, arr);
  };
  EXPECT_NO_THROW((void)parse({1, 1, 9, 0, 100000}));
  EXPECT_NO_THROW((void)parse({0, 0, 0, -1, 0}));
  EXPECT_NO_THROW((void)parse({0, 0, 0, 5, 7, 3}));
  for (const auto& bad : std::vector<std::vector<long long>>{{2, 1, 9, 0, 0},
                                                             {1, 0, 9, 0, 0},
                                                             {1, 1, -1, 0, 0},
                                                             {1, 1, 11, 0, 0},
                                                             {1, 1, 9, 5, 0},
                                                             {0, 0, 0, -2, 0},
                                                             {0, 0, 0, 0, 0},
                                                             {0, 1, 0, 0, 5},
                                                             {0, 0, 0, 0, -1},
                                                             {0, 0, 0, 0, 0, 0},
                                                             {0, 0, 4, 0, 0, 3}}) {
    EXPECT_THROW((void)parse(bad), redis::script_error) << ::testing::PrintToString(bad);
  }
}

}  // namespace
