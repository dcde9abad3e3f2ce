// SPDX-License-Identifier: Apache-2.0
// ratelimit::asio over a real redis-server: the same decisions as in process,
// completions on their strand, the work guard, cancellation with a check in
// flight (the late reply dropped, the script still consumed), a server killed
// and a store destroyed with checks in flight: every handler exactly once.
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <csignal>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "asio_support.hpp"
#include "ratelimit/asio.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using rltest::completions;

/// The server's process id, from INFO (to SIGKILL it while it is stopped:
/// redis_server::stop() resumes it first, which would let it answer).
pid_t pid_of(const rltest::redis_server& server) {
  const auto r = rltest::command(server.options(), {"INFO", "server"});
  const std::string info(r->str, r->len);
  const std::string field = "process_id:";
  const std::size_t at = info.find(field);
  if (at == std::string::npos) throw std::runtime_error("no process_id in INFO");
  return static_cast<pid_t>(std::stol(info.substr(at + field.size())));
}

/// One check of a trace.
struct step {
  const char* key;
  std::int64_t t;  // us
  units cost;
};

template <class L>
::asio::awaitable<std::vector<decision>> run_trace(L& l, const std::vector<step>& trace) {
  std::vector<decision> out;
  for (const step& s : trace) {
    out.push_back(co_await ratelimit::asio::async_try_acquire(l, s.key, timestamp{s.t}, s.cost,
                                                              ::asio::use_awaitable));
  }
  co_return out;
}

// Verifies that the coroutine form gives identical decisions in process and
// on Redis for a small trace of two policies (edges: the microsecond before a
// window ends, exactly one window later, a cost above the limit).
TEST(AsioRedis, SameDecisionsAsInProcess) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("asio-diff");
  const std::int64_t base = 1'000'000'000;
  const std::vector<step> trace = {
      {"a", base, 1},
      {"a", base, 2},
      {"a", base + 1, 1},
      {"b", base + 5, 3},
      {"a", base + 999'999, 1},
      {"a", base + 1'000'000, 1},
      {"b", base + 1'000'004, 1},
      {"b", base + 1'000'005, 4},
      {"a", base + 1'500'000, 2},
  };
  const fixed_window::config fw("3/1s", window_options{.name = "fw"});
  const gcra::config gc("3/1s", bucket_options{.name = "gc"});
  ::asio::io_context io;
  limiter<fixed_window, redis::redis_store> fw_remote(fw, redis::redis_store(o));
  limiter<fixed_window> fw_local(fw);
  limiter<gcra, redis::redis_store> gc_remote(gc, redis::redis_store(o));
  limiter<gcra> gc_local(gc);
  auto f1 = ::asio::co_spawn(io, run_trace(fw_remote, trace), ::asio::use_future);
  auto f2 = ::asio::co_spawn(io, run_trace(fw_local, trace), ::asio::use_future);
  auto f3 = ::asio::co_spawn(io, run_trace(gc_remote, trace), ::asio::use_future);
  auto f4 = ::asio::co_spawn(io, run_trace(gc_local, trace), ::asio::use_future);
  io.run();
  const auto r1 = f1.get(), r2 = f2.get(), r3 = f3.get(), r4 = f4.get();
  ASSERT_EQ(r1.size(), trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) {
    EXPECT_EQ(r1[i], r2[i]) << "fixed_window step " << i;
    EXPECT_EQ(r3[i], r4[i]) << "gcra step " << i;
    EXPECT_EQ(r1[i].source, decision_source::store);
  }
  EXPECT_FALSE(r1[2].allowed);
  EXPECT_EQ(r1[4].retry_after, 1us);
  EXPECT_TRUE(r1[5].allowed);
}

// Verifies use_future and deferred on Redis (server clock), callbacks on a
// strand with the io_context on two threads, and that io_context::run does
// not return while a check is in flight (the work guard), with nothing else
// keeping it busy.
TEST(AsioRedis, TokensStrandAndWorkGuard) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("asio-tokens");
  const fixed_window::config cfg("100/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store, redis::server_clock> l(cfg, redis::redis_store(o));

  std::future<decision> f = ratelimit::asio::async_try_acquire(l, "k", 10, ::asio::use_future);
  EXPECT_EQ(f.get().remaining, 90);

  ::asio::io_context io;
  completions one(1);
  ratelimit::asio::async_try_acquire(l, "k", ::asio::bind_executor(io, one.handler(0)));
  EXPECT_EQ(io.run(), 1U);  // returns only after the reply (the check's work guard)
  EXPECT_EQ(one.calls[0], 1);
  EXPECT_EQ(one.decisions[0].remaining, 89);

  io.restart();
  auto op = ratelimit::asio::async_try_acquire(l, "k", 9, rltest::deferred_token);
  completions later(1);
  std::move(op)(::asio::bind_executor(io, later.handler(0)));
  io.run();
  EXPECT_EQ(later.calls[0], 1);
  EXPECT_EQ(later.decisions[0].remaining, 80);

  io.restart();
  auto strand = ::asio::make_strand(io);
  constexpr int n = 80;
  int on_strand = 0, allowed = 0, ran = 0;  // the strand's, unsynchronised
  for (int i = 0; i < n; ++i) {
    ratelimit::asio::async_try_acquire(
        l, "k", ::asio::bind_executor(strand, [&](std::exception_ptr e, decision d) {
          on_strand += strand.running_in_this_thread() ? 1 : 0;
          allowed += (!e && d.allowed) ? 1 : 0;
          ++ran;
        }));
  }
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
  EXPECT_EQ(ran, n);
  EXPECT_EQ(on_strand, n);
  EXPECT_EQ(allowed, n);
}

// Verifies terminal cancellation with the check in flight (the server
// stopped): the handler completes at once with operation_aborted, the reply
// that comes after the server resumes is dropped (still one call), and the
// script did run and consume. A total-only cancellation is ignored: that
// check completes with its decision.
TEST(AsioRedis, CancelInFlightCompletesAtOnceAndTheScriptStillRuns) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("asio-cancel");
  o.multiplex = 1;
  o.command_timeout = 10s;
  const fixed_window::config cfg("5/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store, redis::server_clock> l(cfg, redis::redis_store(o));
  ASSERT_TRUE(l.try_acquire("k").allowed);  // connected

  ::asio::io_context io;
  completions c(2);
  ::asio::cancellation_signal terminal, total;
  server.pause();
  ratelimit::asio::async_try_acquire(
      l, "k",
      ::asio::bind_cancellation_slot(terminal.slot(), ::asio::bind_executor(io, c.handler(0))));
  ratelimit::asio::async_try_acquire(
      l, "k",
      ::asio::bind_cancellation_slot(total.slot(), ::asio::bind_executor(io, c.handler(1))));
  std::this_thread::sleep_for(100ms);  // both scripts written; the server holds them
  ::asio::post(io, [&] {
    terminal.emit(::asio::cancellation_type::terminal);
    total.emit(::asio::cancellation_type::total);
  });
  // Only the cancelled one completes while the server is stopped.
  io.run_for(300ms);
  EXPECT_EQ(c.calls[0], 1);
  EXPECT_TRUE(rltest::aborted(c.errors[0]));
  EXPECT_EQ(c.calls[1], 0);
  server.resume();
  io.restart();
  io.run();                  // the second check's work guard keeps it running until its reply
  EXPECT_EQ(c.calls[0], 1);  // the late reply was dropped
  EXPECT_EQ(c.calls[1], 1);
  EXPECT_FALSE(c.errors[1]);
  EXPECT_TRUE(c.decisions[1].allowed);
  EXPECT_EQ(c.decisions[1].remaining, 2);  // the cancelled check consumed too
  EXPECT_EQ(l.peek("k").remaining, 1);
}

// Verifies exactly one completion per check when the server is killed with
// checks in flight, under throw_error (a connection_error each) and
// fail_open (degraded decisions), some of them cancelled at the same time.
TEST(AsioRedis, ServerKilledEveryHandlerOnce) {
  for (const auto policy : {redis::failure_policy::throw_error, redis::failure_policy::fail_open}) {
    rltest::redis_server server;
    redis::options o = server.options();
    o.prefix = rltest::unique_prefix("asio-kill");
    o.multiplex = 2;
    o.on_failure = policy;
    o.command_timeout = 5s;
    const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
    limiter<fixed_window, redis::redis_store, redis::server_clock> l(cfg, redis::redis_store(o));
    ASSERT_TRUE(l.try_acquire("k").allowed);
    const pid_t pid = pid_of(server);

    ::asio::io_context io;
    constexpr std::size_t n = 40;
    completions c(n);
    std::vector<::asio::cancellation_signal> signals(n);
    const std::string keys[] = {"k0", "k1", "k2"};
    server.pause();
    for (std::size_t i = 0; i < n; ++i) {
      ratelimit::asio::async_try_acquire(
          l, keys[i % 3],
          ::asio::bind_cancellation_slot(signals[i].slot(),
                                         ::asio::bind_executor(io, c.handler(i))));
    }
    std::this_thread::sleep_for(100ms);
    std::thread killer([&] {
      ::kill(pid, SIGKILL);  // stopped: none of the written scripts runs
      server.stop();
    });
    ::asio::post(io, [&] {
      for (std::size_t i = 0; i < n; i += 4) signals[i].emit(::asio::cancellation_type::terminal);
    });
    io.run();
    killer.join();
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(c.calls[i], 1) << i;
      if (i % 4 == 0) {
        EXPECT_TRUE(rltest::aborted(c.errors[i]) ||
                    (policy == redis::failure_policy::throw_error
                         ? rltest::holds<redis::connection_error>(c.errors[i])
                         : c.decisions[i].source == decision_source::fail_open))
            << i;
      } else if (policy == redis::failure_policy::throw_error) {
        EXPECT_TRUE(rltest::holds<redis::connection_error>(c.errors[i])) << i;
      } else {
        EXPECT_FALSE(c.errors[i]) << i;
        EXPECT_EQ(c.decisions[i].source, decision_source::fail_open) << i;
      }
    }
  }
}

// Verifies that destroying the limiter (its store) with checks in flight
// completes each handler once, on its executor, with multiplexer_stopped.
TEST(AsioRedis, StoreDestroyedInFlight) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("asio-destroy");
  o.multiplex = 1;
  o.command_timeout = 10s;
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  ::asio::io_context io;
  completions c(3);
  {
    limiter<fixed_window, redis::redis_store, redis::server_clock> l(cfg, redis::redis_store(o));
    ASSERT_TRUE(l.try_acquire("k").allowed);
    server.pause();
    for (std::size_t i = 0; i < 3; ++i) {
      ratelimit::asio::async_try_acquire(l, "k", ::asio::bind_executor(io, c.handler(i)));
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(c.calls[0] + c.calls[1] + c.calls[2], 0);  // posted, not run by the destructor
  io.run();
  server.resume();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c.calls[i], 1);
    EXPECT_TRUE(rltest::holds<redis::multiplexer_stopped>(c.errors[i])) << i;
  }
}

// Verifies the documented rule "bad input (key, cost, time) throws from the
// initiating function itself for every token; the handler is then never
// called" for a time the Redis store refuses (above 2^52 us, where Lua numbers
// stop being exact) though the limiter accepts it (up to 2^62 us): the
// operation started and completed the handler with the std::invalid_argument.
TEST(AsioRedis, TimeOnlyTheStoreRefusesThrowsFromTheCall) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("asio-time");
  const fixed_window::config cfg("5/1s", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store> l(cfg, redis::redis_store(o));
  const timestamp too_late{(std::int64_t{1} << 52) + 1};
  ::asio::io_context io;
  completions c(1);
  EXPECT_THROW(ratelimit::asio::async_try_acquire(l, "k", too_late, 1,
                                                  ::asio::bind_executor(io, c.handler(0))),
               std::invalid_argument);
  EXPECT_THROW((void)ratelimit::asio::async_try_acquire(l, "k", too_late, 1, ::asio::use_future),
               std::invalid_argument);
  EXPECT_THROW(
      (void)ratelimit::asio::async_try_acquire(l, "k", too_late, 1, rltest::deferred_token),
      std::invalid_argument);
  io.run();
  EXPECT_EQ(c.calls[0], 0);
  // The last microsecond the store accepts is decided.
  std::future<decision> f = ratelimit::asio::async_try_acquire(
      l, "k", timestamp{std::int64_t{1} << 52}, 1, ::asio::use_future);
  EXPECT_TRUE(f.get().allowed);
}

// Verifies cancellation racing completion on a live server: 600 checks in
// flight from one io_context, a terminal cancellation emitted for every
// other one at staggered moments while replies arrive. Every handler runs
// exactly once (a decision or operation_aborted), never both; and since a
// cancellation never withdraws a check, every script ran: the key holds
// exactly 600 units afterwards. use_future rethrows the store's own error
// type (throw_error, server gone).
TEST(AsioRedis, CancellationRacingRepliesEveryHandlerOnceAndEveryScriptRuns) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("asio-race");
  o.multiplex = 2;
  o.command_timeout = 5s;
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store, redis::server_clock> l(cfg, redis::redis_store(o));
  ASSERT_EQ(l.peek("k").remaining, 999);
  ::asio::io_context io;
  constexpr std::size_t n = 600;
  completions c(n);
  std::vector<::asio::cancellation_signal> signals(n);
  for (std::size_t i = 0; i < n; ++i) {
    ratelimit::asio::async_try_acquire(
        l, "k",
        ::asio::bind_cancellation_slot(signals[i].slot(), ::asio::bind_executor(io, c.handler(i))));
    if (i % 2 == 1) {
      // Emitted from the io_context (as Asio requires), after 0..2 other
      // handlers ran: some before the reply, some after it.
      ::asio::post(io, [&, i] { signals[i].emit(::asio::cancellation_type::terminal); });
    }
  }
  io.run();
  std::size_t aborted = 0, decided = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(c.calls[i], 1) << i;
    if (rltest::aborted(c.errors[i])) {
      ++aborted;
      EXPECT_EQ(i % 2, 1U) << i;
    } else {
      ASSERT_FALSE(c.errors[i]) << i;
      EXPECT_TRUE(c.decisions[i].allowed) << i;
      ++decided;
    }
  }
  EXPECT_EQ(aborted + decided, n);
  EXPECT_EQ(l.peek("k").remaining, 999 - static_cast<units>(n));

  redis::options gone = o;
  gone.port = 1;  // nothing listens there
  gone.on_failure = redis::failure_policy::throw_error;
  gone.connect_timeout = 200ms;
  limiter<fixed_window, redis::redis_store, redis::server_clock> down(cfg,
                                                                      redis::redis_store(gone));
  std::future<decision> f = ratelimit::asio::async_try_acquire(down, "k", ::asio::use_future);
  EXPECT_THROW((void)f.get(), redis::connection_error);
}

// Verifies a handler that destroys the limiter (its store's last copy) with
// other checks in flight, on the io_context's thread: each other handler
// still runs exactly once, with its decision or multiplexer_stopped, and the
// io_context's run() returns (no work guard is left behind).
TEST(AsioRedis, HandlerDestroysTheLimiterWithChecksInFlight) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("asio-destroy-in-handler");
  o.multiplex = 1;
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  using limiter_t = limiter<fixed_window, redis::redis_store, redis::server_clock>;
  auto l = std::make_unique<limiter_t>(cfg, redis::redis_store(o));
  ::asio::io_context io;
  constexpr std::size_t n = 200;
  completions c(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto record = c.handler(i);
    ratelimit::asio::async_try_acquire(
        *l, "k",
        ::asio::bind_executor(io, [&l, i, record](std::exception_ptr e, decision d) mutable {
          record(std::move(e), d);
          if (i == 0) l.reset();
        }));
  }
  io.run();
  EXPECT_EQ(l, nullptr);
  std::size_t stopped = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(c.calls[i], 1) << i;
    if (rltest::holds<redis::multiplexer_stopped>(c.errors[i])) {
      ++stopped;
    } else {
      EXPECT_FALSE(c.errors[i]) << i;
      EXPECT_TRUE(c.decisions[i].allowed) << i;
    }
  }
  EXPECT_LT(stopped, n);
}

// Verifies fork() with Asio checks in flight: in the child, a check on the
// parent's limiter completes its handler (on the child's own io_context,
// no thread started) with std::logic_error, as the docs say of any error
// from starting a check; the parent's checks in flight complete once each.
TEST(AsioRedis, ForkedChildGetsLogicErrorThroughTheHandler) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("asio-fork");
  o.multiplex = 1;
  o.command_timeout = 5s;
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store, redis::server_clock> l(cfg, redis::redis_store(o));
  ASSERT_TRUE(l.try_acquire("k").allowed);
  ::asio::io_context io;
  completions c(4);
  server.pause();
  for (std::size_t i = 0; i < 4; ++i) {
    ratelimit::asio::async_try_acquire(l, "k", ::asio::bind_executor(io, c.handler(i)));
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::asio::io_context child_io;
    std::exception_ptr got;
    int calls = 0;
    ratelimit::asio::async_try_acquire(
        l, "k", ::asio::bind_executor(child_io, [&](std::exception_ptr e, decision) {
          got = std::move(e);
          ++calls;
        }));
    child_io.run();
    ::_exit(calls == 1 && rltest::holds<std::logic_error>(got) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  server.resume();
  io.run();
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c.calls[i], 1) << i;
    EXPECT_FALSE(c.errors[i]) << i;
  }
  EXPECT_EQ(l.peek("k").remaining, 4);  // 10 - 1 - 4 - the one peek would take
}

}  // namespace
