// SPDX-License-Identifier: Apache-2.0
// A minimal consumer of ratelimit: prints the decisions of a fixed window with a manual clock.
#include <chrono>
#include <cstdio>
#include <ratelimit/ratelimit.hpp>

int main() {
  using namespace std::chrono_literals;
  using limiter =
      ratelimit::limiter<ratelimit::fixed_window, ratelimit::memory_store<ratelimit::fixed_window>,
                         ratelimit::manual_clock>;
  ratelimit::manual_clock clock{10s};
  limiter lim{ratelimit::fixed_window::config{"2/s"},
              ratelimit::memory_store<ratelimit::fixed_window>{}, clock};
  std::printf("ratelimit %s\n", ratelimit::version_string);
  for (int i = 0; i < 3; ++i) {
    const ratelimit::decision d = lim.try_acquire("caller {1}");
    std::printf("allowed=%d remaining=%lld retry_after_us=%lld source=%s\n", d.allowed ? 1 : 0,
                static_cast<long long>(d.remaining), static_cast<long long>(d.retry_after.count()),
                ratelimit::to_string(d.source).data());
  }
  clock.advance(1s);
  const ratelimit::decision later = lim.try_acquire("caller {1}");
  std::printf("after 1s allowed=%d remaining=%lld\n", later.allowed ? 1 : 0,
              static_cast<long long>(later.remaining));
  return 0;
}
