// SPDX-License-Identifier: Apache-2.0
// Redis Sentinel: asking the sentinels where the master is, each time a
// connection is opened, so that a store follows failovers.
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
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

/// What a server said, as a message quotes it: at most `most` bytes of it
/// (then `...`), each byte outside printable ASCII, `"` and `\` as `\xNN`
/// (ratelimit::detail::printable, as reply_text and escaped_name write
/// them), so that a hostile or broken server cannot fill a message (or a
/// log line) with megabytes or control characters (`-ERR a\nb` reads
/// `ERR a\x0ab`; it read `ERR a?b`, as if the server had sent a '?').
[[nodiscard]] inline std::string shown(std::string_view said, std::size_t most = 120) {
  return ratelimit::detail::printable(said, most);
}

/// The message `what` of an error of this library (a store_error), without
/// its leading "ratelimit: redis: " (nested), as another message quotes it:
/// at most `most` bytes (then `...`). What it quotes is escaped already
/// (escaped_name, reply_text), so it is not escaped again (its `"` and
/// `\x0d` stay as they are); should it hold a byte outside printable ASCII
/// all the same, all of it is escaped as shown() does.
[[nodiscard]] inline std::string shown_message(std::string_view what, std::size_t most = 400) {
  what = nested(what);
  if (!std::all_of(what.begin(), what.end(), [](char c) { return c >= ' ' && c <= '~'; })) {
    return shown(what, most);
  }
  if (what.size() <= most) return std::string(what);
  // Not inside an escape the message already holds ("\x0d"): cut before it.
  std::size_t cut = most;
  for (std::size_t k = 1; k <= 3 && k <= cut; ++k) {
    if (what[cut - k] == '\\' && what[cut - k + 1] == 'x') {
      cut -= k;
      break;
    }
  }
  return std::string(what.substr(0, cut)) + "...";
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

/// True when `text`, a `+switch-master` message
/// (`<name> <old ip> <old port> <new ip> <new port>`), is about the master
/// `name`: the four fields at the end are cut off and what is left must be
/// `name` exactly (so "m" does not take the message of a master "m x").
[[nodiscard]] inline bool switch_names(std::string_view text, std::string_view name) noexcept {
  std::size_t end = text.size();
  for (int field = 0; field < 4; ++field) {
    const auto space = text.rfind(' ', end == 0 ? 0 : end - 1);
    if (space == std::string_view::npos || space == 0) return false;
    end = space;
  }
  return text.substr(0, end) == name;
}

/// `timeout` as poll()'s int milliseconds: 0..INT_MAX (about 24.8 days), so
/// a longer connect_timeout waits that long instead of wrapping round to a
/// negative (endless) or tiny wait.
[[nodiscard]] inline int poll_ms(std::chrono::milliseconds timeout) noexcept {
  return static_cast<int>(
      std::clamp<long long>(timeout.count(), 0, std::numeric_limits<int>::max()));
}

/// Throws when called in a child forked after `owner` made the object: a
/// thread of the parent may have held its lock at the fork.
/// @throws std::logic_error
inline void sentinel_same_process(pid_t owner) {
  if (owner != ::getpid()) {
    throw std::logic_error(
        "ratelimit: redis: sentinel: a locator made before fork() was used in the child; make a "
        "new store (or locator) in the child after fork()");
  }
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
/// After fork(), in a child of the process that made it, connect(),
/// last_master() and sentinels() throw std::logic_error and prefer() does
/// nothing: none touches the parent's state (its lock may have been held by
/// a parent thread at the fork). Destroying it there locks nothing.
///
/// Thread safety: all member functions may be called from any number of threads.
class sentinel_locator {
 public:
  /// @throws std::invalid_argument when `o.sentinel` names no master (or one
  ///   holding a space or control byte, see detail::bad_master_name) or lists
  ///   no sentinel, a sentinel has a host of other than 1..253 letters, digits
  ///   and `.-_:%` or a port outside 1..65535, `o.unix_socket` is set, or
  ///   a user (`o.user`, `o.sentinel.user`) is set without its password
  explicit sentinel_locator(const options& o) : order_(o.sentinel.sentinels) {
    const sentinel_options& s = o.sentinel;
    if (s.master_name.empty()) {
      throw std::invalid_argument("ratelimit: redis: sentinel: no master name given");
    }
    if (const std::string why = detail::bad_master_name(s.master_name); !why.empty()) {
      throw std::invalid_argument("ratelimit: redis: sentinel: master name " + why);
    }
    if (s.sentinels.empty()) {
      throw std::invalid_argument("ratelimit: redis: sentinel: no sentinel given for master \"" +
                                  s.master_name + "\"");
    }
    for (const sentinel_address& a : s.sentinels) {
      if (!detail::plausible_host(a.host) || a.port < 1 || a.port > 65535) {
        throw std::invalid_argument("ratelimit: redis: sentinel: bad sentinel address \"" +
                                    detail::quoted_part(detail::address_text(a.host, a.port)) +
                                    "\"");
      }
    }
    detail::check_credentials(o, "ratelimit: redis: sentinel");
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
  ///   with what each answered, when no sentinel led to a master;
  ///   std::logic_error in a child forked after the locator was made
  [[nodiscard]] std::unique_ptr<connection> connect(const options& o) {
    detail::sentinel_same_process(owner_pid_);
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
        so.tls = o.tls;
        const deadline until = deadline_clock::now() + timeout;
        connection c(so);
        const std::string_view args[] = {"SENTINEL", "get-master-addr-by-name", name};
        const reply_ptr r = c.command(args, 3, until);
        if (r->type == REDIS_REPLY_NIL) {
          note("sentinel " + at + " knows no master named \"" + name + "\"");
          continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
          note("sentinel " + at + " answered \"" + detail::shown({r->str, r->len}) + "\"");
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
        note("sentinel " + at + ": " + detail::shown_message(e.what(), 400));
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
          role = detail::shown({r->element[0]->str, r->element[0]->len});
        } else if (r->type == REDIS_REPLY_ERROR) {
          role = "server that answers ROLE with \"" + detail::shown({r->str, r->len}) + "\"";
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
             detail::shown_message(e.what(), 400));
      }
    }
    throw connection_error("ratelimit: redis: sentinel: no master \"" + name +
                           "\" reached through the sentinels " + tried + ": " + why);
  }

  /// The master's address (`host:port`) found by the last successful
  /// connect(); empty before the first.
  /// @throws std::logic_error in a child forked after the locator was made
  [[nodiscard]] std::string last_master() const {
    detail::sentinel_same_process(owner_pid_);
    std::lock_guard<std::mutex> lock(mutex_);
    return master_;
  }

  /// Moves the sentinel at `host`:`port` (when listed) to the front: it is
  /// asked first from then on (it announced the latest failover).
  void prefer(const std::string& host, int port) {
    if (owner_pid_ != ::getpid()) return;  // a forked child (see above)
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = std::find_if(order_.begin(), order_.end(), [&](const sentinel_address& x) {
      return x.host == host && x.port == port;
    });
    if (it != order_.end()) std::rotate(order_.begin(), it, it + 1);
  }

  /// The sentinels in the order the next connect() asks them.
  /// @throws std::logic_error in a child forked after the locator was made
  [[nodiscard]] std::vector<sentinel_address> sentinels() const {
    detail::sentinel_same_process(owner_pid_);
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<sentinel_address> order_;  ///< the one that last led to the master first
  std::string master_;
  const pid_t owner_pid_ = ::getpid();
};

/// Listens to `+switch-master` on one sentinel at a time (the first that
/// accepts, in the locator's order; the next one when it goes away, all of
/// them again after a pause of 1 s, or connect_timeout if longer (at most
/// INT_MAX ms, about 24.8 days, the longest poll() takes), when none
/// accepts) on a background thread, and
/// calls `on_switch` when the sentinels announce a new master for the name:
/// a master that lost its role but is still up (a failover Sentinel was asked
/// for, or one that cut it off) would otherwise keep answering on pooled
/// connections until Sentinel demotes it. The sentinel that announced the
/// switch is asked first from then on.
///
/// Started by start() (the store calls it after its first connection to the
/// master), stopped and joined by stop() or the destructor: at once when the
/// thread waits for a message, else after the connect in progress (at most
/// connect_timeout).
///
/// After fork(), in a child of the process that made it, start() does nothing
/// and stop() (the destructor) leaks the thread's handle: it neither joins the
/// parent's thread (absent from the child), nor locks a mutex that thread may
/// have held at the fork, nor writes to the wake-up pipe, which the child
/// shares with the parent (that would stop the parent's subscription).
///
/// Thread safety: all member functions may be called from any number of threads.
class sentinel_watcher {
 public:
  sentinel_watcher(options o, std::shared_ptr<sentinel_locator> locator,
                   std::function<void()> on_switch)
      : options_(std::move(o)), locator_(std::move(locator)), on_switch_(std::move(on_switch)) {}
  sentinel_watcher(const sentinel_watcher&) = delete;
  sentinel_watcher& operator=(const sentinel_watcher&) = delete;
  ~sentinel_watcher() { stop(); }

  /// Starts the thread once; later calls do nothing. Never throws: without a
  /// thread (none could be made) the store still finds a new master when a
  /// connection fails.
  void start() noexcept {
    if (::getpid() != owner_pid_) return;  // a forked child (see above)
    std::lock_guard<std::mutex> lock(mutex_);
    if (started_ || stopping_) return;
    started_ = true;
    try {
      if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) return;
      thread_ = std::make_unique<std::thread>([this] { run(); });
    } catch (...) {
    }
  }

  /// Stops and joins the thread; a call made while another one joins
  /// returns when the thread has ended too. Not from `on_switch`.
  void stop() noexcept {
    if (::getpid() != owner_pid_) {
      (void)thread_.release();  // a forked child: the parent's thread is not here; never join
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopping_) {
        stopping_ = true;
        if (wake_[1] >= 0) {
          const char byte = 1;
          (void)!::write(wake_[1], &byte, 1);
        }
      }
    }
    std::lock_guard<std::mutex> join_lock(join_mutex_);
    if (thread_ != nullptr && thread_->joinable()) thread_->join();
    for (int& fd : wake_) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }

  /// `+switch-master` messages for this master received so far.
  [[nodiscard]] std::uint64_t switches() const noexcept {
    return switches_.load(std::memory_order_relaxed);
  }

 private:
  /// Waits until `fd` is readable (true) or stop() was called (false),
  /// `timeout_ms` at most (-1: no limit; a timeout returns false too).
  bool wait_readable(int fd, int timeout_ms) const noexcept {
    pollfd p[2] = {{wake_[0], POLLIN, 0}, {fd, POLLIN, 0}};
    for (;;) {
      const int r = ::poll(p, fd >= 0 ? 2 : 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || (p[0].revents & POLLIN) != 0) return false;
      return fd >= 0 && p[1].revents != 0;
    }
  }

  [[nodiscard]] bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  }

  void run() noexcept {
    const auto timeout = options_.connect_timeout.count() > 0 ? options_.connect_timeout
                                                              : std::chrono::milliseconds{200};
    const std::string& name = options_.sentinel.master_name;
    while (!stopping()) {
      std::vector<sentinel_address> order;
      try {
        order = locator_->sentinels();
      } catch (...) {
      }
      for (const sentinel_address& s : order) {
        if (stopping()) return;
        try {
          options so;
          so.host = s.host;
          so.port = s.port;
          so.user = options_.sentinel.user;
          so.password = options_.sentinel.password;
          so.connect_timeout = timeout;
          so.resolver = options_.resolver;
          so.tls = options_.tls;
          // The connect (with AUTH) and SUBSCRIBE's answer share one
          // connect_timeout: stop() waits for no more than that.
          const deadline until = deadline_clock::now() + timeout;
          connection c(so);
          const std::string_view args[] = {"SUBSCRIBE", "+switch-master"};
          const reply_ptr ok = c.command(args, 2, until);
          if (ok->type != REDIS_REPLY_ARRAY) continue;
          // Messages: ["message", "+switch-master", "<name> <old ip> <old port> <new ip> <new port>"].
          // A message read together with the previous one is already in the
          // reader: the socket would not wake us for it.
          while ((c.has_buffered_input() && !stopping()) || wait_readable(c.native_handle(), -1)) {
            const reply_ptr m = c.receive(deadline_clock::now() + timeout);
            if (m->type != REDIS_REPLY_ARRAY || m->elements != 3 ||
                m->element[2]->type != REDIS_REPLY_STRING) {
              continue;
            }
            if (!detail::switch_names(std::string_view(m->element[2]->str, m->element[2]->len),
                                      name)) {
              continue;
            }
            switches_.fetch_add(1, std::memory_order_relaxed);
            locator_->prefer(s.host, s.port);
            if (on_switch_) on_switch_();
          }
          if (stopping()) return;
        } catch (...) {
          // The sentinel went away or refused: the next one.
        }
      }
      // No sentinel accepts: wait before trying them all again.
      (void)wait_readable(-1, detail::poll_ms(std::max(timeout, std::chrono::milliseconds{1000})));
    }
  }

  options options_;
  std::shared_ptr<sentinel_locator> locator_;
  std::function<void()> on_switch_;
  std::mutex mutex_;
  std::mutex join_mutex_;  ///< held by the stop() that joins (and closes the pipe)
  bool started_ = false;
  bool stopping_ = false;
  int wake_[2] = {-1, -1};
  const pid_t owner_pid_ = ::getpid();
  std::unique_ptr<std::thread> thread_;  ///< leaked in a forked child (see stop)
  std::atomic<std::uint64_t> switches_{0};
};

namespace detail {

/// A store's Sentinel parts: the locator its connections ask, and the
/// watcher of `+switch-master`.
struct sentinel_link {
  std::shared_ptr<sentinel_locator> locator;
  std::unique_ptr<sentinel_watcher> watcher;
};

/// The Sentinel parts of a store made with `o`: none when `o.sentinel` is
/// empty. `on_switch` is called (on the watcher's thread) when the sentinels
/// announce a new master.
/// @throws std::invalid_argument as sentinel_locator's constructor
[[nodiscard]] inline std::unique_ptr<sentinel_link> make_sentinel_link(
    const options& o, std::function<void()> on_switch) {
  if (o.sentinel.master_name.empty() && o.sentinel.sentinels.empty()) return nullptr;
  auto link = std::make_unique<sentinel_link>();
  link->locator = std::make_shared<sentinel_locator>(o);
  link->watcher = std::make_unique<sentinel_watcher>(o, link->locator, std::move(on_switch));
  return link;
}

/// The opener of a store's connection pool: through the link's locator, and
/// the watcher started after the first connection (none without a link:
/// connect to host and port). The link must outlive the pool's use.
[[nodiscard]] inline connection_pool::opener sentinel_opener(sentinel_link* link) {
  if (link == nullptr) return {};
  return [locator = link->locator, watcher = link->watcher.get()](const options& opts) {
    auto c = locator->connect(opts);
    watcher->start();
    return c;
  };
}

}  // namespace detail

}  // namespace ratelimit::redis
