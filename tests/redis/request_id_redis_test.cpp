// SPDX-License-Identifier: Apache-2.0
// Idempotent checks on Redis: the exact rules, the id record (key, value,
// TTL), foreign values, degraded decisions, NOSCRIPT, two processes retrying
// one request, and random traces with repeated ids decided exactly as the
// in-process limiter decides them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/request_id_rules.hpp"
#include "support/request_id_traces.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

redis::options fresh(std::string_view what) {
  auto o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  o.pool_size = 4;
  return o;
}

TEST(RedisRequestId, ExactRules) {
  limiter<fixed_window, redis::redis_store> lim{rltest::request_id_rules_config(),
                                                redis::redis_store{fresh("rules")}};
  rltest::check_request_id_rules(lim, "");
}

// Verifies shadow mode with request ids on Redis: the wrapped script forces
// (ARGV[3] = "2") and records the forced decision.
TEST(RedisRequestId, ShadowModeForcesRecordsAndShadowsRepeats) {
  limiter<fixed_window, redis::redis_store> lim{rltest::request_id_rules_config(),
                                                redis::redis_store{fresh("shadow")}};
  rltest::check_request_id_shadow_rules(lim, "");
}

TEST(RedisRequestId, ExactRulesOnServerTime) {
  redis::options o = fresh("server-time");
  limiter<gcra, redis::redis_store, redis::server_clock> lim{
      gcra::config{"3/1h", bucket_options{.name = "ids"}}, redis::redis_store{o}};
  EXPECT_EQ(lim.retention(), microseconds{3'600'000'000});
  const decision first = lim.try_acquire("k", request_id{"r1"});
  EXPECT_TRUE(first.allowed);
  EXPECT_FALSE(first.repeat);
  decision expected = first;
  expected.repeat = true;
  EXPECT_EQ(lim.try_acquire("k", request_id{"r1"}), expected);
  EXPECT_EQ(lim.peek("k", request_id{"r1"}), expected);
  EXPECT_EQ(lim.try_acquire("k", request_id{"r2"}).remaining, 1);
}

// Verifies the id key's name, slot, value and TTL.
TEST(RedisRequestId, RecordIsOneKeyBesideThePolicyKeyWithTheRetentionAsTtl) {
  const redis::options o = fresh("record");
  const fixed_window::config cfg{"2/10s", window_options{.name = "ids"}};
  redis::redis_store store(o);
  const timestamp t0{1'700'000'000'000'000};
  const std::string id("a:b\0}{", 6);
  (void)store.apply_once(cfg, "+1555", request_id{id}, microseconds{400'000'000}, t0, 1);
  const std::string base = store.key_for(cfg, "+1555");
  const std::string id_key = base + ":id:" + id + ":6#";
  auto v = rltest::command(o, {"GET", id_key});
  ASSERT_EQ(v->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(v->str, v->len), "rid1:1700000400000000:1:1:1:0:10000000:2");
  auto ttl = rltest::command(o, {"PTTL", id_key});
  EXPECT_GT(ttl->integer, 399'000);
  EXPECT_LE(ttl->integer, 400'000);
  EXPECT_EQ(redis::key_slot(id_key), redis::key_slot(base));
  // A peek writes no record.
  (void)store.apply_once(cfg, "+1555", request_id{"peeked"}, microseconds{400'000'000}, t0, 1,
                         access::peek);
  EXPECT_EQ(rltest::command(o, {"EXISTS", base + ":id:peeked:6#"})->integer, 0);
}

// Verifies that a value our script did not write at the id key is a script
// error naming the key, and that the check is left undone.
TEST(RedisRequestId, ForeignRecordIsAScriptErrorAndTheCheckIsLeftUndone) {
  redis::options o = fresh("foreign");
  o.on_failure = redis::failure_policy::throw_error;
  const fixed_window::config cfg{"2/10s", window_options{.name = "ids"}};
  redis::redis_store store(o);
  const timestamp t0{1'700'000'000'000'000};
  const std::string base = store.key_for(cfg, "k");
  const std::string id_key = base + ":id:r:1#";
  for (const std::string bad :
       {"rid1:1:1:1:1:0:1", "rid1:1:2:1:1:0:1:0", "rid2:1:1:1:1:0:1:0", "1", "",
        "rid1:1:1:1:1:0:1:0:9", "rid1:99999999999999999999:1:1:1:0:1:0", "rid1:1:1:1:1:x:1:0"}) {
    rltest::command(o, {"SET", id_key, bad});
    try {
      (void)store.apply_once(cfg, "k", request_id{"r"}, microseconds{1'000'000}, t0, 1);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const redis::script_error& e) {
      EXPECT_NE(std::string(e.what()).find(id_key), std::string::npos) << e.what();
    }
    EXPECT_EQ(rltest::command(o, {"EXISTS", base})->integer, 0) << bad;
    auto still = rltest::command(o, {"GET", id_key});
    EXPECT_EQ(std::string(still->str, still->len), bad);
  }
  // Well-formed records whose decision no script gives (admitted, not
  // counted; admitted with a wait; rejected without one; more remaining than
  // the limit), each with a valid limit so that only the decision is wrong.
  for (const std::string inconsistent :
       {"rid1:9999999999999999:1:0:1:0:1:5", "rid1:9999999999999999:1:1:1:7:1:5",
        "rid1:9999999999999999:0:0:0:0:1:5", "rid1:9999999999999999:1:1:6:0:1:5"}) {
    rltest::command(o, {"SET", id_key, inconsistent});
    EXPECT_THROW((void)store.apply_once(cfg, "k", request_id{"r"}, microseconds{1'000'000}, t0, 1),
                 redis::script_error)
        << inconsistent;
    EXPECT_EQ(rltest::command(o, {"EXISTS", base})->integer, 0) << inconsistent;
  }
  rltest::command(o, {"DEL", id_key});
  rltest::command(o, {"RPUSH", id_key, "x"});
  EXPECT_THROW((void)store.apply_once(cfg, "k", request_id{"r"}, microseconds{1'000'000}, t0, 1),
               redis::script_error);
  EXPECT_EQ(rltest::command(o, {"EXISTS", base})->integer, 0);
}

// Verifies that a degraded decision records no id: a retry while Redis is
// down is degraded again, and once it is back the id is decided as new.
TEST(RedisRequestId, DegradedDecisionsRecordNoId) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = "deg:";
  o.on_failure = redis::failure_policy::fail_open;
  o.breaker_threshold = 1000;
  o.command_timeout = std::chrono::milliseconds(300);
  o.connect_timeout = std::chrono::milliseconds(300);
  const fixed_window::config cfg{"1/10s", window_options{.name = "ids"}};
  limiter<fixed_window, redis::redis_store> lim{cfg, redis::redis_store{o}};
  const timestamp t0{1'700'000'000'000'000};
  server.stop();
  const decision down = lim.try_acquire("k", request_id{"r"}, t0);
  EXPECT_EQ(down.source, decision_source::fail_open);
  EXPECT_FALSE(down.repeat);
  EXPECT_EQ(lim.try_acquire("k", request_id{"r"}, t0).source, decision_source::fail_open);
  server.restart();
  const decision back = lim.try_acquire("k", request_id{"r"}, t0 + microseconds{1});
  EXPECT_EQ(back.source, decision_source::store);
  EXPECT_TRUE(back.allowed);
  EXPECT_FALSE(back.repeat);
  EXPECT_TRUE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{2}).repeat);
}

// Verifies that the wrapped scripts are reloaded after SCRIPT FLUSH.
TEST(RedisRequestId, WrappedScriptsAreReloadedAfterFlush) {
  const redis::options o = fresh("flush");
  redis::redis_store store(o);
  const gcra::config cfg{"5/s", bucket_options{.name = "ids"}};
  const timestamp t0{1'700'000'000'000'000};
  (void)store.apply_once(cfg, "k", request_id{"1"}, microseconds{1'000'000}, t0, 1);
  rltest::command(o, {"SCRIPT", "FLUSH"});
  const auto before = store.stats().script_reloads;
  EXPECT_TRUE(store.apply_once(cfg, "k", request_id{"1"}, microseconds{1'000'000}, t0, 1).repeat);
  EXPECT_EQ(store.stats().script_reloads, before + 1);
  // The plain script and the wrapped one are distinct scripts: both load.
  EXPECT_FALSE(store.apply(cfg, "k", t0, 1).repeat);
  EXPECT_EQ(store.stats().script_reloads, before + 2);
}

// Verifies that the decorators hand idempotent checks to Redis (the ids live
// there, shared by every limiter on it), and that the blocked-key cache never
// answers a retry with a cached block instead of its first decision.
TEST(RedisRequestId, DecoratorsKeepIdsInRedis) {
  const redis::options o = fresh("decorators");
  const fixed_window::config cfg{"1/10s", window_options{.name = "ids"}};
  const timestamp t0{1'700'000'000'000'000};
  basic_metrics metrics;
  using observed = observed_store<redis::redis_store, basic_metrics*>;
  limiter<fixed_window, observed> a{cfg, observed{redis::redis_store{o}, &metrics}};
  limiter<fixed_window, blocked_cache<redis::redis_store>> b{
      cfg, blocked_cache<redis::redis_store>{redis::redis_store{o}}};
  EXPECT_TRUE(a.try_acquire("k", request_id{"r1"}, t0).allowed);
  EXPECT_EQ(a.request_ids_held(), 0u);
  // Another limiter (another node) sees the id: a repeat, admitted as first decided.
  const decision retry = b.try_acquire("k", request_id{"r1"}, t0 + microseconds{1});
  EXPECT_TRUE(retry.repeat);
  EXPECT_TRUE(retry.allowed);
  // A new request is blocked (and may be cached); the retry of r1 still is not.
  EXPECT_FALSE(b.try_acquire("k", t0 + microseconds{2}).allowed);
  EXPECT_FALSE(b.try_acquire("k", t0 + microseconds{3}).allowed);
  EXPECT_TRUE(b.try_acquire("k", request_id{"r1"}, t0 + microseconds{4}).allowed);
  EXPECT_EQ(b.request_ids_held(), 0u);
}

// Verifies that ids built to look like another id's key suffix (`:<len>#`
// inside the id) and 256-byte binary ids on a 512-byte key starting with '}'
// (the key's own hash tag form) are distinct requests, decided as in process.
TEST(RedisRequestId, IdsShapedLikeKeySuffixesAreDistinctRequests) {
  const fixed_window::config cfg{"10/1h", window_options{.name = "ids"}};
  limiter<fixed_window> mem{cfg};
  limiter<fixed_window, redis::redis_store> red{cfg, redis::redis_store{fresh("suffix")}};
  std::string long_key(512, '}');
  long_key[3] = '\0';
  std::string long_id(256, '#');
  long_id[0] = '\0';
  long_id[10] = '{';
  long_id[254] = ':';
  long_id[255] = '3';
  const std::vector<std::string> ids = {
      "a", "a:1#", "a:1#:4#", std::string("a\0", 2), long_id, long_id.substr(0, 255)};
  const timestamp t0{1'700'000'000'000'000};
  for (const std::string& key : {std::string("k"), long_key}) {
    for (int round = 0; round < 2; ++round) {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const timestamp t = t0 + microseconds{10 * round + static_cast<int>(i)};
        const decision a = mem.try_acquire(key, request_id{ids[i]}, t);
        const decision b = red.try_acquire(key, request_id{ids[i]}, t);
        EXPECT_EQ(a, b) << "id " << i << " round " << round;
        EXPECT_EQ(b.repeat, round == 1) << "id " << i;
        EXPECT_EQ(b.remaining, static_cast<units>(9 - static_cast<int>(i))) << "id " << i;
      }
    }
  }
}

// A retention set later applies to ids recorded from then on; ids already
// held keep the end of retention they were recorded with, on Redis as in
// idempotent_store (the limiter's own table forgets them instead).
TEST(RedisRequestId, RetentionChangesKeepHeldIdsAsIdempotentStoreDoes) {
  const fixed_window::config cfg{"100/s", window_options{.name = "rc"}};
  limiter<fixed_window, redis::redis_store> on_redis{cfg, redis::redis_store{fresh("retain")}};
  limiter<fixed_window, idempotent_store<fixed_window>> in_node{cfg};
  const timestamp t0{5'000'000};
  struct step {
    std::int64_t at;
    const char* id;
    std::int64_t retention;  ///< set before the check when > 0
    bool reset;
    bool repeat;  ///< expected
  };
  const step steps[] = {
      {0, "r", 250, false, false},  {249, "r", 0, false, true},     {250, "r", 1000, false, false},
      {300, "s", 0, false, false},  {1249, "r", 0, false, true},    {1250, "r", 0, false, false},
      {1299, "s", 0, false, true},  {1300, "s", 100, false, false}, {1350, "s", 0, false, true},
      {1399, "s", 0, true, true},   {1400, "s", 0, false, false},   {2249, "r", 0, false, true},
      {2250, "r", 0, false, false},
  };
  for (const step& e : steps) {
    if (e.retention > 0) {
      on_redis.set_idempotency({.retention = microseconds{e.retention}});
      in_node.set_idempotency({.retention = microseconds{e.retention}});
    }
    if (e.reset) {
      on_redis.reset("k");
      in_node.reset("k");
    }
    const timestamp at = t0 + microseconds{e.at};
    const decision node = in_node.try_acquire("k", request_id{e.id}, at);
    EXPECT_EQ(node.repeat, e.repeat) << "at t0 + " << e.at << " id " << e.id;
    ASSERT_EQ(rltest::describe_id(node),
              rltest::describe_id(on_redis.try_acquire("k", request_id{e.id}, at)))
        << "at t0 + " << e.at << " id " << e.id;
  }
}

TEST(RedisRequestId, BadRetentionIsRefused) {
  redis::redis_store store(fresh("bad"));
  const gcra::config cfg{"5/s", bucket_options{.name = "ids"}};
  const timestamp t0{1'000};
  EXPECT_THROW((void)store.apply_once(cfg, "k", request_id{"1"}, microseconds{0}, t0, 1),
               std::invalid_argument);
  EXPECT_THROW((void)store.apply_once(cfg, "k", request_id{"1"},
                                      redis::max_script_time + microseconds{1}, t0, 1),
               std::invalid_argument);
  EXPECT_THROW((void)store.apply_once(cfg, "k", request_id{""}, microseconds{1}, t0, 1),
               std::invalid_argument);
}

// Verifies atomicity: 2 processes x 8 threads retry one request (same key,
// same id) and exactly one check consumes.
TEST(RedisRequestId, TwoProcessesSixteenThreadsRetryingOneRequestConsumeOnce) {
  const redis::options o = fresh("procs");
  const sliding_window_log::config cfg{"100/1h", window_options{.name = "ids"}};
  const timestamp t0{1'700'000'000'000'000};
  for (int round = 0; round < 5; ++round) {
    const std::string id = "call-" + std::to_string(round);
    std::vector<std::pair<pid_t, int>> children;
    for (int p = 0; p < 2; ++p) {
      int fds[2];
      ASSERT_EQ(::pipe(fds), 0);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[0]);
        long firsts = -1;
        try {
          redis::redis_store store(o);
          std::atomic<long> n{0};
          std::vector<std::thread> pool;
          for (int i = 0; i < 8; ++i) {
            pool.emplace_back([&] {
              const decision d = store.apply_once(cfg, "+15551234567", request_id{id},
                                                  microseconds{3'600'000'000}, t0, 1);
              if (d.source == decision_source::store && !d.repeat) ++n;
              if (d.source != decision_source::store) n += 1000;
            });
          }
          for (auto& t : pool) t.join();
          firsts = n.load();
        } catch (...) {
        }
        (void)!::write(fds[1], &firsts, sizeof firsts);
        ::_exit(0);
      }
      ::close(fds[1]);
      children.emplace_back(pid, fds[0]);
    }
    long total = 0;
    for (auto [pid, fd] : children) {
      long n = -1;
      EXPECT_EQ(::read(fd, &n, sizeof n), static_cast<ssize_t>(sizeof n));
      EXPECT_GE(n, 0);
      total += n;
      ::close(fd);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
    EXPECT_EQ(total, 1) << "round " << round;
  }
  redis::redis_store store(o);
  EXPECT_EQ(store.apply(cfg, "+15551234567", t0, 1, access::peek).remaining, 100 - 5 - 1);
}

template <class P>
class RedisRequestIdDifferential : public ::testing::Test {};
using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(RedisRequestIdDifferential, policies);

// Verifies identical decisions, `repeat` included, on random traces mixing
// plain and idempotent checks, ids repeated across keys and times (around the
// retention's end, backwards), peeks and resets.
TYPED_TEST(RedisRequestIdDifferential, MatchesTheInProcessLimiter) {
  using P = TypeParam;
  redis::redis_store store(fresh(std::string("diff-") + std::string(P::name)));
  const int traces = rltest::diff_traces(150);
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 104729u + 5u);
    const auto cfg = rltest::random_id_config<P>(rng);
    rltest::compare_id_traces(cfg, rng, store, seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(RedisRequestIdDifferential, CompoundMatchesTheInProcessLimiter) {
  redis::redis_store store(fresh("diff-compound"));
  using mixed = compound<fixed_window, gcra>;
  const int traces = rltest::diff_traces(150);
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919u + 3u);
    if (seed % 2 == 0) {
      const compound_of<sliding_window_log>::config cfg{
          {"2/s", "4/10s"}, window_options{.count_rejected = seed % 4 == 0, .name = "d"}};
      rltest::compare_id_traces(cfg, rng, store, seed);
    } else {
      const mixed::config cfg{compound_options{.name = "d"}, fixed_window::config{"3/s"},
                              gcra::config{"1/300ms"}};
      rltest::compare_id_traces(cfg, rng, store, seed);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
