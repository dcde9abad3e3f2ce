// SPDX-License-Identifier: Apache-2.0
// The one place that turns a --store URL into a store for policy P (memory, or Redis when built in).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/store/memory_store.hpp"

#ifdef RATELIMIT_REPLAY_HAVE_REDIS
#include "redis_support.hpp"
#endif

namespace ratelimit::replay {

/// A --store URL the tool cannot use (unknown scheme, or Redis not built in).
class store_usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

[[nodiscard]] inline bool is_redis_url(std::string_view url) noexcept {
  return url.starts_with("redis://") || url.starts_with("redis-cluster://");
}

/// Opens the store named by `url` for policy P and returns `f(store)`.
/// - "" or "memory": a fresh in-process `memory_store<P>`.
/// - "redis://[USER:PASSWORD@]HOST:PORT[/DB]", "redis-cluster://HOST:PORT[,HOST:PORT...]":
///   the Redis store with caller-supplied time, when built with RATELIMIT_REPLAY_HAVE_REDIS
///   (see `open_redis_store` and `open_redis_cluster_store` in redis_support.hpp).
/// @throws store_usage_error for an unusable URL
template <class P, class F>
decltype(auto) with_store(std::string_view url, F&& f) {
  if (url.empty() || url == "memory") {
    // A fixed hash key: with out-of-order times a decision can depend on
    // which keys the store reclaimed, and that order follows the hash; the
    // same file must give the same output on every run. The keys come from
    // the user's own file, so flooding resistance is not needed here.
    memory_store<P> store(memory_store_options{
        .hash_key = std::array<std::uint64_t, 2>{0x7261746531696d69ULL, 0x7265706c61793031ULL}});
    return std::forward<F>(f)(store);
  }
  if (is_redis_url(url)) {
#ifdef RATELIMIT_REPLAY_HAVE_REDIS
    if (url.starts_with("redis-cluster://")) {
      auto store = open_redis_cluster_store(url);
      return std::forward<F>(f)(store);
    }
    auto store = open_redis_store(url);
    return std::forward<F>(f)(store);
#else
    throw store_usage_error("--store " + std::string(url) +
                            ": this ratelimit-replay was built without Redis support "
                            "(configure with -DRATELIMIT_REDIS=ON)");
#endif
  }
  throw store_usage_error("--store " + std::string(url) +
                          ": unknown store (use memory, redis://HOST:PORT[/DB] or "
                          "redis-cluster://HOST:PORT[,HOST:PORT...])");
}

}  // namespace ratelimit::replay
