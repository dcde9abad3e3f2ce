// SPDX-License-Identifier: Apache-2.0
// Multiplexed connections and async checks on a real redis-server: exact
// admission across threads and processes, a connection killed mid-pipeline,
// timeouts, destruction with checks in flight, and the limiter's async API
// over both stores.
#include <dirent.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/async_outcomes.hpp"
#include "support/fork_child.hpp"

namespace {

using namespace ratelimit;
using rltest::holds;
using rltest::outcomes;
using namespace std::chrono_literals;

/// Lets the I/O thread write what was submitted (the server holds it: CLIENT PAUSE).
void let_write() {
  std::this_thread::sleep_for(200ms);
}

/// A server of this test's own (CLIENT PAUSE and KILL would disturb others).
redis::options own(rltest::redis_server& server, std::string_view what) {
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix(what);
  return o;
}

/// Admissions of 16 threads x `per_thread` multiplexed checks on one key.
long run_threads(const redis::options& o, const fixed_window::config& cfg, int per_thread) {
  redis::redis_store store(o);
  std::atomic<long> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < 16; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < per_thread; ++j) {
        if (store.apply(cfg, "+15551234567", store_time, 1, access::consume).allowed) ++admitted;
      }
    });
  }
  for (auto& t : pool) t.join();
  return store.stats().store == static_cast<std::uint64_t>(16 * per_thread) ? admitted.load() : -1;
}

// Verifies atomicity through shared connections: 16 threads x 2 processes,
// 1280 checks on one key, admit exactly the limit; every check was decided by
// Redis.
// One connection and two, with blocking callers leading (options::multiplex_lead)
// and without.
TEST(RedisMultiplex, SixteenThreadsTwoProcessesAdmitExactlyTheLimit) {
  for (const bool lead : {false, true}) {
    for (const std::size_t connections : {1u, 2u}) {
      redis::options o = rltest::shared_redis();
      o.prefix = rltest::unique_prefix("mux-conc");
      o.multiplex = connections;
      o.multiplex_lead = lead;
      const fixed_window::config cfg("100/1h", window_options{.name = "t"});
      // -1: a child failed, or a check was not decided by Redis.
      EXPECT_EQ(rltest::sum_in_children(2, [&](int) { return run_threads(o, cfg, 40); }), 100)
          << connections << (lead ? " leading" : "");
    }
  }
}

// Verifies that a connection killed with checks written on it fails exactly
// those checks, each once, through the failure policy (fail_closed), counts
// one failed round trip each, and that the next checks are decided by Redis
// on a new connection. The checks are held in the server by CLIENT PAUSE
// WRITE (EVALSHA waits) while CLIENT KILL drops their connection.
TEST(RedisMultiplex, ConnectionKilledMidPipelineFailsExactlyTheChecksInFlight) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-kill");
  o.multiplex = 1;
  o.command_timeout = 5000ms;
  o.on_failure = redis::failure_policy::fail_closed;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  ASSERT_TRUE(store.apply(cfg, "warm", store_time, 1).allowed);  // connection made, script cached

  constexpr std::size_t n = 20;
  outcomes out(n);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "3000", "WRITE"});
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "k" + std::to_string(i), store_time, 1, access::consume, out.handler(i));
  }
  // Wait until the server holds them (they were written).
  let_write();
  (void)rltest::command(o, {"CLIENT", "KILL", "TYPE", "normal"});
  ASSERT_TRUE(out.wait());
  (void)rltest::command(o, {"CLIENT", "UNPAUSE"});
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_FALSE(out.decisions[i].allowed) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::fail_closed) << i;
  }
  const redis::store_stats s = store.stats();
  EXPECT_EQ(s.fail_closed, n);
  EXPECT_EQ(s.errors, n);
  EXPECT_EQ(s.store, 1u);
  // The next checks are decided by Redis; the killed checks never ran.
  for (std::size_t i = 0; i < n; ++i) {
    const decision d = store.apply(cfg, "k" + std::to_string(i), store_time, 1);
    EXPECT_EQ(d.source, decision_source::store) << i;
    EXPECT_EQ(d.remaining, 999u) << i;
  }
  std::this_thread::sleep_for(50ms);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(out.calls[i], 1) << i;
}

// Verifies that checks held past their deadline complete exactly once each,
// within their deadline, with the error (failure_policy::throw_error), and
// that checks after the server answers again succeed.
TEST(RedisMultiplex, TimedOutChecksCompleteOnceWithTimeoutError) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-timeout");
  o.multiplex = 1;
  o.command_timeout = 100ms;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  const gcra::config cfg("10/s", bucket_options{.name = "t"});
  ASSERT_TRUE(store.apply(cfg, "warm", store_time, 1).allowed);
  constexpr std::size_t n = 10;
  outcomes out(n);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "400", "WRITE"});
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
  }
  ASSERT_TRUE(out.wait());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 350ms);
  // The first to time out drops the connection: each other check written on
  // it fails too, with timeout_error if its own deadline passed, else
  // connection_error.
  std::size_t timeouts = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1);
    EXPECT_TRUE(holds<redis::connection_error>(out.errors[i])) << i;
    timeouts += holds<redis::timeout_error>(out.errors[i]) ? 1 : 0;
  }
  EXPECT_GE(timeouts, 1u);
  EXPECT_EQ(store.stats().timeouts, timeouts);
  EXPECT_EQ(store.stats().errors, n);
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(store.apply(cfg, "k2", store_time, 1).source, decision_source::store);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(out.calls[i], 1);
}

// Verifies the documented rule for destruction: checks in flight when the
// store's last copy is destroyed each get multiplexer_stopped exactly once
// (no failure policy), on the destroying thread, before the destructor returns.
TEST(RedisMultiplex, DestructionWithChecksInFlightGivesEachAnError) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-destroy");
  o.command_timeout = 5000ms;
  o.on_failure = redis::failure_policy::fail_open;
  constexpr std::size_t n = 16;
  outcomes out(n);
  {
    redis::redis_store store(o);
    const fixed_window::config cfg("10/s", window_options{.name = "t"});
    ASSERT_TRUE(store.apply(cfg, "warm", store_time, 1).allowed);
    (void)rltest::command(o, {"CLIENT", "PAUSE", "2000", "WRITE"});
    for (std::size_t i = 0; i < n; ++i) {
      store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
    }
    let_write();
  }
  (void)rltest::command(o, {"CLIENT", "UNPAUSE"});
  std::lock_guard<std::mutex> lock(out.m);
  EXPECT_EQ(out.left, 0u);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(holds<redis::multiplexer_stopped>(out.errors[i])) << i;
  }
}

// Verifies that multiplexed connections give the maxmemory-policy warning
// once per store, as pooled ones do, also after their connection was killed.
TEST(RedisMultiplex, EvictionPolicyWarnsOncePerStore) {
  rltest::redis_server server({"--maxmemory-policy", "allkeys-lru"});
  redis::options o = own(server, "mux-warn");
  o.multiplex = 1;
  std::mutex m;
  std::vector<std::string> lines;
  o.on_warning = [&](std::string_view line) {
    std::lock_guard<std::mutex> lock(m);
    lines.emplace_back(line);
  };
  redis::redis_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "t"});
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(store.apply(cfg, "k", store_time, 1).source, decision_source::store);
    (void)rltest::command(server.options(), {"CLIENT", "KILL", "TYPE", "normal"});
    std::this_thread::sleep_for(50ms);
  }
  std::lock_guard<std::mutex> lock(m);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("allkeys-lru"), std::string::npos) << lines[0];
}

// Verifies that a hostile connection count is refused when the store is
// made, naming it, and that 256 is accepted.
TEST(RedisMultiplex, TooManyConnectionsAreRefused) {
  redis::options o = rltest::shared_redis();
  o.multiplex = 257;
  try {
    redis::redis_store store(o);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiplex 257"), std::string::npos) << e.what();
  }
  o.multiplex = std::size_t(-1);
  EXPECT_THROW(redis::redis_store{o}, std::invalid_argument);
  o.multiplex = 256;
  o.prefix = rltest::unique_prefix("mux-256");
  redis::redis_store store(o);
  EXPECT_EQ(
      store.apply(gcra::config("1/1h", bucket_options{.name = "t"}), "k", store_time, 1).source,
      decision_source::store);
}

// Verifies NOSCRIPT through the multiplexer: after SCRIPT FLUSH the check is
// sent again with EVAL (the script did not run) and decided once.
TEST(RedisMultiplex, NoscriptIsResentOnce) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-noscript");
  o.multiplex = 1;
  redis::redis_store store(o);
  const fixed_window::config cfg("3/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "k", store_time, 1).remaining, 2u);
  // The first check loads the script itself when no earlier test did.
  const auto reloads_before = store.stats().script_reloads;
  (void)rltest::command(o, {"SCRIPT", "FLUSH"});
  const decision d = store.apply(cfg, "k", store_time, 1);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(d.remaining, 1u);
  EXPECT_EQ(store.stats().script_reloads, reloads_before + 1);
}

// Verifies that a blocking check inside an async handler (on the I/O
// thread) throws std::logic_error instead of waiting for itself.
TEST(RedisMultiplex, BlockingCheckOnTheIoThreadThrows) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-self");
  o.multiplex = 1;
  redis::redis_store store(o);
  const fixed_window::config cfg("3/1h", window_options{.name = "t"});
  outcomes out(1);
  std::atomic<bool> threw{false};
  store.async_apply(cfg, "k", store_time, 1, access::consume,
                    [&](decision d, std::exception_ptr e) {
                      try {
                        (void)store.apply(cfg, "k", store_time, 1);
                      } catch (const std::logic_error&) {
                        threw = true;
                      }
                      out.handler(0)(d, std::move(e));
                    });
  ASSERT_TRUE(out.wait());
  EXPECT_TRUE(threw.load());
}

// Verifies limiter::async_try_acquire over both stores: Redis completes on
// the I/O thread, memory_store inline before the call returns; both give the
// decisions of try_acquire; bad input throws and calls no handler.
TEST(RedisMultiplex, LimiterAsyncOverBothStores) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-limiter");
  const fixed_window::config cfg("2/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store, redis::server_clock> remote(cfg, redis::redis_store(o));
  limiter<fixed_window> local(cfg);
  for (int round = 0; round < 3; ++round) {
    outcomes out(2);
    remote.async_try_acquire("k", out.handler(0));
    bool inline_done = false;
    local.async_try_acquire("k", [&](decision d, std::exception_ptr e) {
      out.handler(1)(d, std::move(e));
      inline_done = true;
    });
    EXPECT_TRUE(inline_done);
    ASSERT_TRUE(out.wait());
    EXPECT_EQ(out.decisions[0].allowed, round < 2);
    EXPECT_EQ(out.decisions[1].allowed, round < 2);
    EXPECT_EQ(out.decisions[0].remaining, out.decisions[1].remaining);
  }
  int calls = 0;
  EXPECT_THROW(remote.async_try_acquire("", [&](decision, std::exception_ptr) { ++calls; }),
               std::invalid_argument);
  EXPECT_THROW(
      local.async_try_acquire("k", units{0}, [&](decision, std::exception_ptr) { ++calls; }),
      std::invalid_argument);
  EXPECT_EQ(calls, 0);
}

}  // namespace

namespace {

/// A minimal coroutine type for the test: runs eagerly, never suspends at the
/// start or the end.
struct task {
  struct promise_type {
    task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

template <class L>
task acquire_twice(L& l, outcomes& out) {
  for (std::size_t i = 0; i < 2; ++i) {
    try {
      const ratelimit::decision d = co_await l.async_try_acquire("k");
      out.handler(i)(d, nullptr);
    } catch (...) {
      out.handler(i)(ratelimit::decision{}, std::current_exception());
    }
  }
}

// Verifies `co_await limiter.async_try_acquire(key)` over Redis (resumed on
// the I/O thread) and in process (no suspension), and that bad input is
// thrown from the co_await.
TEST(RedisMultiplex, CoAwaitOverBothStores) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-coawait");
  const fixed_window::config cfg("1/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::redis_store, redis::server_clock> remote(cfg, redis::redis_store(o));
  limiter<fixed_window> local(cfg);
  outcomes a(2), b(2);
  acquire_twice(remote, a);
  acquire_twice(local, b);
  ASSERT_TRUE(a.wait());
  ASSERT_TRUE(b.wait(0ms));  // completed inline
  for (outcomes* out : {&a, &b}) {
    EXPECT_FALSE(out->errors[0]);
    EXPECT_FALSE(out->errors[1]);
    EXPECT_TRUE(out->decisions[0].allowed);
    EXPECT_FALSE(out->decisions[1].allowed);
  }
  outcomes bad(1);
  [](auto& l, outcomes& out) -> task {
    try {
      (void)co_await l.async_try_acquire("");
      out.handler(0)(ratelimit::decision{}, nullptr);
    } catch (...) {
      out.handler(0)(ratelimit::decision{}, std::current_exception());
    }
  }(remote, bad);
  ASSERT_TRUE(bad.wait(0ms));
  EXPECT_TRUE(holds<std::invalid_argument>(bad.errors[0]));
}

/// A raw command through a multiplexer: records its outcome; `pause` is
/// slept in complete() (a slow handler, or the I/O thread descheduled).
struct raw_job final : redis::mux_job {
  raw_job(std::vector<std::string_view> args, std::chrono::milliseconds timeout,
          std::chrono::milliseconds p, std::atomic<int>& c, std::exception_ptr& e)
      : pause(p), calls(c), error(e) {
    redis::append_command(bytes, args.data(), args.size());
    until = redis::deadline_clock::now() + timeout;
  }
  void complete(std::unique_ptr<redis::mux_job>, redis::reply_ptr,
                std::exception_ptr e) noexcept override {
    error = std::move(e);
    std::this_thread::sleep_for(pause);
    calls.fetch_add(1);
  }
  std::chrono::milliseconds pause;
  std::atomic<int>& calls;
  std::exception_ptr& error;
};

// Verifies that a reply which arrived before its check's deadline is
// delivered even when the I/O thread gets to it after the deadline (busy in
// another connection's handler): BLPOP answers after 50 ms, well within its
// 250 ms; the other connection's handler holds the thread for 400 ms. The
// late check must look at what arrived before failing anything.
TEST(RedisMultiplex, ReplyArrivedInTimeIsDeliveredWhenReadLate) {
  rltest::redis_server server;
  redis::multiplexer mux(server.options(), 2);
  std::atomic<int> calls{0};
  std::exception_ptr blpop_error, ping_error;
  const std::string list = rltest::unique_prefix("mux-late") + "list";
  std::unique_ptr<redis::mux_job> blpop(
      new raw_job({"BLPOP", list, "0.05"}, 250ms, 0ms, calls, blpop_error));
  std::unique_ptr<redis::mux_job> ping(new raw_job({"PING"}, 5000ms, 400ms, calls, ping_error));
  ASSERT_TRUE(mux.submit(blpop));  // lane 0
  ASSERT_TRUE(mux.submit(ping));   // lane 1
  const auto start = std::chrono::steady_clock::now();
  while (calls.load() < 2 && std::chrono::steady_clock::now() - start < 5s) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(calls.load(), 2);
  EXPECT_FALSE(ping_error);
  EXPECT_FALSE(blpop_error) << "the BLPOP's reply came after 50 ms of its 250 ms";
  EXPECT_EQ(mux.connections_dropped(), 0u);
}

/// In a child process: with no file descriptor left (RLIMIT_NOFILE at the
/// highest one open, the holes below it filled), one check of a new store with `multiplex` connections
/// under fail_open. Exit 0: decided fail_open, the error counted; 1: it
/// threw; 2: another decision; 3: setup failed.
int check_without_descriptors(redis::options o, std::size_t multiplex) {
  o.multiplex = multiplex;
  o.on_failure = redis::failure_policy::fail_open;
  redis::redis_store store(o);
  const fixed_window::config cfg("5/1h", window_options{.name = "t"});
  int highest = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 3;
  while (const dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd != ::dirfd(d)) highest = std::max(highest, fd);
  }
  ::closedir(d);
  const rlimit lim{static_cast<rlim_t>(highest + 1), static_cast<rlim_t>(highest + 1)};
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 3;
  while (::dup(2) >= 0) {
  }  // fill the holes below the limit
  if (errno != EMFILE) return 3;
  try {
    const decision dec = store.apply(cfg, "k", store_time, 1);
    if (dec.source != decision_source::fail_open || !dec.allowed) return 2;
    if (store.stats().fail_open != 1 || store.stats().errors != 1) return 2;
    int calls = 0;
    store.async_apply(cfg, "k", store_time, 1, access::consume,
                      [&](decision d2, std::exception_ptr e) {
                        ++calls;
                        if (e || d2.source != decision_source::fail_open) calls += 100;
                      });
    return calls == 1 ? 0 : 2;
  } catch (...) {
    return 1;
  }
}

// Verifies that a multiplexed check that cannot get its I/O thread going
// (no file descriptor for its eventfd) is a failure decided by the failure
// policy, as a pooled check that cannot open a socket is; the async form
// calls its handler (inline) with that decision instead of throwing.
TEST(RedisMultiplex, NoDescriptorForTheIoThreadIsDecidedByTheFailurePolicy) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "UBSan (built with ASan here) checks a vptr through a pipe: with no "
                  "descriptor left it reports a valid object as invalid";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "UBSan (built with ASan here) checks a vptr through a pipe: with no "
                  "descriptor left it reports a valid object as invalid";
#endif
#endif
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-emfile");
  for (const std::size_t multiplex : {std::size_t{0}, std::size_t{1}}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(check_without_descriptors(o, multiplex));
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "multiplex " << multiplex;
  }
}

// Verifies SCRIPT FLUSH with many checks pipelined on one connection: every
// EVALSHA written before the first EVAL reloaded the script gets NOSCRIPT,
// each is resent once, and the replies of the checks behind them still go to
// their own checks: on one key, exactly the limit is admitted, with every
// remaining count from limit-1 down to 0 given once, each handler called once.
TEST(RedisMultiplex, ScriptFlushWithManyChecksInFlight) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-flush-many");
  o.multiplex = 1;
  o.command_timeout = 5000ms;
  o.on_failure = redis::failure_policy::throw_error;
  redis::redis_store store(o);
  const fixed_window::config cfg("30/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  const std::uint64_t reloads_before = store.stats().script_reloads;  // 1: a new server
  (void)rltest::command(o, {"SCRIPT", "FLUSH"});
  constexpr std::size_t n = 60;
  outcomes out(n);
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
  }
  ASSERT_TRUE(out.wait());
  std::vector<int> remaining_seen(30, 0);
  std::size_t admitted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    ASSERT_FALSE(out.errors[i]) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::store) << i;
    if (out.decisions[i].allowed) {
      ++admitted;
      ASSERT_LT(out.decisions[i].remaining, 30);
      ++remaining_seen[static_cast<std::size_t>(out.decisions[i].remaining)];
    }
  }
  EXPECT_EQ(admitted, 30u);
  for (int c : remaining_seen) EXPECT_EQ(c, 1);
  const redis::store_stats st = store.stats();
  EXPECT_GE(st.script_reloads - reloads_before, 1u);
  EXPECT_LE(st.script_reloads - reloads_before, n);
  EXPECT_EQ(st.store, n + 1);
  EXPECT_EQ(st.errors, 0u);
}

// Verifies renew() (Sentinel's +switch-master) with a check in flight and one
// queued behind it on the retired connection: once the first is answered
// (BLPOP, after 200 ms) the queued one goes out on a new connection at once,
// not when its deadline (2 s) has passed.
TEST(RedisMultiplex, RenewedConnectionHandsItsQueuedChecksOnWhenAnswered) {
  rltest::redis_server server;
  redis::multiplexer mux(server.options(), 1);
  std::atomic<int> calls{0};
  std::exception_ptr blpop_error, ping_error;
  const std::string list = rltest::unique_prefix("mux-renew") + "list";
  std::unique_ptr<redis::mux_job> blpop(
      new raw_job({"BLPOP", list, "0.2"}, 5000ms, 0ms, calls, blpop_error));
  ASSERT_TRUE(mux.submit(blpop));
  std::this_thread::sleep_for(50ms);  // written, held by the server
  mux.renew();
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<redis::mux_job> ping(new raw_job({"PING"}, 2000ms, 0ms, calls, ping_error));
  ASSERT_TRUE(mux.submit(ping));
  while (calls.load() < 2 && std::chrono::steady_clock::now() - start < 5s) {
    std::this_thread::sleep_for(5ms);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(calls.load(), 2);
  EXPECT_FALSE(blpop_error);
  EXPECT_FALSE(ping_error) << "the queued check waited for its deadline";
  EXPECT_LT(took, 1000ms);
}

// Verifies that a value our script did not write (a list where a check's
// state lives: WRONGTYPE inside the script) is decided the same way through
// the multiplexer as through the pool: script_error under throw_error; under
// fail_open an admitted fail_open decision, one error counted, the breaker
// untouched, and the connection kept (the next check on another key is
// decided by Redis).
TEST(RedisMultiplex, ForeignValueIsDecidedAsThroughThePool) {
  redis::options base = rltest::shared_redis();
  const gcra::config cfg("5/1h", bucket_options{.name = "t"});
  for (const auto policy : {redis::failure_policy::throw_error, redis::failure_policy::fail_open}) {
    for (const std::size_t multiplex : {std::size_t{0}, std::size_t{1}}) {
      redis::options o = base;
      o.prefix = rltest::unique_prefix("mux-foreign");
      o.multiplex = multiplex;
      o.on_failure = policy;
      o.breaker_threshold = 1;
      redis::redis_store store(o);
      (void)rltest::command(o, {"RPUSH", store.key_for(cfg, "k"), "x"});
      if (policy == redis::failure_policy::throw_error) {
        EXPECT_THROW((void)store.apply(cfg, "k", store_time, 1), redis::script_error) << multiplex;
        outcomes out(1);
        store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(0));
        ASSERT_TRUE(out.wait());
        EXPECT_TRUE(holds<redis::script_error>(out.errors[0])) << multiplex;
      } else {
        const decision d = store.apply(cfg, "k", store_time, 1);
        EXPECT_EQ(d.source, decision_source::fail_open) << multiplex;
        EXPECT_TRUE(d.allowed) << multiplex;
        EXPECT_EQ(store.stats().errors, 1u) << multiplex;
      }
      EXPECT_FALSE(store.circuit_open()) << multiplex;
      EXPECT_EQ(store.apply(cfg, "other", store_time, 1).source, decision_source::store)
          << multiplex;
    }
  }
}

/// In a child process: an async check whose handler holds a copy of the
/// store, the caller's copy dropped before the answer; later checks on a
/// new store still work. Exit 0 when the handler ran once and the process
/// lived on.
int last_copy_in_the_handler(const redis::options& o) {
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  std::atomic<int> calls{0};
  std::atomic<int> after{0};
  {
    redis::redis_store store(o);
    store.async_apply(
        cfg, "k", store_time, 1, access::consume,
        [copy = store, &calls, &after, cfg](decision d, std::exception_ptr e) mutable {
          if (!e && d.source == decision_source::store) ++calls;
          // A follow-up check through the copy (reentrancy).
          copy.async_apply(cfg, "k2", store_time, 1, access::consume,
                           [&after](decision, std::exception_ptr) { ++after; });
        });
  }  // the handler's copy is now the last one
  for (int i = 0; i < 300 && (calls.load() < 1 || after.load() < 1); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms);
  redis::redis_store again(o);
  if (again.apply(cfg, "k", store_time, 1).remaining != 8) return 2;
  return calls.load() == 1 && after.load() == 1 ? 0 : 3;
}

// Verifies that a handler holding a copy of the store (to submit follow-up
// checks) may be the store's last copy: the store is then destroyed after
// the handler returns, on no thread that waits for itself. The follow-up
// check gets exactly one answer (multiplexer_stopped or its decision).
TEST(RedisMultiplex, HandlerHoldingTheLastCopyOfTheStore) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-last-copy");
  o.multiplex = 1;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(last_copy_in_the_handler(o));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

/// In a child forked while the parent's I/O thread runs: the parent's store
/// refuses checks (sync and async, the handler never called) and its copy
/// destroyed there touches nothing of the parent's; a new store works.
int child_with_the_parents_store(redis::redis_store parents, const redis::options& o) {
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  int calls = 0;
  try {
    parents.async_apply(cfg, "k", store_time, 1, access::consume,
                        [&](decision, std::exception_ptr) { ++calls; });
    return 1;
  } catch (const std::logic_error&) {
  }
  try {
    (void)parents.apply(cfg, "k", store_time, 1);
    return 2;
  } catch (const std::logic_error&) {
  }
  if (calls != 0) return 3;
#if defined(__SANITIZE_THREAD__)
  return 0;  // TSan kills children that start threads after a multi-threaded fork
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return 0;
#endif
#endif
  redis::redis_store own(o);
  if (own.apply(cfg, "k", store_time, 1).remaining != 9) return 4;
  int own_calls = 0;
  decision got;
  std::mutex m;
  std::condition_variable cv;
  own.async_apply(cfg, "k", store_time, 1, access::consume, [&](decision d, std::exception_ptr) {
    std::lock_guard<std::mutex> lock(m);
    got = d;
    ++own_calls;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(m);
  if (!cv.wait_for(lock, 5s, [&] { return own_calls == 1; })) return 5;
  return got.remaining == 8 ? 0 : 6;
}

// Verifies fork() with the I/O thread running and checks in flight in the
// parent: the child refuses the parent's store (std::logic_error, no handler
// call), destroys its copy without joining or closing anything, and a store
// of its own works; the parent's checks in flight complete once each.
TEST(RedisMultiplex, ForkWithTheIoThreadRunning) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-fork");
  o.multiplex = 2;
  o.command_timeout = 5000ms;
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  redis::redis_store store(o);
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "300", "WRITE"});
  constexpr std::size_t n = 8;
  outcomes out(n);
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "p", store_time, 1, access::consume, out.handler(i));
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(child_with_the_parents_store(store, o));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(out.wait());
  std::size_t admitted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    admitted += out.decisions[i].allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, n);
  EXPECT_EQ(store.apply(cfg, "p", store_time, 1).remaining, 1);  // 10 - 8 - 1
}

// Verifies that destroying a store whose I/O thread is connecting to a hung
// server (SIGSTOP: the kernel accepts, nothing answers) waits for that one
// connect only, not for one connect per connection with checks queued: four
// connections, connect_timeout 300 ms, checks with 5 s deadlines. Every
// handler is called once.
TEST(RedisMultiplex, DestructionWhileConnectingWaitsForOneConnect) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-hung");
  o.multiplex = 4;
  o.connect_timeout = 300ms;
  o.command_timeout = 5000ms;
  o.breaker_threshold = 1000;
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  constexpr std::size_t n = 4;
  outcomes out(n);
  server.pause();
  auto took = std::chrono::steady_clock::duration{};
  {
    redis::redis_store store(o);
    for (std::size_t i = 0; i < n; ++i) {
      store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
    }
    std::this_thread::sleep_for(50ms);  // the first connect is under way
    const auto start = std::chrono::steady_clock::now();
    store = redis::redis_store(o);  // the first store's last copy goes
    took = std::chrono::steady_clock::now() - start;
  }
  server.resume();
  ASSERT_TRUE(out.wait(1s));
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(holds<redis::connection_error>(out.errors[i]) || !out.errors[i]) << i;
  }
  EXPECT_LT(took, 600ms);
}

// Verifies exactly-once completion under churn: 4 threads submit 400 async
// checks each over 3 shared connections while another thread kills the
// connections (CLIENT KILL) every 5 ms; every handler is called exactly
// once, and the checks decided by Redis never admit more than the limit.
TEST(RedisMultiplex, EveryHandlerOnceWhileConnectionsAreKilled) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-churn");
  o.multiplex = 3;
  o.command_timeout = 2000ms;
  o.on_failure = redis::failure_policy::fail_closed;
  o.breaker_threshold = 1000000;
  redis::redis_store store(o);
  const fixed_window::config cfg("500/1h", window_options{.name = "t"});
  constexpr std::size_t threads = 4, per_thread = 400, n = threads * per_thread;
  outcomes out(n);
  std::atomic<bool> done{false};
  std::thread killer([&] {
    while (!done.load()) {
      (void)rltest::command(o, {"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
      std::this_thread::sleep_for(5ms);
    }
  });
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::size_t j = 0; j < per_thread; ++j) {
        const std::size_t i = t * per_thread + j;
        store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
        if (j % 50 == 0) std::this_thread::sleep_for(2ms);
      }
    });
  }
  for (auto& th : pool) th.join();
  const bool all = out.wait(20s);
  done = true;
  killer.join();
  ASSERT_TRUE(all);
  std::size_t by_store = 0, admitted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    if (out.decisions[i].source == decision_source::store) {
      ++by_store;
      admitted += out.decisions[i].allowed ? 1 : 0;
    }
  }
  EXPECT_LE(admitted, 500u);
  const redis::store_stats st = store.stats();
  EXPECT_EQ(st.store, by_store);
  EXPECT_EQ(st.store + st.fail_closed, n);
  std::this_thread::sleep_for(50ms);
  std::lock_guard<std::mutex> lock(out.m);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out.calls[i], 1) << i;
}

// Verifies the cap on pending checks: with multiplex_max_pending 8 and the
// server holding every check (CLIENT PAUSE WRITE), 8 async checks are
// pending and the next 12 are refused at once, each handler called once with
// multiplexer_full naming the cap (throw_error); a sync check refused the
// same way is decided by the failure policy (fail_closed); once the server
// answers, the 8 held checks are decided by Redis and new checks go through.
TEST(RedisMultiplex, PendingChecksAreCappedAndTheRefusedOnesFailThroughThePolicy) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-cap");
  o.multiplex = 1;
  o.multiplex_max_pending = 8;
  o.command_timeout = 5000ms;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  redis::options closed = o;
  closed.on_failure = redis::failure_policy::fail_closed;
  redis::redis_store closed_store(closed);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  ASSERT_EQ(closed_store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  constexpr std::size_t n = 20, cap = 8;
  outcomes out(n);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "1000", "WRITE"});
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
  }
  {
    // The refused ones were called inline, before async_apply returned.
    std::lock_guard<std::mutex> lock(out.m);
    for (std::size_t i = cap; i < n; ++i) {
      ASSERT_EQ(out.calls[i], 1) << i;
      ASSERT_TRUE(holds<redis::multiplexer_full>(out.errors[i])) << i;
      try {
        std::rethrow_exception(out.errors[i]);
      } catch (const redis::multiplexer_full& e) {
        EXPECT_NE(std::string(e.what()).find("8 checks already pending"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("multiplex_max_pending"), std::string::npos);
      }
    }
    for (std::size_t i = 0; i < cap; ++i) EXPECT_EQ(out.calls[i], 0) << i;
  }
  // The fail_closed store, full too: its sync check is decided by the policy.
  outcomes held(cap);
  for (std::size_t i = 0; i < cap; ++i) {
    closed_store.async_apply(cfg, "c", store_time, 1, access::consume, held.handler(i));
  }
  const decision refused = closed_store.apply(cfg, "c", store_time, 1);
  EXPECT_EQ(refused.source, decision_source::fail_closed);
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(closed_store.stats().fail_closed, 1u);
  ASSERT_TRUE(out.wait());
  ASSERT_TRUE(held.wait());
  for (std::size_t i = 0; i < cap; ++i) {
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::store) << i;
    EXPECT_EQ(held.decisions[i].source, decision_source::store) << i;
  }
  EXPECT_EQ(store.stats().store, 1 + cap);
  EXPECT_EQ(store.apply(cfg, "k", store_time, 1).remaining, 1000u - cap - 1);
}

// Eight threads submit 12 checks each at once to a multiplexer capped at 16
// while the server is paused: exactly 16 are taken (none more, none fewer:
// the count is tested and raised under one lock), the other 80 refused with
// multiplexer_full; once answered, the count is back to 0 (no leak), so the
// next 16 are all taken again.
TEST(RedisMultiplex, PendingCapIsExactUnderThreadsAndFreedOnceAnswered) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-cap-threads");
  o.multiplex = 2;
  o.multiplex_max_pending = 16;
  o.command_timeout = 5000ms;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  const fixed_window::config cfg("100000/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  constexpr std::size_t threads = 8, each = 12, cap = 16;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    outcomes out(threads * each);
    (void)rltest::command(o, {"CLIENT", "PAUSE", "600", "WRITE"});
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        for (std::size_t i = 0; i < each; ++i) {
          store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(t * each + i));
        }
      });
    }
    go = true;
    for (std::thread& th : pool) th.join();
    ASSERT_TRUE(out.wait());
    std::size_t taken = 0, full = 0;
    for (std::size_t i = 0; i < threads * each; ++i) {
      EXPECT_EQ(out.calls[i], 1) << i;
      if (!out.errors[i]) {
        EXPECT_EQ(out.decisions[i].source, decision_source::store) << i;
        ++taken;
      } else {
        EXPECT_TRUE(holds<redis::multiplexer_full>(out.errors[i])) << i;
        ++full;
      }
    }
    EXPECT_EQ(taken, cap);
    EXPECT_EQ(full, threads * each - cap);
  }
  EXPECT_EQ(store.apply(cfg, "k", store_time, 1).remaining, 100000u - 2 * cap - 1);
}

/// What a reply_job saw: its reply's text (status or bulk string) and error.
struct job_result {
  std::string reply;
  std::exception_ptr error;
};

/// A raw command that keeps its outcome in `out` and counts its completion.
struct reply_job final : redis::mux_job {
  reply_job(std::vector<std::string_view> args, job_result& o, std::atomic<int>& c)
      : out(o), calls(c) {
    redis::append_command(bytes, args.data(), args.size());
    until = redis::deadline_clock::now() + 5s;
  }
  void complete(std::unique_ptr<redis::mux_job>, redis::reply_ptr r,
                std::exception_ptr e) noexcept override {
    if (r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) {
      out.reply.assign(r->str, r->len);
    }
    out.error = std::move(e);
    calls.fetch_add(1);
  }
  job_result& out;
  std::atomic<int>& calls;
};

/// Waits up to 5 s for `calls` to reach `n`.
bool reaches(const std::atomic<int>& calls, int n) {
  const auto start = std::chrono::steady_clock::now();
  while (calls.load() < n && std::chrono::steady_clock::now() - start < 5s) {
    std::this_thread::sleep_for(2ms);
  }
  return calls.load() == n;
}

// Verifies multiplexer::submit_pair (a cluster check behind its ASKING): the
// pair counts as one job under the pending cap (with multiplex_max_pending 1
// it is taken; while another job holds the one place it is refused whole,
// both jobs left with the caller), and nothing comes between its two
// commands: over two connections, threads queue pairs CLIENT SETNAME <own
// name>, CLIENT GETNAME, and every GETNAME answers its own pair's name.
TEST(RedisMultiplex, SubmitPairCountsOnceAndKeepsThePairAdjacent) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.multiplex_max_pending = 1;
  {
    redis::multiplexer mux(o, 1);
    std::atomic<int> calls{0};
    job_result set_a, get_a, blpop, set_b, get_b;
    std::unique_ptr<redis::mux_job> lead(new reply_job({"CLIENT", "SETNAME", "a"}, set_a, calls));
    std::unique_ptr<redis::mux_job> job(new reply_job({"CLIENT", "GETNAME"}, get_a, calls));
    ASSERT_TRUE(mux.submit_pair(lead, job));
    ASSERT_TRUE(reaches(calls, 2));
    EXPECT_FALSE(set_a.error);
    EXPECT_FALSE(get_a.error);
    EXPECT_EQ(get_a.reply, "a");
    EXPECT_EQ(mux.pending(), 0u);
    const std::string list = rltest::unique_prefix("mux-pair") + "list";
    std::unique_ptr<redis::mux_job> held(new reply_job({"BLPOP", list, "0.3"}, blpop, calls));
    ASSERT_TRUE(mux.submit(held));
    lead.reset(new reply_job({"CLIENT", "SETNAME", "b"}, set_b, calls));
    job.reset(new reply_job({"CLIENT", "GETNAME"}, get_b, calls));
    EXPECT_THROW((void)mux.submit_pair(lead, job), redis::multiplexer_full);
    EXPECT_NE(lead, nullptr);
    EXPECT_NE(job, nullptr);
    ASSERT_TRUE(reaches(calls, 3));  // the BLPOP timed out on the server: the place is free
    ASSERT_TRUE(mux.submit_pair(lead, job));
    ASSERT_TRUE(reaches(calls, 5));
    EXPECT_FALSE(blpop.error);
    EXPECT_EQ(get_b.reply, "b");
    EXPECT_EQ(mux.pending(), 0u);
  }
  o.multiplex_max_pending = 0;
  redis::multiplexer mux(o, 2);
  constexpr int threads = 4, each = 25;
  std::atomic<int> calls{0};
  std::vector<job_result> sets(threads * each), gets(threads * each);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < each; ++i) {
        const int k = t * each + i;
        const std::string name = "pair" + std::to_string(k);
        std::unique_ptr<redis::mux_job> lead(
            new reply_job({"CLIENT", "SETNAME", name}, sets[static_cast<std::size_t>(k)], calls));
        std::unique_ptr<redis::mux_job> job(
            new reply_job({"CLIENT", "GETNAME"}, gets[static_cast<std::size_t>(k)], calls));
        EXPECT_TRUE(mux.submit_pair(lead, job));
      }
    });
  }
  for (std::thread& th : pool) th.join();
  ASSERT_TRUE(reaches(calls, 2 * threads * each));
  for (std::size_t k = 0; k < gets.size(); ++k) {
    EXPECT_FALSE(sets[k].error) << k;
    EXPECT_FALSE(gets[k].error) << k;
    EXPECT_EQ(gets[k].reply, "pair" + std::to_string(k)) << k;
  }
  EXPECT_EQ(mux.pending(), 0u);
}

// Verifies that the pending cap is local overload, not a Redis fault: with
// breaker_threshold 1 and the cap (2) taken while the server holds the
// checks, three blocking checks refused with multiplexer_full are decided by
// the failure policy (fail_open) and counted as errors, but open no breaker:
// once the server answers, the held checks and the next one are decided by
// Redis (with the breaker opened, that one would be short-circuited).
TEST(RedisMultiplex, PendingCapRefusalIsNoBreakerFailure) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-cap-breaker");
  o.multiplex = 1;
  o.multiplex_max_pending = 2;
  o.command_timeout = 5000ms;
  o.breaker_threshold = 1;
  o.on_failure = redis::failure_policy::fail_open;
  redis::redis_store store(o);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  outcomes held(2);
  // Long enough for slow sanitizer builds on a loaded machine: the refusals
  // below must all come while the two held checks are pending.
  (void)rltest::command(o, {"CLIENT", "PAUSE", "1500", "WRITE"});
  for (std::size_t i = 0; i < 2; ++i) {
    store.async_apply(cfg, "k", store_time, 1, access::consume, held.handler(i));
  }
  for (int i = 0; i < 3; ++i) {
    const decision d = store.apply(cfg, "k", store_time, 1);
    EXPECT_EQ(d.source, decision_source::fail_open) << i;
    EXPECT_TRUE(d.allowed) << i;
  }
  EXPECT_FALSE(store.circuit_open());
  EXPECT_EQ(store.stats().breaker_opened, 0u);
  EXPECT_EQ(store.stats().errors, 3u);
  EXPECT_EQ(store.stats().fail_open, 3u);
  EXPECT_EQ(store.stats().short_circuited, 0u);
  ASSERT_TRUE(held.wait());
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(held.errors[i]) << i;
    EXPECT_EQ(held.decisions[i].source, decision_source::store) << i;
  }
  const decision next = store.apply(cfg, "k", store_time, 1);
  EXPECT_EQ(next.source, decision_source::store);
  EXPECT_EQ(next.remaining, 1000u - 3);
  EXPECT_EQ(store.stats().short_circuited, 0u);
}

// Verifies the copy a blocking check's waiter gets of an error handed over
// from the I/O thread: the same dynamic type (not a base: a tls_error stays
// a tls_error) and message, a distinct object; a type it does not know is
// handed over as it is.
TEST(RedisMultiplex, WaiterOwnsACopyOfTheErrorOfTheSameType) {
  const auto same = [](auto original) {
    using E = decltype(original);
    const std::exception_ptr e = std::make_exception_ptr(original);
    const std::exception_ptr c = redis::detail::own_copy(e);
    EXPECT_NE(c, e) << typeid(E).name();
    try {
      std::rethrow_exception(c);
    } catch (const std::exception& x) {
      EXPECT_EQ(typeid(x), typeid(E));
      EXPECT_STREQ(x.what(), original.what());
    }
  };
  same(redis::timeout_error("t"));
  same(redis::connection_error("c"));
  same(redis::tls_error("tls"));
  same(redis::multiplexer_full("full"));
  same(redis::multiplexer_stopped("stopped"));
  same(redis::script_error("s"));
  same(std::invalid_argument("bad"));
  same(std::bad_alloc());
  struct own_error : redis::connection_error {
    using connection_error::connection_error;
  };
  const std::exception_ptr mine = std::make_exception_ptr(own_error("mine"));
  EXPECT_EQ(redis::detail::own_copy(mine), mine);
  const std::exception_ptr number = std::make_exception_ptr(7);
  EXPECT_EQ(redis::detail::own_copy(number), number);
}

/// Runs `body(i)` on 16 threads at once and joins them.
template <class Body>
void on_sixteen_threads(Body body) {
  std::vector<std::thread> pool;
  for (int i = 0; i < 16; ++i) pool.emplace_back([&body, i] { body(i); });
  for (auto& t : pool) t.join();
}

// Verifies the leader/follower path's deadlines: 16 blocking checks held by
// the server (CLIENT PAUSE) past their 100 ms deadline, on one connection
// that the blocking callers drive themselves, each end once, within their
// deadline (plus slack), with a connection_error (timeout_error for at least
// the first: the one whose deadline passes drops the connection, failing the
// others written on it); then the next check is decided by Redis.
TEST(RedisMultiplex, BlockingChecksPastTheirDeadlineWhileALeaderReads) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-lead-timeout");
  o.multiplex = 1;
  o.multiplex_lead = true;
  o.command_timeout = 100ms;
  o.on_failure = redis::failure_policy::throw_error;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  const gcra::config cfg("10/s", bucket_options{.name = "t"});
  ASSERT_TRUE(store.apply(cfg, "warm", store_time, 1).allowed);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "400", "WRITE"});
  std::atomic<int> connection_errors{0}, timeouts{0}, other{0};
  std::atomic<long long> slowest_ms{0};
  on_sixteen_threads([&](int) {
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)store.apply(cfg, "k", store_time, 1);
      ++other;
    } catch (const redis::timeout_error&) {
      ++timeouts;
    } catch (const redis::connection_error&) {
      ++connection_errors;
    } catch (...) {
      ++other;
    }
    const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
    long long seen = slowest_ms.load();
    while (ms > seen && !slowest_ms.compare_exchange_weak(seen, ms)) {
    }
  });
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(timeouts.load() + connection_errors.load(), 16);
  EXPECT_GE(timeouts.load(), 1);
  EXPECT_LT(slowest_ms.load(), 350);
  EXPECT_EQ(store.stats().errors, 16u);
  EXPECT_EQ(store.stats().timeouts, static_cast<std::uint64_t>(timeouts.load()));
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(store.apply(cfg, "k2", store_time, 1).source, decision_source::store);
}

// Verifies the leader/follower path when the connection breaks: 16 blocking
// checks written on one connection (held by CLIENT PAUSE) when it is killed
// each end once through the failure policy (fail_closed), and none of them
// ran (each key's next check is its first); the next checks go out on a new
// connection.
TEST(RedisMultiplex, BlockingChecksOnAKilledConnectionFailOnceAndNeverRan) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-lead-kill");
  o.multiplex = 1;
  o.multiplex_lead = true;
  o.command_timeout = 5000ms;
  o.on_failure = redis::failure_policy::fail_closed;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  ASSERT_TRUE(store.apply(cfg, "warm", store_time, 1).allowed);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "3000", "WRITE"});
  std::atomic<int> fail_closed{0};
  std::thread killer([&] {
    let_write();
    (void)rltest::command(o, {"CLIENT", "KILL", "TYPE", "normal"});
  });
  on_sixteen_threads([&](int i) {
    const decision d = store.apply(cfg, "k" + std::to_string(i), store_time, 1);
    if (!d.allowed && d.source == decision_source::fail_closed) ++fail_closed;
  });
  killer.join();
  (void)rltest::command(o, {"CLIENT", "UNPAUSE"});
  EXPECT_EQ(fail_closed.load(), 16);
  EXPECT_EQ(store.stats().fail_closed, 16u);
  EXPECT_EQ(store.stats().errors, 16u);
  for (int i = 0; i < 16; ++i) {
    const decision d = store.apply(cfg, "k" + std::to_string(i), store_time, 1);
    EXPECT_EQ(d.source, decision_source::store) << i;
    EXPECT_EQ(d.remaining, 999u) << i;
  }
}

// Verifies blocking and async checks on the same connections: the lanes go
// from blocking leaders to the I/O thread (async checks pending) and back;
// on one key exactly the limit is admitted, every check decided by Redis once.
TEST(RedisMultiplex, BlockingAndAsyncChecksTogetherAdmitExactlyTheLimit) {
  for (const std::size_t connections : {1u, 2u}) {
    redis::options o = rltest::shared_redis();
    o.prefix = rltest::unique_prefix("mux-mixed");
    o.multiplex = connections;
    o.multiplex_lead = true;
    o.command_timeout = 5000ms;
    o.on_failure = redis::failure_policy::throw_error;
    redis::redis_store store(o);
    const fixed_window::config cfg("300/1h", window_options{.name = "t"});
    constexpr std::size_t async_n = 200;
    outcomes out(async_n);
    std::atomic<long> admitted{0};
    std::thread async_thread([&] {
      for (std::size_t i = 0; i < async_n; ++i) {
        store.async_apply(cfg, "k", store_time, 1, access::consume, out.handler(i));
        if (i % 20 == 0) std::this_thread::sleep_for(1ms);
      }
    });
    on_sixteen_threads([&](int) {
      for (int j = 0; j < 25; ++j) {
        if (store.apply(cfg, "k", store_time, 1).allowed) ++admitted;
      }
    });
    async_thread.join();
    ASSERT_TRUE(out.wait());
    for (std::size_t i = 0; i < async_n; ++i) {
      EXPECT_EQ(out.calls[i], 1) << i;
      EXPECT_FALSE(out.errors[i]) << i;
      if (out.decisions[i].allowed) ++admitted;
    }
    EXPECT_EQ(admitted.load(), 300) << connections;
    EXPECT_EQ(store.stats().store, 16u * 25u + async_n) << connections;
  }
}

// Verifies NOSCRIPT on the leader/follower path: after SCRIPT FLUSH, 16
// threads x 4 blocking checks on one key (a leader sends some again as EVAL,
// for other threads) admit exactly the limit, each remaining count once.
TEST(RedisMultiplex, BlockingChecksAfterScriptFlushAdmitExactlyTheLimit) {
  rltest::redis_server server;
  redis::options o = own(server, "mux-lead-flush");
  o.multiplex = 1;
  o.multiplex_lead = true;
  o.command_timeout = 5000ms;
  o.on_failure = redis::failure_policy::throw_error;
  redis::redis_store store(o);
  const fixed_window::config cfg("30/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  (void)rltest::command(o, {"SCRIPT", "FLUSH"});
  std::mutex m;
  std::vector<int> remaining_seen(30, 0);
  std::atomic<int> admitted{0}, not_store{0};
  on_sixteen_threads([&](int) {
    for (int j = 0; j < 4; ++j) {
      const decision d = store.apply(cfg, "k", store_time, 1);
      if (d.source != decision_source::store) ++not_store;
      if (!d.allowed) continue;
      ++admitted;
      std::lock_guard<std::mutex> lock(m);
      if (d.remaining >= 0 && d.remaining < 30)
        ++remaining_seen[static_cast<std::size_t>(d.remaining)];
    }
  });
  EXPECT_EQ(not_store.load(), 0);
  EXPECT_EQ(admitted.load(), 30);
  for (int c : remaining_seen) EXPECT_EQ(c, 1);
  EXPECT_GE(store.stats().script_reloads, 2u);  // the new server's, and the flush's
  EXPECT_EQ(store.stats().errors, 0u);
}

/// A raw command whose blocking caller waits for it on `w` (the
/// leader/follower path: the caller may drive the connection).
struct waited_job final : redis::mux_job {
  waited_job(std::vector<std::string_view> args, std::chrono::milliseconds timeout,
             redis::detail::sync_waiter& w)
      : w_(w) {
    redis::append_command(bytes, args.data(), args.size());
    until = redis::deadline_clock::now() + timeout;
    waiter = &w;
  }
  void complete(std::unique_ptr<redis::mux_job>, redis::reply_ptr,
                std::exception_ptr e) noexcept override {
    w_.set(decision{}, std::move(e));
  }
  redis::detail::sync_waiter& w_;
};

/// Submits `args` as a blocking caller and waits for it on this thread.
/// @return its error (null: answered); a multiplexer_stopped when refused
std::exception_ptr waited(redis::multiplexer& mux, std::vector<std::string_view> args,
                          std::chrono::milliseconds timeout) {
  redis::detail::sync_waiter w;
  std::unique_ptr<redis::mux_job> j(new waited_job(std::move(args), timeout, w));
  try {
    if (!mux.submit(j)) return std::make_exception_ptr(redis::multiplexer_stopped("refused"));
    (void)w.get();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

/// Waits for `w`. @return its error (null: answered)
std::exception_ptr error_of(redis::detail::sync_waiter& w) {
  try {
    (void)w.get();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

// Verifies that a reply which arrived before its check's deadline is
// delivered when the blocking caller handed the connection reads it after
// the deadline (as the I/O thread does): a leader waits for its BLPOP
// (150 ms) with B (BLPOP of 50 ms, deadline 250 ms) written behind it, and
// hands the connection to B's caller, which comes to wait only at 450 ms.
// B's reply arrived at about 200 ms: B is answered, no connection dropped.
TEST(RedisMultiplex, ReplyArrivedInTimeIsDeliveredToAWaiterHandedTheConnectionLate) {
  rltest::redis_server server;
  redis::multiplexer mux(server.options(), 1);
  const std::string p = rltest::unique_prefix("mux-lead-late");
  EXPECT_FALSE(waited(mux, {"PING"}, 5000ms));  // connected
  std::exception_ptr a_error;
  std::thread leader([&] { a_error = waited(mux, {"BLPOP", p + "a", "0.15"}, 5000ms); });
  std::this_thread::sleep_for(50ms);
  redis::detail::sync_waiter w;
  std::unique_ptr<redis::mux_job> b(new waited_job({"BLPOP", p + "b", "0.05"}, 250ms, w));
  const bool queued = mux.submit(b);
  std::this_thread::sleep_for(400ms);
  const std::exception_ptr b_error = queued ? error_of(w) : nullptr;
  leader.join();
  EXPECT_TRUE(queued);
  EXPECT_FALSE(a_error);
  EXPECT_FALSE(b_error) << "B's reply came at about 200 ms, its deadline is at 300 ms";
  EXPECT_EQ(mux.connections_dropped(), 0u);
}

/// A blocking caller's raw command that sends itself once more (as a check
/// answered NOSCRIPT does) with `again`, its deadline `timeout` from then.
struct resent_job final : redis::mux_job {
  resent_job(redis::multiplexer& m, std::vector<std::string_view> first,
             std::vector<std::string_view> again, std::chrono::milliseconds timeout,
             redis::detail::sync_waiter& w)
      : mux(m), again_(std::move(again)), timeout_(timeout), w_(w) {
    redis::append_command(bytes, first.data(), first.size());
    until = redis::deadline_clock::now() + timeout;
    waiter = &w;
  }
  void complete(std::unique_ptr<redis::mux_job> self, redis::reply_ptr,
                std::exception_ptr e) noexcept override {
    if (!e && !again_.empty()) {
      bytes.clear();
      redis::append_command(bytes, again_.data(), again_.size());
      again_.clear();
      until = redis::deadline_clock::now() + timeout_;
      try {
        if (mux.submit(self)) return;
      } catch (...) {
        e = std::current_exception();
      }
    }
    w_.set(decision{}, std::move(e));
  }
  redis::multiplexer& mux;
  std::vector<std::string_view> again_;
  std::chrono::milliseconds timeout_;
  redis::detail::sync_waiter& w_;
};

// Verifies that a connection is never handed to a blocking caller busy
// driving another one: W leads connection 0 (J, then K of another thread
// behind it, answered at 900 ms); J is sent again (as after NOSCRIPT) on
// connection 1, led by X, and answered there at about 320 ms, after X's own
// reply. X must not hand connection 1 to W (busy on connection 0 until
// 900 ms): J is answered and W returns well before K's reply.
TEST(RedisMultiplex, ConnectionIsNotHandedToACallerDrivingAnother) {
  rltest::redis_server server;
  redis::multiplexer mux(server.options(), 2);
  const std::string p = rltest::unique_prefix("mux-busy-lead");
  EXPECT_FALSE(waited(mux, {"PING"}, 5000ms));  // submit 0: connection 0
  EXPECT_FALSE(waited(mux, {"PING"}, 5000ms));  // submit 1: connection 1
  const std::string lj = p + "j", lj2 = p + "j2", lx = p + "x", lk = p + "k";
  std::exception_ptr j_error, x_error, k_error;
  long long j_ms = -1;
  std::thread tw([&] {  // submit 2: connection 0, sent again as submit 5 (connection 1)
    const auto start = std::chrono::steady_clock::now();
    redis::detail::sync_waiter w;
    std::unique_ptr<redis::mux_job> j(
        // The resend's budget is generous (it was 400 ms, and a loaded
        // machine once ran it out, dropping the connection): a J handed to
        // the busy W is caught by its time, answered at about 900 ms.
        new resent_job(mux, {"BLPOP", lj, "0.1"}, {"BLPOP", lj2, "0.1"}, 2000ms, w));
    j_error = mux.submit(j) ? error_of(w) : std::make_exception_ptr(std::runtime_error("refused"));
    j_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start)
               .count();
  });
  std::this_thread::sleep_for(20ms);
  std::thread tx([&] { x_error = waited(mux, {"BLPOP", lx, "0.2"}, 5000ms); });  // submit 3
  std::this_thread::sleep_for(20ms);
  std::thread tk([&] { k_error = waited(mux, {"BLPOP", lk, "0.8"}, 5000ms); });  // submit 4
  tw.join();
  tx.join();
  tk.join();
  EXPECT_FALSE(j_error);
  EXPECT_FALSE(x_error);
  EXPECT_FALSE(k_error);
  EXPECT_LT(j_ms, 600) << "J was answered at about 320 ms";
  EXPECT_EQ(mux.connections_dropped(), 0u);
}

}  // namespace
