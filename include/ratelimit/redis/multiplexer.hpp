// SPDX-License-Identifier: Apache-2.0
// Multiplexed connections to Redis (auto-pipelining): checks from any number
// of threads share a few connections driven by one I/O thread.
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/transport.hpp"

namespace ratelimit::redis {

/// One command sent through a multiplexer, and what to do with its reply.
/// The multiplexer owns it from submit() until it calls complete(), exactly
/// once, handing ownership back (a job may then submit itself again, as a
/// check does after NOSCRIPT).
struct mux_job {
  mux_job() = default;
  mux_job(const mux_job&) = delete;
  mux_job& operator=(const mux_job&) = delete;
  virtual ~mux_job() = default;

  /// The command(s) in RESP (see append_command): exactly one reply is read for it.
  std::string bytes;
  /// When the job fails with timeout_error if no reply came (queue time included).
  deadline until{};

  /// The reply (`r` set, `error` null) or the failure (`error` set): a
  /// timeout_error, a connection_error when the connection broke with the
  /// job written (it may have run) or could not be made, or
  /// multiplexer_stopped at destruction. Runs on the I/O thread (at
  /// destruction, on the destroying thread); must not block on the multiplexer.
  virtual void complete(std::unique_ptr<mux_job> self, reply_ptr r,
                        std::exception_ptr error) noexcept = 0;
};

/// The error a job gets when its multiplexer is destroyed before its reply came.
class multiplexer_stopped : public connection_error {
 public:
  using connection_error::connection_error;
};

/// A few connections to one Redis server, each shared by every thread:
/// submit() queues a command; the I/O thread writes all commands queued while
/// the previous write was in flight in one write, and matches replies to
/// commands in order (RESP replies come in command order).
///
/// Rules:
/// - A job's deadline covers its time in the queue, the connect of a new
///   connection excepted (as the pool, connect time is added, bounded by
///   connect_timeout). A queued job past its deadline fails with
///   timeout_error and is never sent.
/// - A job written whose deadline passes with no reply read fails with
///   timeout_error, and its connection is dropped (replies that arrived are
///   read first, whenever the I/O thread gets to them): every other job written on
///   it fails with connection_error (each may have run). Jobs still queued
///   go out on a new connection.
/// - A connection that breaks (reset, closed, protocol error, a node failure
///   reply such as READONLY, see detail::is_node_failure) fails every job
///   written on it with connection_error and is replaced. A write refused
///   before any byte of it was accepted (the server had closed the
///   connection) sent nothing: its jobs are queued again.
/// - Connections are made lazily on the I/O thread (a connect that waits
///   for its connect_timeout stalls the other connections meanwhile); the
///   connect hook runs there too.
/// - Destruction (or stop()) fails every job not yet completed with
///   multiplexer_stopped. It waits for a connect under way, and no other
///   connect starts once it began.
/// - fork(): the I/O thread does not exist in a child. A multiplexer
///   destroyed in a child forked after it was made leaks its state and
///   closes nothing (see detail::delete_unless_forked; stores refuse to run
///   in such a child before reaching it).
///
/// Thread safety: submit() from any number of threads, including the I/O
/// thread (from complete()).
class multiplexer {
 public:
  /// Called on the I/O thread with each new connection and when its connect
  /// began, before any job uses it (the store reads maxmemory-policy there).
  /// Throwing fails the connect.
  using connect_hook = std::function<void(connection&, deadline)>;
  /// Opens a connection in place of `connection(options)` (the pool's
  /// opener: Sentinel finds the master there). Called on the I/O thread.
  using opener = std::function<std::unique_ptr<connection>(const options&)>;

  /// Makes nothing yet: the eventfd and the I/O thread come with the first
  /// submit(), connections when jobs need them.
  /// @param connections connections to share (0 = 1)
  /// @throws std::invalid_argument for more than max_connections
  multiplexer(options o, std::size_t connections, connect_hook on_connect = {}, opener open = {})
      : options_(std::move(o)),
        lanes_(checked(connections)),
        on_connect_(std::move(on_connect)),
        open_(std::move(open)) {}

  /// Most connections one multiplexer shares.
  static constexpr std::size_t max_connections = 256;

  /// @throws std::invalid_argument when `connections` exceeds max_connections
  static std::size_t checked(std::size_t connections) {
    if (connections > max_connections) {
      throw std::invalid_argument("ratelimit: redis: multiplex " + std::to_string(connections) +
                                  " is more than " + std::to_string(max_connections) +
                                  " connections");
    }
    return connections == 0 ? 1 : connections;
  }

  multiplexer(const multiplexer&) = delete;
  multiplexer& operator=(const multiplexer&) = delete;

  ~multiplexer() {
    if (owner_ != ::getpid()) {
      // Forked child: the thread is the parent's; join nothing, close nothing.
      for (lane& l : lanes_) (void)l.conn.release();
      wake_fd_ = -1;
      (void)thread_.release();
      return;
    }
    stop();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  /// Queues `job` (its bytes and deadline set); starts the I/O thread on
  /// first use. On success `job` is moved from, and its complete() will be
  /// called exactly once; otherwise `job` is left as it was.
  /// @return false after stop() began (the store is being destroyed)
  /// @throws connection_error when the eventfd or the I/O thread cannot be
  ///   made (no file descriptor, no thread): nothing was sent; std::bad_alloc
  [[nodiscard]] bool submit(std::unique_ptr<mux_job>& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return false;
      if (thread_ == nullptr) {
        if (wake_fd_ < 0) {
          wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
          if (wake_fd_ < 0) {
            throw connection_error(std::string("ratelimit: redis: cannot make an eventfd: ") +
                                   std::strerror(errno));
          }
        }
        try {
          thread_ = std::make_unique<std::thread>([this] { run(); });
        } catch (const std::system_error& e) {
          throw connection_error(std::string("ratelimit: redis: cannot start the I/O thread: ") +
                                 e.what());
        }
      }
      lane& l = lanes_[next_lane_ % lanes_.size()];
      l.incoming.push_back(std::move(job));
      ++next_lane_;
    }
    if (!wake_pending_.exchange(true, std::memory_order_acq_rel)) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
    }
    return true;
  }

  /// True on the multiplexer's I/O thread (where a synchronous wait on it
  /// would never end).
  [[nodiscard]] bool on_io_thread() const noexcept {
    return io_thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }

  /// Stops and joins the I/O thread, then fails every job not completed
  /// with multiplexer_stopped (on this thread). Idempotent.
  void stop() noexcept {
    std::unique_ptr<std::thread> t;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      t = std::move(thread_);
    }
    if (t != nullptr) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
      t->join();
    }
    const auto err = std::make_exception_ptr(
        multiplexer_stopped("ratelimit: redis: the store was destroyed with this check in flight"));
    for (lane& l : lanes_) {
      std::vector<std::unique_ptr<mux_job>> all;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& j : l.incoming) all.push_back(std::move(j));
        l.incoming.clear();
      }
      for (auto& j : l.queued) all.push_back(std::move(j));
      for (auto& j : l.inflight) all.push_back(std::move(j));
      l.queued.clear();
      l.inflight.clear();
      l.conn.reset();
      for (auto& j : all) finish(std::move(j), nullptr, err);
    }
  }

  /// Retires every connection open now (Sentinel announced a new master):
  /// no new check is written on one; each is closed once the checks written
  /// on it have their answers, and the next checks go out on a new
  /// connection. The checks in flight are not interrupted.
  void renew() noexcept {
    generation_.fetch_add(1, std::memory_order_acq_rel);
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_ != nullptr && !wake_pending_.exchange(true, std::memory_order_acq_rel)) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
    }
  }

  /// Connections this multiplexer shares.
  [[nodiscard]] std::size_t connections() const noexcept { return lanes_.size(); }

  /// Connections broken or dropped so far (each was replaced on demand), for tests and metrics.
  [[nodiscard]] std::uint64_t connections_dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }

 private:
  struct reader_deleter {
    void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
  };

  struct lane {
    std::vector<std::unique_ptr<mux_job>> incoming;  ///< guarded by mutex_
    std::deque<std::unique_ptr<mux_job>> queued;     ///< not yet written (I/O thread)
    std::deque<std::unique_ptr<mux_job>> inflight;   ///< written, or being written, in order
    std::unique_ptr<connection> conn;
    std::unique_ptr<redisReader, reader_deleter> reader;
    std::string out;               ///< bytes of the write in progress
    std::size_t written = 0;       ///< of `out`
    std::size_t batch_first = 0;   ///< index in inflight of the first job of `out`
    bool readable = true;          ///< poll() saw input (or an error) since the last read
    std::uint64_t generation = 0;  ///< generation_ when `conn` was opened
    detail::reply_budget budget;   ///< objects the reply being read may still hold
    std::size_t fed = 0;           ///< bytes fed since the last complete reply
  };

  /// Whether `l`'s connection was opened before the last renew().
  [[nodiscard]] bool retired(const lane& l) const noexcept {
    return l.conn != nullptr && l.generation != generation_.load(std::memory_order_acquire);
  }

  static void finish(std::unique_ptr<mux_job> j, reply_ptr r, std::exception_ptr e) noexcept {
    mux_job* p = j.get();
    p->complete(std::move(j), std::move(r), std::move(e));
  }

  /// Drops the lane's connection: fails every job written on it. Jobs whose
  /// deadline passed get timeout_error; the others `why`.
  void drop(lane& l, const std::exception_ptr& why) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    l.conn.reset();
    l.reader.reset();
    l.out.clear();
    l.written = 0;
    l.batch_first = 0;
    std::deque<std::unique_ptr<mux_job>> failed;
    failed.swap(l.inflight);
    const deadline now = deadline_clock::now();
    for (auto& j : failed) {
      if (j->until <= now) {
        finish(std::move(j), nullptr,
               std::make_exception_ptr(timeout_error("ratelimit: redis: command timed out")));
      } else {
        finish(std::move(j), nullptr, why);
      }
    }
  }

  /// Connects the lane (blocking, within connect_timeout); queued jobs get
  /// the connect's time added to their deadline. On failure every queued job
  /// fails with the connect's error.
  void connect(lane& l) {
    const deadline start = deadline_clock::now();
    try {
      l.generation = generation_.load(std::memory_order_acquire);
      l.conn = open_ ? open_(options_) : std::make_unique<connection>(options_);
      l.readable = true;
      if (on_connect_) on_connect_(*l.conn, start);
      // Bounded as the pool's connections are (see detail::reply_budget).
      // lanes_ never grows, so the budget's address stays valid.
      if (redisReplyObjectFunctions* fn = detail::bounded_reply_functions(); fn != nullptr) {
        l.reader.reset(redisReaderCreateWithFunctions(fn));
        if (l.reader != nullptr) l.reader->privdata = &l.budget;
      } else {
        l.reader.reset(redisReaderCreate());
      }
      if (l.reader == nullptr) throw connection_error("ratelimit: redis: cannot allocate a reader");
      l.budget = detail::reply_budget{detail::max_reply_objects, false};
      l.fed = 0;
    } catch (...) {
      l.conn.reset();
      l.reader.reset();
      const std::exception_ptr e = std::current_exception();
      std::deque<std::unique_ptr<mux_job>> failed;
      failed.swap(l.queued);
      for (auto& j : failed) finish(std::move(j), nullptr, e);
      return;
    }
    const auto took = deadline_clock::now() - start;
    for (auto& j : l.queued) j->until += took;
  }

  /// Fails queued jobs whose deadline passed (they were never sent).
  static void expire_queued(lane& l, deadline now) {
    for (auto it = l.queued.begin(); it != l.queued.end();) {
      if ((*it)->until <= now) {
        std::unique_ptr<mux_job> j = std::move(*it);
        it = l.queued.erase(it);
        finish(std::move(j), nullptr,
               std::make_exception_ptr(
                   timeout_error("ratelimit: redis: command timed out waiting to be sent")));
      } else {
        ++it;
      }
    }
  }

  /// Writes what it can; starts a new write of every queued job when none is
  /// in progress. @return false when the lane broke (already dropped)
  bool write(lane& l) {
    if (l.written == l.out.size() && !l.queued.empty() && !retired(l)) {
      l.out.clear();
      l.written = 0;
      l.batch_first = l.inflight.size();
      for (auto& j : l.queued) {
        l.out += j->bytes;
        l.inflight.push_back(std::move(j));
      }
      l.queued.clear();
    }
    transport& s = l.conn->stream();
    while (l.written < l.out.size()) {
      std::size_t n = 0;
      const transport::io r = s.write_some(std::string_view(l.out).substr(l.written), n);
      if (r == transport::io::ok) {
        l.written += n;
        continue;
      }
      if (r == transport::io::want_write || r == transport::io::want_read) return true;
      const int e = s.error();
      const bool nothing_sent = l.written == 0 && (e == EPIPE || e == ECONNRESET || e == ENOTCONN);
      if (nothing_sent) {
        // None of this write reached the server: its jobs go out again.
        for (std::size_t i = l.inflight.size(); i > l.batch_first; --i) {
          l.queued.push_front(std::move(l.inflight[i - 1]));
        }
        l.inflight.resize(l.batch_first);
      }
      drop(l,
           std::make_exception_ptr(connection_error(
               "ratelimit: redis: write failed: " +
               (r == transport::io::closed ? std::string("connection closed") : s.error_text()))));
      return false;
    }
    return true;
  }

  /// Reads every reply available and completes its job.
  /// @return false when the lane broke (already dropped)
  bool read(lane& l) {
    transport& s = l.conn->stream();
    char buf[16 * 1024];
    for (;;) {
      for (;;) {
        void* got = nullptr;
        if (redisReaderGetReply(l.reader.get(), &got) != REDIS_OK) {
          drop(l, std::make_exception_ptr(connection_error(
                      l.budget.exceeded
                          ? "ratelimit: redis: protocol error in reply: " + l.conn->where() +
                                " sent a reply of more than " +
                                std::to_string(detail::max_reply_objects) + " elements"
                          : std::string("ratelimit: redis: protocol error in reply"))));
          return false;
        }
        if (got == nullptr) break;
        reply_ptr r(static_cast<redisReply*>(got));
        l.budget = detail::reply_budget{detail::max_reply_objects, false};
        l.fed = 0;
        if (l.inflight.empty()) {
          drop(l, std::make_exception_ptr(
                      connection_error("ratelimit: redis: reply that no command asked for")));
          return false;
        }
        if (detail::is_node_failure(*r)) {
          const std::string what = "ratelimit: redis: " + l.conn->where() +
                                   " cannot serve checks now: " + std::string(r->str, r->len);
          drop(l, std::make_exception_ptr(connection_error(what)));
          return false;
        }
        std::unique_ptr<mux_job> j = std::move(l.inflight.front());
        l.inflight.pop_front();
        if (l.batch_first > 0) --l.batch_first;
        finish(std::move(j), std::move(r), nullptr);
      }
      std::size_t n = 0;
      const transport::io got = s.read_some(buf, sizeof buf, n);
      if (got == transport::io::ok) {
        l.fed += n;
        if (l.fed > detail::max_reply_bytes) {
          drop(l, std::make_exception_ptr(connection_error(
                      "ratelimit: redis: protocol error in reply: " + l.conn->where() +
                      " sent a reply larger than " + std::to_string(detail::max_reply_bytes >> 20) +
                      " MiB")));
          return false;
        }
        if (redisReaderFeed(l.reader.get(), buf, n) != REDIS_OK) {
          drop(l, std::make_exception_ptr(
                      connection_error("ratelimit: redis: protocol error in reply")));
          return false;
        }
        continue;
      }
      if (got == transport::io::want_read || got == transport::io::want_write) return true;
      drop(l, std::make_exception_ptr(connection_error(
                  got == transport::io::closed
                      ? std::string("ratelimit: redis: server closed the connection")
                      : "ratelimit: redis: read failed: " + s.error_text())));
      return false;
    }
  }

  void run() noexcept {
    io_thread_id_.store(std::this_thread::get_id(), std::memory_order_release);
    std::vector<pollfd> fds;
    std::vector<lane*> polled;
    bool woken = true;
    for (;;) {
      // Drained before the lock: a wake-up written after it is for jobs
      // that this round may not see, and must end the next poll.
      if (woken) {
        std::uint64_t drained = 0;
        (void)!::read(wake_fd_, &drained, sizeof drained);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
        wake_pending_.store(false, std::memory_order_release);
        for (lane& l : lanes_) {
          for (auto& j : l.incoming) l.queued.push_back(std::move(j));
          l.incoming.clear();
        }
      }
      deadline now = deadline_clock::now();
      deadline next = deadline::max();
      fds.clear();
      polled.clear();
      fds.push_back(pollfd{wake_fd_, POLLIN, 0});
      for (lane& l : lanes_) {
        expire_queued(l, now);
        if (retired(l) && l.inflight.empty()) {
          // Every check written on it has its answer: close it quietly.
          l.conn.reset();
          l.reader.reset();
          l.out.clear();
          l.written = 0;
          l.batch_first = 0;
        }
        if (l.conn == nullptr && !l.queued.empty()) {
          {
            // stop() waits for this thread: no further connect once it began
            // (each may take connect_timeout).
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) return;
          }
          connect(l);
          now = deadline_clock::now();
        }
        if (l.conn == nullptr) continue;
        // Replies first: one that arrived while this thread was busy elsewhere
        // (another connection's handlers) answers its check, deadline or not.
        if (l.readable) {
          l.readable = false;
          if (!read(l)) continue;
        }
        // A written job past its deadline with no reply read: the connection
        // cannot be trusted to answer in time, and its late reply would be
        // read for the next.
        const bool late = std::any_of(l.inflight.begin(), l.inflight.end(),
                                      [&](const auto& j) { return j->until <= now; });
        if (late) {
          drop(l, std::make_exception_ptr(connection_error(
                      "ratelimit: redis: connection dropped: a check written on it timed out")));
          continue;
        }
        if (!write(l)) continue;
        short ev = POLLIN;  // also to see an idle connection closed by the server
        if (l.written < l.out.size()) ev |= POLLOUT;
        fds.push_back(pollfd{l.conn->stream().fd(), ev, 0});
        polled.push_back(&l);
        for (const auto& j : l.inflight) next = std::min(next, j->until);
      }
      for (lane& l : lanes_) {
        for (const auto& j : l.queued) next = std::min(next, j->until);
      }
      int timeout_ms = -1;
      if (next != deadline::max()) {
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(next - deadline_clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 60000));
      }
      // Queued jobs waiting for a connection, or for a retired one whose last
      // answer was just read (it is closed and replaced in the next round):
      // go round again at once, not at their deadline.
      bool queued_left = false;
      for (lane& l : lanes_) {
        queued_left = queued_left || (!l.queued.empty() &&
                                      (l.conn == nullptr || (retired(l) && l.inflight.empty())));
      }
      if (queued_left) timeout_ms = 0;
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
        woken = true;  // EINTR: look at everything again
        for (lane* l : polled) l->readable = true;
        continue;
      }
      woken = fds[0].revents != 0;
      for (std::size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents != 0) polled[k - 1]->readable = true;
      }
    }
  }

  options options_;
  std::vector<lane> lanes_;
  connect_hook on_connect_;
  opener open_;
  std::atomic<std::uint64_t> generation_{0};  ///< renew() calls so far
  std::mutex mutex_;
  bool stopping_ = false;
  std::size_t next_lane_ = 0;
  std::unique_ptr<std::thread> thread_;
  std::atomic<std::thread::id> io_thread_id_{};
  std::atomic<bool> wake_pending_{false};
  std::atomic<std::uint64_t> dropped_{0};
  int wake_fd_ = -1;
  const pid_t owner_ = ::getpid();
};

}  // namespace ratelimit::redis
