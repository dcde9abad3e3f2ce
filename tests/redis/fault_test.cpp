// SPDX-License-Identifier: Apache-2.0
// Redis killed, paused and restarted mid-run: every check returns within its
// timeout (plus margin) under each failure policy, and the store recovers.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

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

// Verifies bounded latency under each failure policy while Redis is down,
// the breaker answering at once, and recovery after a restart on the same port.
TEST_P(RedisFault, KilledServerThenRestartRecoversWithoutUserAction) {
  rltest::redis_server server;
  const auto o = fault_options(server, GetParam());
  redis::redis_store store(o);
  const gcra::config cfg("10/1h");
  const auto bound = o.connect_timeout + o.command_timeout + margin;

  const auto up = check(store, cfg, "a");
  ASSERT_FALSE(up.threw);
  EXPECT_EQ(up.d.source, decision_source::store);

  server.stop();
  int degraded = 0;
  const auto until = clk::now() + 1500ms;
  while (clk::now() < until) {
    const auto r = check(store, cfg, "a");
    EXPECT_LE(r.took, bound);
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
  }
  const auto s = store.stats();
  EXPECT_GE(s.breaker_opened, 1u);
  EXPECT_GT(s.short_circuited, 0u);
  EXPECT_TRUE(store.circuit_open());
  if (GetParam() != redis::failure_policy::throw_error) {
    EXPECT_EQ(s.fail_open + s.fail_closed + s.fallback, static_cast<std::uint64_t>(degraded));
  }

  server.restart();
  bool recovered = false;
  const auto give_up = clk::now() + 10s;
  while (clk::now() < give_up && !recovered) {
    const auto r = check(store, cfg, "b");
    EXPECT_LE(r.took, bound);
    recovered = !r.threw && r.d.source == decision_source::store;
    if (!recovered) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(recovered);
  EXPECT_FALSE(store.circuit_open());
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
  const gcra::config cfg("10/1h");
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

// Verifies the fallback limiter's own rate: limit / fallback_divisor.
TEST(RedisFaultFallback, FallbackAdmitsLimitOverDivisor) {
  rltest::redis_server server;
  const auto o = fault_options(server, redis::failure_policy::fallback);
  redis::redis_store store(o);
  server.stop();
  const fixed_window::config cfg("10/1h");
  int admitted = 0;
  for (int i = 0; i < 20; ++i) {
    const auto d = store.apply(cfg, "k", std::chrono::microseconds{1'000'000}, 1, access::consume);
    EXPECT_EQ(d.source, decision_source::fallback);
    admitted += d.allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 5);
  EXPECT_EQ(store.stats().fallback, 20u);
}

}  // namespace
