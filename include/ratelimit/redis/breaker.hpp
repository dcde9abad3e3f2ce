// SPDX-License-Identifier: Apache-2.0
// The circuit breaker of a Redis server and the background prober that
// closes it again once the server answers.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/stats.hpp"
#include "ratelimit/redis/transport.hpp"

namespace ratelimit::redis {

namespace detail {

/// Circuit breaker: after `threshold` consecutive failures it opens; while
/// open, every check is answered by the failure policy at once and none goes
/// to Redis. A background prober (see prober) tries Redis once each cool-down;
/// a failed probe doubles the cool-down (up to the maximum); a successful probe,
/// or any check that succeeds (one already in flight when it opened), closes it.
/// Thread safety: any number of threads.
class breaker {
 public:
  enum class verdict : unsigned char { go, refuse };

  explicit breaker(const options& o)
      : threshold_(o.breaker_threshold == 0 ? 3u : o.breaker_threshold),
        base_(o.breaker_cooldown.count() > 0 ? o.breaker_cooldown : std::chrono::milliseconds{200}),
        max_(std::max(base_, o.breaker_max_cooldown.count() > 0 ? o.breaker_max_cooldown
                                                                : std::chrono::milliseconds{5000})),
        cooldown_(base_) {}

  breaker(const breaker&) = delete;
  breaker& operator=(const breaker&) = delete;

  /// `go` when closed, `refuse` when open (callers never probe).
  [[nodiscard]] verdict enter() const noexcept {
    return open_.load(std::memory_order_acquire) ? verdict::refuse : verdict::go;
  }

  /// A round trip succeeded, or a probe did: closes the breaker.
  void success() noexcept {
    if (!open_.load(std::memory_order_acquire) && failures_.load(std::memory_order_relaxed) == 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.store(0, std::memory_order_relaxed);
    cooldown_ = base_;
    open_.store(false, std::memory_order_release);
  }

  /// A round trip failed (ignored while open: it was in flight when it opened).
  /// @return true when this failure opened the breaker (start probing it)
  bool failure() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_.load(std::memory_order_relaxed)) return false;
    if (failures_.fetch_add(1, std::memory_order_relaxed) + 1 < threshold_) return false;
    cooldown_ = base_;
    probe_at_ = deadline_clock::now() + cooldown_;
    open_.store(true, std::memory_order_release);
    return true;
  }

  /// When the next probe is due (meaningful while open).
  [[nodiscard]] deadline probe_at() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return probe_at_;
  }

  /// A probe failed: the next one waits twice as long (up to the maximum).
  void probe_failed() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_.load(std::memory_order_relaxed)) return;
    cooldown_ = std::min(cooldown_ * 2, max_);
    probe_at_ = deadline_clock::now() + cooldown_;
  }

  [[nodiscard]] bool is_open() const noexcept { return open_.load(std::memory_order_acquire); }

 private:
  std::uint32_t threshold_;
  std::chrono::milliseconds base_;
  std::chrono::milliseconds max_;
  std::mutex mutex_;
  std::atomic<bool> open_{false};
  std::atomic<std::uint32_t> failures_{0};
  std::chrono::milliseconds cooldown_;
  deadline probe_at_{};
};

/// Probes open breakers from one background thread, started on the first
/// watch() and then asleep on a condition variable until a breaker opens or a
/// probe is due; stop() (the destructor) wakes and joins it at once, or after
/// the probe in progress (bounded by connect_timeout + command_timeout).
///
/// After fork(), a child holding a prober made by its parent never touches
/// its mutex or condition variable (the parent's thread, absent from the
/// child, may have held the one or waited on the other at the fork): stop()
/// leaks it and watch() refuses. Stores do not reach either in a child (see
/// check_same_process), so this is a second line of defence.
///
/// Thread safety: watch() from any number of threads; stop() once no watch()
/// can run (the owner's destructor).
class prober {
 public:
  /// One attempt to reach the breaker's server: true when it answered.
  using probe_fn = std::function<bool()>;

  prober() : core_(std::make_unique<core>()) {}
  prober(const prober&) = delete;
  prober& operator=(const prober&) = delete;
  ~prober() { stop(); }

  /// Probes `gate` with `probe` each cool-down until a probe succeeds (and
  /// closes it) or something else closes it. `gate` and whatever `probe` uses
  /// must outlive stop().
  /// @return false when the thread could not be started (the caller should
  ///   then close the breaker, or it would stay open)
  [[nodiscard]] bool watch(breaker& gate, probe_fn probe) noexcept {
    if (core_ == nullptr || core_->pid != ::getpid()) return false;
    core& c = *core_;
    try {
      std::lock_guard<std::mutex> lock(c.mutex);
      if (c.stopping) return false;
      const bool known = std::any_of(c.targets.begin(), c.targets.end(),
                                     [&](const target& t) { return t.gate == &gate; });
      if (!known) {
        c.targets.push_back(target{&gate, std::make_shared<const probe_fn>(std::move(probe))});
      }
      c.changed = true;
      if (!c.thread.joinable()) {
        c.thread = std::thread([&c] { run(c); });
      }
    } catch (...) {
      return false;
    }
    c.wake.notify_one();
    return true;
  }

  /// Stops and joins the thread (no-op when it never started).
  void stop() noexcept {
    if (core_ == nullptr) return;
    if (core_->pid != ::getpid()) {
      (void)core_.release();  // forked child: the parent's thread is not here; leak, never join
      return;
    }
    if (!core_->thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      core_->stopping = true;
    }
    core_->wake.notify_all();
    core_->thread.join();
  }

 private:
  struct target {
    breaker* gate;
    std::shared_ptr<const probe_fn> probe;
  };

  struct core {
    std::mutex mutex;
    std::condition_variable wake;
    std::vector<target> targets;  ///< breakers that opened, until they close
    bool changed = false;         ///< a breaker opened since the thread last looked
    bool stopping = false;
    const pid_t pid = ::getpid();  ///< the process that made the prober (and may run its thread)
    std::thread thread;
  };

  static void run(core& c) noexcept {
    std::unique_lock<std::mutex> lock(c.mutex);
    while (!c.stopping) {
      c.changed = false;
      std::erase_if(c.targets, [](const target& t) { return !t.gate->is_open(); });
      const auto woken = [&] { return c.stopping || c.changed; };
      if (c.targets.empty()) {
        c.wake.wait(lock, woken);
        continue;
      }
      auto next = c.targets.begin();
      deadline due = next->gate->probe_at();
      for (auto it = std::next(next); it != c.targets.end(); ++it) {
        const deadline at = it->gate->probe_at();
        if (at < due) {
          due = at;
          next = it;
        }
      }
      if (deadline_clock::now() < due) {
        c.wake.wait_until(lock, due, woken);
        continue;
      }
      breaker* gate = next->gate;
      const std::shared_ptr<const probe_fn> probe = next->probe;
      lock.unlock();
      bool ok = false;
      try {
        ok = (*probe)();
      } catch (...) {
      }
      if (ok) {
        gate->success();
      } else {
        gate->probe_failed();
      }
      lock.lock();
    }
  }

  std::unique_ptr<core> core_;
};

/// One background probe of a server whose breaker is open: PING on a fresh
/// connection of `pool` (idle ones, likely made before the outage, are dropped
/// first), within connect_timeout + `command_timeout`. The connection goes
/// back to the pool when it answered.
/// @return true when the server answered PING
[[nodiscard]] inline bool probe_ping(connection_pool& pool,
                                     std::chrono::milliseconds command_timeout,
                                     counters& c) noexcept {
  c.probes.fetch_add(1, std::memory_order_relaxed);
  try {
    pool.clear();
    const deadline start = deadline_clock::now();
    connection_pool::lease lease = pool.acquire(start + command_timeout);
    const std::string_view args[] = {"PING"};
    reply_ptr r = lease->command(args, 1, start + command_timeout + lease.connect_time());
    if (r->type != REDIS_REPLY_ERROR) return true;
    lease->mark_broken();
  } catch (...) {
  }
  c.probe_failures.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace detail

}  // namespace ratelimit::redis
