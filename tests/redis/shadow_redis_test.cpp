// SPDX-License-Identifier: Apache-2.0
// Shadow mode on Redis: the exact rules per policy, threads and processes on one key, the
// failure policies (fail_open, fail_closed, fallback) and blocked_cache under forced checks.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/http_headers.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "ratelimit/store/blocked_cache.hpp"
#include "redis_server.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using ratelimit_test::reference::describe;
using std::chrono::microseconds;

constexpr std::int64_t s = 1'000'000;
constexpr std::int64_t t0 = 1'732'950'000'000'000;  // a caller time near today

redis::options fresh(std::string_view what) {
  auto o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  return o;
}

/// Runs one shadow scenario on Redis and in process: `n` checks of cost
/// `cost` at t0 + i * step in shadow mode, then one enforced check; every
/// decision must match field for field, and `flagged` of them must be
/// shadow_rejected.
template <class P>
void same_on_redis(const typename P::config& cfg, int n, units cost, std::int64_t step, int flagged,
                   std::int64_t start = t0) {
  limiter<P, redis::redis_store> remote{cfg, redis::redis_store{fresh(P::name)}};
  limiter<P> local{cfg};
  remote.set_shadow(true);
  local.set_shadow(true);
  int seen = 0;
  for (int i = 0; i < n; ++i) {
    const microseconds at{start + i * step};
    const decision want = local.try_acquire("+15551234567", at, cost);
    const decision got = remote.try_acquire("+15551234567", at, cost);
    ASSERT_EQ(describe(got), describe(want)) << P::name << " check " << i;
    ASSERT_EQ(got.shadow_rejected, want.shadow_rejected);
    ASSERT_TRUE(got.allowed);
    seen += got.shadow_rejected ? 1 : 0;
    if constexpr (requires { http::describe_policy(cfg); }) {
      ASSERT_EQ(http::headers(got, cfg), http::headers(want, cfg)) << P::name << " check " << i;
    }
  }
  EXPECT_EQ(seen, flagged) << P::name;
  remote.set_shadow(false);
  local.set_shadow(false);
  const microseconds at{start + n * step};
  const decision want = local.try_acquire("+15551234567", at, 1);
  const decision got = remote.try_acquire("+15551234567", at, 1);
  EXPECT_EQ(describe(got), describe(want)) << P::name << " enforced after shadow";
  EXPECT_FALSE(got.allowed) << P::name << ": the shadow checks were recorded";
}

// Verifies the exact shadow rules (and the HTTP header fields made from
// them) on Redis for every policy (every check
// recorded, the ones past the limit flagged, the enforced check after them
// rejected), identical to the in-process limiter field for field.
TEST(RedisShadow, ExactRulesPerPolicy) {
  same_on_redis<fixed_window>(fixed_window::config("3/10s", window_options{.name = "s"}), 8, 1,
                              1000, 5);
  same_on_redis<sliding_window_log>(
      sliding_window_log::config("3/10s", window_options{.name = "s"}), 8, 1, 1000, 5);
  same_on_redis<sliding_window_counter>(
      sliding_window_counter::config("3/10s", window_options{.name = "s"}), 8, 1, 1000, 5);
  same_on_redis<token_bucket>(token_bucket::config("3/10s", bucket_options{.name = "s"}), 8, 2,
                              1000, 7);
  same_on_redis<gcra>(gcra::config("3/10s", bucket_options{.name = "s"}), 8, 1, 1000, 5);
  same_on_redis<compound_of<fixed_window>>(
      compound_of<fixed_window>::config({"3/10s", "5/1h"}, window_options{.name = "s"}), 8, 1, 1000,
      5);
}

// Verifies the 2^52 caps on Redis: forced checks of the largest cost
// (2^50) push counts, debts and the GCRA TAT to their saturation points;
// every decision matches the in-process one, and the state the scripts
// wrote is read back by their strict readers (no "corrupt state" error).
TEST(RedisShadow, CapsMatchInProcess) {
  same_on_redis<fixed_window>(fixed_window::config("3/10s", window_options{.name = "c"}), 7,
                              max_units, 1, 7);
  same_on_redis<sliding_window_log>(
      sliding_window_log::config("3/10s", window_options{.name = "c"}), 7, max_units, 1, 7);
  same_on_redis<sliding_window_counter>(
      sliding_window_counter::config("3/10s", window_options{.name = "c"}), 7, max_units, 1, 7);
  same_on_redis<token_bucket>(token_bucket::config("3/10s", bucket_options{.name = "c"}), 7,
                              max_units, 1, 7);
  same_on_redis<gcra>(gcra::config("3/10s", bucket_options{.name = "c"}), 7, max_units, 1, 7);
  same_on_redis<gcra>(gcra::config("1000000/1s", bucket_options{.name = "c2"}), 7, max_units, 1, 7);
  same_on_redis<compound_of<fixed_window>>(
      compound_of<fixed_window>::config({"3/10s", "5/1h"}, window_options{.name = "c"}), 7,
      max_units, 1, 7);
  // At the latest caller time the scripts accept, the TAT cap t + 2^52 is
  // past 2^53, where a Lua double no longer holds every integer.
  const std::int64_t late = redis::max_script_time.count() - 7;  // the last check at 2^52
  same_on_redis<gcra>(gcra::config("1000000/1s", bucket_options{.name = "c3"}), 7, max_units, 1, 7,
                      late);
  same_on_redis<token_bucket>(token_bucket::config("1000000/1s", bucket_options{.name = "c3"}), 7,
                              max_units, 1, 7, late);
  same_on_redis<sliding_window_log>(
      sliding_window_log::config("3/10s", window_options{.name = "c3"}), 7, max_units, 1, 7, late);
}

/// Shadow checks on one GCRA key at one caller time from `threads` threads;
/// returns {checks, flagged}.
std::pair<long, long> shadow_threads(const redis::options& o, const gcra::config& cfg, int threads,
                                     int per_thread) {
  limiter<gcra, redis::redis_store> l{cfg, redis::redis_store{o}};
  l.set_shadow(true);
  std::atomic<long> checks{0};
  std::atomic<long> flagged{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < per_thread; ++j) {
        const decision d = l.try_acquire("+15551234567", microseconds{t0});
        if (!d.allowed || d.source != decision_source::store) return;
        ++checks;
        if (d.shadow_rejected) ++flagged;
      }
    });
  }
  for (auto& t : pool) t.join();
  return {checks.load(), flagged.load()};
}

// Verifies shadow checks from 2 processes x 4 threads on one key: every one
// admitted and recorded exactly once, exactly `burst` of them unflagged (at
// one instant GCRA admits the burst, then only forced checks follow), and
// the key's debt afterwards is the number of checks x T.
TEST(RedisShadow, ThreadsAndProcessesOnOneKey) {
  const redis::options o = fresh("procs");
  const gcra::config cfg("10/10s", bucket_options{.name = "s"});  // T = 1 s
  constexpr int processes = 2;
  constexpr int threads = 4;
  constexpr int per_thread = 50;
  std::vector<std::pair<pid_t, int>> children;
  for (int p = 0; p < processes; ++p) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::pair<long, long> r{-1, -1};
      try {
        r = shadow_threads(o, cfg, threads, per_thread);
      } catch (...) {
      }
      (void)!::write(fds[1], &r, sizeof r);
      ::_exit(0);
    }
    ::close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  long checks = 0;
  long flagged = 0;
  for (auto [pid, fd] : children) {
    std::pair<long, long> r{-1, -1};
    EXPECT_EQ(::read(fd, &r, sizeof r), static_cast<ssize_t>(sizeof r));
    checks += r.first;
    flagged += r.second;
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  EXPECT_EQ(checks, processes * threads * per_thread);
  EXPECT_EQ(flagged, checks - 10);
  limiter<gcra, redis::redis_store> l{cfg, redis::redis_store{o}};
  EXPECT_EQ(l.peek("+15551234567", microseconds{t0}).reset_after, microseconds{checks * s});
}

// Verifies shadow mode with the Redis server's clock (the limiter passes
// store_time): every check admitted, those past the limit flagged.
TEST(RedisShadow, ServerClock) {
  limiter<fixed_window, redis::redis_store, redis::server_clock> l{
      fixed_window::config("2/1h", window_options{.name = "s"}),
      redis::redis_store{fresh("server-clock")}};
  l.set_shadow(true);
  int flagged = 0;
  for (int i = 0; i < 5; ++i) {
    const decision d = l.try_acquire("k");
    ASSERT_TRUE(d.allowed);
    flagged += d.shadow_rejected ? 1 : 0;
  }
  // An hour boundary may pass between two checks (then fewer are flagged).
  EXPECT_GE(flagged, 1);
  EXPECT_LE(flagged, 3);
}

redis::options unreachable(redis::failure_policy p) {
  redis::options o = fresh("down");
  o.port = rltest::free_port();  // nothing listens there
  o.connect_timeout = std::chrono::milliseconds(200);
  o.on_failure = p;
  return o;
}

// Verifies the failure policies under shadow mode, with Redis unreachable:
// fail_closed is admitted and flagged (shadow mode never rejects), fail_open
// admitted unflagged; neither is counted. The fallback limiter records the
// forced checks: after them, an enforced check is rejected by it.
TEST(RedisShadow, FailurePoliciesUnderForce) {
  const fixed_window::config cfg("2/1h", window_options{.name = "s"});
  {
    limiter<fixed_window, redis::redis_store> l{
        cfg, redis::redis_store{unreachable(redis::failure_policy::fail_closed)}};
    l.set_shadow(true);
    const decision d = l.try_acquire("k", microseconds{t0});
    EXPECT_TRUE(d.allowed);
    EXPECT_TRUE(d.shadow_rejected);
    EXPECT_FALSE(d.counted);
    EXPECT_EQ(d.source, decision_source::fail_closed);
  }
  {
    limiter<fixed_window, redis::redis_store> l{
        cfg, redis::redis_store{unreachable(redis::failure_policy::fail_open)}};
    l.set_shadow(true);
    const decision d = l.try_acquire("k", microseconds{t0});
    EXPECT_TRUE(d.allowed);
    EXPECT_FALSE(d.shadow_rejected);
    EXPECT_EQ(d.source, decision_source::fail_open);
  }
  {
    limiter<fixed_window, redis::redis_store> l{
        cfg, redis::redis_store{unreachable(redis::failure_policy::fallback)}};
    l.set_shadow(true);
    for (int i = 0; i < 4; ++i) {
      const decision d = l.try_acquire("k", microseconds{t0});
      EXPECT_TRUE(d.allowed);
      EXPECT_EQ(d.shadow_rejected, i >= 2) << i;
      EXPECT_TRUE(d.counted);
      EXPECT_EQ(d.source, decision_source::fallback);
    }
    l.set_shadow(false);
    const decision d = l.try_acquire("k", microseconds{t0});
    EXPECT_FALSE(d.allowed);
    EXPECT_EQ(d.source, decision_source::fallback);
  }
}

// Verifies that blocked_cache over Redis sends a forced check to Redis even
// while it holds a cached rejection of the key: the script records it (the
// count read back passes the limit).
TEST(RedisShadow, BlockedCacheSendsForcedChecksToRedis) {
  const redis::options o = fresh("cache");
  using cache_t = blocked_cache<redis::redis_store>;
  const fixed_window::config cfg("1/1h", window_options{.name = "s"});
  limiter<fixed_window, cache_t> l{cfg, cache_t{redis::redis_store{o}}};
  (void)l.try_acquire("k", microseconds{t0});
  ASSERT_FALSE(l.try_acquire("k", microseconds{t0}).allowed);
  ASSERT_EQ(l.try_acquire("k", microseconds{t0 + 1}).source, decision_source::local_cache);
  l.set_shadow(true);
  for (int i = 0; i < 3; ++i) {
    const decision d = l.try_acquire("k", microseconds{t0 + 2});
    EXPECT_EQ(d.source, decision_source::store);
    EXPECT_TRUE(d.shadow_rejected);
  }
  const auto v = rltest::command(o, {"GET", o.prefix + "{k}:fixed_window:s"});
  ASSERT_EQ(v->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(v->str, v->len).substr(0, std::string(v->str, v->len).find(';')),
            std::to_string(t0 / 3'600'000'000) + ":4");
}

}  // namespace
