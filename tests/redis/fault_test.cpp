// SPDX-License-Identifier: Apache-2.0
// Redis killed, paused and restarted mid-run: every check returns within its
// timeout (plus margin) under each failure policy, at once while the circuit
// breaker is open, and the store's background prober recovers by itself.
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

constexpr auto margin = 1000ms;  // generous: CI runs this under sanitizers on 2 busy cores

redis::options fault_options(const rltest::redis_server& server, redis::failure_policy p) {
  auto o = server.options();
  o.connect_timeout = 200ms;
  o.command_timeout = 200ms;
  o.breaker_threshold = 3;
  o.breaker_cooldown = 100ms;
  o.breaker_max_cooldown = 400ms;
  o.on_failure = p;
  o.fallback_divisor = 2;
  return o;
}

/// One check, timed; `threw` when it threw a store_error.
struct outcome {
  decision d;
  bool threw = false;
  clk::duration took{};
};

outcome check(redis::redis_store& store, const gcra::config& cfg, std::string_view key) {
  outcome r;
  const auto start = clk::now();
  try {
    r.d = store.apply(cfg, key, store_time, 1, access::consume);
  } catch (const store_error&) {
    r.threw = true;
  }
  r.took = clk::now() - start;
  return r;
}

class RedisFault : public ::testing::TestWithParam<redis::failure_policy> {};

/// The q-quantile of `v` (sorts it).
clk::duration quantile(std::vector<clk::duration>& v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  return v[i];
}

long long ms(clk::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// Verifies bounded latency under each failure policy while Redis is down, the
// open breaker answering at once (no caller ever probes: errors stay at the
// threshold), and recovery by the background prober after a restart on the
// same port, before any check is made.
TEST_P(RedisFault, KilledServerThenRestartRecoversWithoutUserAction) {
  rltest::redis_server server;
  const auto o = fault_options(server, GetParam());
  redis::redis_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "t"});
  const auto bound = o.connect_timeout + o.command_timeout + margin;

  const auto up = check(store, cfg, "a");
  ASSERT_FALSE(up.threw);
  EXPECT_EQ(up.d.source, decision_source::store);

  server.stop();
  int degraded = 0;
  std::vector<clk::duration> while_open;  // checks made after the breaker had opened
  const auto until = clk::now() + 1500ms;
  while (clk::now() < until) {
    const bool open = store.circuit_open();
    const auto r = check(store, cfg, "a");
    EXPECT_LE(r.took, bound);
    if (open) while_open.push_back(r.took);
    switch (GetParam()) {
      case redis::failure_policy::throw_error: EXPECT_TRUE(r.threw); break;
      case redis::failure_policy::fail_open:
        EXPECT_TRUE(r.d.allowed);
        EXPECT_EQ(r.d.source, decision_source::fail_open);
        break;
      case redis::failure_policy::fail_closed:
        EXPECT_FALSE(r.d.allowed);
        EXPECT_EQ(r.d.source, decision_source::fail_closed);
        break;
      case redis::failure_policy::fallback: EXPECT_EQ(r.d.source, decision_source::fallback); break;
    }
    ++degraded;
    std::this_thread::sleep_for(2ms);
  }
  const auto s = store.stats();
  EXPECT_EQ(s.breaker_opened, 1u);
  EXPECT_GT(s.short_circuited, 0u);
  // Only the checks that opened the breaker went to Redis; the rest never probed.
  EXPECT_EQ(s.errors, o.breaker_threshold);
  EXPECT_EQ(s.short_circuited + o.breaker_threshold, static_cast<std::uint64_t>(degraded));
  // Probes at about 100, 300, 700 and 1100 ms after opening (cool-down 100 ms doubling to 400).
  EXPECT_GE(s.probes, 2u);
  EXPECT_GE(s.probe_failures + 1, s.probes);  // all failed (one may be in progress)
  EXPECT_TRUE(store.circuit_open());
  if (GetParam() != redis::failure_policy::throw_error) {
    EXPECT_EQ(s.fail_open + s.fail_closed + s.fallback, static_cast<std::uint64_t>(degraded));
  }
  ASSERT_GT(while_open.size(), 10u);
  const auto median = quantile(while_open, 0.5);
  const auto p90 = quantile(while_open, 0.9);
  std::cout << "[ breaker  ] " << while_open.size() << " checks while open: median "
            << std::chrono::duration_cast<std::chrono::microseconds>(median).count() << " us, p90 "
            << std::chrono::duration_cast<std::chrono::microseconds>(p90).count() << " us, max "
            << ms(while_open.back()) << " ms; " << s.probes << " probes\n";
  EXPECT_LT(p90, 50ms) << "p90 " << ms(p90) << " ms";

  // Recovery without any check: the prober closes the breaker by itself.
  server.restart();
  const auto restarted = clk::now();
  while (store.circuit_open() && clk::now() - restarted < 10s) std::this_thread::sleep_for(10ms);
  ASSERT_FALSE(store.circuit_open()) << "the prober never closed the breaker";
  const auto s2 = store.stats();
  std::cout << "[ breaker  ] closed by the prober " << ms(clk::now() - restarted)
            << " ms after the restart\n";
  EXPECT_EQ(s2.probes, s2.probe_failures + 1);
  EXPECT_EQ(s2.errors, s.errors);  // no check was made meanwhile
  EXPECT_EQ(s2.short_circuited, s.short_circuited);

  const auto r = check(store, cfg, "b");
  EXPECT_LE(r.took, bound);
  EXPECT_FALSE(r.threw);
  EXPECT_EQ(r.d.source, decision_source::store);
  EXPECT_FALSE(store.circuit_open());
  EXPECT_EQ(store.stats().store, s.store + 1);
}

INSTANTIATE_TEST_SUITE_P(Policies, RedisFault,
                         ::testing::Values(redis::failure_policy::throw_error,
                                           redis::failure_policy::fail_open,
                                           redis::failure_policy::fail_closed,
                                           redis::failure_policy::fallback));

// Verifies that a stalled server (SIGSTOP) costs each check at most its
// command timeout, that a timeout is reported as timeout_error and never
// retried, and that checks go on once it resumes.
TEST(RedisFaultTimeout, PausedServerTimesOutWithinTheCommandTimeout) {
  rltest::redis_server server;
  const auto o = fault_options(server, redis::failure_policy::throw_error);
  redis::redis_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "t"});
  ASSERT_FALSE(check(store, cfg, "a").threw);
  server.pause();
  const auto start = clk::now();
  try {
    (void)store.apply(cfg, "a", store_time, 1, access::consume);
    ADD_FAILURE() << "expected timeout_error";
  } catch (const redis::timeout_error&) {
  }
  const auto took = clk::now() - start;
  EXPECT_GE(took, o.command_timeout - 5ms);
  EXPECT_LE(took, o.command_timeout + margin);
  EXPECT_EQ(store.stats().timeouts, 1u);
  server.resume();
  // The timed-out check may have run on the server once it resumed; it was
  // not sent again, so at most 1 + 1 units are used now.
  std::this_thread::sleep_for(50ms);
  const auto r = check(store, cfg, "a");
  ASSERT_FALSE(r.threw);
  EXPECT_GE(r.d.remaining, 7);
}

/// A store against a stopped server whose breaker is open.
redis::redis_store opened_store(const redis::options& o) {
  redis::redis_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "t"});
  for (std::uint32_t i = 0; i < o.breaker_threshold; ++i) (void)check(store, cfg, "a");
  return store;
}

// Verifies that the last handle's destructor stops the prober at once, not
// after its cool-down, and that copies keep it running until then.
TEST(RedisFaultBreaker, DestructorStopsTheSleepingProberPromptly) {
  rltest::redis_server server;
  auto o = fault_options(server, redis::failure_policy::fail_open);
  o.breaker_cooldown = 30s;  // the prober sleeps 30 s before its first probe
  o.breaker_max_cooldown = 60s;
  server.stop();
  std::optional<redis::redis_store> store(opened_store(o));
  ASSERT_TRUE(store->circuit_open());
  {
    redis::redis_store copy = *store;  // a copy going away leaves the prober alone
  }
  std::this_thread::sleep_for(20ms);  // the prober is asleep now
  EXPECT_TRUE(store->circuit_open());
  EXPECT_EQ(store->stats().probes, 0u);
  const auto start = clk::now();
  store.reset();
  const auto took = clk::now() - start;
  EXPECT_LT(took, 2s) << ms(took) << " ms";
}

// Verifies that stores in forked children work (their own prober closes their
// breaker) while the parent has a prober thread, and that a child destroying
// the last handle of a store made by its parent neither hangs nor crashes.
TEST(RedisFaultBreaker, ForkedChildrenUseTheirOwnStores) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan kills children that start threads after a multi-threaded fork";
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  GTEST_SKIP() << "TSan kills children that start threads after a multi-threaded fork";
#endif
#endif
  rltest::redis_server server;
  const auto o = fault_options(server, redis::failure_policy::fail_closed);
  server.stop();
  std::optional<redis::redis_store> parents(opened_store(o));  // its prober thread runs
  ASSERT_TRUE(parents->circuit_open());
  server.restart();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);  // a hang fails the test instead of blocking it
    int code = 0;
    try {
      auto co = o;
      co.unix_socket = "/nonexistent/ratelimit-fault-test.sock";  // connect fails at once
      {
        redis::redis_store mine = opened_store(co);
        if (!mine.circuit_open()) code = 2;
        const auto wait_until = clk::now() + 5s;
        while (mine.stats().probes == 0 && clk::now() < wait_until)
          std::this_thread::sleep_for(10ms);
        if (mine.stats().probes == 0) code = 3;
      }
      redis::redis_store theirs(o);
      const auto d = theirs.apply(gcra::config("10/1h", bucket_options{.name = "t"}), "child",
                                  store_time, 1, access::consume);
      if (d.source != decision_source::store) code = 4;
      parents.reset();  // the parent's thread does not exist here: must not join it
    } catch (...) {
      code = 5;
    }
    ::_exit(code);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's own prober closes its breaker.
  const auto until = clk::now() + 10s;
  while (parents->circuit_open() && clk::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(parents->circuit_open());
}

// Verifies the fallback limiter's own rate: limit / fallback_divisor.
TEST(RedisFaultFallback, FallbackAdmitsLimitOverDivisor) {
  rltest::redis_server server;
  const auto o = fault_options(server, redis::failure_policy::fallback);
  redis::redis_store store(o);
  server.stop();
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  int admitted = 0;
  for (int i = 0; i < 20; ++i) {
    const auto d = store.apply(cfg, "k", std::chrono::microseconds{1'000'000}, 1, access::consume);
    EXPECT_EQ(d.source, decision_source::fallback);
    admitted += d.allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 5);
  EXPECT_EQ(store.stats().fallback, 20u);
}

// Verifies that fallback limiters are bounded: every distinct config that
// degrades (tiers changed during an outage) gets its own, and past 64 the
// least recently used one is dropped, so its keys start fresh.
TEST(RedisFaultFallback, FallbackLimitersAreBoundedLeastRecentlyUsedDropped) {
  rltest::redis_server server;
  const auto o = fault_options(server, redis::failure_policy::fallback);
  redis::redis_store store(o);
  server.stop();
  const auto cfg_of = [](int limit) {
    return fixed_window::config(std::to_string(limit) + "/1h", window_options{.name = "t"});
  };
  const auto t = std::chrono::microseconds{1'000'000};
  // Config 2 (fallback limit 1) admits once, then rejects while it is held.
  EXPECT_TRUE(store.apply(cfg_of(2), "k", t, 1, access::consume).allowed);
  EXPECT_FALSE(store.apply(cfg_of(2), "k", t, 1, access::consume).allowed);
  for (int limit = 4; limit < 4 + 62; limit += 2) {
    EXPECT_EQ(store.apply(cfg_of(limit), "k", t, 1, access::consume).source,
              decision_source::fallback);
  }
  // 32 configs held; touch config 2 again, so it is the most recent.
  EXPECT_FALSE(store.apply(cfg_of(2), "k", t, 1, access::consume).allowed);
  for (int limit = 100; limit < 100 + 2 * 40; limit += 2) {
    (void)store.apply(cfg_of(limit), "k", t, 1, access::consume);
  }
  EXPECT_EQ(store.stats().fallback_limiters, 64u);
  // Config 2 was used recently enough to survive; config 4 (the least
  // recently used) was dropped and starts fresh.
  EXPECT_FALSE(store.apply(cfg_of(2), "k", t, 1, access::consume).allowed);
  EXPECT_TRUE(store.apply(cfg_of(4), "k", t, 1, access::consume).allowed);
  EXPECT_TRUE(store.apply(cfg_of(4), "k", t, 1, access::consume).allowed);
  EXPECT_FALSE(store.apply(cfg_of(4), "k", t, 1, access::consume).allowed);
  EXPECT_EQ(store.stats().fallback_limiters, 64u);
}

}  // namespace
