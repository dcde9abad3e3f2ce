// SPDX-License-Identifier: Apache-2.0
// Example: how many Redis round trips a local cache of blocked keys saves on the abusive
// callers of a call log, and whether it changes any decision.
//
// Usage: redis_cache_effect [redis://HOST:PORT] [CALLS.csv] [THRESHOLD_MS]
//   defaults: redis://127.0.0.1:6379, the sample log of this repository, 1000 ms.
// Replays every call labelled 1 (abusive) at its own timestamp through
// limiter<sliding_window_log, S, system_clock> at 10/15min, with S = redis_store and
// S = blocked_cache<redis_store>, once with default semantics and once with
// count_rejected. Keys are written under a fresh prefix and deleted at the end.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "../replay/trace.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "ratelimit/store/blocked_cache.hpp"

#ifndef RATELIMIT_SAMPLE_CALLS
#define RATELIMIT_SAMPLE_CALLS "examples/data/sample_calls.csv"
#endif

namespace rl = ratelimit;

namespace {

struct call {
  rl::timestamp at;
  std::string key;
  rl::units cost;
};

struct run_result {
  std::vector<bool> allowed;
  std::uint64_t round_trips = 0;
  std::uint64_t cache_hits = 0;
  double seconds = 0;
};

/// Replays `calls` through a limiter on `store`; round trips are read from the
/// Redis store's own counter of checks it decided.
template <class Store>
run_result replay(const std::vector<call>& calls, const rl::sliding_window_log::config& cfg,
                  Store store, rl::redis::redis_store& redis) {
  rl::limiter<rl::sliding_window_log, Store, rl::system_clock> lim(cfg, std::move(store));
  run_result r;
  r.allowed.reserve(calls.size());
  const std::uint64_t before = redis.stats().store;
  const auto start = std::chrono::steady_clock::now();
  for (const call& c : calls) r.allowed.push_back(lim.try_acquire(c.key, c.at, c.cost).allowed);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.round_trips = redis.stats().store - before;
  if constexpr (requires { lim.store().stats().hits; }) r.cache_hits = lim.store().stats().hits;
  for (const call& c : calls) lim.reset(c.key);  // clean up (a few DELs per key, not counted)
  return r;
}

/// Most admissions of one key in any window (t - w, t].
std::size_t max_per_window(const std::vector<call>& calls, const std::vector<bool>& allowed,
                           std::chrono::microseconds w) {
  std::map<std::string, std::vector<rl::timestamp>> per_key;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (allowed[i]) per_key[calls[i].key].push_back(calls[i].at);
  }
  std::size_t best = 0;
  for (const auto& [key, v] : per_key) {
    std::size_t lo = 0;
    for (std::size_t hi = 0; hi < v.size(); ++hi) {
      while (v[lo] <= v[hi] - w) ++lo;
      best = std::max(best, hi - lo + 1);
    }
  }
  return best;
}

void print_row(const char* semantics, const char* cache, const run_result& r,
               const run_result& base) {
  const auto admitted = std::count(r.allowed.begin(), r.allowed.end(), true);
  std::printf("%-15s %-5s %11llu %9llu %6.1f%% %9lld %9lld %8.2f s\n", semantics, cache,
              static_cast<unsigned long long>(r.round_trips),
              static_cast<unsigned long long>(base.round_trips - r.round_trips),
              100.0 * static_cast<double>(base.round_trips - r.round_trips) /
                  static_cast<double>(base.round_trips),
              static_cast<long long>(admitted),
              static_cast<long long>(static_cast<std::ptrdiff_t>(r.allowed.size()) - admitted),
              r.seconds);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
  const std::string path = argc > 2 ? argv[2] : RATELIMIT_SAMPLE_CALLS;
  const long threshold_ms = argc > 3 ? std::stol(argv[3]) : 1000;

  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot open " << path << '\n';
    return 2;
  }
  std::vector<call> calls;
  rl::replay::trace_reader reader(in);
  std::map<std::string, int> keys;
  for (rl::replay::event e; reader.next(e);) {
    if (e.label != 1) continue;
    calls.push_back({rl::timestamp{e.ts_us}, std::string(e.key), e.cost});
    ++keys[calls.back().key];
  }
  if (calls.empty()) {
    std::cerr << path << ": no call labelled 1\n";
    return 2;
  }

  rl::redis::options o = rl::redis::parse_url(url);
  o.prefix = "cache_effect:" + std::to_string(::getpid()) + ":";
  rl::redis::redis_store redis(o);
  redis.ping();
  const rl::blocked_cache_options cache_opts{.threshold = std::chrono::milliseconds(threshold_ms)};

  std::printf("%zu abusive calls (label 1) on %zu keys from %s\n", calls.size(), keys.size(),
              path.c_str());
  std::printf("sliding_log 10/15min at the calls' own timestamps; cache threshold %ld ms\n\n",
              threshold_ms);
  std::printf("%-15s %-5s %11s %9s %7s %9s %9s %10s\n", "semantics", "cache", "round trips",
              "saved", "", "admitted", "rejected", "time");

  for (const bool count_rejected : {false, true}) {
    const rl::sliding_window_log::config cfg(
        "10/15min", rl::window_options{.count_rejected = count_rejected, .name = "calls"});
    const char* name = count_rejected ? "count_rejected" : "default";
    const run_result plain = replay(calls, cfg, redis, redis);
    const run_result cached = replay(
        calls, cfg, rl::blocked_cache<rl::redis::redis_store>(redis, cache_opts), redis);
    print_row(name, "off", plain, plain);
    print_row(name, "on", cached, plain);
    std::size_t more = 0;
    std::size_t fewer = 0;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      more += cached.allowed[i] && !plain.allowed[i] ? 1 : 0;
      fewer += !cached.allowed[i] && plain.allowed[i] ? 1 : 0;
    }
    std::printf(
        "  cache hits %llu; decisions that differ: %zu admitted only with the cache, %zu only "
        "without; most admissions of one key in any 15 min: %zu without, %zu with the cache\n\n",
        static_cast<unsigned long long>(cached.cache_hits), more, fewer,
        max_per_window(calls, plain.allowed, std::chrono::minutes(15)),
        max_per_window(calls, cached.allowed, std::chrono::minutes(15)));
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "error: " << e.what() << '\n';
  return 1;
}
