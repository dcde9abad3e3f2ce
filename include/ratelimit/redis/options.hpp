// SPDX-License-Identifier: Apache-2.0
// Options of the Redis store: where the server is, timeouts, failure policy.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ratelimit/decision.hpp"

namespace ratelimit::redis {

/// What a check does when Redis cannot be reached (connection refused or
/// broken, timeout, circuit breaker open) or answers with an error.
enum class failure_policy : unsigned char {
  throw_error,  ///< throw the connection_error / timeout_error / script_error
  fail_open,    ///< admit (decision.source == fail_open); nothing is recorded anywhere
  fail_closed,  ///< reject (decision.source == fail_closed, retry_after 0: nothing is known)
  fallback,  ///< decide with an in-process limiter at limit / fallback_divisor (source == fallback)
};

/// Where and how to reach Redis. An aggregate: every field has a default.
struct options {
  /// Host name or address for TCP. Ignored when `unix_socket` is set.
  std::string host = "127.0.0.1";
  /// TCP port.
  int port = 6379;
  /// Path of a unix domain socket; empty = use TCP (`host`, `port`).
  std::string unix_socket;
  /// Database index sent with SELECT after connecting; 0 = the default database (no SELECT).
  int database = 0;
  /// ACL user name for AUTH; empty = the default user (AUTH with the password alone).
  std::string user;
  /// Password for AUTH; empty = no AUTH.
  std::string password;
  /// Longest wait to establish one connection (TCP connect, AUTH, SELECT); 0 = 200 ms.
  std::chrono::milliseconds connect_timeout{200};
  /// Longest wait for a check's round trip, including the wait for a pooled
  /// connection; 0 = 100 ms. A check that must also connect may take up to
  /// connect_timeout + command_timeout.
  std::chrono::milliseconds command_timeout{100};
  /// Connections in the pool (each serves one thread at a time); 0 = 4.
  std::size_t pool_size = 4;
  /// Prefix of every Redis key: `<prefix>{<user key>}:<policy>`; may be empty.
  std::string prefix = "rl:";
  /// What a check does when Redis fails (see failure_policy).
  failure_policy on_failure = failure_policy::throw_error;
  /// For failure_policy::fallback: the local limiter admits limit / divisor
  /// (rounded down, at least 1) per period, typically the number of
  /// application instances; 0 = 1.
  units fallback_divisor = 1;
  /// With caller-supplied time, real time and the caller's time run at
  /// different speeds, so every TTL is raised to at least this; 0 = none
  /// (TTLs are then computed in caller time). Server time never uses it.
  std::chrono::milliseconds caller_time_ttl_floor{std::chrono::minutes{5}};
  /// Consecutive failed round trips that open the circuit breaker; 0 = 3.
  std::uint32_t breaker_threshold = 3;
  /// First cool-down of an open breaker. While the breaker is open every check
  /// is answered by the failure policy at once and none goes to Redis; a
  /// background thread of the store PINGs Redis once per cool-down (within
  /// connect_timeout + command_timeout) and closes the breaker when it answers.
  /// Each failed probe doubles the cool-down up to breaker_max_cooldown. 0 = 200 ms.
  std::chrono::milliseconds breaker_cooldown{200};
  /// Longest cool-down; 0 = 5 s.
  std::chrono::milliseconds breaker_max_cooldown{5000};
};

namespace detail {

[[nodiscard]] inline int parse_small_int(std::string_view s, std::string_view url,
                                         const char* what) {
  if (s.empty() || s.size() > 9) {
    throw std::invalid_argument("ratelimit: bad " + std::string(what) + " in redis URL \"" +
                                std::string(url) + "\"");
  }
  int v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') {
      throw std::invalid_argument("ratelimit: bad " + std::string(what) + " in redis URL \"" +
                                  std::string(url) + "\"");
    }
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace detail

/// Parses `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` or
/// `unix://[[USER]:PASSWORD@]/PATH[?db=DB]` into options (other fields keep
/// their defaults). No percent-decoding.
/// @throws std::invalid_argument quoting the URL
[[nodiscard]] inline options parse_url(std::string_view url) {
  options o;
  std::string_view rest;
  bool unix_path = false;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("unix://")) {
    rest = url.substr(7);
    unix_path = true;
  } else {
    throw std::invalid_argument("ratelimit: redis URL \"" + std::string(url) +
                                "\" must start with redis:// or unix://");
  }
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (const auto colon = cred.find(':'); colon != std::string_view::npos) {
      o.user = std::string(cred.substr(0, colon));
      o.password = std::string(cred.substr(colon + 1));
    } else {
      o.password = std::string(cred);
    }
  }
  if (unix_path) {
    if (const auto q = rest.find("?db="); q != std::string_view::npos) {
      o.database = detail::parse_small_int(rest.substr(q + 4), url, "database");
      rest = rest.substr(0, q);
    }
    if (rest.empty()) {
      throw std::invalid_argument("ratelimit: redis URL \"" + std::string(url) +
                                  "\" has no socket path");
    }
    o.unix_socket = std::string(rest);
    return o;
  }
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 < rest.size()) {
      o.database = detail::parse_small_int(rest.substr(slash + 1), url, "database");
    }
    rest = rest.substr(0, slash);
  }
  if (const auto colon = rest.rfind(':');
      colon != std::string_view::npos && rest.find(']') == std::string_view::npos) {
    o.port = detail::parse_small_int(rest.substr(colon + 1), url, "port");
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) {
    throw std::invalid_argument("ratelimit: redis URL \"" + std::string(url) + "\" has no host");
  }
  o.host = std::string(rest);
  return o;
}

}  // namespace ratelimit::redis
