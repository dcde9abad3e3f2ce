// SPDX-License-Identifier: Apache-2.0
// Tests that std::bad_alloc on a multiplexer's I/O thread fails the checks it
// hit, each handler called once, and that the I/O thread carries on.
//
// This binary replaces the global operator new so that the n-th allocation
// made off the test's main thread (in practice: on the store's I/O thread)
// throws std::bad_alloc. For n = 0, 1, 2, ... a fresh store runs a burst of
// async checks with that allocation failing, until a burst needs fewer
// allocations than n. Before the fix, the first failure outside a check's own
// reply handling (queuing, writing, reading, failing jobs) reached the I/O
// thread's noexcept loop and terminated the process.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/replaced_new.hpp"

namespace {
/// Allocations off the main thread that succeed before one fails; negative: none fails.
std::atomic<long> io_allocations_before_failure{-1};
std::atomic<long> failures_injected{0};
/// When set, every allocation off the main thread after the n-th fails too.
std::atomic<bool> sticky{false};
const std::thread::id main_thread = std::this_thread::get_id();

}  // namespace

/// The n-th allocation off the main thread fails (then every one after it
/// too, when sticky).
bool rltest::allocation_fails() noexcept {
  if (io_allocations_before_failure.load(std::memory_order_relaxed) >= 0 &&
      std::this_thread::get_id() != main_thread) {
    long left = io_allocations_before_failure.load(std::memory_order_relaxed);
    while (left >= 0 && !io_allocations_before_failure.compare_exchange_weak(left, left - 1)) {
    }
    if (left == 0) {
      failures_injected.fetch_add(1);
      if (sticky.load()) io_allocations_before_failure.store(0);
      return true;
    }
  }
  return false;
}

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;

struct outcomes {
  explicit outcomes(std::size_t n) : calls(n, 0), errors(n), sources(n), left(n) {}
  std::mutex m;
  std::condition_variable cv;
  std::vector<int> calls;
  std::vector<std::exception_ptr> errors;
  std::vector<decision_source> sources;
  std::size_t left;
};

// Verifies that each allocation on the I/O thread failing in turn gives every
// check's handler exactly one call (a decision by Redis, or the error), and
// that after each failure the same store's next check is decided by Redis on
// the same (still running) I/O thread.
TEST(RedisMultiplexAlloc, EachAllocationOnTheIoThreadFailingInTurn) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("mux-alloc");
  o.multiplex = 1;
  o.command_timeout = 2000ms;
  o.breaker_threshold = 1000000;
  o.on_warning = [](std::string_view) {};
  const fixed_window::config cfg("1000000/1h", window_options{.name = "t"});
  constexpr std::size_t burst = 8;
  long failed_rounds = 0;
  long n = 0;
  for (; n < 400; ++n) {
    redis::redis_store store(o);
    outcomes out(burst);
    io_allocations_before_failure.store(n);
    for (std::size_t i = 0; i < burst; ++i) {
      store.async_apply(cfg, "k", store_time, 1, access::consume,
                        [&out, i](decision d, std::exception_ptr e) {
                          std::lock_guard<std::mutex> lock(out.m);
                          ++out.calls[i];
                          out.sources[i] = d.source;
                          out.errors[i] = std::move(e);
                          --out.left;
                          out.cv.notify_all();
                        });
    }
    {
      std::unique_lock<std::mutex> lock(out.m);
      ASSERT_TRUE(out.cv.wait_for(lock, 10s, [&] { return out.left == 0; })) << "allocation " << n;
    }
    const bool injected = io_allocations_before_failure.exchange(-1) < 0;
    std::size_t errors = 0;
    {
      std::lock_guard<std::mutex> lock(out.m);
      for (std::size_t i = 0; i < burst; ++i) {
        EXPECT_EQ(out.calls[i], 1) << "allocation " << n << " check " << i;
        if (out.errors[i]) {
          ++errors;
        } else {
          EXPECT_EQ(out.sources[i], decision_source::store) << "allocation " << n;
        }
      }
    }
    if (injected) ++failed_rounds;
    if (!injected) {
      EXPECT_EQ(errors, 0u);
      break;
    }
    // The I/O thread survived: the next check is decided by Redis.
    EXPECT_EQ(store.apply(cfg, "k", store_time, 1).source, decision_source::store)
        << "allocation " << n;
    std::this_thread::sleep_for(1ms);
    std::lock_guard<std::mutex> lock(out.m);
    for (std::size_t i = 0; i < burst; ++i) EXPECT_EQ(out.calls[i], 1) << "allocation " << n;
  }
  EXPECT_LT(n, 400) << "the burst never ran without a failure";
  EXPECT_GE(failed_rounds, 5);
  EXPECT_EQ(failures_injected.load(), failed_rounds);
}

// Verifies the same when, from the n-th on, every allocation off the main
// thread fails until the burst is over (memory stays short): failing checks
// (dropping a connection, a timeout's error, the failure policy) must itself
// allocate nothing that ends the I/O thread; every handler is called once.
TEST(RedisMultiplexAlloc, AllocationsFailingFromTheNthOnUntilTheBurstEnds) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("mux-alloc-sticky");
  o.multiplex = 2;
  o.command_timeout = 2000ms;
  o.breaker_threshold = 1000000;
  o.on_warning = [](std::string_view) {};
  const fixed_window::config cfg("1000000/1h", window_options{.name = "t"});
  constexpr std::size_t burst = 8;
  sticky = true;
  long n = 0;
  for (; n < 400; ++n) {
    redis::redis_store store(o);
    outcomes out(burst);
    failures_injected = 0;
    io_allocations_before_failure.store(n);
    for (std::size_t i = 0; i < burst; ++i) {
      store.async_apply(cfg, "k", store_time, 1, access::consume,
                        [&out, i](decision d, std::exception_ptr e) {
                          std::lock_guard<std::mutex> lock(out.m);
                          ++out.calls[i];
                          out.sources[i] = d.source;
                          out.errors[i] = std::move(e);
                          --out.left;
                          out.cv.notify_all();
                        });
    }
    {
      std::unique_lock<std::mutex> lock(out.m);
      ASSERT_TRUE(out.cv.wait_for(lock, 10s, [&] { return out.left == 0; })) << "allocation " << n;
    }
    io_allocations_before_failure.store(-1);
    const bool injected = failures_injected.load() > 0;
    {
      std::lock_guard<std::mutex> lock(out.m);
      for (std::size_t i = 0; i < burst; ++i) {
        EXPECT_EQ(out.calls[i], 1) << "allocation " << n << " check " << i;
      }
    }
    if (!injected) break;
    EXPECT_EQ(store.apply(cfg, "k", store_time, 1).source, decision_source::store)
        << "allocation " << n;
  }
  sticky = false;
  EXPECT_LT(n, 400) << "the burst never ran without a failure";
  EXPECT_GE(n, 5);
}

// Verifies that destroying a store with checks in flight while every
// allocation of the destroying thread fails (memory short) calls each
// handler once with an error and returns: stop() gathered the jobs it fails
// into a new vector and made its multiplexer_stopped in a noexcept function,
// so the first std::bad_alloc there ended the process.
TEST(RedisMultiplexAlloc, DestroyedWithChecksInFlightWhileMemoryIsShort) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.prefix = rltest::unique_prefix("mux-alloc-stop");
  o.multiplex = 2;
  o.command_timeout = 5000ms;
  o.breaker_threshold = 1000000;
  o.on_warning = [](std::string_view) {};
  const fixed_window::config cfg("1000000/1h", window_options{.name = "t"});
  constexpr std::size_t burst = 8;
  auto store = std::make_unique<redis::redis_store>(o);
  ASSERT_EQ(store->apply(cfg, "warm", store_time, 1).source, decision_source::store);
  (void)rltest::command(o, {"CLIENT", "PAUSE", "1500", "WRITE"});
  outcomes out(burst);
  for (std::size_t i = 0; i < burst; ++i) {
    store->async_apply(cfg, "k", store_time, 1, access::consume,
                       [&out, i](decision d, std::exception_ptr e) {
                         std::lock_guard<std::mutex> lock(out.m);
                         ++out.calls[i];
                         out.sources[i] = d.source;
                         out.errors[i] = std::move(e);
                         --out.left;
                         out.cv.notify_all();
                       });
  }
  std::this_thread::sleep_for(200ms);  // written on the lanes, held by the paused server
  failures_injected = 0;
  sticky = true;
  io_allocations_before_failure.store(0);
  std::thread destroyer([&store] { store.reset(); });
  destroyer.join();
  io_allocations_before_failure.store(-1);
  sticky = false;
  std::lock_guard<std::mutex> lock(out.m);
  EXPECT_EQ(out.left, 0u);
  for (std::size_t i = 0; i < burst; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(out.errors[i]) << i;
  }
}

/// A job sending `args` that counts its completion (allocating nothing there).
struct counted_job final : redis::mux_job {
  counted_job(std::vector<std::string_view> args, std::atomic<int>& c) : calls(c) {
    redis::append_command(bytes, args.data(), args.size());
    until = redis::deadline_clock::now() + 5s;
  }
  void complete(std::unique_ptr<redis::mux_job>, redis::reply_ptr,
                std::exception_ptr) noexcept override {
    calls.fetch_add(1);
  }
  std::atomic<int>& calls;
};

// Verifies that a pair queued by submit_pair (a cluster check behind its
// ASKING) is never split by std::bad_alloc on the I/O thread: when the
// check cannot be moved to the connection's queue, its lead fails with it
// instead of going out alone (a lone ASKING would apply to whatever command
// came next on that connection). The I/O thread is held in the connect (an
// opener waiting) while 32 pairs INCR <lead>, INCR <job> queue up; from the
// connect on, the n-th allocation there fails, for each n until none does;
// every lead that reached the server must have its job behind it:
// GET <lead> == GET <job>. Before the fix, the allocation of the queue's
// second block (the 64th job, a pair's second half) left the lead queued alone.
TEST(RedisMultiplexAlloc, PairIsNeverSplitWhenQueuingItFails) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.command_timeout = 5000ms;
  const std::string prefix = rltest::unique_prefix("mux-alloc-pair");
  constexpr int pairs = 32;
  long n = 0;
  long injected_rounds = 0;
  for (; n < 300; ++n) {
    const std::string lead_key = prefix + std::to_string(n) + ":lead";
    const std::string job_key = prefix + std::to_string(n) + ":job";
    std::mutex m;
    std::condition_variable cv;
    bool entered = false;
    bool go = false;
    std::atomic<int> calls{0};
    {
      redis::multiplexer mux(o, 1, {}, [&](const redis::options& opts) {
        {
          std::unique_lock<std::mutex> lock(m);
          entered = true;
          cv.notify_all();
          cv.wait(lock, [&] { return go; });
        }
        auto c = std::make_unique<redis::connection>(opts);
        io_allocations_before_failure.store(n);
        return c;
      });
      std::unique_ptr<redis::mux_job> first(new counted_job({"PING"}, calls));
      ASSERT_TRUE(mux.submit(first));
      {
        std::unique_lock<std::mutex> lock(m);
        ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return entered; }));
      }
      for (int i = 0; i < pairs; ++i) {
        std::unique_ptr<redis::mux_job> lead(new counted_job({"INCR", lead_key}, calls));
        std::unique_ptr<redis::mux_job> job(new counted_job({"INCR", job_key}, calls));
        ASSERT_TRUE(mux.submit_pair(lead, job));
      }
      {
        std::lock_guard<std::mutex> lock(m);
        go = true;
      }
      cv.notify_all();
      const auto start = std::chrono::steady_clock::now();
      while (calls.load() < 1 + 2 * pairs && std::chrono::steady_clock::now() - start < 10s) {
        std::this_thread::sleep_for(1ms);
      }
      ASSERT_EQ(calls.load(), 1 + 2 * pairs) << "allocation " << n;
    }
    const bool injected = io_allocations_before_failure.exchange(-1) < 0;
    const auto count = [&](const std::string& key) {
      auto r = rltest::command(o, {"GET", key});
      return r->type == REDIS_REPLY_STRING ? std::stol(std::string(r->str, r->len)) : 0L;
    };
    EXPECT_EQ(count(lead_key), count(job_key)) << "allocation " << n;
    if (!injected) break;
    ++injected_rounds;
  }
  EXPECT_LT(n, 300) << "the burst never ran without a failure";
  EXPECT_GE(injected_rounds, 3);
}

}  // namespace
