// SPDX-License-Identifier: Apache-2.0
// Opens the Redis store for --store redis://... (compiled only when the ratelimit_redis target exists).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <unistd.h>

#include "ratelimit/redis.hpp"

namespace ratelimit::replay {

/// THE REDIS HOOK: turns a --store URL into a Redis store with caller-supplied
/// time. Each run writes under its own key prefix so that state left by an
/// earlier replay can never change this one's decisions ("output is identical
/// whatever the store"); the keys expire by their own TTLs.
///
/// `redis-cluster://` URLs need the cluster client; until the Redis store
/// offers one, they are refused with a clear message.
[[nodiscard]] inline ratelimit::redis::redis_store open_redis_store(std::string_view url) {
  if (url.starts_with("redis-cluster://")) {
    throw std::invalid_argument("--store " + std::string(url) +
                                ": Redis Cluster is not supported by this build");
  }
  ratelimit::redis::options o = ratelimit::redis::parse_url(url);
  const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  o.prefix = "rl:replay:" + std::to_string(::getpid()) + ":" + std::to_string(now_us) + ":";
  o.on_failure = ratelimit::redis::failure_policy::throw_error;
  o.command_timeout = std::chrono::milliseconds{2000};
  return ratelimit::redis::redis_store(std::move(o));
}

}  // namespace ratelimit::replay
