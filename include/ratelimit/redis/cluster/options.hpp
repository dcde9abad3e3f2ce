// SPDX-License-Identifier: Apache-2.0
// Where a Redis Cluster is and how to reach its nodes: cluster_options and
// the redis-cluster:// / rediss-cluster:// URL.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/redis/multiplexer.hpp"
#include "ratelimit/redis/options.hpp"

namespace ratelimit::redis {

/// A node's TCP address.
struct node_address {
  std::string host = "127.0.0.1";
  int port = 6379;
  friend bool operator==(const node_address&, const node_address&) = default;
};

/// Where the cluster is and how to talk to each of its nodes. An aggregate.
struct cluster_options {
  /// Nodes asked for the slot map (CLUSTER SLOTS) until one answers; any
  /// node of the cluster will do, the others are discovered. At least one.
  std::vector<node_address> seeds;
  /// Settings applied to every node: user/password, connect and command
  /// timeouts, pool size and multiplex (per node), prefix, failure policy,
  /// fallback divisor, TTL floor and circuit breaker (one breaker per node).
  /// `multiplex` above 256 is refused when the store is made. `host` and `port`
  /// are ignored; `unix_socket` must be empty and `database` 0 (a cluster has
  /// only database 0).
  options node;
  /// Redirects (MOVED, ASK, TRYAGAIN) one check follows before it is given up
  /// with a script_error; 0 = 5.
  std::size_t max_redirects = 5;
  /// Shortest interval between two background refreshes of the slot map; 0 = 100 ms.
  std::chrono::milliseconds refresh_interval{100};
};

namespace detail {}  // namespace detail

/// Parses `redis-cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][?multiplex=N]`
/// (port 6379 when omitted) into cluster_options with default node settings;
/// `rediss-cluster://` is the same over TLS, with the parameters of a
/// `rediss://` URL (see parse_url) after `?` as well, applied to every node.
/// `multiplex=N` (0..256) sets options::multiplex of every node. The
/// userinfo follows parse_url's rules: an empty password (`@`, `:@`,
/// `USER:@`) is refused, and so is a '/', '?' or '#' in it (a query value
/// holding '@' would end it). The userinfo ends at the last '@' and must not hold
/// ',': `redis-cluster://a:7000,:@b` (a seed given an '@' of its own) would
/// otherwise read user `a`, password `7000,:` and the one seed `b`. Nothing
/// is percent-decoded, so a user or password holding ',' is set in code
/// (cluster_options::node.user/password). `read_spin_us=` is refused by
/// name (the cluster store never spins), and so is a '#' anywhere (as in
/// parse_url: `redis-cluster://h#x` made "h#x" a seed).
/// @throws std::invalid_argument quoting the URL
[[nodiscard]] inline cluster_options parse_cluster_url(std::string_view url) {
  constexpr std::string_view scheme = "redis-cluster://";
  constexpr std::string_view tls_scheme = "rediss-cluster://";
  const bool tls = url.starts_with(tls_scheme);
  if (!tls && !url.starts_with(scheme)) {
    throw std::invalid_argument("ratelimit: redis cluster URL \"" + detail::redacted_url(url) +
                                "\" must start with redis-cluster:// or rediss-cluster://");
  }
  std::string after_scheme(url.substr(tls ? tls_scheme.size() : scheme.size()));
  if (const auto at = detail::userinfo_end(after_scheme, false); at != std::string::npos) {
    // `redis-cluster://h:7000?multiplex=2@evil:7000` would be password
    // `7000?multiplex=2` and the one seed `evil:7000`.
    detail::refuse_delimiter_in_userinfo(
        std::string_view(after_scheme).substr(0, at), url, false,
        tls ? "cluster_options::node.user, node.password and node.tls"
            : "cluster_options::node.user and node.password");
  }
  detail::refuse_fragment(after_scheme, url,
                          tls ? "cluster_options::seeds and node.tls" : "cluster_options::seeds");
  cluster_options o;
  // read_spin_us= is taken only to be refused by name, before its value is
  // read: the cluster store never spins. Left in the query it was reported
  // as a TLS parameter ("TLS parameters need rediss://" on redis-cluster://),
  // and read first, `read_spin_us=x` as a bad value.
  std::chrono::microseconds spin{-1};
  o.node.multiplex = detail::take_multiplex_query(
      after_scheme, url, false, &spin,
      "has parameter \"read_spin_us\": the cluster store never spins "
      "(options::read_spin is for redis_store)");
  std::string_view rest = after_scheme;
  o.node.tls.enabled = tls;
  detail::take_tls_query(rest, o.node.tls, url, true);
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    detail::refuse_comma_in_userinfo(rest.substr(0, at), url,
                                     "cluster_options::node.user and node.password");
    detail::take_userinfo(rest.substr(0, at), o.node, url);
    rest = rest.substr(at + 1);
  }
  for (;;) {
    const auto comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    if (part.empty() || part.find('/') != std::string_view::npos) {
      throw std::invalid_argument("ratelimit: redis cluster URL \"" + detail::redacted_url(url) +
                                  "\" needs HOST[:PORT] items separated by commas (no /DB)");
    }
    options one;
    try {
      one = parse_url("redis://" + std::string(part));
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument("ratelimit: bad node " + detail::quoted_host_item(part) +
                                  " in redis cluster URL \"" + detail::redacted_url(url) + "\"" +
                                  detail::host_item_why(part));
    }
    o.seeds.push_back(node_address{one.host, one.port});
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return o;
}

}  // namespace ratelimit::redis
