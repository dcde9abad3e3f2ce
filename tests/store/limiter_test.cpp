// SPDX-License-Identifier: Apache-2.0
// Tests of limiter: input validation, peek, reset, the clock it reads, and threads.
#include "ratelimit/limiter.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::decision;
using ratelimit::decision_source;
using ratelimit::fixed_window;
using ratelimit::manual_clock;
using ratelimit::memory_store;
using ratelimit::timestamp;

using manual_fixed = ratelimit::limiter<fixed_window, memory_store<fixed_window>, manual_clock>;

manual_fixed make_fixed(const char* rate, manual_clock clock = manual_clock{}) {
  return manual_fixed{fixed_window::config{rate}, memory_store<fixed_window>{}, clock};
}

/// Runs `f` and returns the message of the std::invalid_argument it throws
/// ("<no exception>" if it throws none).
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST(Limiter, EmptyKeyThrows) {
  auto lim = make_fixed("5/s");
  const std::string msg = invalid_argument_message([&] { (void)lim.try_acquire(""); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  EXPECT_THROW((void)lim.peek(""), std::invalid_argument);
  EXPECT_THROW((void)lim.try_acquire("", 0s), std::invalid_argument);
  EXPECT_THROW(lim.reset(""), std::invalid_argument);
  EXPECT_EQ(lim.store().size(), 0u);
}

TEST(Limiter, KeyOver512BytesThrowsNamingItsSize) {
  auto lim = make_fixed("5/s");
  const std::string key(513, 'k');
  const std::string msg = invalid_argument_message([&] { (void)lim.try_acquire(key); });
  EXPECT_NE(msg.find("513"), std::string::npos) << msg;
  EXPECT_NE(msg.find("512"), std::string::npos) << msg;
  const std::string huge(100'000, '\0');
  const std::string huge_msg = invalid_argument_message([&] { (void)lim.peek(huge); });
  EXPECT_NE(huge_msg.find("100000"), std::string::npos) << huge_msg;
  EXPECT_THROW(lim.reset(key), std::invalid_argument);
  EXPECT_EQ(lim.store().size(), 0u);
}

TEST(Limiter, KeyOf512BytesIsAccepted) {
  auto lim = make_fixed("1/s");
  std::string key(512, '\0');
  key.front() = '{';
  key.back() = '}';
  EXPECT_TRUE(lim.try_acquire(key).allowed);
  EXPECT_FALSE(lim.try_acquire(key).allowed);
  key.back() = ']';
  EXPECT_TRUE(lim.try_acquire(key).allowed);
  EXPECT_EQ(lim.store().size(), 2u);
}

TEST(Limiter, CostBelowOneThrowsNamingTheValue) {
  auto lim = make_fixed("5/s");
  const std::string zero = invalid_argument_message([&] { (void)lim.try_acquire("k", 0); });
  EXPECT_NE(zero.find("got 0"), std::string::npos) << zero;
  const std::string negative = invalid_argument_message([&] { (void)lim.try_acquire("k", -3); });
  EXPECT_NE(negative.find("got -3"), std::string::npos) << negative;
  const std::string peeked = invalid_argument_message([&] { (void)lim.peek("k", 0s, 0); });
  EXPECT_NE(peeked.find("got 0"), std::string::npos) << peeked;
  EXPECT_EQ(lim.store().size(), 0u);
}

TEST(Limiter, CostAboveMaximumThrowsButCostAboveLimitIsARejection) {
  auto lim = make_fixed("5/s");
  const ratelimit::units too_big = ratelimit::max_units + 1;
  const std::string msg = invalid_argument_message([&] { (void)lim.try_acquire("k", too_big); });
  EXPECT_NE(msg.find(std::to_string(too_big)), std::string::npos) << msg;

  const decision d = lim.try_acquire("k", 6);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, ratelimit::never);
  EXPECT_EQ(d.remaining, 5);
  EXPECT_TRUE(lim.try_acquire("k", 5).allowed);
}

TEST(Limiter, TimeOutsideZeroTo2Pow62Throws) {
  auto lim = make_fixed("5/s");
  const std::string before = invalid_argument_message([&] { (void)lim.try_acquire("k", -1us); });
  EXPECT_NE(before.find("-1us"), std::string::npos) << before;
  const timestamp late{(std::int64_t{1} << 62) + 1};
  const std::string after = invalid_argument_message([&] { (void)lim.peek("k", late); });
  EXPECT_NE(after.find(std::to_string(late.count())), std::string::npos) << after;
  EXPECT_EQ(lim.store().size(), 0u);

  EXPECT_TRUE(lim.try_acquire("k", 0us).allowed);
  EXPECT_TRUE(lim.try_acquire("late", ratelimit::max_time).allowed);
  EXPECT_EQ(ratelimit::max_time.count(), std::int64_t{1} << 62);
}

// Verifies that a clock reading outside the accepted range is refused too,
// not silently clamped.
TEST(Limiter, ClockOutsideRangeThrows) {
  manual_clock clock{-5us};
  auto lim = make_fixed("5/s", clock);
  const std::string msg = invalid_argument_message([&] { (void)lim.try_acquire("k"); });
  EXPECT_NE(msg.find("-5us"), std::string::npos) << msg;
  const std::string peeked = invalid_argument_message([&] { (void)lim.peek("k"); });
  EXPECT_NE(peeked.find("-5us"), std::string::npos) << peeked;
  EXPECT_EQ(lim.store().size(), 0u);  // nothing recorded, no lock left held
  clock.set(0us);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
}

/// A clock that counts its readings (shared by copies) and returns 7 s.
struct counting_clock {
  using duration = std::chrono::microseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  std::shared_ptr<std::atomic<int>> reads = std::make_shared<std::atomic<int>>(0);
  [[nodiscard]] time_point now() const noexcept {
    reads->fetch_add(1);
    return time_point{7s};
  }
};

// Verifies that the memory store, which reads the limiter's clock itself
// (after hashing the key), reads it exactly once per check, new key or held,
// and decides at that reading.
TEST(Limiter, ReadsItsClockOncePerCheck) {
  counting_clock clock;
  ratelimit::limiter<fixed_window, memory_store<fixed_window>, counting_clock> lim{
      fixed_window::config{"2/10s"}, memory_store<fixed_window>{}, clock};
  EXPECT_EQ(lim.try_acquire("k").reset_after, 3s);  // window [0s, 10s) at 7s
  EXPECT_EQ(clock.reads->load(), 1);
  EXPECT_TRUE(lim.peek("k").allowed);
  EXPECT_EQ(clock.reads->load(), 2);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_EQ(lim.try_acquire("k").retry_after, 3s);
  EXPECT_EQ(clock.reads->load(), 4);
  EXPECT_THROW((void)lim.try_acquire(""), std::invalid_argument);  // refused before any reading
  EXPECT_EQ(clock.reads->load(), 4);
}

TEST(Limiter, PeekDoesNotConsume) {
  auto lim = make_fixed("2/s");
  for (int i = 0; i < 10; ++i) {
    const decision d = lim.peek("k");
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 1);
    EXPECT_EQ(d.reset_after, 1s);
  }
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  const decision peeked = lim.peek("k");
  EXPECT_FALSE(peeked.allowed);
  EXPECT_EQ(peeked.retry_after, 1s);
  EXPECT_EQ(lim.try_acquire("k"), peeked);
}

TEST(Limiter, ResetForgetsTheKey) {
  auto lim = make_fixed("1/h");
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_FALSE(lim.try_acquire("k").allowed);
  lim.reset("k");
  const decision d = lim.try_acquire("k");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.source, decision_source::store);
}

// Verifies that the limiter decides at its clock's time: the same calls give
// different answers once the (shared) manual clock moves.
TEST(Limiter, DecidesAtItsClocksTime) {
  manual_clock clock{10s};
  auto lim = make_fixed("3/1min", clock);
  EXPECT_EQ(lim.now(), 10s);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(lim.try_acquire("k").allowed);
  const decision blocked = lim.try_acquire("k");
  EXPECT_FALSE(blocked.allowed);
  EXPECT_EQ(blocked.retry_after, 50s);
  clock.advance(50s - 1us);
  EXPECT_EQ(lim.try_acquire("k").retry_after, 1us);
  clock.advance(1us);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_EQ(lim.now(), 1min);
}

// Verifies SPEC's boundary through the limiter: "10 per 15 minutes" admits an
// 11th call exactly 15:00.000000 after the first, not a microsecond sooner.
TEST(Limiter, SlidingLogAdmitsExactlyOneWindowLater) {
  manual_clock clock{1h};
  ratelimit::limiter<ratelimit::sliding_window_log, memory_store<ratelimit::sliding_window_log>,
                     manual_clock>
      lim{ratelimit::sliding_window_log::config{"10 per 15 minutes"},
          memory_store<ratelimit::sliding_window_log>{}, clock};
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(lim.try_acquire("caller").allowed);
  clock.advance(15min - 1us);
  const decision early = lim.try_acquire("caller");
  EXPECT_FALSE(early.allowed);
  EXPECT_EQ(early.retry_after, 1us);
  clock.advance(1us);
  EXPECT_TRUE(lim.try_acquire("caller").allowed);
}

TEST(Limiter, CallerSuppliedTimeBypassesTheClock) {
  manual_clock clock{0s};
  auto lim = make_fixed("1/s", clock);
  EXPECT_TRUE(lim.try_acquire("k", 5s).allowed);
  EXPECT_FALSE(lim.try_acquire("k", 5s + 999'999us).allowed);
  EXPECT_TRUE(lim.try_acquire("k", 6s).allowed);
  EXPECT_EQ(lim.now(), 0s);
  // The clock's 0s is earlier than the key's stored window (6s): the request is
  // decided at 6s, where the window is full.
  const decision d = lim.try_acquire("k");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 1s);
  EXPECT_TRUE(lim.try_acquire("other").allowed);
}

TEST(Limiter, DefaultLimiterUsesMemoryStoreAndSteadyClock) {
  ratelimit::limiter<ratelimit::gcra> lim{ratelimit::gcra::config{"2/s"}};
  static_assert(std::is_same_v<decltype(lim)::store_type, memory_store<ratelimit::gcra>>);
  static_assert(std::is_same_v<decltype(lim)::clock_type, ratelimit::steady_clock>);
  EXPECT_GE(lim.now().count(), 0);
  EXPECT_TRUE(lim.try_acquire("k").allowed);
  EXPECT_EQ(lim.config().burst(), 2);
  EXPECT_EQ(lim.store().size(), 1u);
}

TEST(Limiter, StoreOptionsPassThrough) {
  ratelimit::memory_store_options o;
  o.max_keys = 1;
  o.on_full = ratelimit::when_full::fail_closed;
  ratelimit::limiter<fixed_window, memory_store<fixed_window>, manual_clock> lim{
      fixed_window::config{"5/s"}, memory_store<fixed_window>{o}, manual_clock{}};
  EXPECT_TRUE(lim.try_acquire("a").allowed);
  const decision d = lim.try_acquire("b");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.source, decision_source::fail_closed);
  EXPECT_EQ(d.limit, 5);
}

// Verifies the limiter is safe to share: threads on one key through one
// limiter (steady clock, so time is real) admit exactly the bucket's burst,
// since the rate refills far slower than the test runs.
TEST(Limiter, SharedAcrossThreadsAdmitsExactlyTheBurst) {
  ratelimit::limiter<ratelimit::token_bucket> lim{
      ratelimit::token_bucket::config{ratelimit::rate{1, 24h}, {.burst = 500}}};
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&] {
      int mine = 0;
      for (int i = 0; i < 5'000; ++i) {
        if (lim.try_acquire("shared").allowed) ++mine;
      }
      admitted.fetch_add(mine);
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(admitted.load(), 500);
}

}  // namespace
