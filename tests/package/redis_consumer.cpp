// SPDX-License-Identifier: Apache-2.0
// A consumer of ratelimit::redis: parses a URL and gets a fail_closed decision from an unreachable Redis.
#include <chrono>
#include <cstdio>
#include <ratelimit/ratelimit.hpp>
#include <ratelimit/redis.hpp>

int main() {
  namespace rl = ratelimit;
  const rl::redis::options parsed = rl::redis::parse_url("redis://app:secret@10.0.0.5:6380/2");
  std::printf("host=%s port=%d database=%d user=%s\n", parsed.host.c_str(), parsed.port,
              parsed.database, parsed.user.c_str());

  // A socket path that cannot exist: the check must go through the connect
  // (so the program really links libhiredis and OpenSSL) and be answered by
  // the failure policy, with no server needed.
  rl::redis::options o = rl::redis::parse_url(
      "unix:///nonexistent-ratelimit-package-test/redis.sock");
  o.on_failure = rl::redis::failure_policy::fail_closed;
  o.connect_timeout = std::chrono::milliseconds{100};
  rl::limiter<rl::gcra, rl::redis::redis_store, rl::manual_clock> lim{
      rl::gcra::config{"10/s", rl::bucket_options{.name = "calls"}}, rl::redis::redis_store{o},
      rl::manual_clock{}};
  const rl::decision d = lim.try_acquire("caller");
  std::printf("allowed=%d source=%s\n", d.allowed ? 1 : 0, rl::to_string(d.source).data());
  return 0;
}
