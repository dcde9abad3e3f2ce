// SPDX-License-Identifier: Apache-2.0
// Redis Sentinel: asking the sentinels where the master is, each time a
// connection is opened, so that a store follows failovers.
#pragma once

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/options.hpp"

namespace ratelimit::redis {

namespace detail {

/// `host:port`, or `[host]:port` for an IPv6 address, for messages.
[[nodiscard]] inline std::string address_text(std::string_view host, int port) {
  const bool v6 = host.find(':') != std::string_view::npos;
  return (v6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" + std::to_string(port);
}

/// `what` without the leading "ratelimit: redis: ", to nest it in another message.
[[nodiscard]] inline std::string_view nested(std::string_view what) {
  constexpr std::string_view head = "ratelimit: redis: ";
  if (what.starts_with(head)) what.remove_prefix(head.size());
  return what;
}

/// True when a sentinel's answer is a plausible host: 1..253 characters,
/// letters, digits and `.-_:%` only (a name, an IPv4 or IPv6 address).
[[nodiscard]] inline bool plausible_host(std::string_view h) noexcept {
  if (h.empty() || h.size() > 253) return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_' || c == ':' || c == '%';
  });
}

/// The port of a sentinel's answer: decimal digits, 1..65535; 0 when not.
[[nodiscard]] inline int plausible_port(std::string_view p) noexcept {
  if (p.empty() || p.size() > 5) return 0;
  int v = 0;
  for (const char c : p) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + (c - '0');
  }
  return v >= 1 && v <= 65535 ? v : 0;
}

}  // namespace detail

/// Finds the master that a group of sentinels monitors, and connects to it.
///
/// connect() asks the sentinels in turn (`SENTINEL get-master-addr-by-name`),
/// connects to the address the first one gives, and sends `ROLE`: a server
/// that is no master (a replica, or a sentinel) is refused, and the next
/// sentinel is asked. The first sentinel that led to the master moves to the
/// front of the list. A redis_store made with options::sentinel uses one
/// locator for every connection of its pool, so every new connection (after a
/// failure, a READONLY answer or an idle connection the server closed) asks
/// the sentinels again: that is how the store follows a failover.
///
/// Each sentinel gets connect_timeout for its connect, AUTH and answer, and
/// the master connect_timeout for its connect, AUTH, SELECT and ROLE: one
/// connect() takes at most 2 x sentinels x connect_timeout (a master already
/// refused in this call is not tried again).
///
/// Thread safety: all member functions may be called from any number of threads.
class sentinel_locator {
 public:
  /// @throws std::invalid_argument when `o.sentinel` names no master or lists
  ///   no sentinel, a sentinel has an empty host or a port outside 1..65535,
  ///   or `o.unix_socket` is set
  explicit sentinel_locator(const options& o) : order_(o.sentinel.sentinels) {
    const sentinel_options& s = o.sentinel;
    if (s.master_name.empty()) {
      throw std::invalid_argument("ratelimit: redis: sentinel: no master name given");
    }
    if (s.sentinels.empty()) {
      throw std::invalid_argument("ratelimit: redis: sentinel: no sentinel given for master \"" +
                                  s.master_name + "\"");
    }
    for (const sentinel_address& a : s.sentinels) {
      if (a.host.empty() || a.port < 1 || a.port > 65535) {
        throw std::invalid_argument("ratelimit: redis: sentinel: bad sentinel address \"" +
                                    detail::address_text(a.host, a.port) + "\"");
      }
    }
    if (!o.unix_socket.empty()) {
      throw std::invalid_argument(
          "ratelimit: redis: sentinel: unix_socket cannot be used with Sentinel (the master's "
          "address comes from the sentinels)");
    }
  }

  /// Asks the sentinels for the master named `o.sentinel.master_name`,
  /// connects to it with `o`'s user, password, database and timeouts, and
  /// checks with ROLE that it is a master.
  /// @throws connection_error naming the master and every sentinel tried,
  ///   with what each answered, when no sentinel led to a master
  [[nodiscard]] std::unique_ptr<connection> connect(const options& o) {
    const auto timeout = o.connect_timeout.count() > 0 ? o.connect_timeout
                                                       : std::chrono::milliseconds{200};
    const std::string& name = o.sentinel.master_name;
    std::vector<sentinel_address> order;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      order = order_;
    }
    std::string why;
    std::string tried;
    const auto note = [&](const std::string& line) {
      why += why.empty() ? "" : "; ";
      why += line;
    };
    std::vector<std::string> refused;  // masters that failed in this call
    for (const sentinel_address& s : order) {
      const std::string at = detail::address_text(s.host, s.port);
      tried += (tried.empty() ? "" : ", ") + at;
      std::string host;
      int port = 0;
      try {
        options so;
        so.host = s.host;
        so.port = s.port;
        so.user = o.sentinel.user;
        so.password = o.sentinel.password;
        so.connect_timeout = timeout;
        so.resolver = o.resolver;
        const deadline until = deadline_clock::now() + timeout;
        connection c(so);
        const std::string_view args[] = {"SENTINEL", "get-master-addr-by-name", name};
        const reply_ptr r = c.command(args, 3, until);
        if (r->type == REDIS_REPLY_NIL) {
          note("sentinel " + at + " knows no master named \"" + name + "\"");
          continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
          note("sentinel " + at + " answered \"" + std::string(r->str, r->len) + "\"");
          continue;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_STRING) {
          note("sentinel " + at + " gave no address (not a sentinel?)");
          continue;
        }
        host.assign(r->element[0]->str, r->element[0]->len);
        port = detail::plausible_port(std::string_view(r->element[1]->str, r->element[1]->len));
        if (!detail::plausible_host(host) || port == 0) {
          note("sentinel " + at + " gave a malformed address");
          continue;
        }
      } catch (const store_error& e) {
        note("sentinel " + at + ": " + std::string(detail::nested(e.what())));
        continue;
      }
      const std::string master = detail::address_text(host, port);
      if (std::find(refused.begin(), refused.end(), master) != refused.end()) {
        note("sentinel " + at + " named " + master + " too");
        continue;
      }
      try {
        options mo = o;
        mo.host = host;
        mo.port = port;
        mo.connect_timeout = timeout;
        const deadline until = deadline_clock::now() + timeout;
        auto c = std::make_unique<connection>(mo);
        const std::string_view args[] = {"ROLE"};
        const reply_ptr r = c->command(args, 1, until);
        std::string role;
        if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
            r->element[0]->type == REDIS_REPLY_STRING) {
          role.assign(r->element[0]->str, r->element[0]->len);
        } else if (r->type == REDIS_REPLY_ERROR) {
          role = "server that answers ROLE with \"" + std::string(r->str, r->len) + "\"";
        } else {
          role = "server with a malformed ROLE answer";
        }
        if (role == "master") {
          std::lock_guard<std::mutex> lock(mutex_);
          const auto it = std::find_if(
              order_.begin(), order_.end(),
              [&](const sentinel_address& x) { return x.host == s.host && x.port == s.port; });
          if (it != order_.end()) std::rotate(order_.begin(), it, it + 1);
          master_ = master;
          return c;
        }
        refused.push_back(master);
        note("master \"" + name + "\" at " + master + " named by sentinel " + at + " is a " +
             (role == "slave" ? std::string("replica") : role) + " (ROLE), not a master");
      } catch (const store_error& e) {
        refused.push_back(master);
        note("master \"" + name + "\" at " + master + " named by sentinel " + at + ": " +
             std::string(detail::nested(e.what())));
      }
    }
    throw connection_error("ratelimit: redis: sentinel: no master \"" + name +
                           "\" reached through the sentinels " + tried + ": " + why);
  }

  /// The master's address (`host:port`) found by the last successful
  /// connect(); empty before the first.
  [[nodiscard]] std::string last_master() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return master_;
  }

  /// The sentinels in the order the next connect() asks them.
  [[nodiscard]] std::vector<sentinel_address> sentinels() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<sentinel_address> order_;  ///< the one that last led to the master first
  std::string master_;
};

namespace detail {

/// The opener of a store's connection pool: through a sentinel_locator when
/// `o.sentinel.master_name` is set, else none (connect to host and port).
/// @throws std::invalid_argument as sentinel_locator's constructor
[[nodiscard]] inline connection_pool::opener sentinel_opener(const options& o) {
  if (o.sentinel.master_name.empty() && o.sentinel.sentinels.empty()) return {};
  auto locator = std::make_shared<sentinel_locator>(o);
  return [locator](const options& opts) { return locator->connect(opts); };
}

}  // namespace detail

}  // namespace ratelimit::redis
