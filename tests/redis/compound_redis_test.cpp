// SPDX-License-Identifier: Apache-2.0
// Verifies the compound Lua script: identical decisions to the in-process
// compound on random traces (the script alone and through redis_store, one
// check at a time and in batches), reset deleting every sub-key, exact
// admission under concurrency, and a TTL on every key within its own
// sub-limit's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/policy/compound.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "ratelimit/redis/scripts/compound.hpp"
#include "redis_server.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

/// Runs the compound script the way a store does: every sub-limit's key in
/// KEYS, EVALSHA with one EVAL on NOSCRIPT, the six-element reply.
/// Thread safety: one thread at a time (one connection).
class script_driver {
 public:
  explicit script_driver(redis::options o) : opts_(std::move(o)), conn_(opts_) {}

  template <class Config>
  [[nodiscard]] std::vector<std::string> keys(const Config& cfg, std::string_view key) const {
    using P = typename Config::policy_type;
    std::vector<std::string> out;
    redis::script_for<P>::append_keys(
        cfg, opts_.prefix + "{" + std::string(key) + "}:compound:" + cfg.name(), out);
    return out;
  }

  /// @param now the caller's time, or none for the server's TIME
  template <class Config>
  decision apply(const Config& cfg, std::string_view key, std::optional<timestamp> now, units cost,
                 ratelimit::access a = ratelimit::access::consume) {
    using P = typename Config::policy_type;
    const std::vector<std::string> ks = keys(cfg, key);
    std::vector<std::string> policy_args;
    redis::script_for<P>::append_args(cfg, policy_args);
    const std::string nkeys = std::to_string(ks.size());
    const std::string time = now ? std::to_string(now->count()) : std::string();
    const std::string cost_s = std::to_string(cost);
    const std::string floor = now ? std::to_string(opts_.caller_time_ttl_floor.count()) : "0";
    const std::string& sha = redis::detail::script_sha<P>();
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<std::string_view> args{
          attempt == 0 ? std::string_view("EVALSHA") : std::string_view("EVAL"),
          attempt == 0 ? std::string_view(sha) : redis::script_for<P>::text, nkeys};
      for (const std::string& k : ks) args.emplace_back(k);
      args.emplace_back(time);
      args.emplace_back(cost_s);
      args.emplace_back(a == ratelimit::access::peek ? "1"
                                                     : (a == ratelimit::access::force ? "2" : "0"));
      args.emplace_back(floor);
      for (const std::string& p : policy_args) args.emplace_back(p);
      const redis::reply_ptr r = conn_.command(
          args.data(), args.size(), redis::deadline_clock::now() + std::chrono::seconds(5));
      if (redis::detail::is_noscript(*r)) continue;
      return parse(*r);
    }
    throw std::runtime_error("NOSCRIPT after EVAL");
  }

  template <class Config>
  void reset(const Config& cfg, std::string_view key) {
    std::vector<std::string_view> args{"DEL"};
    const std::vector<std::string> ks = keys(cfg, key);
    for (const std::string& k : ks) args.emplace_back(k);
    (void)conn_.command(args.data(), args.size(),
                        redis::deadline_clock::now() + std::chrono::seconds(5));
  }

 private:
  static decision parse(const redisReply& r) {
    if (r.type == REDIS_REPLY_ERROR) throw std::runtime_error(std::string(r.str, r.len));
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 6) throw std::runtime_error("bad reply");
    long long v[6];
    for (std::size_t i = 0; i < 6; ++i) v[i] = r.element[i]->integer;
    decision d;
    d.allowed = v[0] != 0;
    d.counted = v[1] != 0;
    d.remaining = static_cast<units>(v[2]);
    d.retry_after = v[3] < 0 ? never : microseconds{v[3]};
    d.reset_after = v[4] < 0 ? never : microseconds{v[4]};
    d.limit = static_cast<units>(v[5]);
    return d;
  }

  redis::options opts_;
  redis::connection conn_;
};

std::string describe(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted << " source=" << to_string(d.source)
    << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == never ? -1 : d.retry_after.count())
    << " reset_after=" << (d.reset_after == never ? -1 : d.reset_after.count()) << "}";
  return o.str();
}

int traces_per_type() {
  return rltest::diff_traces(500);
}

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

/// Small limits and periods that overlap, so sub-limits take turns binding.
rate random_rate(std::mt19937_64& rng) {
  static constexpr std::int64_t limits[] = {1, 2, 3, 4, 5, 7, 10, 16};
  static constexpr std::int64_t periods[] = {1, 7, 64, 1000, 999'983, 1'000'000, 60'000'000};
  const auto l = limits[uniform(rng, 0, 7)];
  auto p = periods[uniform(rng, 0, 6)];
  if (uniform(rng, 0, 3) == 0) p = uniform(rng, 1, 5'000'000);
  return rate(l, microseconds{p});
}

template <class P>
typename P::config random_part(std::mt19937_64& rng) {
  for (;;) {
    try {
      const rate r = random_rate(rng);
      if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
        bucket_options o;
        o.name = "t";
        if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 2 * r.limit() + 3);
        return typename P::config(r, o);
      } else {
        return typename P::config(r, window_options{uniform(rng, 0, 1) == 0, "t"});
      }
    } catch (const std::invalid_argument&) {
      // e.g. GCRA faster than 1/us: draw again
    }
  }
}

template <class C>
struct random_config;

template <policy P>
struct random_config<compound_of<P>> {
  static typename compound_of<P>::config make(std::mt19937_64& rng) {
    std::vector<typename P::config> parts;
    const auto n = uniform(rng, 1, 3);
    for (std::int64_t i = 0; i < n; ++i) parts.push_back(random_part<P>(rng));
    return typename compound_of<P>::config(std::move(parts), compound_options{"t"});
  }
};

template <policy... Ps>
struct random_config<compound<Ps...>> {
  static typename compound<Ps...>::config make(std::mt19937_64& rng) {
    // Braced lists evaluate left to right: a seed gives one config.
    return std::apply(
        [](auto... p) {
          return typename compound<Ps...>::config(compound_options{"t"}, std::move(p)...);
        },
        std::tuple<typename Ps::config...>{random_part<Ps>(rng)...});
  }
};

struct event {
  std::string key;
  std::int64_t t = 0;
  units cost = 1;
  enum kind_t { consume, peek, reset, force } kind = consume;
};

// The access of an event: forced checks (shadow mode) are part of the traces.
ratelimit::access access_of(event::kind_t k) {
  return k == event::peek    ? ratelimit::access::peek
         : k == event::force ? ratelimit::access::force
                             : ratelimit::access::consume;
}

std::vector<event> random_trace(std::mt19937_64& rng, units smallest, std::int64_t w) {
  const std::vector<std::string> keys = {"+15551234567", std::string("a\0}{b", 5)};
  const auto nkeys = static_cast<std::size_t>(uniform(rng, 1, 2));
  std::int64_t t = uniform(rng, 0, 1) == 0 ? uniform(rng, 0, 3 * w)
                                           : 1'732'950'000'000'000 + uniform(rng, 0, 1'000'000'000);
  const auto n = uniform(rng, 20, 80);
  std::vector<event> trace;
  // Forced checks: none, some or most of the trace.
  const std::int64_t forced_share = uniform(rng, 0, 2) * 30;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 9)) {
      case 0:
      case 1: break;
      case 2:
      case 3: t += uniform(rng, 1, 3); break;
      case 4: t += uniform(rng, 1, std::max<std::int64_t>(1, w / 4)); break;
      case 5: t += uniform(rng, 0, w); break;
      case 6: t += uniform(rng, 0, 3 * w); break;
      case 7: t -= uniform(rng, 0, 2 * w); break;  // time going backwards
      default: t += uniform(rng, 0, 1000); break;
    }
    t = std::clamp<std::int64_t>(t, 0, std::int64_t{1} << 52);
    event e;
    e.key = keys[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(nkeys) - 1))];
    e.t = t;
    switch (uniform(rng, 0, 9)) {
      case 0: e.cost = uniform(rng, 1, smallest + 2); break;
      case 1: e.cost = uniform(rng, smallest + 1, smallest + 20); break;  // above a sub-limit
      case 2: e.cost = uniform(rng, 2, 4); break;
      default: e.cost = 1; break;
    }
    const auto k = uniform(rng, 0, 39);
    e.kind = k < 4 ? event::peek : (k == 4 ? event::reset : event::consume);
    if (e.kind == event::consume && uniform(rng, 0, 99) < forced_share) e.kind = event::force;
    trace.push_back(std::move(e));
  }
  return trace;
}

template <class C>
class CompoundRedisDifferential : public ::testing::Test {};

using compounds =
    ::testing::Types<compound_of<sliding_window_log>, compound_of<fixed_window>,
                     compound_of<sliding_window_counter>, compound_of<token_bucket>,
                     compound_of<gcra>, compound<sliding_window_log, fixed_window, token_bucket>,
                     compound<gcra, sliding_window_counter, sliding_window_log>>;
TYPED_TEST_SUITE(CompoundRedisDifferential, compounds);

// Verifies identical decisions, every field, to memory_store<compound> on
// thousands of random traces: count_rejected mixes, costs above sub-limits,
// time going backwards, peeks and resets, binary keys.
TYPED_TEST(CompoundRedisDifferential, MatchesInProcessCompound) {
  using C = TypeParam;
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("compound");
  script_driver redis_side(o);
  for (int seed = 0; seed < traces_per_type(); ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 104729u + 5u);
    const auto cfg = random_config<C>::make(rng);
    const auto trace = random_trace(rng, cfg.limit(), uniform(rng, 1, 2'000'000));
    std::map<std::string, memory_store<C>> memory;
    for (std::size_t j = 0; j < trace.size(); ++j) {
      const event& e = trace[j];
      auto& m = memory[e.key];
      if (e.kind == event::reset) {
        m.reset(cfg, e.key);
        redis_side.reset(cfg, e.key);
        continue;
      }
      const ratelimit::access a = access_of(e.kind);
      const decision want = m.apply(cfg, e.key, microseconds{e.t}, e.cost, a);
      const decision got = redis_side.apply(cfg, e.key, microseconds{e.t}, e.cost, a);
      ASSERT_EQ(describe(got), describe(want))
          << "seed " << seed << " event " << j << " t=" << e.t << " cost=" << e.cost
          << " peek=" << (a == ratelimit::access::peek);
    }
    for (const auto& [key, m] : memory) redis_side.reset(cfg, key);
  }
}

/// Every key of the Redis database whose name starts with `start` (SCAN, so
/// binary keys are compared byte for byte).
std::vector<std::string> keys_starting_with(const redis::options& o, const std::string& start) {
  std::vector<std::string> out;
  std::string cursor = "0";
  do {
    auto r = rltest::command(o, {"SCAN", cursor, "MATCH", o.prefix + "*", "COUNT", "1000"});
    cursor.assign(r->element[0]->str, r->element[0]->len);
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
      std::string k(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
      if (k.starts_with(start)) out.push_back(std::move(k));
    }
  } while (cursor != "0");
  return out;
}

/// The start of every Redis key of `key`: `<prefix>{<key>}`.
std::string user_key_start(const redis::options& o, std::string_view key) {
  return o.prefix + "{" + std::string(key) + "}";
}

int store_traces_per_type() {
  return rltest::diff_traces(300);
}

// Verifies that redis::redis_store decides compound checks exactly as
// memory_store<compound> (every field, including source), with caller time,
// one check per round trip on even seeds and pipelined batches (apply_batch)
// on odd ones; and that reset deletes every sub-key of the user key (SCAN
// finds none left) while other user keys keep theirs.
TYPED_TEST(CompoundRedisDifferential, RedisStoreMatchesMemoryStore) {
  using C = TypeParam;
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("compound-store");
  redis::redis_store store(o);
  std::int64_t checks = 0;
  for (int seed = 0; seed < store_traces_per_type(); ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7907u + 3u);
    const auto cfg = random_config<C>::make(rng);
    const auto trace = random_trace(rng, cfg.limit(), uniform(rng, 1, 2'000'000));
    const bool batched = seed % 2 == 1;
    // One memory_store per key: a sweep of one idle key must not forget state
    // that a request stamped earlier on another key still sees.
    std::map<std::string, memory_store<C>> memory;
    std::vector<decision> expected;
    for (const event& e : trace) {
      auto& m = memory[e.key];
      if (e.kind == event::reset) {
        m.reset(cfg, e.key);
        expected.push_back(decision{});
      } else {
        expected.push_back(m.apply(cfg, e.key, microseconds{e.t}, e.cost, access_of(e.kind)));
      }
    }
    std::vector<decision> got(trace.size());
    std::size_t i = 0;
    while (i < trace.size()) {
      const event& e = trace[i];
      const ratelimit::access a = access_of(e.kind);
      if (e.kind == event::reset) {
        store.reset(cfg, e.key);
        ASSERT_EQ(keys_starting_with(o, user_key_start(o, e.key)), std::vector<std::string>{})
            << "seed " << seed << " event " << i << ": sub-keys left after reset";
        ++i;
      } else if (!batched) {
        got[i] = store.apply(cfg, e.key, microseconds{e.t}, e.cost, a);
        ++i;
      } else {
        // The longest run of one kind (consume or peek) up to the next reset.
        std::vector<redis::batch_item> batch;
        const std::size_t first = i;
        while (i < trace.size() && trace[i].kind == e.kind) {
          batch.push_back({trace[i].key, trace[i].cost, microseconds{trace[i].t}});
          ++i;
        }
        const auto ds = store.apply_batch(cfg, std::span<const redis::batch_item>(batch), a);
        ASSERT_EQ(ds.size(), batch.size());
        std::copy(ds.begin(), ds.end(), got.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    for (std::size_t j = 0; j < trace.size(); ++j) {
      if (trace[j].kind == event::reset) continue;
      ++checks;
      ASSERT_EQ(describe(got[j]), describe(expected[j]))
          << "seed " << seed << " event " << j << " t=" << trace[j].t << " cost=" << trace[j].cost
          << " peek=" << (trace[j].kind == event::peek) << (batched ? " (batched)" : "");
      ASSERT_EQ(got[j], expected[j]) << "seed " << seed << " event " << j;  // never vs -1
    }
    for (const auto& [key, m] : memory) store.reset(cfg, key);
    ASSERT_EQ(keys_starting_with(o, o.prefix), std::vector<std::string>{})
        << "seed " << seed << ": keys left after resetting every user key";
  }
  const redis::store_stats s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.fail_open + s.fail_closed + s.fallback, 0u);
  EXPECT_EQ(s.store, static_cast<std::uint64_t>(checks));
}

// Verifies that reset through the store deletes every sub-key of one user key
// and nothing of another, for a compound of all five policies and a
// compound_of, whatever the user key's bytes.
TEST(CompoundRedis, StoreResetDeletesEverySubKey) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("compound-reset");
  redis::redis_store store(o);
  using all5 =
      compound<sliding_window_log, fixed_window, sliding_window_counter, token_bucket, gcra>;
  const all5::config five{compound_options{"t"},
                          sliding_window_log::config{"5/2s", window_options{true, "t"}},
                          fixed_window::config{"50/1min", window_options{.name = "t"}},
                          sliding_window_counter::config{"40/10s", window_options{.name = "t"}},
                          token_bucket::config{"10/30s", bucket_options{.name = "t"}},
                          gcra::config{"20/1h", bucket_options{.name = "t"}}};
  const compound_of<fixed_window>::config three({"1/1s", "2/1min", "3/1h"}, compound_options{"t"});
  const std::vector<std::string> users = {"alice", std::string("n\0ul", 4), "a}b", "{x}", "bob"};
  const auto check = [&](const auto& cfg, std::size_t n) {
    for (const std::string& u : users) {
      EXPECT_TRUE(store.apply(cfg, u, store_time, 1).allowed) << u;
      const auto ks = redis::detail::redis_keys(o.prefix, cfg, u);
      ASSERT_EQ(ks.size(), n);
      for (const std::string& k : ks) {
        EXPECT_EQ(rltest::command(o, {"EXISTS", k})->integer, 1) << k;
      }
    }
    for (std::size_t i = 0; i + 1 < users.size(); ++i) {
      store.reset(cfg, users[i]);
      EXPECT_EQ(keys_starting_with(o, user_key_start(o, users[i])), std::vector<std::string>{})
          << users[i];
      // The last user key is untouched: all its sub-keys remain.
      EXPECT_EQ(keys_starting_with(o, user_key_start(o, users.back())).size(), n);
    }
    store.reset(cfg, users.back());
    EXPECT_EQ(keys_starting_with(o, o.prefix), std::vector<std::string>{});
  };
  check(five, 5);
  check(three, 3);
}

// Verifies the worked example of docs/compound_and_metrics.md: the day binds,
// nothing is recorded, retry_after is 23:30:00.
TEST(CompoundRedis, WorkedExample) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("example");
  script_driver redis_side(o);
  const compound_of<sliding_window_log>::config cfg({"3/15min", "5/day"}, compound_options{"t"});
  const std::int64_t min = 60'000'000;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(redis_side.apply(cfg, "k", microseconds{0}, 1).allowed);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(redis_side.apply(cfg, "k", microseconds{15 * min}, 1).allowed);
  }
  const decision d = redis_side.apply(cfg, "k", microseconds{30 * min}, 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.limit, 5);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, microseconds{(24 * 60 - 30) * min});
  const auto keys = redis_side.keys(cfg, "k");
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], o.prefix + "{k}:compound:t:0:sliding_log");
  EXPECT_EQ(keys[1], o.prefix + "{k}:compound:t:1:sliding_log");
}

// Verifies that 8 threads on one key with "5/min and 3/min" (server time)
// admit exactly 3: the smaller limit, never one request past it.
TEST(CompoundRedis, ThreadsOnOneKeyAdmitExactlyTheSmallerLimit) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("threads");
  const compound<sliding_window_log, fixed_window>::config cfg{
      compound_options{"t"}, sliding_window_log::config{"5/min", window_options{.name = "t"}},
      fixed_window::config{"3/1h", window_options{.name = "t"}}};
  for (int round = 0; round < 5; ++round) {
    const std::string key = "user" + std::to_string(round);
    std::atomic<long> admitted{0};
    std::vector<std::thread> pool;
    for (int i = 0; i < 8; ++i) {
      pool.emplace_back([&] {
        script_driver d(o);
        for (int j = 0; j < 25; ++j) {
          if (d.apply(cfg, key, std::nullopt, 1).allowed) ++admitted;
        }
      });
    }
    for (auto& t : pool) t.join();
    EXPECT_EQ(admitted.load(), 3) << "round " << round;
  }
}

// Verifies that every key written has a TTL, within its own sub-limit's bound
// (window policies 2 * period + 1 s, bucket and GCRA their time to full).
TEST(CompoundRedis, EveryKeyHasTheTtlOfItsOwnSubLimit) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("ttl");
  script_driver redis_side(o);
  const compound<sliding_window_log, fixed_window, sliding_window_counter, token_bucket,
                 gcra>::config cfg{
      compound_options{"t"},
      sliding_window_log::config{"5/2s", window_options{true, "t"}},
      fixed_window::config{"50/1min", window_options{.name = "t"}},
      sliding_window_counter::config{"40/10s", window_options{.name = "t"}},
      token_bucket::config{"10/30s", bucket_options{.name = "t"}},
      gcra::config{"20/1h", bucket_options{.name = "t"}}};
  const std::int64_t bounds_ms[] = {2 * 2000 + 1000, 2 * 60'000 + 1000, 2 * 10'000 + 1000, 30'000,
                                    3'600'000};
  for (int i = 0; i < 40; ++i) {
    (void)redis_side.apply(cfg, "key" + std::to_string(i % 7), std::nullopt, 1 + i % 3);
  }
  long keys = 0;
  std::string cursor = "0";
  do {
    auto r = rltest::command(o, {"SCAN", cursor, "MATCH", o.prefix + "*", "COUNT", "1000"});
    cursor.assign(r->element[0]->str, r->element[0]->len);
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
      const std::string k(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
      const auto colon = k.rfind(':');
      const auto index_at = k.rfind(':', colon - 1) + 1;
      const auto index = std::stoul(k.substr(index_at, colon - index_at));
      ASSERT_LT(index, 5u) << k;
      const long long ms = rltest::command(o, {"PTTL", k})->integer;
      EXPECT_GT(ms, 0) << k;
      EXPECT_LE(ms, bounds_ms[index]) << k;
      ++keys;
    }
  } while (cursor != "0");
  EXPECT_EQ(keys, 7 * 5);
}

// Verifies the limiter with the Redis store, at the caller's time and at the
// server's: the compound decides as in process.
TEST(CompoundRedis, LimiterWithRedisStore) {
  using C = compound_of<sliding_window_log>;
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("limiter");
  o.caller_time_ttl_floor = std::chrono::milliseconds{0};
  const C::config cfg({"3/15min", "5/day"}, compound_options{"t"});
  limiter<C, redis::redis_store, manual_clock> caller(cfg, redis::redis_store(o));
  limiter<C> memory(cfg);
  manual_clock& clock = caller.clock();
  const std::int64_t min = 60'000'000;
  for (const std::int64_t at : {0L, 0L, 0L, 0L, 15 * min, 15 * min, 30 * min, 31 * min}) {
    clock.set(microseconds{at});
    EXPECT_EQ(describe(caller.try_acquire("k")),
              describe(memory.try_acquire("k", microseconds{at})))
        << at;
  }
  limiter<C, redis::redis_store, redis::server_clock> server(cfg, redis::redis_store(o));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(server.try_acquire("s").allowed);
  const decision d = server.try_acquire("s");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 3);
  server.reset("s");
  EXPECT_TRUE(server.try_acquire("s").allowed);
}

}  // namespace
