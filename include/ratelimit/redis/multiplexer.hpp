// SPDX-License-Identifier: Apache-2.0
// Multiplexed connections to Redis (auto-pipelining): checks from any number
// of threads share a few connections driven by one I/O thread.
#pragma once

#include <hiredis/hiredis.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
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

class multiplexer;

/// The thread waiting for a blocking check on a multiplexer (see
/// detail::sync_waiter): it sleeps on one futex word until its outcome is set,
/// or until a leader hands it the lane to drive (leader/follower, see
/// multiplexer).
class mux_waiter {
 public:
  mux_waiter() = default;
  mux_waiter(const mux_waiter&) = delete;
  mux_waiter& operator=(const mux_waiter&) = delete;

 protected:
  ~mux_waiter() = default;

  static constexpr std::uint32_t asleep = 1;  ///< the waiter is in FUTEX_WAIT
  static constexpr std::uint32_t done = 2;    ///< outcome set
  static constexpr std::uint32_t lead = 4;    ///< the waiter is to drive lane lead_lane_

  /// Sets `bit`; wakes the waiter when it sleeps.
  void signal(std::uint32_t bit) noexcept {
    if ((state_.fetch_or(bit, std::memory_order_acq_rel) & asleep) != 0) {
      (void)::syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }

  /// Sleeps until done; drives a lane whenever a leader hands one over.
  inline void wait_done() noexcept;

  [[nodiscard]] bool is_done() const noexcept {
    return (state_.load(std::memory_order_acquire) & done) != 0;
  }

 private:
  friend class multiplexer;
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  std::atomic<std::uint32_t> state_{0};
  multiplexer* lead_mux_ = nullptr;  ///< set with `lead`
  std::size_t lead_lane_ = 0;        ///< set with `lead`
  /// Leads a lane, or was handed one (guarded by the multiplexer's mutex):
  /// never handed a second lane meanwhile.
  bool driving_ = false;
};

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
  /// Set by multiplexer::submit_pair on the job it queues first (an ASKING):
  /// it takes no place of its own under the pending cap. submit() clears it.
  bool uncounted = false;
  /// Counted in the multiplexer's async jobs (no blocking caller drives its lane).
  bool async_counted = false;
  /// The blocking caller waiting for this job (null for an async job): it
  /// may drive the job's connection itself (see multiplexer).
  mux_waiter* waiter = nullptr;

  /// The reply (`r` set, `error` null) or the failure (`error` set): a
  /// timeout_error, a connection_error when the connection broke with the
  /// job written (it may have run) or could not be made, or
  /// multiplexer_stopped at destruction. Runs on the I/O thread (at
  /// destruction, on the destroying thread; a job with a `waiter`, on the
  /// thread of a blocking caller driving its connection); must not block on
  /// the multiplexer.
  virtual void complete(std::unique_ptr<mux_job> self, reply_ptr r,
                        std::exception_ptr error) noexcept = 0;
};

/// The error a job gets when its multiplexer is destroyed before its reply came.
class multiplexer_stopped : public connection_error {
 public:
  using connection_error::connection_error;
};

/// The error submit() throws when the multiplexer already holds its most
/// pending jobs (options::multiplex_max_pending): nothing was queued or sent.
class multiplexer_full : public connection_error {
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
/// - At most max_pending() jobs are pending (submitted and not completed) at
///   a time; submit() refuses one more with multiplexer_full, so a server
///   that stalls cannot make the queue grow without bound. A pair queued by
///   submit_pair (ASKING and the check behind it) counts as one job.
/// - An exception on the I/O thread (std::bad_alloc while queuing, writing,
///   reading or failing jobs) fails the jobs of the connection it happened
///   on (queued and written: each gets that exception, once) and drops the
///   connection; the I/O thread carries on. A job whose deadline passed may
///   then get it instead of timeout_error.
/// - Connections are made lazily on the I/O thread (a connect that waits
///   for its connect_timeout stalls the other connections meanwhile); the
///   connect hook runs there too.
/// - Destruction (or stop()) fails every job not yet completed with
///   multiplexer_stopped. It waits for a connect under way, and no other
///   connect starts once it began.
/// - Leader/follower: a job with a `waiter` (a blocking caller) submitted
///   to a connection nobody drives, while no job without one is pending,
///   makes submit() drive that connection on the calling thread until the
///   job is done: it writes what is queued, reads replies from the socket
///   (waiting at most until the earliest deadline, 10 ms at a time) and
///   completes their jobs, writes what was queued meanwhile, then hands the
///   connection to the waiter of another job on it (mux_waiter::wait_done
///   drives it) or back to the I/O thread. Connects, renew() and jobs
///   without a waiter stay with the I/O thread, and a driver hands over to
///   it when one arrives. The rules above hold whoever drives.
/// - fork(): the I/O thread does not exist in a child. A multiplexer
///   destroyed in a child forked after it was made leaks its state and
///   closes nothing (see detail::delete_unless_forked; stores refuse to run
///   in such a child before reaching it).
///
/// Thread safety: submit() from any number of threads, including the I/O
/// thread and a driving caller (from complete(): such a submit never makes
/// the thread drive another connection). stop() (destruction) only when no
/// caller waits in submit() or mux_waiter::wait_done().
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
        open_(std::move(open)),
        max_pending_(options_.multiplex_max_pending == 0 ? default_max_pending
                                                         : options_.multiplex_max_pending) {}

  /// Most connections one multiplexer shares.
  static constexpr std::size_t max_connections = detail::max_multiplex_connections;
  /// Pending jobs one multiplexer holds when options::multiplex_max_pending is 0.
  static constexpr std::size_t default_max_pending = 65536;

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
  /// called exactly once; otherwise `job` is left as it was. A job with a
  /// `waiter` may be completed before this returns (this thread drove its
  /// connection); the waiter then calls wait_done() all the same.
  /// @return false after stop() began (the store is being destroyed)
  /// @throws multiplexer_full when max_pending() jobs are pending (nothing
  ///   was queued); connection_error when the eventfd or the I/O thread
  ///   cannot be made (no file descriptor, no thread): nothing was sent;
  ///   std::bad_alloc
  [[nodiscard]] bool submit(std::unique_ptr<mux_job>& job) {
    mux_waiter* const w = job->waiter;
    lane* claimed = nullptr;
    if (!enqueue(nullptr, job, &claimed)) return false;
    if (claimed != nullptr) lead_lane(*claimed, *w);
    return true;
  }

  /// Queues `lead` and right behind it `job` on one connection, nothing
  /// between them (ASKING before the check an ASK redirected), both or
  /// neither, as submit() queues one job: the pair counts as one job under
  /// max_pending() (`lead` takes no place of its own, so a lone `lead` is
  /// never queued for want of room for `job`). Each gets its own complete().
  /// @return false after stop() began (neither queued)
  /// @throws as submit() (neither queued)
  [[nodiscard]] bool submit_pair(std::unique_ptr<mux_job>& lead, std::unique_ptr<mux_job>& job) {
    return enqueue(&lead, job, nullptr);
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
    // Allocates nothing but the error (std::bad_alloc in its place when
    // memory is short): the jobs are swapped out, never copied into a new
    // container.
    const std::exception_ptr err = error_or_current([] {
      return std::make_exception_ptr(multiplexer_stopped(
          "ratelimit: redis: the store was destroyed with this check in flight"));
    });
    for (lane& l : lanes_) {
      std::vector<std::unique_ptr<mux_job>> incoming;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        incoming.swap(l.incoming);
      }
      l.conn.reset();
      for (auto* jobs : {&l.refused, &incoming}) {
        for (auto& j : *jobs) {
          if (j != nullptr) finish(std::move(j), nullptr, err);
        }
        jobs->clear();
      }
      fail_jobs(l, l.queued, err);
      fail_jobs(l, l.inflight, err);
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

  /// Most jobs pending at a time (options::multiplex_max_pending, or default_max_pending).
  [[nodiscard]] std::size_t max_pending() const noexcept { return max_pending_; }

  /// Jobs submitted and not yet completed.
  [[nodiscard]] std::size_t pending() const noexcept {
    return pending_.load(std::memory_order_acquire);
  }

  /// Connections broken or dropped so far (each was replaced on demand), for tests and metrics.
  [[nodiscard]] std::uint64_t connections_dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }

 private:
  struct lane;

  /// submit() (`lead` null) and submit_pair().
  [[nodiscard]] bool enqueue(std::unique_ptr<mux_job>* lead, std::unique_ptr<mux_job>& job,
                             lane** claimed) {
    bool wake = true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return false;
      if (pending_.load(std::memory_order_acquire) >= max_pending_) {
        throw multiplexer_full("ratelimit: redis: " + std::to_string(max_pending_) +
                               " checks already pending on the multiplexer "
                               "(options::multiplex_max_pending): check refused");
      }
      if (thread_ == nullptr) {
        // The I/O thread's poll set never grows past this: no allocation there.
        fds_.reserve(lanes_.size() + 1);
        polled_.reserve(lanes_.size());
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
      job->uncounted = false;
      if (lead != nullptr) {
        // Room for both first (growing as push_back would): the pushes below
        // cannot throw, so a pair is never split.
        if (l.incoming.capacity() - l.incoming.size() < 2) {
          l.incoming.reserve(std::max<std::size_t>(4, 2 * l.incoming.capacity()));
        }
        (*lead)->uncounted = true;
        l.incoming.push_back(std::move(*lead));
      }
      mux_waiter* const w = job->waiter;
      const bool async = w == nullptr || lead != nullptr;
      job->async_counted = async;
      if (lead != nullptr) l.incoming.back()->async_counted = true;
      l.incoming.push_back(std::move(job));
      pending_.fetch_add(1, std::memory_order_acq_rel);
      ++next_lane_;
      if (async) {
        async_pending_.fetch_add(lead != nullptr ? 2 : 1, std::memory_order_acq_rel);
      } else if (l.led.load(std::memory_order_relaxed)) {
        wake = false;  // the lane's leader writes it
      } else if (claimed != nullptr && !leading_ &&
                 async_pending_.load(std::memory_order_acquire) == 0) {
        l.led.store(true, std::memory_order_relaxed);
        w->driving_ = true;
        *claimed = &l;
        wake = false;
      }
    }
    if (wake && !wake_pending_.exchange(true, std::memory_order_acq_rel)) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
    }
    return true;
  }

  struct reader_deleter {
    void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
  };

  struct lane {
    std::vector<std::unique_ptr<mux_job>> incoming;  ///< guarded by mutex_
    std::deque<std::unique_ptr<mux_job>> queued;     ///< not yet written (I/O thread)
    std::deque<std::unique_ptr<mux_job>> inflight;   ///< written, or being written, in order
    /// Jobs being failed (swapped in from queued or inflight, empty
    /// otherwise): made with the lane, because making a std::deque
    /// allocates, and failing jobs must not (std::bad_alloc).
    std::deque<std::unique_ptr<mux_job>> failing;
    std::unique_ptr<connection> conn;
    std::unique_ptr<redisReader, reader_deleter> reader;
    std::string out;               ///< bytes of the write in progress
    std::size_t written = 0;       ///< of `out`
    std::size_t batch_first = 0;   ///< index in inflight of the first job of `out`
    bool readable = true;          ///< poll() saw input (or an error) since the last read
    std::uint64_t generation = 0;  ///< generation_ when `conn` was opened
    /// Held by whoever drives the lane (the I/O thread while serving it, or
    /// the blocking caller leading it): queued, inflight, conn, reader, out.
    std::mutex drive;
    /// A blocking caller leads the lane, or was handed it (written under
    /// mutex_; read by the I/O thread holding `drive` as well).
    std::atomic<bool> led{false};
    bool served = false;          ///< the I/O thread served it this round (I/O thread)
    bool was_led = false;         ///< led when the I/O thread last looked (I/O thread)
    detail::reply_budget budget;  ///< objects the reply being read may still hold
    std::size_t fed = 0;          ///< bytes fed since the last complete reply
    /// Jobs of `incoming` that could not be queued (no memory), failed with
    /// `refused_why` once the lock is released (I/O thread).
    std::vector<std::unique_ptr<mux_job>> refused;
    std::exception_ptr refused_why;
  };

  /// Whether `l`'s connection was opened before the last renew().
  [[nodiscard]] bool retired(const lane& l) const noexcept {
    return l.conn != nullptr && l.generation != generation_.load(std::memory_order_acquire);
  }

  friend class mux_waiter;

  /// Leader/follower: the blocking caller `me` drives `l` (led set for it)
  /// until its own job is done or the lane has nothing left for it: moves
  /// the lane's incoming jobs to the queue, writes them, waits for replies
  /// on the socket and completes every job whose reply it reads (waking
  /// only their waiters). Then hands the lane to a waiter whose job is on
  /// it, or back to the I/O thread (async jobs, no connection, renew, stop).
  void lead_lane(lane& l, mux_waiter& me) noexcept {
    leading_ = true;
    std::unique_lock<std::mutex> d(l.drive);
    bool to_io = false;
    for (;;) {
      deadline soonest = deadline::max();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_ || async_pending_.load(std::memory_order_acquire) > 0) {
          to_io = true;
        } else {
          try {
            for (auto& j : l.incoming) {
              soonest = std::min(soonest, j->until);
              l.queued.push_back(std::move(j));
            }
            l.incoming.clear();
          } catch (...) {
            // No memory: the I/O thread fails what is left (as it would).
            std::erase(l.incoming, nullptr);
            to_io = true;
          }
        }
      }
      if (to_io || l.conn == nullptr || retired(l)) {
        to_io = true;
        break;
      }
      deadline now = deadline_clock::now();
      expire_queued(l, now);
      try {
        const auto late = [&] {
          return std::any_of(l.inflight.begin(), l.inflight.end(),
                             [&](const auto& j) { return j->until <= now; });
        };
        // A reply that arrived is read first, deadline or not (as the I/O
        // thread does): this thread may come to the lane late (handed it
        // while busy elsewhere, or descheduled).
        if (late() && !read(l)) continue;
        if (late()) {
          drop(l, std::make_exception_ptr(connection_error(
                      "ratelimit: redis: connection dropped: a check written on it timed out")));
          continue;
        }
        // Jobs queued meanwhile go out before this thread leaves (its own
        // reply read): the next leader finds them written.
        if (!write(l)) continue;
        if (me.is_done() || (l.inflight.empty() && l.queued.empty())) break;
        for (const auto& j : l.inflight) soonest = std::min(soonest, j->until);
        for (const auto& j : l.queued) soonest = std::min(soonest, j->until);
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(soonest - deadline_clock::now()).count();
        // Jobs that arrive while this thread waits are looked at within 10 ms
        // at the latest (their deadlines; replies end the wait much sooner).
        const int timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 10));
        short ev = POLLIN;
        if (l.written < l.out.size()) ev |= POLLOUT;
        pollfd p{l.conn->stream().fd(), ev, 0};
        if (::poll(&p, 1, timeout_ms) > 0 && (p.revents & ~POLLOUT) != 0) {
          if (!read(l)) continue;
        }
      } catch (...) {
        fail_lane(l, std::current_exception());
      }
    }
    // Hand the lane on.
    mux_waiter* next = nullptr;
    bool wake_io = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool work = !l.incoming.empty() || !l.queued.empty() || !l.inflight.empty();
      if (work && !to_io && !stopping_ && async_pending_.load(std::memory_order_acquire) == 0) {
        // Not to a caller driving another lane (its check was sent again
        // there, after NOSCRIPT): it would leave this one undriven meanwhile.
        const auto free_waiter = [&](const std::unique_ptr<mux_job>& j) {
          return j->waiter != nullptr && j->waiter != &me && !j->waiter->driving_;
        };
        for (auto* jobs : {&l.inflight, &l.queued}) {
          for (const auto& j : *jobs) {
            if (next == nullptr && free_waiter(j)) next = j->waiter;
          }
        }
        for (const auto& j : l.incoming) {
          if (next == nullptr && free_waiter(j)) next = j->waiter;
        }
      }
      me.driving_ = false;
      if (next != nullptr) {
        next->driving_ = true;
        next->lead_mux_ = this;
        next->lead_lane_ = static_cast<std::size_t>(&l - lanes_.data());
      } else {
        l.led.store(false, std::memory_order_relaxed);
        wake_io = work || to_io;
      }
    }
    d.unlock();
    leading_ = false;
    if (next != nullptr) {
      next->signal(mux_waiter::lead);
    } else if (wake_io) {
      wake_pending_.store(true, std::memory_order_release);
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
    }
  }

  /// Hands `j` back: it is no longer pending (so complete() may submit it again).
  void finish(std::unique_ptr<mux_job> j, reply_ptr r, std::exception_ptr e) noexcept {
    if (!j->uncounted) pending_.fetch_sub(1, std::memory_order_acq_rel);
    if (j->async_counted) async_pending_.fetch_sub(1, std::memory_order_acq_rel);
    mux_job* p = j.get();
    p->complete(std::move(j), std::move(r), std::move(e));
  }

  /// `make()`'s exception, or the one thrown while making it (std::bad_alloc).
  template <class Make>
  static std::exception_ptr error_or_current(Make make) noexcept {
    try {
      return make();
    } catch (...) {
      return std::current_exception();
    }
  }

  [[nodiscard]] static std::exception_ptr timed_out(const char* what) noexcept {
    return error_or_current([what] { return std::make_exception_ptr(timeout_error(what)); });
  }

  /// Closes the lane's connection and forgets the write in progress (the
  /// jobs stay where they are).
  static void reset_lane(lane& l) noexcept {
    l.conn.reset();
    l.reader.reset();
    l.out.clear();
    l.written = 0;
    l.batch_first = 0;
  }

  /// Fails every job of `jobs` with `why` (null entries, moved from when an
  /// exception came, are skipped) and empties it. Swaps `jobs` into
  /// `l.failing` first, so a complete() that submits again cannot touch the
  /// container being walked. Allocates nothing: `l.failing` keeps its node.
  void fail_jobs(lane& l, std::deque<std::unique_ptr<mux_job>>& jobs,
                 const std::exception_ptr& why) noexcept {
    l.failing.swap(jobs);
    for (auto& j : l.failing) {
      if (j != nullptr) finish(std::move(j), nullptr, why);
    }
    l.failing.clear();
  }

  /// After an exception on the I/O thread while serving `l`: drops its
  /// connection and fails each of its jobs (queued and written; null
  /// entries, moved from when the exception came, are skipped) with `why`.
  /// Allocates nothing.
  void fail_lane(lane& l, const std::exception_ptr& why) noexcept {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    reset_lane(l);
    fail_jobs(l, l.inflight, why);
    fail_jobs(l, l.queued, why);
  }

  /// Drops the lane's connection: fails every job written on it. Jobs whose
  /// deadline passed get timeout_error; the others `why`.
  /// Allocates nothing but the timeout_error (or gives it `why` instead).
  void drop(lane& l, const std::exception_ptr& why) noexcept {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    reset_lane(l);
    l.failing.swap(l.inflight);
    const deadline now = deadline_clock::now();
    std::exception_ptr late;
    for (auto& j : l.failing) {
      if (j->until <= now) {
        if (!late) late = timed_out("ratelimit: redis: command timed out");
        finish(std::move(j), nullptr, late);
      } else {
        finish(std::move(j), nullptr, why);
      }
    }
    l.failing.clear();
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
      fail_jobs(l, l.queued, std::current_exception());
      return;
    }
    const auto took = deadline_clock::now() - start;
    for (auto& j : l.queued) j->until += took;
  }

  /// Fails queued jobs whose deadline passed (they were never sent).
  void expire_queued(lane& l, deadline now) noexcept {
    std::exception_ptr late;
    for (auto it = l.queued.begin(); it != l.queued.end();) {
      if ((*it)->until <= now) {
        if (!late) late = timed_out("ratelimit: redis: command timed out waiting to be sent");
        std::unique_ptr<mux_job> j = std::move(*it);
        it = l.queued.erase(it);  // moves unique_ptrs only: no exception
        finish(std::move(j), nullptr, late);
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
                                   " cannot serve checks now: " + detail::reply_text(*r);
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
    leading_ = true;  // a job submitted again here (NOSCRIPT) never makes this thread lead
    std::vector<pollfd>& fds = fds_;
    std::vector<lane*>& polled = polled_;
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
          l.served = !l.led.load(std::memory_order_relaxed);
          if (!l.served) {
            l.was_led = true;
            continue;
          }
          if (l.was_led) {
            // Back from a leader: look at the socket again (TLS may hold bytes).
            l.was_led = false;
            l.readable = true;
          }
          std::size_t moved = 0;
          try {
            for (; moved < l.incoming.size(); ++moved) {
              l.queued.push_back(std::move(l.incoming[moved]));  // unchanged if it throws
            }
          } catch (...) {
            // No memory: the jobs not moved yet fail below, out of the lock.
            l.refused_why = std::current_exception();
            // A pair is never split: when the job refused is the one behind a
            // lead (ASKING) just moved, the lead goes back and fails with it
            // rather than go out alone. Moves a pointer only: no exception.
            if (moved > 0 && l.queued.back()->uncounted) {
              l.incoming[moved - 1] = std::move(l.queued.back());
              l.queued.pop_back();
            }
            l.refused.swap(l.incoming);
          }
          l.incoming.clear();
        }
      }
      for (lane& l : lanes_) {
        if (l.refused.empty()) continue;
        for (auto& j : l.refused) {
          if (j != nullptr) finish(std::move(j), nullptr, l.refused_why);
        }
        l.refused.clear();
        l.refused_why = nullptr;
      }
      deadline now = deadline_clock::now();
      deadline next = deadline::max();
      fds.clear();
      polled.clear();
      fds.push_back(pollfd{wake_fd_, POLLIN, 0});
      // Queued jobs waiting for a connection, or for a retired one whose last
      // answer was just read (it is closed and replaced in the next round):
      // go round again at once, not at their deadline.
      bool queued_left = false;
      for (lane& l : lanes_) {
        if (!l.served) continue;
        // A blocking caller that claimed the lane since leads it (and holds
        // `drive` until it hands the lane on): not this thread's this round.
        // Or was handed it by such a caller that let go of `drive`: the
        // lane stays its until it takes it (its check must not be completed
        // here meanwhile: it would return without taking the lane, and
        // nobody would drive the lane again).
        std::unique_lock<std::mutex> d(l.drive, std::try_to_lock);
        if (!d.owns_lock() || l.led.load(std::memory_order_acquire)) {
          l.was_led = true;  // look at its socket again once it is back
          continue;
        }
        try {
          if (!serve(l, now, next)) return;
        } catch (...) {
          // std::bad_alloc (or any exception) while serving the lane: its
          // jobs get it, and the other lanes carry on.
          fail_lane(l, std::current_exception());
        }
        for (const auto& j : l.queued) next = std::min(next, j->until);
        queued_left = queued_left || (!l.queued.empty() &&
                                      (l.conn == nullptr || (retired(l) && l.inflight.empty())));
      }
      int timeout_ms = -1;
      if (next != deadline::max()) {
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(next - deadline_clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 60000));
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

  /// One round of the I/O thread for `l`: expires, connects, reads, writes;
  /// adds the lane to the poll set and its deadlines to `next`.
  /// @return false when stop() began (the thread must end)
  bool serve(lane& l, deadline& now, deadline& next) {
    expire_queued(l, now);
    if (retired(l) && l.inflight.empty()) {
      // Every check written on it has its answer: close it quietly.
      reset_lane(l);
    }
    if (l.conn == nullptr && !l.queued.empty()) {
      {
        // stop() waits for this thread: no further connect once it began
        // (each may take connect_timeout).
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return false;
      }
      connect(l);
      now = deadline_clock::now();
    }
    if (l.conn == nullptr) return true;
    // Replies first: one that arrived while this thread was busy elsewhere
    // (another connection's handlers) answers its check, deadline or not.
    if (l.readable) {
      l.readable = false;
      if (!read(l)) return true;
    }
    // A written job past its deadline with no reply read: the connection
    // cannot be trusted to answer in time, and its late reply would be
    // read for the next.
    const bool late = std::any_of(l.inflight.begin(), l.inflight.end(),
                                  [&](const auto& j) { return j->until <= now; });
    if (late) {
      drop(l, std::make_exception_ptr(connection_error(
                  "ratelimit: redis: connection dropped: a check written on it timed out")));
      return true;
    }
    if (!write(l)) return true;
    short ev = POLLIN;  // also to see an idle connection closed by the server
    if (l.written < l.out.size()) ev |= POLLOUT;
    fds_.push_back(pollfd{l.conn->stream().fd(), ev, 0});
    polled_.push_back(&l);
    for (const auto& j : l.inflight) next = std::min(next, j->until);
    return true;
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
  const std::size_t max_pending_;
  std::atomic<std::size_t> pending_{0};  ///< submitted, not completed (uncounted ones aside)
  /// Pending jobs no blocking caller waits for (async, ASKING pairs): while
  /// any, the I/O thread drives every lane (their handlers run there).
  std::atomic<std::size_t> async_pending_{0};
  static inline thread_local bool leading_ =
      false;                   ///< this thread leads a lane, or is an I/O thread
  std::vector<pollfd> fds_;    ///< the I/O thread's poll set (reserved in submit)
  std::vector<lane*> polled_;  ///< lanes of fds_[1..]
  int wake_fd_ = -1;
  const pid_t owner_ = ::getpid();
};

inline void mux_waiter::wait_done() noexcept {
  for (;;) {
    std::uint32_t s = state_.load(std::memory_order_acquire);
    if ((s & done) != 0) return;
    if ((s & lead) != 0) {
      state_.fetch_and(~lead, std::memory_order_acq_rel);
      lead_mux_->lead_lane(lead_mux_->lanes_[lead_lane_], *this);
      continue;
    }
    if ((s & asleep) == 0) {
      (void)state_.compare_exchange_weak(s, s | asleep, std::memory_order_acq_rel);
      continue;
    }
    (void)::syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, s, nullptr, nullptr, 0);
  }
}

}  // namespace ratelimit::redis
