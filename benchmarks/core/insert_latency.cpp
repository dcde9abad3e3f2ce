// SPDX-License-Identifier: Apache-2.0
// Latency of inserting new keys into one shard of a memory_store: the p50, p99.9 and
// longest insert (the longest is a resize, which holds every bucket of the shard).
//
// Not built by CMake; a diagnosis run by hand, against this tree or another's include/:
//   g++ -O2 -DNDEBUG -std=gnu++20 -pthread -Iinclude -o /tmp/insert_latency
//     benchmarks/core/insert_latency.cpp && /tmp/insert_latency [HOT_THREADS]
// (one command, on one line).
// HOT_THREADS (default 0) threads check one held key of the same shard meanwhile.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  const int hot = argc > 1 ? std::atoi(argv[1]) : 0;
  constexpr int inserts = 300'000;
  const ratelimit::fixed_window::config cfg{ratelimit::rate{1'000'000'000, 1h}};
  ratelimit::memory_store<ratelimit::fixed_window> store({.shards = 1});
  const ratelimit::timestamp t{0};
  (void)store.apply(cfg, "hot", t, 1, ratelimit::access::consume);
  std::atomic<bool> stop{false};
  std::atomic<long> hot_checks{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < hot; ++i) {
    pool.emplace_back([&] {
      long n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        (void)store.apply(cfg, "hot", t, 1, ratelimit::access::consume);
        ++n;
      }
      hot_checks += n;
    });
  }
  std::vector<std::string> keys;
  keys.reserve(inserts);
  for (int i = 0; i < inserts; ++i) keys.push_back("k" + std::to_string(i));
  std::vector<double> us;
  us.reserve(inserts);
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& k : keys) {
    const auto a = std::chrono::steady_clock::now();
    (void)store.apply(cfg, k, t, 1, ratelimit::access::consume);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  const double total =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  stop = true;
  for (std::thread& th : pool) th.join();
  std::sort(us.begin(), us.end());
  std::printf("%d inserts in %.0f ms; p50 %.2f us, p99.9 %.1f us, max %.0f us; hot checks %ld\n",
              inserts, total, us[us.size() / 2], us[us.size() * 999 / 1000], us.back(),
              hot_checks.load());
}
