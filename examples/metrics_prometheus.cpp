// SPDX-License-Identifier: Apache-2.0
// Runs traffic through observed in-process stores and prints their metrics for Prometheus.
//
// Two limiters share nothing but the way they are measured:
// - "api": 10 per 15 minutes and 100 per day per caller (a compound limit),
//   on a store capped at 40 keys, so that the 50 callers overflow it and some
//   checks are decided by the store's fail-open policy (counted as degraded);
// - "login": 5 per minute per account, with a few peeks;
// - "search": 20 per hour per caller, a new limit rolled out in shadow mode:
//   every request goes ahead, and the ones it would have rejected are counted
//   as result="shadow_rejected".
// Time is passed explicitly, so the counts are the same on every run; only
// the latencies vary. Serve the output from a /metrics endpoint to scrape it.
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>

#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "ratelimit/store/observed_store.hpp"

int main() {
  using namespace std::chrono_literals;
  using ratelimit::basic_metrics;
  using ratelimit::memory_store;
  using ratelimit::observed_store;
  using ratelimit::timestamp;

  // The metrics outlive the limiters and are shared with them by pointer.
  basic_metrics api_metrics;
  basic_metrics login_metrics;
  basic_metrics search_metrics;

  using api_policy = ratelimit::compound_of<ratelimit::sliding_window_log>;
  using api_store = observed_store<memory_store<api_policy>, basic_metrics*>;
  ratelimit::memory_store_options capped;
  capped.max_keys = 40;
  capped.on_full = ratelimit::when_full::fail_open;
  ratelimit::limiter<api_policy, api_store> api(
      api_policy::config{"10/15min", "100/day"},
      api_store{memory_store<api_policy>{capped}, &api_metrics});

  using login_policy = ratelimit::fixed_window;
  using login_store = observed_store<memory_store<login_policy>, basic_metrics*>;
  ratelimit::limiter<login_policy, login_store> login(
      login_policy::config{"5/min"}, login_store{memory_store<login_policy>{}, &login_metrics});

  using search_policy = ratelimit::sliding_window_log;
  using search_store = observed_store<memory_store<search_policy>, basic_metrics*>;
  ratelimit::limiter<search_policy, search_store> search(
      search_policy::config{"20/1h"}, search_store{memory_store<search_policy>{}, &search_metrics});
  search.set_shadow(true);

  // One hour of traffic: a request every 1.2 s, round robin over 50 callers
  // (each caller every minute, more than 10 per 15 minutes allow).
  const timestamp start = 1'000h;
  for (std::int64_t i = 0; i < 3'000; ++i) {
    const timestamp now = start + std::chrono::milliseconds{i * 1'200};
    const std::string caller = "caller:" + std::to_string(i % 50);
    (void)api.try_acquire(caller, now);
    (void)search.try_acquire(caller, now);
    // Every tenth request also logs in, in bursts against three accounts.
    if (i % 10 == 0) {
      const std::string account = "account:" + std::to_string(i % 3);
      for (int attempt = 0; attempt < 3; ++attempt) (void)login.try_acquire(account, now);
      (void)login.peek(account, now);
    }
  }

  ratelimit::write_prometheus(
      std::cout, {{"api", api_metrics}, {"login", login_metrics}, {"search", search_metrics}});
  return 0;
}
