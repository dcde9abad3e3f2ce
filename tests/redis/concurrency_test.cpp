// SPDX-License-Identifier: Apache-2.0
// Many processes and threads on one key admit exactly the limit; a client
// killed mid-run leaves no key without a TTL.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/fork_child.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;

constexpr int processes = 2;
constexpr int threads_per_process = 8;
constexpr int attempts_per_thread = 40;

/// Runs `attempts_per_thread` checks on one key from 8 threads; returns admissions.
template <class Config, class Time>
long run_threads(const redis::options& o, const Config& cfg, Time when) {
  redis::redis_store store(o);
  std::atomic<long> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads_per_process; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < attempts_per_thread; ++j) {
        if (store.apply(cfg, "+15551234567", when, 1, access::consume).allowed) ++admitted;
      }
    });
  }
  for (auto& t : pool) t.join();
  return admitted.load();
}

/// 2 processes x 8 threads; returns the total admitted.
template <class Config, class Time>
long admitted_across_processes(const redis::options& o, const Config& cfg, Time when) {
  return rltest::sum_in_children(processes, [&](int) { return run_threads(o, cfg, when); });
}

redis::options fresh(std::string_view what) {
  auto o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  o.pool_size = 4;
  return o;
}

// Verifies atomicity: 640 attempts from 16 threads in 2 processes at one
// caller-supplied time admit exactly the limit (the burst for bucket/GCRA).
TEST(RedisConcurrency, TwoProcessesSixteenThreadsAdmitExactlyTheLimit) {
  const std::chrono::microseconds t{1'700'000'000'000'000};
  EXPECT_EQ(admitted_across_processes(
                fresh("c-fw"), fixed_window::config("100/1h", window_options{.name = "t"}), t),
            100);
  EXPECT_EQ(
      admitted_across_processes(
          fresh("c-log"), sliding_window_log::config("100/1h", window_options{.name = "t"}), t),
      100);
  EXPECT_EQ(
      admitted_across_processes(
          fresh("c-ctr"), sliding_window_counter::config("100/1h", window_options{.name = "t"}), t),
      100);
  EXPECT_EQ(admitted_across_processes(fresh("c-tb"),
                                      token_bucket::config("1/1h", bucket_options{77, "t"}), t),
            77);
  EXPECT_EQ(
      admitted_across_processes(fresh("c-gcra"), gcra::config("1/1h", bucket_options{77, "t"}), t),
      77);
}

// Verifies the same on the server's clock (no refill can complete a token in
// the test's duration at 1 per hour).
TEST(RedisConcurrency, TwoProcessesOnServerClockAdmitExactlyTheBurst) {
  EXPECT_EQ(admitted_across_processes(fresh("s-gcra"),
                                      gcra::config("1/1h", bucket_options{50, "t"}), store_time),
            50);
  EXPECT_EQ(admitted_across_processes(
                fresh("s-tb"), token_bucket::config("1/1h", bucket_options{50, "t"}), store_time),
            50);
  EXPECT_EQ(admitted_across_processes(
                fresh("s-log"), sliding_window_log::config("50/1h", window_options{.name = "t"}),
                store_time),
            50);
}

// Verifies that a client killed with SIGKILL mid-run leaves no key without a
// TTL: every write and its expiry are one script.
TEST(RedisConcurrency, KilledClientLeavesNoKeyWithoutTtl) {
  const auto o = fresh("kill");
  const pid_t pid = ::fork();
  if (pid == 0) {
    redis::redis_store store(o);
    const fixed_window::config fw("5/10s", window_options{true, "t"});
    const sliding_window_log::config log("5/10s", window_options{.name = "t"});
    const sliding_window_counter::config ctr("5/10s", window_options{.name = "t"});
    const token_bucket::config tb("5/10s", bucket_options{.name = "t"});
    const gcra::config g("5/10s", bucket_options{.name = "t"});
    std::vector<std::thread> pool;
    for (int th = 0; th < 4; ++th) {
      pool.emplace_back([&, th] {
        for (long i = 0;; ++i) {
          const std::string key = "k" + std::to_string((i * 7 + th) % 500);
          // On a loaded machine a check may time out; keep going until killed.
          try {
            (void)store.apply(fw, key, store_time, 1, access::consume);
            (void)store.apply(log, key, store_time, 2, access::consume);
            (void)store.apply(ctr, key, store_time, 1, access::consume);
            (void)store.apply(tb, key, store_time, 1, access::consume);
            (void)store.apply(g, key, std::chrono::microseconds{i * 1000}, 1, access::consume);
          } catch (const ratelimit::store_error&) {
          }
        }
      });
    }
    for (auto& t : pool) t.join();
    ::_exit(0);
  }
  // Kill it mid-run: once it has written a good number of keys (a loaded
  // machine may take a while to get there), and while it is still writing.
  const std::string pattern = o.prefix + "*";
  for (int waited = 0; waited < 200; ++waited) {
    auto r = rltest::command(o, {"SCAN", "0", "MATCH", pattern, "COUNT", "100000"});
    if (r->element[1]->elements >= 50) break;
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(100ms);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  long keys = 0;
  std::string cursor = "0";
  const std::string match = o.prefix + "*";
  do {
    auto r = rltest::command(o, {"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
    cursor.assign(r->element[0]->str, r->element[0]->len);
    for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
      const std::string k(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
      const long long ms = rltest::command(o, {"PTTL", k})->integer;
      // -2: expired between SCAN and PTTL; 0: under a millisecond left;
      // -1 would be a key without a TTL.
      EXPECT_TRUE(ms >= 0 || ms == -2) << k << " PTTL " << ms;
      ++keys;
    }
  } while (cursor != "0");
  EXPECT_GT(keys, 10);
}

}  // namespace
