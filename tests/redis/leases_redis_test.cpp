// SPDX-License-Identifier: Apache-2.0
// The lease limiter on a real Redis: identical decisions to the in-process
// limiter on random acquire/release/renew traces (alone and with each rate
// policy; half the operations through lease_hint, which Redis ignores),
// exactly N leases across processes and threads, keys and TTLs, values the
// script did not write, server time and the fallback limiter.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/concurrency.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/fork_child.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using ratelimit_test::reference::describe;
using std::chrono::microseconds;

std::string describe_all(const decision& d) {
  return describe(d) + (d.repeat ? " repeat" : "");
}

redis::options fresh(std::string_view what) {
  auto o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  o.pool_size = 4;
  o.on_failure = redis::failure_policy::throw_error;
  // Every answer must come from Redis: be patient on a loaded machine.
  o.command_timeout = 5000ms;
  return o;
}

const timestamp t0{1'700'000'000'000'000};

/// Replays one random trace through both limiters and requires identical
/// decisions. Steps are multiples of 25 us and D is 1000 us, so operations
/// land exactly on expiries, the microsecond before and after (odd offsets).
template <class R, class... RateConfig>
void differential(std::string_view what, unsigned seed, const RateConfig&... rate) {
  const concurrency_config cc{2, microseconds{1000}, concurrency_options{.name = "calls"}};
  concurrency_limiter<R> mem{cc, rate...};
  concurrency_limiter<R, redis::redis_store> red{cc, rate..., redis::redis_store{fresh(what)}};
  std::mt19937 rng(seed);  // 32-bit results
  timestamp t = t0;
  const std::vector<std::string> keys = {"+15551234567", "k{2}", std::string("n\0l", 3)};
  // Half the in-process operations go through lease_hint (the acquire's
  // own, or one of another key or lease), drawn from a generator of their
  // own so that the trace is the same as without them.
  std::mt19937 pick(seed + 1000);
  std::map<std::string, lease_hint> hints;  // key + '/' + id -> its last acquire's hint
  const auto hint_for = [&](const std::string& key, const std::string& id) -> lease_hint& {
    if (pick() % 4 == 0 && !hints.empty()) {
      auto it = hints.begin();
      std::advance(it, static_cast<long>(pick() % hints.size()));
      return it->second;
    }
    return hints[key + '/' + id];
  };
  int repeats = 0;
  int full = 0;   // acquires refused by the lease set
  int rated = 0;  // acquires refused by the rate alone
  for (int i = 0; i < 800; ++i) {
    const int step = static_cast<int>(rng() % 8);
    t += microseconds{step * 25 + (rng() % 5 == 0 ? static_cast<int>(rng() % 3) - 1 : 0)};
    if (t < t0) t = t0;
    const std::string& key = keys[rng() % 10 == 0 ? 2 : rng() % 2];
    const std::string id = "call-" + std::to_string(rng() % 8);
    const auto op = static_cast<unsigned>(rng() % 20);
    decision a;
    decision b;
    const bool hinted = pick() % 2 == 0;
    if (op < 13) {
      a = hinted ? mem.acquire(key, id, t, hints[key + '/' + id]) : mem.acquire(key, id, t);
      lease_hint unused;
      b = hinted ? red.acquire(key, id, t, unused) : red.acquire(key, id, t);
      EXPECT_FALSE(unused.filled());  // Redis hashes no key in process
      if (a.repeat) ++repeats;
      if (!a.allowed) ++(a.limit == cc.limit() ? full : rated);
    } else if (op < 17) {
      a = hinted ? mem.release(key, id, t, hint_for(key, id)) : mem.release(key, id, t);
      b = hinted ? red.release(key, id, t, lease_hint{}) : red.release(key, id, t);
    } else {
      a = hinted ? mem.renew(key, id, t, hint_for(key, id)) : mem.renew(key, id, t);
      b = hinted ? red.renew(key, id, t, lease_hint{}) : red.renew(key, id, t);
    }
    ASSERT_EQ(a, b) << "step " << i << " op " << op << (hinted ? " hinted" : "") << " at "
                    << t.count() << ": memory " << describe_all(a) << " redis " << describe_all(b);
  }
  // The trace reached every kind of answer.
  EXPECT_GT(repeats, 5) << what;
  EXPECT_GT(full, 5) << what;
  if constexpr (leases<R>::rated) {
    EXPECT_GT(rated, 5) << what;
  }
}

// Verifies identical decisions on random traces, leases alone and with each rate.
TEST(LeasesRedis, DifferentialAgainstTheInProcessLimiter) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    differential<no_rate>("d-none", seed);
    differential<fixed_window>("d-fw", seed,
                               fixed_window::config{"6/4ms", window_options{.name = "calls"}});
    differential<sliding_window_log>(
        "d-log", seed, sliding_window_log::config{"6/4ms", window_options{.name = "calls"}});
    differential<sliding_window_counter>(
        "d-ctr", seed, sliding_window_counter::config{"6/4ms", window_options{.name = "calls"}});
    differential<token_bucket>("d-tb", seed,
                               token_bucket::config{"3/4ms", bucket_options{.name = "calls"}});
    differential<gcra>("d-gcra", seed, gcra::config{"3/4ms", bucket_options{.name = "calls"}});
  }
}

// Verifies the exact edges in Redis: the microsecond before a lease expires
// the key is full and retry_after is 1 us; at its expiry a slot is free.
TEST(LeasesRedis, ExactEdgesAtExpiry) {
  const microseconds d{1000};
  concurrency_limiter<no_rate, redis::redis_store> c{
      concurrency_config{1, d, concurrency_options{.name = "calls"}},
      redis::redis_store{fresh("edges")}};
  ASSERT_TRUE(c.acquire("k", "a", t0).allowed);
  decision r = c.acquire("k", "b", t0 + d - microseconds{1});
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.retry_after, microseconds{1});
  EXPECT_EQ(r.reset_after, microseconds{1});
  EXPECT_TRUE(c.renew("k", "a", t0 + d - microseconds{1}).allowed);
  r = c.acquire("k", "b", t0 + d);
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.retry_after, d - microseconds{1});
  // The renewed lease expires at t0 + 2d - 1: then it cannot be renewed or released.
  EXPECT_EQ(c.renew("k", "a", t0 + 2 * d - microseconds{1}).retry_after, never);
  EXPECT_FALSE(c.release("k", "a", t0 + 2 * d - microseconds{1}).allowed);
  r = c.acquire("k", "b", t0 + 2 * d - microseconds{1});
  EXPECT_TRUE(r.allowed);
  EXPECT_EQ(r.remaining, 0);
  EXPECT_EQ(r.reset_after, d);
}

// Verifies that time running backwards is decided alike in process and in
// Redis (no clamp): a lease dropped by an operation at its expiry stays
// dropped for an operation stamped before it; a lease granted at a later time
// is live at an earlier one, with retry and reset measured from that time.
TEST(LeasesRedis, TimeRunningBackwardsMatchesTheInProcessLimiter) {
  const microseconds d{1000};
  const concurrency_config cc{2, d, concurrency_options{.name = "calls"}};
  concurrency_limiter<no_rate> mem{cc};
  concurrency_limiter<no_rate, redis::redis_store> red{cc, redis::redis_store{fresh("backwards")}};
  const auto both = [&](int op, std::string_view id, timestamp t) {
    const decision a = op == 0 ? mem.acquire("k", id, t)
                               : (op == 1 ? mem.release("k", id, t) : mem.renew("k", id, t));
    const decision b = op == 0 ? red.acquire("k", id, t)
                               : (op == 1 ? red.release("k", id, t) : red.renew("k", id, t));
    EXPECT_EQ(a, b) << "op " << op << " " << id << " at " << (t - t0).count() << ": memory "
                    << describe_all(a) << " redis " << describe_all(b);
    return a;
  };
  EXPECT_TRUE(both(0, "a", t0).allowed);
  EXPECT_TRUE(both(0, "b", t0 + d).allowed);       // drops a (expired at t0 + d)
  EXPECT_FALSE(both(1, "a", t0 + d / 2).allowed);  // not revived by an earlier time
  EXPECT_FALSE(both(2, "a", t0 + d / 2).allowed);
  const decision r = both(0, "c", t0 + d / 2);  // b (expiry t0 + 2d) is live at t0 + d/2
  EXPECT_TRUE(r.allowed);
  EXPECT_EQ(r.remaining, 0);
  const decision full = both(0, "e", t0 + d / 4);
  EXPECT_FALSE(full.allowed);
  EXPECT_EQ(full.retry_after, d + d / 2 - d / 4);  // c expires at t0 + 3d/2
  EXPECT_EQ(full.reset_after, 2 * d - d / 4);
  EXPECT_TRUE(both(2, "b", t0).allowed);  // a renew at an earlier time never shortens
  EXPECT_EQ(both(0, "b", t0).reset_after, 2 * d);
}

// Verifies identical decisions on random traces of one key with N = 1 and
// 3, ids of the in-process storage's edge lengths (1, 15, 16, 17, 40, 256
// bytes, NUL and 0xFF bytes, pairs apart in their last byte) and times that
// go backwards as well as forwards and land on a live lease's expiry or the
// microsecond before; with a rate the acquire is all or nothing in both.
template <class R, class... RateConfig>
void hostile_differential(std::string_view what, units n, unsigned seed,
                          const RateConfig&... rate) {
  const microseconds d{1000};
  const concurrency_config cc{n, d, concurrency_options{.name = "calls"}};
  concurrency_limiter<R> mem{cc, rate...};
  concurrency_limiter<R, redis::redis_store> red{cc, rate..., redis::redis_store{fresh(what)}};
  std::vector<std::string> ids;
  for (const std::size_t len : {1U, 15U, 16U, 17U, 40U, 256U}) {
    std::string id(len, '\xff');
    id[0] = '\0';
    ids.push_back(id);
    id[len - 1] = 'x';
    ids.push_back(id);
  }
  std::mt19937 rng(seed);  // 32-bit results
  timestamp t = t0 + microseconds{100'000};
  std::vector<timestamp> expiries;  // of grants and renewals, to land on
  for (int i = 0; i < 400; ++i) {
    const auto how = rng() % 8;
    if (how < 3) {
      t += microseconds{rng() % 700};
    } else if (how < 5) {
      t -= microseconds{rng() % 700};
    } else if (!expiries.empty()) {
      t = expiries[rng() % expiries.size()] - microseconds{how == 5 ? 1 : 0};
    }
    const std::string& id = ids[rng() % ids.size()];
    const auto op = rng() % 10;
    decision a;
    decision b;
    if (op < 5) {
      a = mem.acquire("k", id, t);
      b = red.acquire("k", id, t);
      if (a.counted) expiries.push_back(t + d);
    } else if (op < 8) {
      a = mem.release("k", id, t);
      b = red.release("k", id, t);
    } else {
      a = mem.renew("k", id, t);
      b = red.renew("k", id, t);
      if (a.counted) expiries.push_back(t + d);
    }
    ASSERT_EQ(a, b) << what << " step " << i << " op " << op << " id of " << id.size()
                    << " bytes at " << (t - t0).count() << ": memory " << describe_all(a)
                    << " redis " << describe_all(b);
  }
}

TEST(LeasesRedis, DifferentialWithHostileIdsAndTimeGoingBackwards) {
  for (unsigned seed = 1; seed <= 2; ++seed) {
    hostile_differential<no_rate>("h-none-1", 1, seed);
    hostile_differential<no_rate>("h-none-3", 3, seed);
    hostile_differential<fixed_window>(
        "h-fw-3", 3, seed, fixed_window::config{"4/3ms", window_options{.name = "calls"}});
  }
}

// Verifies lease ids of 256 bytes (the maximum) holding NUL, braces, ':' and
// '#' on a 512-byte key: granted, found again, renewed and released in Redis
// as in process; a 257-byte id throws before Redis is asked.
TEST(LeasesRedis, LongestBinaryLeaseIdsOnTheLongestKey) {
  const concurrency_config cc{1, microseconds{1000}, concurrency_options{.name = "calls"}};
  concurrency_limiter<no_rate> mem{cc};
  concurrency_limiter<no_rate, redis::redis_store> red{cc, redis::redis_store{fresh("longest")}};
  std::string key(512, '}');
  key[7] = '\0';
  std::string id(256, '#');
  id[0] = '\0';
  id[100] = '{';
  id[200] = ':';
  std::string other = id;
  other[255] = ':';
  const auto both = [&](int op, const std::string& i, timestamp t) {
    const decision a = op == 0 ? mem.acquire(key, i, t)
                               : (op == 1 ? mem.release(key, i, t) : mem.renew(key, i, t));
    const decision b = op == 0 ? red.acquire(key, i, t)
                               : (op == 1 ? red.release(key, i, t) : red.renew(key, i, t));
    EXPECT_EQ(a, b) << "op " << op << ": memory " << describe_all(a) << " redis "
                    << describe_all(b);
    return b;
  };
  EXPECT_TRUE(both(0, id, t0).allowed);
  EXPECT_TRUE(both(0, id, t0 + microseconds{1}).repeat);
  EXPECT_FALSE(both(0, other, t0 + microseconds{2}).allowed);
  EXPECT_TRUE(both(2, id, t0 + microseconds{3}).allowed);
  EXPECT_TRUE(both(1, id, t0 + microseconds{4}).allowed);
  EXPECT_TRUE(both(0, other, t0 + microseconds{5}).allowed);
  EXPECT_THROW((void)red.acquire(key, id + "x", t0), std::invalid_argument);
}

// Verifies the keys, their TTLs (the latest expiry) and the repeat flag.
TEST(LeasesRedis, KeysAndTtls) {
  const auto o = fresh("keys");
  redis::redis_store store(o);
  concurrency_limiter<gcra, redis::redis_store> c{
      concurrency_config{2, 10s, concurrency_options{.name = "calls"}},
      gcra::config{"10/1min", bucket_options{.name = "calls"}}, store};
  ASSERT_TRUE(c.acquire("+1555", "a", t0).allowed);
  const std::string set = o.prefix + "{+1555}:leases:calls";
  const std::string rate = set + ":0:gcra";
  auto r = rltest::command(o, {"ZSCORE", set, "a"});
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(r->str, r->len), std::to_string((t0 + 10s).count()));
  r = rltest::command(o, {"PTTL", set});
  EXPECT_GT(r->integer, 0);
  r = rltest::command(o, {"PTTL", rate});
  EXPECT_GT(r->integer, 0);
  const decision again = c.acquire("+1555", "a", t0 + 1s);
  EXPECT_TRUE(again.repeat);
  EXPECT_FALSE(again.counted);
  // A repeat consumes no rate: GCRA's state is unchanged.
  r = rltest::command(o, {"GET", rate});
  const std::string before(r->str, r->len);
  (void)c.acquire("+1555", "a", t0 + 2s);
  r = rltest::command(o, {"GET", rate});
  EXPECT_EQ(std::string(r->str, r->len), before);
  ASSERT_TRUE(c.release("+1555", "a", t0 + 3s).allowed);
  r = rltest::command(o, {"EXISTS", set});
  EXPECT_EQ(r->integer, 0);  // the last lease gone, the set is gone
  c.reset("+1555");
  r = rltest::command(o, {"EXISTS", rate});
  EXPECT_EQ(r->integer, 0);
}

// Verifies that values the script did not write are a script error naming
// the key, and that nothing is written.
TEST(LeasesRedis, ForeignValuesAreScriptErrorsNamingTheKey) {
  const auto o = fresh("foreign");
  concurrency_limiter<no_rate, redis::redis_store> c{
      concurrency_config{2, 10s, concurrency_options{.name = "calls"}}, redis::redis_store{o}};
  const std::string set = o.prefix + "{k}:leases:calls";
  const auto expect_error = [&](std::string_view why) {
    try {
      (void)c.acquire("k", "a", t0);
      ADD_FAILURE() << "accepted " << why;
    } catch (const redis::script_error& e) {
      EXPECT_NE(std::string(e.what()).find(set), std::string::npos) << e.what();
    }
  };
  (void)rltest::command(o, {"SET", set, "x"});
  expect_error("a string");
  (void)rltest::command(o, {"DEL", set});
  (void)rltest::command(o, {"ZADD", set, "1.5", "b"});
  expect_error("a fractional expiry");
  (void)rltest::command(o, {"ZADD", set, "-5", "c"});
  expect_error("a negative expiry");
  (void)rltest::command(o, {"DEL", set});
  (void)rltest::command(o, {"ZADD", set, "1800000000000000", std::string(300, 'x')});
  expect_error("a member too long");
  auto r = rltest::command(o, {"ZCARD", set});
  EXPECT_EQ(r->integer, 1);  // nothing written, nothing dropped
  EXPECT_THROW((void)c.release("k", "a", t0), redis::script_error);
}

// Verifies that a foreign expiry in the middle of the lease set (neither the
// lowest nor the highest), or a foreign value at the rate's key, is found
// before anything is written: the expired leases are not dropped by a check
// that fails.
TEST(LeasesRedis, ForeignValuesInTheMiddleLeaveTheSetUntouched) {
  const auto o = fresh("foreign-middle");
  const std::int64_t t = t0.count();
  {
    concurrency_limiter<no_rate, redis::redis_store> c{
        concurrency_config{5, 10s, concurrency_options{.name = "calls"}}, redis::redis_store{o}};
    const std::string set = o.prefix + "{k}:leases:calls";
    (void)rltest::command(o, {"ZADD", set, std::to_string(t - 10), "old"});
    (void)rltest::command(o, {"ZADD", set, std::to_string(t) + ".5", "mid"});
    (void)rltest::command(o, {"ZADD", set, std::to_string(t + 1'000'000), "late"});
    for (int op = 0; op < 3; ++op) {
      try {
        (void)(op == 0 ? c.acquire("k", "a", t0)
                       : (op == 1 ? c.release("k", "late", t0) : c.renew("k", "late", t0)));
        ADD_FAILURE() << "accepted a fractional expiry in the middle, op " << op;
      } catch (const redis::script_error& e) {
        EXPECT_NE(std::string(e.what()).find(set), std::string::npos) << e.what();
      }
      EXPECT_EQ(rltest::command(o, {"ZCARD", set})->integer, 3) << "op " << op;
    }
  }
  {
    concurrency_limiter<fixed_window, redis::redis_store> c{
        concurrency_config{5, 10s, concurrency_options{.name = "rated"}},
        fixed_window::config{"10/1h"}, redis::redis_store{o}};
    const std::string set = o.prefix + "{k}:leases:rated";
    (void)rltest::command(o, {"ZADD", set, std::to_string(t - 10), "old"});
    (void)rltest::command(o, {"ZADD", set, std::to_string(t + 1'000'000), "late"});
    (void)rltest::command(o, {"SET", set + ":0:fixed_window", "foreign"});
    EXPECT_THROW((void)c.acquire("k", "a", t0), redis::script_error);
    EXPECT_EQ(rltest::command(o, {"ZCARD", set})->integer, 2);
  }
}

/// Acquires unique lease ids on one key from 8 threads; returns the grants.
template <class Limiter>
long grab(Limiter& c, int process, timestamp now) {
  std::atomic<long> won{0};
  std::vector<std::thread> pool;
  for (int th = 0; th < 8; ++th) {
    pool.emplace_back([&, th] {
      for (int j = 0; j < 30; ++j) {
        const std::string id = std::to_string(process) + "/" + std::to_string(th) + "/" +
                               std::to_string(j);
        const decision d = now.count() == 0 ? c.acquire("+15551234567", id)
                                            : c.acquire("+15551234567", id, now);
        if (d.allowed) ++won;
      }
    });
  }
  for (auto& t : pool) t.join();
  return won.load();
}

/// 2 processes x 8 threads of `make()` limiters; returns the total granted.
template <class Make>
long across_processes(Make make, timestamp now) {
  return rltest::sum_in_children(2, [&](int p) {
    auto c = make();
    return grab(c, p, now);
  });
}

// Verifies that 480 acquires from 16 threads in 2 processes grant exactly N,
// on the caller's time and on the server's, alone and with a rate.
TEST(LeasesRedis, ProcessesAndThreadsGrantExactlyN) {
  const concurrency_config cc{5, 1h, concurrency_options{.name = "calls"}};
  const auto o1 = fresh("p-none");
  EXPECT_EQ(
      across_processes(
          [&] {
            return concurrency_limiter<no_rate, redis::redis_store>{cc, redis::redis_store{o1}};
          },
          t0),
      5);
  const auto o2 = fresh("p-server");
  EXPECT_EQ(across_processes(
                [&] {
                  return concurrency_limiter<no_rate, redis::redis_store, redis::server_clock>{
                      cc, redis::redis_store{o2}};
                },
                timestamp{0}),
            5);
  // The rate binds first (3 per hour), the leases (5) never fill.
  const auto o3 = fresh("p-rate");
  const auto rate = sliding_window_log::config{"3/1h", window_options{.name = "calls"}};
  EXPECT_EQ(across_processes(
                [&] {
                  return concurrency_limiter<sliding_window_log, redis::redis_store>{
                      cc, rate, redis::redis_store{o3}};
                },
                t0),
            3);
  auto r = rltest::command(o3, {"ZCARD", o3.prefix + "{+15551234567}:leases:calls"});
  EXPECT_EQ(r->integer, 3);  // no lease granted beyond the rate's admissions
}

// Verifies acquire/release cycles from threads never hold more than N leases
// at once (the sorted set is read after every grant).
TEST(LeasesRedis, CyclesNeverHoldMoreThanN) {
  const auto o = fresh("cycles");
  concurrency_limiter<no_rate, redis::redis_store, redis::server_clock> c{
      concurrency_config{3, 1h, concurrency_options{.name = "calls"}}, redis::redis_store{o}};
  const std::string set = o.prefix + "{k}:leases:calls";
  std::atomic<long> most{0};
  std::atomic<long> granted{0};
  std::vector<std::thread> pool;
  for (int th = 0; th < 6; ++th) {
    pool.emplace_back([&, th] {
      for (int j = 0; j < 40; ++j) {
        const std::string id = std::to_string(th) + ":" + std::to_string(j);
        if (!c.acquire("k", id).allowed) continue;
        ++granted;
        const long n = rltest::command(o, {"ZCARD", set})->integer;
        long seen = most.load();
        while (n > seen && !most.compare_exchange_weak(seen, n)) {
        }
        ASSERT_TRUE(c.release("k", id).allowed);
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_GT(granted.load(), 3);
}

// Verifies that the fallback limiter applies the lease operations in process:
// a lease acquired there is released there (the operation and id reach it).
TEST(LeasesRedis, FallbackLimiterKeepsLeasesInProcess) {
  redis::options o;
  o.port = rltest::free_port();  // nothing listens there
  o.connect_timeout = 100ms;
  o.command_timeout = 100ms;
  o.on_failure = redis::failure_policy::fallback;
  o.fallback_divisor = 2;
  concurrency_limiter<no_rate, redis::redis_store> c{
      concurrency_config{4, 10s, concurrency_options{.name = "calls"}}, redis::redis_store{o}};
  decision d = c.acquire("k", "a", t0);
  EXPECT_EQ(d.source, decision_source::fallback);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 2);  // 4 / fallback_divisor
  EXPECT_TRUE(c.acquire("k", "b", t0).allowed);
  EXPECT_FALSE(c.acquire("k", "c", t0).allowed);
  EXPECT_TRUE(c.acquire("k", "a", t0).repeat);
  d = c.release("k", "a", t0);
  EXPECT_EQ(d.source, decision_source::fallback);
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(c.acquire("k", "c", t0).allowed);
}

}  // namespace
