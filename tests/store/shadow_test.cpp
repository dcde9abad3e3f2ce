// SPDX-License-Identifier: Apache-2.0
// Shadow mode in process: the limiter's runtime switch (threads too), peek, the wrappers
// (observed_store, blocked_cache) and the full in-process store.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/store/blocked_cache.hpp"
#include "ratelimit/store/observed_store.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

constexpr std::int64_t s = 1'000'000;

// Verifies the rules of a shadow-mode try_acquire: admitted, recorded, and
// flagged exactly when the policy rejects; the other fields are the forced
// decision's (remaining 0, retry_after the policy's wait on the recorded
// state, reset_after of the recorded state); switching back enforces the
// state the shadow checks built.
TEST(Shadow, TryAcquireAdmitsAndFlagsWhatThePolicyWouldReject) {
  limiter<fixed_window> l{fixed_window::config{"2/10s"}};
  EXPECT_FALSE(l.shadow());
  l.set_shadow(true);
  EXPECT_TRUE(l.shadow());
  const decision first = l.try_acquire("k", microseconds{1 * s});
  EXPECT_TRUE(first.allowed);
  EXPECT_FALSE(first.shadow_rejected);
  EXPECT_EQ(first.remaining, 1);
  (void)l.try_acquire("k", microseconds{1 * s});
  const decision third = l.try_acquire("k", microseconds{3 * s});
  EXPECT_TRUE(third.allowed);
  EXPECT_TRUE(third.shadow_rejected);
  EXPECT_TRUE(third.counted);
  EXPECT_EQ(third.source, decision_source::store);
  EXPECT_EQ(third.limit, 2);
  EXPECT_EQ(third.remaining, 0);
  EXPECT_EQ(third.retry_after, microseconds{7 * s});
  EXPECT_EQ(third.reset_after, microseconds{7 * s});
  EXPECT_TRUE(static_cast<bool>(third));
  // peek is unchanged: it says what enforcement would say, records nothing.
  const decision p = l.peek("k", microseconds{3 * s});
  EXPECT_FALSE(p.allowed);
  EXPECT_FALSE(p.shadow_rejected);
  l.set_shadow(false);
  const decision enforced = l.try_acquire("k", microseconds{3 * s});
  EXPECT_FALSE(enforced.allowed);
  EXPECT_FALSE(enforced.shadow_rejected);
  EXPECT_FALSE(enforced.counted);
}

// Verifies that the limiter stays movable and copies the switch's position.
TEST(Shadow, LimiterStaysMovable) {
  static_assert(std::is_move_constructible_v<limiter<gcra>>);
  static_assert(std::is_move_assignable_v<limiter<gcra>>);
  limiter<gcra> a{gcra::config{"1/1s"}};
  a.set_shadow(true);
  limiter<gcra> b = std::move(a);
  EXPECT_TRUE(b.shadow());
  (void)b.try_acquire("k", microseconds{0});
  EXPECT_TRUE(b.try_acquire("k", microseconds{0}).shadow_rejected);
}

// Verifies the switch flipped from another thread while four threads check
// one key at one instant: no decision is rejected while flagged, plain
// admissions never pass the limit, and every admitted request (flagged or
// not) is recorded exactly once: GCRA's debt at the end is their number x T.
TEST(Shadow, SwitchFlippedWhileThreadsCheckOneKey) {
  limiter<gcra> l{gcra::config{"100/100s"}};  // T = 1 s, burst 100
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> plain{0};
  std::atomic<std::int64_t> shadowed{0};
  std::atomic<std::int64_t> rejected{0};
  std::atomic<std::int64_t> bad{0};
  std::atomic<std::int64_t> flips{0};
  std::thread flipper([&] {
    bool on = false;
    while (!stop.load()) {
      on = !on;
      l.set_shadow(on);
      ++flips;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      // At least 3000 checks each, and on until the switch flipped 200 times.
      for (int i = 0; i < 3000 || flips.load() < 200; ++i) {
        const decision d = l.try_acquire("k", microseconds{0});
        if (!d.allowed && d.shadow_rejected) ++bad;
        if (!d.allowed) {
          ++rejected;
        } else if (d.shadow_rejected) {
          ++shadowed;
        } else {
          ++plain;
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  stop = true;
  flipper.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GE(plain + shadowed + rejected, 12'000);
  EXPECT_LE(plain.load(), 100);
  EXPECT_GT(shadowed.load(), 0);
  const decision after = l.peek("k", microseconds{0});
  EXPECT_EQ(after.reset_after, microseconds{(plain + shadowed) * s});
}

// Verifies basic_metrics under shadow mode: a forced check the policy
// rejects counts as shadow_rejected (not rejected, not allowed), and the
// Prometheus exposition carries it as result="shadow_rejected".
TEST(Shadow, MetricsCountShadowRejectionsSeparately) {
  basic_metrics m;
  using store_t = observed_store<memory_store<fixed_window>, basic_metrics*>;
  limiter<fixed_window, store_t> l{fixed_window::config{"1/10s"},
                                   store_t{memory_store<fixed_window>{}, &m}};
  (void)l.try_acquire("k", microseconds{0});
  (void)l.try_acquire("k", microseconds{0});  // rejected
  l.set_shadow(true);
  (void)l.try_acquire("k", microseconds{0});  // shadow-rejected
  (void)l.try_acquire("k", microseconds{0});  // shadow-rejected
  (void)l.try_acquire("j", microseconds{0});  // allowed
  const auto r = m.read();
  EXPECT_EQ(r.allowed, 2U);
  EXPECT_EQ(r.rejected, 1U);
  EXPECT_EQ(r.shadow_rejected, 2U);
  std::ostringstream out;
  m.write_prometheus(out, "memory");
  EXPECT_NE(out.str().find("ratelimit_checks_total{store=\"memory\",result=\"shadow_rejected\"} 2"),
            std::string::npos)
      << out.str();
}

// Verifies that blocked_cache never answers a forced check from its cached
// rejection: the store records it (its state moves on), and a forced
// rejection is not cached either.
TEST(Shadow, BlockedCacheLetsForcedChecksThrough) {
  using cache_t = blocked_cache<memory_store<fixed_window>>;
  limiter<fixed_window, cache_t> l{fixed_window::config{"1/1h"},
                                   cache_t{memory_store<fixed_window>{}}};
  (void)l.try_acquire("k", microseconds{0});
  const decision rejected = l.try_acquire("k", microseconds{0});
  ASSERT_FALSE(rejected.allowed);
  EXPECT_EQ(l.try_acquire("k", microseconds{1}).source, decision_source::local_cache);
  l.set_shadow(true);
  for (int i = 0; i < 3; ++i) {
    const decision d = l.try_acquire("k", microseconds{2});
    EXPECT_EQ(d.source, decision_source::store);
    EXPECT_TRUE(d.shadow_rejected);
    EXPECT_TRUE(d.counted);
  }
  fixed_window::config cfg{"1/1h"};
  const decision held = l.store().inner().apply(cfg, "k", microseconds{3}, 1, access::peek);
  EXPECT_FALSE(held.allowed);
  EXPECT_EQ(l.store().stats().hits, 1U);
}

// Verifies a full memory_store under shadow mode: fail_closed is admitted
// and flagged (shadow mode never rejects), fail_open is admitted unflagged;
// neither records anything.
TEST(Shadow, FullStoreDegradesAsDocumented) {
  for (const when_full w : {when_full::fail_closed, when_full::fail_open}) {
    limiter<fixed_window> l{
        fixed_window::config{"5/1h"},
        memory_store<fixed_window>{memory_store_options{.shards = 1, .max_keys = 1, .on_full = w}}};
    (void)l.try_acquire("a", microseconds{0});
    l.set_shadow(true);
    const decision d = l.try_acquire("b", microseconds{0});
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.shadow_rejected, w == when_full::fail_closed);
    EXPECT_FALSE(d.counted);
    EXPECT_EQ(d.source, w == when_full::fail_closed ? decision_source::fail_closed
                                                    : decision_source::fail_open);
    EXPECT_EQ(l.store().size(), 1U);
  }
}

}  // namespace
