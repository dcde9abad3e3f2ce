// SPDX-License-Identifier: Apache-2.0
// Tests of redis_store against a real redis-server: keys, TTLs, scripts, AUTH.
#include "ratelimit/redis/redis_store.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "redis_server.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using std::chrono::microseconds;

// The concepts, both ways.
static_assert(store_for<redis::redis_store, fixed_window>);
static_assert(store_for<redis::redis_store, sliding_window_log>);
static_assert(store_for<redis::redis_store, sliding_window_counter>);
static_assert(store_for<redis::redis_store, token_bucket>);
static_assert(store_for<redis::redis_store, gcra>);
static_assert(store_clocked_store_for<redis::redis_store, gcra>);
static_assert(store_clocked_store_for<redis::redis_store, sliding_window_log>);
static_assert(store_clock<redis::server_clock>);
static_assert(!clock_source<redis::server_clock>);
static_assert(!store_clocked_store_for<memory_store<gcra>, gcra>);
static_assert(!store_for<redis::redis_store, int>);
static_assert(std::is_copy_constructible_v<redis::redis_store>);
static_assert(std::is_base_of_v<store_error, redis::connection_error>);
static_assert(std::is_base_of_v<redis::connection_error, redis::timeout_error>);
static_assert(std::is_base_of_v<store_error, redis::script_error>);
static_assert(std::is_aggregate_v<redis::options>);

template <class P>
using server_limiter = limiter<P, redis::redis_store, redis::server_clock>;

redis::options fresh_options(std::string_view what) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  return o;
}

long long pttl(const redis::options& o, const std::string& key) {
  return rltest::command(o, {"PTTL", key})->integer;
}

/// Every key under `prefix`, by SCAN.
std::vector<std::string> scan_all(const redis::options& o, const std::string& prefix) {
  std::vector<std::string> keys;
  std::string cursor = "0";
  const std::string match = prefix + "*";
  do {
    auto r = rltest::command(o, {"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
    cursor.assign(r->element[0]->str, r->element[0]->len);
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
      keys.emplace_back(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
    }
  } while (cursor != "0");
  return keys;
}

TEST(RedisStore, ServerClockLimiterAdmitsExactlyTheLimit) {
  const auto o = fresh_options("server");
  server_limiter<fixed_window> fw(fixed_window::config("5/1h", window_options{.name = "t"}),
                                  redis::redis_store(o));
  server_limiter<gcra> g(gcra::config("5/1h", bucket_options{.name = "t"}), redis::redis_store(o));
  server_limiter<sliding_window_log> log(
      sliding_window_log::config("5/1h", window_options{.name = "t"}), redis::redis_store(o));
  int admitted_fw = 0, admitted_g = 0, admitted_log = 0;
  for (int i = 0; i < 8; ++i) {
    admitted_fw += fw.try_acquire("+15551234567").allowed ? 1 : 0;
    admitted_g += g.try_acquire("+15551234567").allowed ? 1 : 0;
    admitted_log += log.try_acquire("+15551234567").allowed ? 1 : 0;
  }
  // A fixed window may roll over at the top of the hour mid-test: 5 or 10.
  EXPECT_TRUE(admitted_fw == 5 || admitted_fw == 10) << admitted_fw;
  EXPECT_EQ(admitted_g, 5);
  EXPECT_EQ(admitted_log, 5);
  const decision d = g.try_acquire("+15551234567");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_GT(d.retry_after, 0us);
  EXPECT_LE(d.retry_after, std::chrono::microseconds(std::chrono::minutes(12)));
}

// Verifies the layout `<prefix>{<key>}:<policy>` and that binary keys (NUL,
// braces, spaces, UTF-8) round-trip and never collide.
TEST(RedisStore, BinaryKeysRoundTripWithoutCollisions) {
  const auto o = fresh_options("binary");
  redis::redis_store store(o);
  const fixed_window::config cfg("3/1h", window_options{.name = "t"});
  const std::vector<std::string> keys = {std::string("a\0b", 3),
                                         std::string("a\0c", 3),
                                         "a",
                                         std::string("a\0", 2),
                                         "{x}",
                                         "}{",
                                         "x}:fixed_window",
                                         "two words",
                                         "\xc3\xa9",
                                         std::string(512, '\0'),
                                         std::string(511, '\0'),
                                         "a:b"};
  const microseconds t{1'000'000'000};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::size_t j = 0; j <= i; ++j) (void)store.apply(cfg, keys[i], t, 1, access::consume);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto d = store.apply(cfg, keys[i], t, 1, access::peek);
    // A peek reports what admitting it would leave.
    EXPECT_EQ(d.remaining, std::max<units>(0, 3 - static_cast<units>(i + 2))) << i;
    const std::string k = store.key_for(cfg, keys[i]);
    // A key starting with '}' would leave the hash tag empty: it gets its own.
    const std::string expected = keys[i].starts_with('}')
                                     ? o.prefix + "{~" + std::to_string(redis::key_slot(keys[i])) +
                                           "}{" + keys[i] + "}:fixed_window:t!"
                                     : o.prefix + "{" + keys[i] + "}:fixed_window:t";
    EXPECT_EQ(k, expected);
    EXPECT_EQ(rltest::command(o, {"EXISTS", k})->integer, 1) << i;
  }
  const auto all = scan_all(o, o.prefix);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), keys.size());
  EXPECT_THROW((void)store.apply(cfg, "", t, 1, access::consume), std::invalid_argument);
  EXPECT_THROW((void)store.apply(cfg, std::string(513, 'x'), t, 1, access::consume),
               std::invalid_argument);
}

// Verifies that after a randomized run every key has a TTL within its bound:
// server time: <= 2 * period + 1 s for window policies, time-to-full for
// bucket/GCRA; caller time: the floor or more, never longer than need + floor.
TEST(RedisStore, EveryKeyHasABoundedTtl) {
  auto o = fresh_options("ttl");
  redis::redis_store store(o);
  const auto period = 10s;
  const fixed_window::config fw(rate(4, period), window_options{true, "t"});
  const sliding_window_log::config log(rate(4, period), window_options{.name = "t"});
  const sliding_window_counter::config ctr(rate(4, period), window_options{true, "t"});
  const token_bucket::config tb(rate(4, period), bucket_options{6, "t"});
  const gcra::config g(rate(4, period), bucket_options{.name = "t"});
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const std::string key = "k" + std::to_string(rng() % 50);
    const units cost = 1 + static_cast<units>(rng() % 3);
    switch (rng() % 5) {
      case 0: (void)store.apply(fw, key, store_time, cost, access::consume); break;
      case 1: (void)store.apply(log, key, store_time, cost, access::consume); break;
      case 2: (void)store.apply(ctr, key, store_time, cost, access::consume); break;
      case 3: (void)store.apply(tb, key, store_time, cost, access::consume); break;
      default: (void)store.apply(g, key, store_time, cost, access::consume); break;
    }
  }
  const long long window_bound = 2 * 10'000 + 1'000;
  const long long bucket_bound = 6 * 2'500 + 1;  // burst 6 refilled at 4 per 10 s
  const long long gcra_bound = 4 * 2'500 + 1;
  const auto keys = scan_all(o, o.prefix);
  EXPECT_GT(keys.size(), 100u);
  for (const std::string& k : keys) {
    const long long ms = pttl(o, k);
    EXPECT_GT(ms, 0) << k;
    long long bound = window_bound;
    if (k.ends_with(":token_bucket:t")) bound = bucket_bound;
    if (k.ends_with(":gcra:t")) bound = gcra_bound;
    if (k.ends_with(":fixed_window:t")) bound = 10'000;
    EXPECT_LE(ms, bound) << k;
  }

  // Caller time: a floor of caller_time_ttl_floor, never below the need.
  o.prefix = rltest::unique_prefix("ttl-caller");
  o.caller_time_ttl_floor = 60s;
  redis::redis_store caller(o);
  (void)caller.apply(fixed_window::config("1/10us", window_options{.name = "t"}), "short", 1000us,
                     1, access::consume);
  (void)caller.apply(fixed_window::config("1/1h", window_options{.name = "t"}), "long", 0us, 1,
                     access::consume);
  const long long short_ms = pttl(
      o, caller.key_for(fixed_window::config("1/10us", window_options{.name = "t"}), "short"));
  const long long long_ms = pttl(
      o, caller.key_for(fixed_window::config("1/1h", window_options{.name = "t"}), "long"));
  EXPECT_GT(short_ms, 55'000);
  EXPECT_LE(short_ms, 60'000);
  EXPECT_GT(long_ms, 3'590'000);
  EXPECT_LE(long_ms, 3'600'000);
}

// Verifies that calling again never extends a fixed window's expiry.
TEST(RedisStore, FixedWindowExpiryIsSetOnceWhenTheWindowStarts) {
  const auto o = fresh_options("fwttl");
  redis::redis_store store(o);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  const auto first = store.apply(cfg, "k", microseconds{3'600'000'000LL * 100 + 1'000'000}, 1,
                                 access::consume);
  EXPECT_TRUE(first.allowed);
  auto o2 = o;
  o2.caller_time_ttl_floor = 0ms;
  redis::redis_store no_floor(o2);
  // Same window, later: PTTL must not grow back.
  const std::string k = store.key_for(cfg, "k");
  const long long before = pttl(o, k);
  for (int i = 0; i < 5; ++i) {
    (void)no_floor.apply(cfg, "k", microseconds{3'600'000'000LL * 100 + 2'000'000 + i}, 1,
                         access::consume);
    (void)store.apply(cfg, "k", microseconds{3'600'000'000LL * 100 + 3'000'000 + i}, 1,
                      access::consume);
  }
  EXPECT_LE(pttl(o, k), before);
  EXPECT_EQ(
      store.apply(cfg, "k", microseconds{3'600'000'000LL * 100 + 9}, 1, access::peek).remaining,
      1000 - 12);  // 11 recorded, and the peek counts itself
}

TEST(RedisStore, PeekAndRejectionWriteNothing) {
  const auto o = fresh_options("peek");
  redis::redis_store store(o);
  const gcra::config g("2/1s", bucket_options{.name = "t"});
  const sliding_window_log::config log("2/1s", window_options{.name = "t"});
  (void)store.apply(g, "p", 10us, 1, access::peek);
  (void)store.apply(log, "p", 10us, 1, access::peek);
  EXPECT_TRUE(scan_all(o, o.prefix).empty());
  // Rejections (cost above the limit) do not create keys either.
  (void)store.apply(g, "q", 10us, 3, access::consume);
  (void)store.apply(log, "q", 10us, 3, access::consume);
  EXPECT_TRUE(scan_all(o, o.prefix).empty());
  EXPECT_TRUE(store.apply(g, "p", 10us, 2, access::consume).allowed);
  EXPECT_FALSE(store.apply(g, "p", 10us, 1, access::peek).allowed);
  store.reset(g, "p");
  EXPECT_TRUE(store.apply(g, "p", 10us, 2, access::peek).allowed);
}

TEST(RedisStore, RejectsCallerTimesThatLuaCannotHoldExactly) {
  redis::redis_store store(fresh_options("time"));
  const gcra::config g("2/1s", bucket_options{.name = "t"});
  EXPECT_NO_THROW((void)store.apply(g, "k", redis::max_script_time, 1, access::consume));
  EXPECT_THROW((void)store.apply(g, "k", redis::max_script_time + 1us, 1, access::consume),
               std::invalid_argument);
  EXPECT_THROW((void)store.apply(g, "k", -1us, 1, access::consume), std::invalid_argument);
  EXPECT_THROW((void)store.apply(g, "k", 1us, 0, access::consume), std::invalid_argument);
}

// Verifies that SCRIPT FLUSH mid-run (or a Redis restart) is invisible:
// the next check gets NOSCRIPT, resends the script once and goes on.
TEST(RedisStore, ScriptFlushMidRunIsInvisible) {
  const auto o = fresh_options("flush");
  redis::redis_store store(o);
  const token_bucket::config tb("10/1s", bucket_options{.name = "t"});
  memory_store<token_bucket> memory;
  std::vector<redis::batch_item> batch;
  for (int i = 0; i < 300; ++i) {
    if (i % 50 == 25) {
      ASSERT_EQ(rltest::command(o, {"SCRIPT", "FLUSH"})->type, REDIS_REPLY_STATUS);
    }
    const microseconds t{1'000'000 + i * 30'000};
    const std::string key = "k" + std::to_string(i % 3);
    const auto want = memory.apply(tb, key, t, 1, access::consume);
    if (i % 2 == 0) {
      EXPECT_EQ(store.apply(tb, key, t, 1, access::consume), want) << i;
    } else {
      batch = {{key, 1, t}};
      EXPECT_EQ(store.apply_batch(tb, std::span<const redis::batch_item>(batch)).at(0), want) << i;
    }
  }
  EXPECT_GE(store.stats().script_reloads, 6u);
  EXPECT_EQ(store.stats().errors, 0u);
}

TEST(RedisStore, BatchDecidesLikeSequentialChecks) {
  const auto o = fresh_options("batch");
  redis::redis_store store(o);
  const sliding_window_counter::config cfg("7/100ms", window_options{.name = "t"});
  memory_store<sliding_window_counter> memory;
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back("phone-" + std::to_string(i % 13));
  std::vector<redis::batch_item> items;
  for (int i = 0; i < 100; ++i)
    items.push_back({keys[static_cast<std::size_t>(i)], 1 + i % 2, microseconds{5'000 * i}});
  const auto got = store.apply_batch(cfg, std::span<const redis::batch_item>(items));
  ASSERT_EQ(got.size(), items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(got[i], memory.apply(cfg, items[i].key, items[i].now, items[i].cost, access::consume))
        << i;
  }
  // Server time, one round trip.
  const auto st = store.apply_batch(cfg, std::span<const redis::batch_item>(items), store_time);
  EXPECT_EQ(st.size(), items.size());
  EXPECT_EQ(store.stats().store, 200u);
}

// Verifies AUTH as an ACL user, and that a wrong password is a clear error.
TEST(RedisStore, AclUserWithPasswordAndWrongPassword) {
  rltest::redis_server server;
  const auto admin = server.options();
  ASSERT_EQ(rltest::command(admin, {"ACL", "SETUSER", "limiter", "on", ">s3cret", "~rl:*", "+@all"})
                ->type,
            REDIS_REPLY_STATUS);
  auto o = admin;
  o.user = "limiter";
  o.password = "s3cret";
  o.database = 0;
  redis::redis_store store(o);
  EXPECT_TRUE(store
                  .apply(gcra::config("1/1s", bucket_options{.name = "t"}), "k", store_time, 1,
                         access::consume)
                  .allowed);
  EXPECT_FALSE(store
                   .apply(gcra::config("1/1s", bucket_options{.name = "t"}), "k", store_time, 1,
                          access::consume)
                   .allowed);

  o.password = "wrong";
  redis::redis_store bad(o);
  try {
    (void)bad.apply(gcra::config("1/1s", bucket_options{.name = "t"}), "k", store_time, 1,
                    access::consume);
    FAIL() << "expected connection_error";
  } catch (const redis::connection_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("AUTH as user \"limiter\""), std::string::npos) << what;
    EXPECT_NE(what.find("WRONGPASS"), std::string::npos) << what;
  }
}

TEST(RedisStore, DatabaseIndexAndUnixSocket) {
  const std::string sock = "/tmp/rltest-" + std::to_string(::getpid()) + ".sock";
  rltest::redis_server server({"--unixsocket", sock, "--unixsocketperm", "700"});
  redis::options o = redis::parse_url("unix://" + sock + "?db=3");
  EXPECT_EQ(o.database, 3);
  redis::redis_store store(o);
  EXPECT_TRUE(store
                  .apply(gcra::config("1/1s", bucket_options{.name = "t"}), "k", store_time, 1,
                         access::consume)
                  .allowed);
  auto tcp = server.options();
  EXPECT_EQ(rltest::command(tcp, {"EXISTS", "rl:{k}:gcra:t"})->integer, 0);
  tcp.database = 3;
  EXPECT_EQ(rltest::command(tcp, {"EXISTS", "rl:{k}:gcra:t"})->integer, 1);
}

TEST(RedisOptions, ParsesUrls) {
  const auto a = redis::parse_url("redis://user:pw@example.com:6380/2");
  EXPECT_EQ(a.host, "example.com");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.database, 2);
  EXPECT_EQ(a.user, "user");
  EXPECT_EQ(a.password, "pw");
  const auto b = redis::parse_url("redis://:pw@h");
  EXPECT_EQ(b.user, "");
  EXPECT_EQ(b.password, "pw");
  EXPECT_EQ(b.port, 6379);
  EXPECT_THROW((void)redis::parse_url("http://h"), std::invalid_argument);
  EXPECT_THROW((void)redis::parse_url("redis://h:port"), std::invalid_argument);
}

TEST(RedisScripts, Sha1MatchesRedis) {
  const auto o = rltest::shared_redis();
  EXPECT_EQ(redis::detail::sha1_hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(redis::detail::sha1_hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  const auto r = rltest::command(o, {"SCRIPT", "LOAD", redis::script_for<gcra>::text});
  EXPECT_EQ(std::string(r->str, r->len), redis::detail::script_sha<gcra>());
}

}  // namespace
