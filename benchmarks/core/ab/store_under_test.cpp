// SPDX-License-Identifier: Apache-2.0
// One side of the in-process A/B benchmark: the five policies' limiters of whichever ratelimit tree this is compiled against.
//
// Compiled twice by run.sh, once per tree, with AB_MAKE naming the factory
// and, for the baseline, the ratelimit namespace renamed by the preprocessor
// so that both trees link into one binary.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace rl = ratelimit;

namespace {

using pass_fn = std::function<double()>;

/// With `clock`, each check reads the limiter's default steady_clock
/// (`try_acquire(key)`) instead of taking the time from the caller.
template <class P>
pass_fn make(typename P::config cfg, const std::vector<std::string>& keys,
             const std::vector<const std::string*>& order, bool clock = false) {
  auto lim = std::make_shared<rl::limiter<P>>(std::move(cfg));
  auto now = std::make_shared<std::int64_t>(1'000'000'000);
  for (const auto& k : keys) (void)lim->try_acquire(k, rl::timestamp{*now});
  return [lim, now, &order, clock] {
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t sum = 0;
    if (clock) {
      for (const std::string* k : order) {
        sum += static_cast<std::uint64_t>(lim->try_acquire(*k).remaining);
      }
    } else {
      for (const std::string* k : order) {
        sum += static_cast<std::uint64_t>(lim->try_acquire(*k, rl::timestamp{*now}).remaining);
        *now += 10;
      }
    }
    asm volatile("" ::"r"(sum));
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
               .count() /
           static_cast<double>(order.size());
  };
}

}  // namespace

/// One pass of checks over `order` per call, returning ns per check.
pass_fn AB_MAKE(const std::string& policy, const std::vector<std::string>& keys,
                const std::vector<const std::string*>& order) {
  const rl::rate fast{1'000'000, std::chrono::milliseconds{1}};
  if (policy == "fixed_window")
    return make<rl::fixed_window>(rl::fixed_window::config{fast}, keys, order);
  if (policy == "sliding_log") {
    return make<rl::sliding_window_log>(rl::sliding_window_log::config{fast}, keys, order);
  }
  if (policy == "sliding_counter") {
    return make<rl::sliding_window_counter>(rl::sliding_window_counter::config{fast}, keys, order);
  }
  if (policy == "token_bucket")
    return make<rl::token_bucket>(rl::token_bucket::config{fast}, keys, order);
  return make<rl::gcra>(rl::gcra::config{rl::rate{1, std::chrono::microseconds{1}},
                                         rl::bucket_options{1'000'000'000}},
                        keys, order, policy == "gcra, steady_clock");
}
