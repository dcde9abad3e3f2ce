// SPDX-License-Identifier: Apache-2.0
// limiter::async_try_acquire and its co_await form over the in-process
// store: decided inline, exactly once, with the decisions of try_acquire.
#include <gtest/gtest.h>

#include <coroutine>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

// Verifies that async checks at caller time give, inline and exactly once,
// the decisions the blocking calls give on a twin limiter, edges included
// (the microsecond before the window ends, and the window's end).
TEST(LimiterAsync, InProcessMatchesTryAcquireInline) {
  const fixed_window::config cfg("2/1s", window_options{.name = "t"});
  limiter<fixed_window> async_side(cfg), sync_side(cfg);
  const std::vector<std::int64_t> times = {0, 1, 2, 999'999, 1'000'000, 1'000'001, 1'000'002};
  for (const std::int64_t t : times) {
    int calls = 0;
    decision got;
    async_side.async_try_acquire("k", microseconds{t}, 1, [&](decision d, std::exception_ptr e) {
      EXPECT_FALSE(e);
      got = d;
      ++calls;
    });
    EXPECT_EQ(calls, 1) << t;
    EXPECT_EQ(got, sync_side.try_acquire("k", microseconds{t}, 1)) << t;
  }
}

// Verifies shadow mode: the async check is forced and reported admitted,
// flagged as the blocking call flags it.
TEST(LimiterAsync, ShadowModeAsTryAcquire) {
  const fixed_window::config cfg("1/1h", window_options{.name = "t"});
  limiter<fixed_window> a(cfg), b(cfg);
  a.set_shadow(true);
  b.set_shadow(true);
  for (int i = 0; i < 3; ++i) {
    decision got;
    a.async_try_acquire("k", microseconds{10}, 1, [&](decision d, std::exception_ptr) { got = d; });
    const decision want = b.try_acquire("k", microseconds{10}, 1);
    EXPECT_EQ(got, want) << i;
    EXPECT_TRUE(got.allowed);
    EXPECT_EQ(got.shadow_rejected, i > 0);
  }
}

// Verifies that bad input throws from the call and never reaches the handler.
TEST(LimiterAsync, BadInputThrowsWithoutCallingTheHandler) {
  limiter<gcra> l(gcra::config("10/s"));
  int calls = 0;
  const auto h = [&](decision, std::exception_ptr) { ++calls; };
  EXPECT_THROW(l.async_try_acquire("", h), std::invalid_argument);
  EXPECT_THROW(l.async_try_acquire(std::string(513, 'x'), h), std::invalid_argument);
  EXPECT_THROW(l.async_try_acquire("k", units{0}, h), std::invalid_argument);
  EXPECT_THROW(l.async_try_acquire("k", microseconds{-1}, 1, h), std::invalid_argument);
  EXPECT_EQ(calls, 0);
}

struct task {
  struct promise_type {
    task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

task take(limiter<gcra>& l, std::vector<bool>& out, std::string& error) {
  for (int i = 0; i < 3; ++i) out.push_back((co_await l.async_try_acquire("k")).allowed);
  try {
    (void)co_await l.async_try_acquire("k", units{0});
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
}

// Verifies the co_await form in process: no suspension, the burst admitted
// then a rejection, and bad input thrown from the co_await.
TEST(LimiterAsync, CoAwaitCompletesWithoutSuspending) {
  limiter<gcra> l(gcra::config("2/1h"));
  std::vector<bool> out;
  std::string error;
  take(l, out, error);
  EXPECT_EQ(out, (std::vector<bool>{true, true, false}));
  EXPECT_FALSE(error.empty());
}

// Verifies the documented rule "what a handler throws is ignored" for the
// in-process store too: the handler runs inline, once, and its exception
// does not escape async_try_acquire (nor the co_await form's check), and the
// check it reported is counted.
TEST(LimiterAsync, WhatAnInlineHandlerThrowsIsIgnored) {
  const fixed_window::config cfg("2/1s", window_options{.name = "t"});
  limiter<fixed_window> l(cfg);
  int calls = 0;
  EXPECT_NO_THROW(l.async_try_acquire("k", microseconds{0}, 1, [&](decision d, std::exception_ptr) {
    ++calls;
    EXPECT_TRUE(d.allowed);
    throw std::runtime_error("handler");
  }));
  EXPECT_NO_THROW(l.async_try_acquire("k", [&](decision, std::exception_ptr) {
    ++calls;
    throw 42;
  }));
  EXPECT_EQ(calls, 2);
  // The first check counted: one of two left in the window at 0.
  EXPECT_TRUE(l.try_acquire("k", microseconds{1}, 1).allowed);
  EXPECT_FALSE(l.try_acquire("k", microseconds{2}, 1).allowed);
}

// Verifies that a clock reading outside 0..2^62 us is bad input for the
// async form as documented (thrown from the call, the handler never called),
// as it is for a store with async_apply: the in-process store decided it
// inline and passed the std::invalid_argument to the handler instead. The
// co_await form throws it from the co_await.
TEST(LimiterAsync, ClockOutOfRangeThrowsWithoutCallingTheHandler) {
  for (const microseconds t : {microseconds{-1}, max_time + microseconds{1}}) {
    limiter<gcra, memory_store<gcra>, manual_clock> l(gcra::config("10/s"), memory_store<gcra>{},
                                                      manual_clock(t));
    EXPECT_THROW((void)l.try_acquire("k"), std::invalid_argument);
    int calls = 0;
    const auto h = [&](decision, std::exception_ptr) { ++calls; };
    EXPECT_THROW(l.async_try_acquire("k", h), std::invalid_argument) << t.count();
    EXPECT_THROW(l.async_try_acquire("k", units{2}, h), std::invalid_argument) << t.count();
    EXPECT_EQ(calls, 0) << t.count();
  }
}

}  // namespace
