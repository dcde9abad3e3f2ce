// SPDX-License-Identifier: Apache-2.0
// Example: one limit shared by every node through Redis, and what happens when
// Redis is down under fail-open, fail-closed and a local fallback.
//
// Usage: redis_failure_policies [redis://HOST:PORT]   (default redis://127.0.0.1:6379)
// Stop the server while it runs to watch the decisions' source change.
#include <iostream>
#include <string>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"

namespace rl = ratelimit;

int main(int argc, char** argv) {
  rl::redis::options base = rl::redis::parse_url(argc > 1 ? argv[1] : "redis://127.0.0.1:6379");
  base.command_timeout = std::chrono::milliseconds(50);

  // Courtesy limit on a search API: better to serve than to refuse.
  auto open_opts = base;
  open_opts.on_failure = rl::redis::failure_policy::fail_open;
  // Anti-fraud limit on SMS verification: refuse when the limit cannot be checked.
  auto closed_opts = base;
  closed_opts.on_failure = rl::redis::failure_policy::fail_closed;
  // Or keep limiting locally at 1/4 of the rate (4 application instances).
  auto fallback_opts = base;
  fallback_opts.on_failure = rl::redis::failure_policy::fallback;
  fallback_opts.fallback_divisor = 4;

  // Three limiters on one subscriber: each has its own name, so each has its
  // own Redis key (rl:{+15551234567}:gcra:search, ...:sms, ...:api).
  using server_gcra = rl::limiter<rl::gcra, rl::redis::redis_store, rl::redis::server_clock>;
  server_gcra search(rl::gcra::config("100/1min", rl::bucket_options{.name = "search"}),
                     rl::redis::redis_store(open_opts));
  server_gcra sms(rl::gcra::config("10/15min", rl::bucket_options{.name = "sms"}),
                  rl::redis::redis_store(closed_opts));
  server_gcra api(rl::gcra::config("100/1min", rl::bucket_options{.name = "api"}),
                  rl::redis::redis_store(fallback_opts));

  for (int i = 0; i < 12; ++i) {
    const rl::decision s = search.try_acquire("+15551234567");
    const rl::decision m = sms.try_acquire("+15551234567");
    const rl::decision a = api.try_acquire("+15551234567");
    std::cout << "search " << (s ? "admit" : "deny ") << " (" << rl::to_string(s.source) << ")  "
              << "sms " << (m ? "admit" : "deny ") << " (" << rl::to_string(m.source)
              << ", retry in " << m.retry_after.count() / 1000 << " ms)  "
              << "api " << (a ? "admit" : "deny ") << " (" << rl::to_string(a.source) << ")\n";
  }
  const rl::redis::store_stats st = sms.store().stats();
  std::cout << "sms: " << st.store << " decided by Redis, " << st.fail_closed
            << " rejected without it, breaker " << (sms.store().circuit_open() ? "open" : "closed")
            << "\n";
  return 0;
}
