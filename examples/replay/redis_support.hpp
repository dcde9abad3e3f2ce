// SPDX-License-Identifier: Apache-2.0
// Opens the Redis or Redis Cluster store for --store URLs (compiled only when the ratelimit_redis target exists).
#pragma once

#include <unistd.h>

#include <chrono>
#include <string>
#include <string_view>

#include "ratelimit/redis.hpp"
#include "ratelimit/redis/cluster_store.hpp"

namespace ratelimit::replay {

/// A key prefix unique to this run, so that state left by an earlier replay
/// can never change this one's decisions ("output is identical whatever the
/// store"); the keys expire by their own TTLs.
[[nodiscard]] inline std::string run_prefix() {
  const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return "rl:replay:" + std::to_string(::getpid()) + ":" + std::to_string(now_us) + ":";
}

/// Node settings for a replay: caller-supplied time, errors are errors (a
/// replay must not silently fail open), generous timeouts.
inline void replay_settings(ratelimit::redis::options& o) {
  o.prefix = run_prefix();
  o.on_failure = ratelimit::redis::failure_policy::throw_error;
  o.command_timeout = std::chrono::milliseconds{2000};
}

/// Turns a --store redis://... URL into a Redis store.
[[nodiscard]] inline ratelimit::redis::redis_store open_redis_store(std::string_view url) {
  ratelimit::redis::options o = ratelimit::redis::parse_url(url);
  replay_settings(o);
  return ratelimit::redis::redis_store(std::move(o));
}

/// Turns a --store redis-cluster://HOST:PORT[,HOST:PORT...] URL into a cluster store.
[[nodiscard]] inline ratelimit::redis::cluster_store open_redis_cluster_store(
    std::string_view url) {
  ratelimit::redis::cluster_options o = ratelimit::redis::parse_cluster_url(url);
  replay_settings(o.node);
  return ratelimit::redis::cluster_store(std::move(o));
}

}  // namespace ratelimit::replay
