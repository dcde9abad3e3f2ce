// SPDX-License-Identifier: Apache-2.0
// Connections to Redis with hard deadlines, and a thread-safe pool of them.
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/options.hpp"

namespace ratelimit::redis {

/// Monotonic deadlines of connects and round trips.
using deadline_clock = std::chrono::steady_clock;
using deadline = deadline_clock::time_point;

/// Frees a hiredis reply.
struct reply_deleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
/// A hiredis reply, freed on scope exit.
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

/// Appends one command in the Redis protocol (RESP) to `out`. Every argument
/// carries its length, so arguments are binary safe (NUL, braces, spaces).
inline void append_command(std::string& out, const std::string_view* args, std::size_t n) {
  out += '*';
  out += std::to_string(n);
  out += "\r\n";
  for (std::size_t i = 0; i < n; ++i) {
    out += '$';
    out += std::to_string(args[i].size());
    out += "\r\n";
    out.append(args[i]);
    out += "\r\n";
  }
}

/// One connection to Redis. Every operation takes a deadline and throws
/// timeout_error when it passes; any error leaves the connection broken
/// (`broken()`), and the pool then discards it, because a late reply could
/// otherwise be read as the answer to the next command.
///
/// Thread safety: one thread at a time (the pool hands it out exclusively).
class connection {
 public:
  /// Connects, authenticates and selects the database.
  /// @throws connection_error (timeout_error when connect_timeout passes)
  explicit connection(const options& o) {
    const auto timeout = o.connect_timeout.count() > 0 ? o.connect_timeout
                                                       : std::chrono::milliseconds{200};
    const deadline until = deadline_clock::now() + timeout;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    redisContext* c = o.unix_socket.empty()
                          ? redisConnectWithTimeout(o.host.c_str(), o.port, tv)
                          : redisConnectUnixWithTimeout(o.unix_socket.c_str(), tv);
    if (c == nullptr) throw connection_error("ratelimit: redis: cannot allocate a connection");
    ctx_.reset(c);
    if (c->err != 0) {
      const std::string what = "ratelimit: redis: cannot connect to " + where(o) + ": " + c->errstr;
      if (std::strstr(c->errstr, "timed out") != nullptr) throw timeout_error(what);
      throw connection_error(what);
    }
    // From here on the socket is non-blocking and every wait is a poll() with
    // the remaining time, so no call can outlive its deadline.
    const int flags = ::fcntl(c->fd, F_GETFL, 0);
    if (flags < 0 || ::fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      throw connection_error("ratelimit: redis: cannot make the socket non-blocking");
    }
    if (!o.password.empty()) {
      reply_ptr r;
      if (o.user.empty()) {
        const std::string_view args[] = {"AUTH", o.password};
        r = command(args, 2, until);
      } else {
        const std::string_view args[] = {"AUTH", o.user, o.password};
        r = command(args, 3, until);
      }
      if (r->type == REDIS_REPLY_ERROR) {
        throw connection_error(
            "ratelimit: redis: AUTH " +
            (o.user.empty() ? std::string("with password") : "as user \"" + o.user + "\"") +
            " at " + where(o) + " failed: " + std::string(r->str, r->len));
      }
    }
    if (o.database != 0) {
      const std::string db = std::to_string(o.database);
      const std::string_view args[] = {"SELECT", db};
      reply_ptr r = command(args, 2, until);
      if (r->type == REDIS_REPLY_ERROR) {
        throw connection_error("ratelimit: redis: SELECT " + db + " at " + where(o) +
                               " failed: " + std::string(r->str, r->len));
      }
    }
  }

  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() = default;

  /// True after any I/O error or timeout: the connection must be dropped.
  [[nodiscard]] bool broken() const noexcept { return broken_; }

  /// Marks the connection broken, so the pool drops it: for a caller that
  /// leaves replies unread (an exception between a pipelined send and its reads).
  void mark_broken() noexcept { broken_ = true; }

  /// Writes all of `bytes` (one or more commands, see append_command).
  void send(std::string_view bytes, deadline until) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(ctx_->fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail<connection_error>(std::string("ratelimit: redis: write failed: ") +
                               std::strerror(errno));
      }
      wait_for(POLLOUT, until);
    }
  }

  /// Reads the next reply (an error reply is a reply, not an exception).
  [[nodiscard]] reply_ptr receive(deadline until) {
    for (;;) {
      void* r = nullptr;
      if (redisReaderGetReply(ctx_->reader, &r) != REDIS_OK) {
        fail<connection_error>("ratelimit: redis: protocol error in reply");
      }
      if (r != nullptr) return reply_ptr(static_cast<redisReply*>(r));
      char buf[16 * 1024];
      const ssize_t n = ::recv(ctx_->fd, buf, sizeof buf, 0);
      if (n > 0) {
        if (redisReaderFeed(ctx_->reader, buf, static_cast<std::size_t>(n)) != REDIS_OK) {
          fail<connection_error>("ratelimit: redis: protocol error in reply");
        }
        continue;
      }
      if (n == 0) fail<connection_error>("ratelimit: redis: server closed the connection");
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail<connection_error>(std::string("ratelimit: redis: read failed: ") +
                               std::strerror(errno));
      }
      wait_for(POLLIN, until);
    }
  }

  /// One command, one reply.
  [[nodiscard]] reply_ptr command(const std::string_view* args, std::size_t n, deadline until) {
    out_.clear();
    append_command(out_, args, n);
    send(out_, until);
    return receive(until);
  }

 private:
  struct context_deleter {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
  };

  static std::string where(const options& o) {
    return o.unix_socket.empty() ? o.host + ":" + std::to_string(o.port) : o.unix_socket;
  }

  template <class Error>
  [[noreturn]] void fail(const std::string& what) {
    broken_ = true;
    throw Error(what);
  }

  void wait_for(short events, deadline until) {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - deadline_clock::now());
      if (left.count() <= 0) fail<timeout_error>("ratelimit: redis: command timed out");
      pollfd p{ctx_->fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
      if (r > 0) return;  // readable/writable, or an error the next call reports
      if (r < 0 && errno != EINTR) {
        fail<connection_error>(std::string("ratelimit: redis: poll failed: ") +
                               std::strerror(errno));
      }
    }
  }

  std::unique_ptr<redisContext, context_deleter> ctx_;
  std::string out_;
  bool broken_ = false;
};

/// At most `pool_size` connections, each lent to one thread at a time.
/// Connections are made lazily and remade after any failure, so a restarted
/// server is picked up without user code.
///
/// Thread safety: all member functions may be called from any number of threads.
class connection_pool {
 public:
  explicit connection_pool(options o)
      : options_(std::move(o)), size_(options_.pool_size == 0 ? 4 : options_.pool_size) {}

  connection_pool(const connection_pool&) = delete;
  connection_pool& operator=(const connection_pool&) = delete;

  /// Exclusive use of one connection; returns it to the pool on destruction,
  /// or drops it when it broke.
  class lease {
   public:
    lease(connection_pool* pool, std::unique_ptr<connection> c,
          deadline_clock::duration connect_time = {}) noexcept
        : pool_(pool), conn_(std::move(c)), connect_time_(connect_time) {}
    lease(lease&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)),
          conn_(std::move(o.conn_)),
          connect_time_(o.connect_time_) {}
    lease& operator=(lease&&) = delete;
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      if (pool_ != nullptr) pool_->give_back(std::move(conn_));
    }
    [[nodiscard]] connection& operator*() const noexcept { return *conn_; }
    [[nodiscard]] connection* operator->() const noexcept { return conn_.get(); }
    /// Time spent making this connection (zero for a pooled one).
    [[nodiscard]] deadline_clock::duration connect_time() const noexcept { return connect_time_; }

   private:
    connection_pool* pool_;
    std::unique_ptr<connection> conn_;
    deadline_clock::duration connect_time_;
  };

  /// Waits until `until` for a free connection, connecting a new one when
  /// fewer than pool_size exist.
  /// @throws timeout_error when every connection stays busy until `until`;
  ///   connection_error when connecting fails
  [[nodiscard]] lease acquire(deadline until) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_until(lock, until, [&] { return !idle_.empty() || open_ < size_; })) {
      throw timeout_error("ratelimit: redis: no pooled connection became free in time");
    }
    if (!idle_.empty()) {
      std::unique_ptr<connection> c = std::move(idle_.back());
      idle_.pop_back();
      return lease(this, std::move(c));
    }
    ++open_;
    lock.unlock();
    try {
      const deadline start = deadline_clock::now();
      auto c = std::make_unique<connection>(options_);
      return lease(this, std::move(c), deadline_clock::now() - start);
    } catch (...) {
      lock.lock();
      --open_;
      lock.unlock();
      ready_.notify_one();
      throw;
    }
  }

  /// Drops every idle connection (the next check reconnects).
  void clear() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ -= idle_.size();
    idle_.clear();
  }

  [[nodiscard]] const options& get_options() const noexcept { return options_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void give_back(std::unique_ptr<connection> c) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (c == nullptr || c->broken()) {
        --open_;
      } else {
        try {
          idle_.push_back(std::move(c));
        } catch (...) {
          --open_;
        }
      }
    }
    ready_.notify_one();
  }

  options options_;
  std::size_t size_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<std::unique_ptr<connection>> idle_;
  std::size_t open_ = 0;  ///< connections in existence (idle or lent) or being made
};

}  // namespace ratelimit::redis
