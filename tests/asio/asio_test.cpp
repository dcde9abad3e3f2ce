// SPDX-License-Identifier: Apache-2.0
// ratelimit::asio over the in-process store: every completion token, the
// handler posted (never run inside the initiating function) to its associated
// executor, strands, cancellation after an inline decision, bad input.
#include "ratelimit/asio.hpp"

#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "asio_support.hpp"
#include "ratelimit/ratelimit.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using rltest::completions;

const fixed_window::config two_per_second("2/1s", window_options{.name = "t"});

// Verifies that a callback is not run by the initiating function, even though
// memory_store decides inline, but by io_context::run, once, with the exact
// decisions: two admitted at 0, denied at 0 (retry 1 s) and at 1 s - 1 us
// (retry 1 us), admitted again at 1 s.
TEST(Asio, CallbackIsPostedWithExactDecisions) {
  ::asio::io_context io;
  limiter<fixed_window> l(two_per_second);
  const std::vector<timestamp> times = {0us, 0us, 0us, 999'999us, 1'000'000us};
  completions c(times.size());
  for (std::size_t i = 0; i < times.size(); ++i) {
    ratelimit::asio::async_try_acquire(l, "k", times[i], 1,
                                       ::asio::bind_executor(io, c.handler(i)));
    EXPECT_EQ(c.calls[i], 0) << i;
  }
  EXPECT_EQ(io.run(), times.size());
  for (std::size_t i = 0; i < times.size(); ++i) {
    EXPECT_EQ(c.calls[i], 1) << i;
    EXPECT_FALSE(c.errors[i]) << i;
  }
  EXPECT_TRUE(c.decisions[0].allowed);
  EXPECT_EQ(c.decisions[0].remaining, 1);
  EXPECT_TRUE(c.decisions[1].allowed);
  EXPECT_FALSE(c.decisions[2].allowed);
  EXPECT_EQ(c.decisions[2].retry_after, 1s);
  EXPECT_FALSE(c.decisions[3].allowed);
  EXPECT_EQ(c.decisions[3].retry_after, 1us);
  EXPECT_TRUE(c.decisions[4].allowed);
}

// Verifies asio::use_future (completion on the system executor) and that bad
// input throws from the initiating function for every token, calling nothing.
TEST(Asio, UseFutureAndBadInput) {
  limiter<fixed_window> l(two_per_second);
  std::future<decision> a = ratelimit::asio::async_try_acquire(l, "k", 0us, 2, ::asio::use_future);
  std::future<decision> b = ratelimit::asio::async_try_acquire(l, "k", 0us, 1, ::asio::use_future);
  const decision da = a.get();
  EXPECT_TRUE(da.allowed);
  EXPECT_EQ(da.remaining, 0);
  EXPECT_FALSE(b.get().allowed);
  std::future<decision> c = ratelimit::asio::async_try_acquire(l, "other", ::asio::use_future);
  EXPECT_TRUE(c.get().allowed);

  ::asio::io_context io;
  completions none(1);
  EXPECT_THROW(
      ratelimit::asio::async_try_acquire(l, "", ::asio::bind_executor(io, none.handler(0))),
      std::invalid_argument);
  EXPECT_THROW((void)ratelimit::asio::async_try_acquire(l, "k", units{0}, ::asio::use_future),
               std::invalid_argument);
  EXPECT_THROW((void)ratelimit::asio::async_try_acquire(l, "k", -1us, 1, rltest::deferred_token),
               std::invalid_argument);
  EXPECT_THROW(
      (void)ratelimit::asio::async_try_acquire(l, std::string(600, 'k'), ::asio::use_awaitable),
      std::invalid_argument);
  EXPECT_EQ(io.run(), 0U);
  EXPECT_EQ(none.calls[0], 0);
}

::asio::awaitable<std::vector<decision>> three_checks(limiter<fixed_window>& l) {
  std::vector<decision> out;
  for (int i = 0; i < 3; ++i) {
    out.push_back(
        co_await ratelimit::asio::async_try_acquire(l, "k", 5us, 1, ::asio::use_awaitable));
  }
  co_return out;
}

// Verifies the use_awaitable form in a coroutine on an io_context, and that
// an error is thrown from the co_await (a bad time passes the validation of
// nothing else: cost above the store's maximum is a decision, not an error).
TEST(Asio, UseAwaitable) {
  ::asio::io_context io;
  limiter<fixed_window> l(two_per_second);
  std::future<std::vector<decision>> f = ::asio::co_spawn(io, three_checks(l), ::asio::use_future);
  io.run();
  const std::vector<decision> d = f.get();
  ASSERT_EQ(d.size(), 3U);
  EXPECT_TRUE(d[0].allowed);
  EXPECT_TRUE(d[1].allowed);
  EXPECT_FALSE(d[2].allowed);
  EXPECT_EQ(d[2].retry_after, 1s - 5us);
}

// Verifies the deferred token: nothing is decided until the operation is
// launched; launched twice it checks twice.
TEST(Asio, DeferredStartsWhenLaunched) {
  ::asio::io_context io;
  limiter<fixed_window> l(two_per_second);
  auto op = ratelimit::asio::async_try_acquire(l, "k", 0us, 1, rltest::deferred_token);
  // peek reports what would remain after admitting one more.
  EXPECT_EQ(l.peek("k", 0us).remaining, 1);
  completions c(2);
  op(::asio::bind_executor(io, c.handler(0)));
  EXPECT_EQ(l.peek("k", 0us).remaining, 0);
  std::move(op)(::asio::bind_executor(io, c.handler(1)));
  EXPECT_EQ(c.calls[0] + c.calls[1], 0);
  io.run();
  EXPECT_EQ(c.calls[0], 1);
  EXPECT_EQ(c.calls[1], 1);
  EXPECT_TRUE(c.decisions[1].allowed);
  EXPECT_EQ(c.decisions[1].remaining, 0);
}

// Verifies that handlers bound to a strand run on it while the io_context
// runs on two threads (the unsynchronised counter is the strand's: TSan
// would report a handler off the strand).
TEST(Asio, HandlersRunOnTheirStrand) {
  ::asio::io_context io;
  auto strand = ::asio::make_strand(io);
  const fixed_window::config cfg("1000/1s", window_options{.name = "t"});
  limiter<fixed_window> l(cfg);
  constexpr int n = 400;
  int on_strand = 0;
  int allowed = 0;
  int ran = 0;
  {
    auto work = ::asio::make_work_guard(io);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) threads.emplace_back([&] { io.run(); });
    for (int i = 0; i < n; ++i) {
      ratelimit::asio::async_try_acquire(
          l, "k", 0us, 1, ::asio::bind_executor(strand, [&](std::exception_ptr e, decision d) {
            on_strand += strand.running_in_this_thread() ? 1 : 0;
            allowed += (!e && d.allowed) ? 1 : 0;
            ++ran;
          }));
    }
    std::promise<void> drained;
    ::asio::post(strand, [&] { drained.set_value(); });
    drained.get_future().wait();
    work.reset();
    for (auto& t : threads) t.join();
  }
  EXPECT_EQ(ran, n);
  EXPECT_EQ(on_strand, n);
  EXPECT_EQ(allowed, n);
}

// Verifies cancellation after an inline decision: the decision stands (it
// arrived first) and the handler runs once with it. Partial and total
// cancellation are never honoured.
TEST(Asio, CancellationAfterInlineDecisionKeepsTheDecision) {
  ::asio::io_context io;
  limiter<fixed_window> l(two_per_second);
  completions c(2);
  ::asio::cancellation_signal terminal, total;
  ratelimit::asio::async_try_acquire(
      l, "k", 0us, 1,
      ::asio::bind_cancellation_slot(terminal.slot(), ::asio::bind_executor(io, c.handler(0))));
  ratelimit::asio::async_try_acquire(
      l, "k", 0us, 1,
      ::asio::bind_cancellation_slot(total.slot(), ::asio::bind_executor(io, c.handler(1))));
  terminal.emit(::asio::cancellation_type::terminal);
  total.emit(::asio::cancellation_type::all);
  io.run();
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(c.calls[i], 1);
    EXPECT_FALSE(c.errors[i]);
    EXPECT_TRUE(c.decisions[i].allowed);
  }
  EXPECT_FALSE(l.peek("k", 0us).allowed);
  // After completion the slot is free again: a new emit reaches nothing of ours.
  terminal.emit(::asio::cancellation_type::terminal);
  EXPECT_EQ(io.run(), 0U);
}

// Verifies that a callback without an associated executor runs on the system
// executor's thread, not inside the initiating function on the caller's.
TEST(Asio, PlainCallbackRunsOnTheSystemExecutor) {
  limiter<fixed_window> l(two_per_second);
  std::promise<std::thread::id> ran;
  ratelimit::asio::async_try_acquire(
      l, "k", [&](std::exception_ptr, decision) { ran.set_value(std::this_thread::get_id()); });
  EXPECT_NE(ran.get_future().get(), std::this_thread::get_id());
}

// Verifies what a handler throws: unlike limiter::async_try_acquire's
// handlers (whose exceptions are ignored), an Asio completion handler's
// exception leaves the executor's run() as for any Asio handler; the other
// completions are still there for the next run(), each run once.
TEST(Asio, WhatAHandlerThrowsLeavesRun) {
  ::asio::io_context io;
  limiter<fixed_window> l(two_per_second);
  completions c(3);
  ratelimit::asio::async_try_acquire(
      l, "k", 0us, 1, ::asio::bind_executor(io, [&](std::exception_ptr e, decision d) {
        c.handler(0)(std::move(e), d);
        throw std::runtime_error("handler");
      }));
  ratelimit::asio::async_try_acquire(l, "k", 0us, 1, ::asio::bind_executor(io, c.handler(1)));
  ratelimit::asio::async_try_acquire(l, "k", 0us, 1, ::asio::bind_executor(io, c.handler(2)));
  EXPECT_THROW(io.run(), std::runtime_error);
  EXPECT_EQ(c.calls[0], 1);
  EXPECT_EQ(c.calls[1] + c.calls[2], 0);
  io.run();
  EXPECT_EQ(c.calls[0], 1);
  EXPECT_EQ(c.calls[1], 1);
  EXPECT_EQ(c.calls[2], 1);
  EXPECT_TRUE(c.decisions[1].allowed);
  EXPECT_FALSE(c.decisions[2].allowed);
}

/// An io_context's executor whose execute() throws while `*refuse` is set
/// (an executor that refuses work, or a post that runs out of memory).
struct refusing_executor {
  ::asio::io_context::executor_type inner;
  std::atomic<bool>* refuse;

  [[nodiscard]] ::asio::execution_context& query(::asio::execution::context_t) const noexcept {
    return inner.context();
  }
  static constexpr ::asio::execution::blocking_t query(::asio::execution::blocking_t) noexcept {
    return ::asio::execution::blocking.never;
  }
  template <class F>
  void execute(F&& f) const {
    if (refuse->load()) throw std::runtime_error("executor refused the completion");
    ::asio::post(inner, std::forward<F>(f));
  }
  bool operator==(const refusing_executor&) const noexcept = default;
};

// Verifies that when posting the completion to the handler's executor
// throws, the handler is not lost: it is completed exactly once, on the
// thread that finished the check, with what the executor threw (the check
// itself was decided and may have consumed). It was never called.
TEST(Asio, HandlerIsCompletedOnceWhenItsExecutorRefusesTheCompletion) {
  ::asio::io_context io;
  std::atomic<bool> refuse{true};
  limiter<fixed_window> l(two_per_second);
  completions c(2);
  std::thread::id ran_on;
  ratelimit::asio::async_try_acquire(
      l, "k", 0us, 1,
      ::asio::bind_executor(refusing_executor{io.get_executor(), &refuse},
                            [&](std::exception_ptr e, decision d) {
                              ran_on = std::this_thread::get_id();
                              c.handler(0)(std::move(e), d);
                            }));
  io.run();
  EXPECT_EQ(c.calls[0], 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());  // memory_store finished it on this thread
  EXPECT_TRUE(rltest::holds<std::runtime_error>(c.errors[0]));
  // The same executor taking work again: posted, run by run(), exactly once.
  refuse = false;
  ratelimit::asio::async_try_acquire(
      l, "k", 0us, 1,
      ::asio::bind_executor(refusing_executor{io.get_executor(), &refuse}, c.handler(1)));
  EXPECT_EQ(c.calls[1], 0);
  io.restart();
  EXPECT_EQ(io.run(), 1u);
  EXPECT_EQ(c.calls[1], 1);
  EXPECT_FALSE(c.errors[1]);
  EXPECT_TRUE(c.decisions[1].allowed);
  EXPECT_EQ(c.decisions[1].remaining, 0);  // the refused completion's check consumed
}

// Verifies named (lvalue) callbacks, as Asio's own operations take them (the
// handler is copied): with a bound executor and without. They did not
// compile (the operation's constructor took an rvalue only).
TEST(Asio, NamedCallbacksAreCopied) {
  ::asio::io_context io;
  limiter<fixed_window> l(two_per_second);
  completions c(3);
  auto bound = ::asio::bind_executor(io, c.handler(0));
  ratelimit::asio::async_try_acquire(l, "k", 0us, 1, bound);
  ratelimit::asio::async_try_acquire(l, "k", 0us, 1, bound);
  std::promise<decision> got;
  auto plain = [&got](std::exception_ptr, decision d) { got.set_value(d); };
  ratelimit::asio::async_try_acquire(l, "k", 0us, 1, plain);
  EXPECT_FALSE(got.get_future().get().allowed);
  EXPECT_EQ(io.run(), 2U);
  EXPECT_EQ(c.calls[0], 2);
}

// Verifies the documented form async_try_acquire(limiter, key, [now,]
// [cost,] token) with a time and no cost (cost 1): it did not exist.
TEST(Asio, TimeWithoutCost) {
  limiter<fixed_window> l(two_per_second);
  EXPECT_EQ(
      ratelimit::asio::async_try_acquire(l, "k", 999'999us, ::asio::use_future).get().remaining, 1);
  EXPECT_EQ(
      ratelimit::asio::async_try_acquire(l, "k", 999'999us, ::asio::use_future).get().remaining, 0);
  const decision d =
      ratelimit::asio::async_try_acquire(l, "k", 999'999us, ::asio::use_future).get();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 1us);
  EXPECT_THROW((void)ratelimit::asio::async_try_acquire(l, "k", -1us, ::asio::use_future),
               std::invalid_argument);
}

}  // namespace
