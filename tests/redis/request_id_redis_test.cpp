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

std::string describe(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted << " source=" << to_string(d.source)
    << " repeat=" << d.repeat << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == never ? -1 : d.retry_after.count())
    << " reset_after=" << d.reset_after.count() << "}";
  return o.str();
}

TEST(RedisRequestId, ExactRules) {
  limiter<fixed_window, redis::redis_store> lim{rltest::request_id_rules_config(),
                                                redis::redis_store{fresh("rules")}};
  rltest::check_request_id_rules(lim, "");
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
  // A well-formed record whose decision no script gives (admitted, not counted).
  rltest::command(o, {"SET", id_key, "rid1:9999999999999999:1:0:1:0:1:0"});
  EXPECT_THROW((void)store.apply_once(cfg, "k", request_id{"r"}, microseconds{1'000'000}, t0, 1),
               redis::script_error);
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

// ---- differential: random traces with ids repeated across them ----

struct event {
  std::string key;
  std::string id;  ///< empty: a plain check
  std::int64_t t = 0;
  units cost = 1;
  bool peek = false;
  bool reset = false;
};

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

std::vector<event> random_trace(std::mt19937_64& rng, std::int64_t w, std::int64_t retention,
                                units limit) {
  static const std::vector<std::string> keys = {"+15551234567", std::string("a\0b", 3), "}{:"};
  std::vector<std::string> ids = {"1", std::string("\0", 1), "x:y", "INVITE 7", "1#"};
  for (int i = 0; i < 4; ++i)
    ids.push_back(
        std::string(static_cast<std::size_t>(uniform(rng, 1, 256)), static_cast<char>('a' + i)));
  std::int64_t t = 1'700'000'000'000'000 + uniform(rng, 0, 1'000'000'000);
  const auto n = uniform(rng, 20, 100);
  std::vector<event> trace;
  std::int64_t latest = t;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 7)) {
      case 0:
      case 1: break;
      case 2: t += uniform(rng, 1, 3); break;
      case 3: t += uniform(rng, 0, w); break;
      case 4: t += retention - uniform(rng, -1, 1); break;  // around the retention's end
      case 5: t -= uniform(rng, 0, w); break;               // time going backwards
      default: t += uniform(rng, 0, std::max<std::int64_t>(1, w / std::max<units>(1, limit)));
    }
    // Times run backwards by less than a retention from the latest one (the
    // exact rule's scope: docs/semantics.md, "Idempotent checks").
    t = std::max(t, latest - (retention - 1));
    latest = std::max(latest, t);
    event e;
    e.key = keys[static_cast<std::size_t>(uniform(rng, 0, 2))];
    const auto k = uniform(rng, 0, 9);
    if (k > 1)
      e.id =
          ids[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(ids.size()) - 1))];
    e.t = t;
    e.cost = uniform(rng, 0, 5) == 0 ? uniform(rng, 1, limit + 2) : 1;
    e.peek = uniform(rng, 0, 9) == 0;
    e.reset = uniform(rng, 0, 39) == 0;
    trace.push_back(std::move(e));
  }
  return trace;
}

template <class Config>
void compare_traces(const Config& cfg, std::mt19937_64& rng, redis::redis_store& store, int seed) {
  using P = typename Config::policy_type;
  const std::int64_t w = detail::natural_period_us(cfg);
  const std::int64_t retention = uniform(rng, 0, 2) == 0
                                     ? w
                                     : uniform(rng, 1, 3) * std::max<std::int64_t>(1, w / 2);
  auto trace = random_trace(rng, w, retention, cfg.limit());
  for (event& e : trace) e.key += "#" + std::to_string(seed);  // fresh keys per trace
  // One in-process limiter per key (as differential_test.cpp: a sweep of
  // another idle key could forget state a request stamped earlier still sees).
  std::map<std::string, limiter<P>> memory;
  for (std::size_t j = 0; j < trace.size(); ++j) {
    const event& e = trace[j];
    auto [it, fresh_key] = memory.try_emplace(e.key, cfg);
    if (fresh_key) it->second.set_idempotency({.retention = microseconds{retention}});
    auto& m = it->second;
    if (e.reset) {
      m.reset(e.key);
      store.reset(cfg, e.key);
      continue;
    }
    const ratelimit::access a = e.peek ? ratelimit::access::peek : ratelimit::access::consume;
    decision want;
    decision got;
    if (e.id.empty()) {
      want = e.peek ? m.peek(e.key, timestamp{e.t}, e.cost)
                    : m.try_acquire(e.key, timestamp{e.t}, e.cost);
      got = store.apply(cfg, e.key, timestamp{e.t}, e.cost, a);
    } else {
      want = e.peek ? m.peek(e.key, request_id{e.id}, timestamp{e.t}, e.cost)
                    : m.try_acquire(e.key, request_id{e.id}, timestamp{e.t}, e.cost);
      got = store.apply_once(cfg, e.key, request_id{e.id}, microseconds{retention}, timestamp{e.t},
                             e.cost, a);
    }
    ASSERT_EQ(describe(got), describe(want))
        << P::name << " seed " << seed << " event " << j << " t=" << e.t << " id=" << e.id.size()
        << "B cost=" << e.cost << " peek=" << e.peek << " retention=" << retention;
  }
}

template <class P>
typename P::config random_config(std::mt19937_64& rng) {
  static const char* rates[] = {"1/10ms", "2/s", "3/7us", "5/min", "10/15min", "7/999983us"};
  const char* r = rates[uniform(rng, 0, 5)];
  if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
    bucket_options o;
    o.name = "d";
    if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 6);
    return typename P::config(r, o);
  } else {
    return typename P::config(r, window_options{uniform(rng, 0, 2) == 0, "d"});
  }
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
    const auto cfg = random_config<P>(rng);
    compare_traces(cfg, rng, store, seed);
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
      compare_traces(cfg, rng, store, seed);
    } else {
      const mixed::config cfg{compound_options{.name = "d"}, fixed_window::config{"3/s"},
                              gcra::config{"1/300ms"}};
      compare_traces(cfg, rng, store, seed);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
