// SPDX-License-Identifier: Apache-2.0
// Redis Cluster redirects: MOVED and ASK answers, and node names.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/redis/cluster/hash_slot.hpp"
#include "ratelimit/redis/cluster/options.hpp"

namespace ratelimit::redis::detail {

/// `host:port` of an address.
[[nodiscard]] inline std::string node_name(const node_address& a) {
  return a.host + ":" + std::to_string(a.port);
}

/// True when `host`, as a node names another node (a MOVED or ASK answer,
/// a CLUSTER SLOTS reply), may be connected to and quoted: at most 255
/// bytes, each printable ASCII other than a space. An empty one (or `?`)
/// passes: it means the host of the node that answered. Anything else (CR,
/// LF, NUL, ...) would only reach connect() and the error messages.
[[nodiscard]] inline bool plausible_node_host(std::string_view host) noexcept {
  if (host.size() > 255) return false;
  for (const char c : host) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

/// Parses the `host:port` of a MOVED/ASK answer; an empty host means the
/// host of the node that answered.
[[nodiscard]] inline std::optional<node_address> parse_endpoint(std::string_view s,
                                                                const std::string& asked_host) {
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= s.size() || s.size() - colon > 6) {
    return std::nullopt;
  }
  int port = 0;
  for (const char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + (c - '0');
  }
  // No node listens on port 0 or past 65535: such an answer is not a redirect.
  if (port < 1 || port > 65535) return std::nullopt;
  std::string host(s.substr(0, colon));
  // Any other host is not a redirect.
  if (!plausible_node_host(host)) return std::nullopt;
  if (host.empty() || host == "?") host = asked_host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return node_address{std::move(host), port};
}

/// A redirect in an error reply: `MOVED <slot> <host:port>` or `ASK <slot> <host:port>`.
struct redirect {
  bool ask = false;
  std::uint16_t slot = 0;
  node_address to;
};

/// The redirect in `r` for a check of slot `slot`; none when `r` is not a
/// well-formed MOVED or ASK, or names another slot (a hostile or confused
/// node must not repoint slots the check does not touch).
[[nodiscard]] inline std::optional<redirect> parse_redirect(const redisReply& r,
                                                            const std::string& asked_host,
                                                            std::uint16_t slot_of_check) {
  if (r.type != REDIS_REPLY_ERROR) return std::nullopt;
  std::string_view s(r.str, r.len);
  redirect d;
  if (s.starts_with("MOVED ")) {
    s.remove_prefix(6);
  } else if (s.starts_with("ASK ")) {
    d.ask = true;
    s.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const auto space = s.find(' ');
  if (space == std::string_view::npos || space == 0 || space > 5) return std::nullopt;
  unsigned slot = 0;
  for (const char c : s.substr(0, space)) {
    if (c < '0' || c > '9') return std::nullopt;
    slot = slot * 10 + static_cast<unsigned>(c - '0');
  }
  if (slot >= cluster_slots || slot != slot_of_check) return std::nullopt;
  auto to = parse_endpoint(s.substr(space + 1), asked_host);
  if (!to) return std::nullopt;
  d.slot = static_cast<std::uint16_t>(slot);
  d.to = std::move(*to);
  return d;
}

[[nodiscard]] inline bool error_starts(const redisReply& r, std::string_view word) noexcept {
  return r.type == REDIS_REPLY_ERROR && std::string_view(r.str, r.len).starts_with(word);
}

}  // namespace ratelimit::redis::detail
