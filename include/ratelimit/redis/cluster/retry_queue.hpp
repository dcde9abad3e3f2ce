// SPDX-License-Identifier: Apache-2.0
// The cluster store's retry thread: async checks answered TRYAGAIN are sent
// again 5 ms later from there, so no completion waits.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/redis/cluster/node.hpp"
#include "ratelimit/redis/cluster/thread_mark.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/multiplexer.hpp"

namespace ratelimit::redis::detail {

/// Checks waiting to be sent again (after TRYAGAIN), and the thread that
/// sends each at its time. The thread starts on first use and carries the
/// mark of its store (see cluster_thread_mark): a handler it runs may not
/// make a blocking check on that store.
class cluster_retry_queue {
 public:
  /// @param store_id the id of the store whose checks it holds
  explicit cluster_retry_queue(std::uint64_t store_id) noexcept : store_id_(store_id) {}
  cluster_retry_queue(const cluster_retry_queue&) = delete;
  cluster_retry_queue& operator=(const cluster_retry_queue&) = delete;
  ~cluster_retry_queue() { stop(); }

  /// Has `job` sent again at `due` by the retry thread (started on first
  /// use), or at once when no thread can be started.
  /// @return false after stop() began (`job` kept)
  bool resend_at(deadline due, std::unique_ptr<mux_job>& job) noexcept {
    try {
      std::lock_guard<std::mutex> lock(retry_mutex_);
      if (retry_stopping_) return false;
      if (!retrier_.joinable()) retrier_ = std::thread([this] { retry_loop(); });
      retries_.push_back(delayed{due, nullptr});
      retries_.back().job = std::move(job);
    } catch (...) {
      if (job == nullptr) return true;  // queued; only the notify is left
      static_cast<cluster_job*>(job.get())->resend(job);
      return true;
    }
    retry_cv_.notify_one();
    return true;
  }

  /// Joins the retry thread; the checks it held get multiplexer_stopped
  /// (std::bad_alloc in its place when memory is short: nothing here
  /// allocates but that error, and only with checks held). Idempotent.
  void stop() noexcept {
    std::vector<delayed> left;
    {
      std::lock_guard<std::mutex> lock(retry_mutex_);
      retry_stopping_ = true;
      left.swap(retries_);
    }
    retry_cv_.notify_all();
    if (retrier_.joinable()) retrier_.join();
    std::vector<delayed> late;  // queued while the thread ran its last round
    {
      std::lock_guard<std::mutex> lock(retry_mutex_);
      late.swap(retries_);
    }
    if (left.empty() && late.empty()) return;
    std::exception_ptr err;
    try {
      err = std::make_exception_ptr(multiplexer_stopped(
          "ratelimit: redis: the store was destroyed with this check in flight"));
    } catch (...) {
      err = std::current_exception();
    }
    for (auto* held : {&left, &late}) {
      for (auto& d : *held) {
        if (d.job == nullptr) continue;
        mux_job* j = d.job.get();
        j->complete(std::move(d.job), nullptr, err);
      }
    }
  }

 private:
  /// A check waiting to be sent again (after TRYAGAIN).
  struct delayed {
    deadline due;
    std::unique_ptr<mux_job> job;
  };

  void retry_loop() noexcept {
    cluster_thread_mark() = store_id_;
    std::unique_lock<std::mutex> lock(retry_mutex_);
    while (!retry_stopping_) {
      deadline next = deadline::max();
      const deadline now = deadline_clock::now();
      // The due checks leave the queue in one pass (erasing one by one
      // would cost O(n^2) under the lock with many checks waiting). Should
      // memory run short, the due ones stay queued for the next round.
      std::vector<std::unique_ptr<mux_job>> due;
      try {
        due.reserve(static_cast<std::size_t>(std::count_if(
            retries_.begin(), retries_.end(), [&](const delayed& d) { return d.due <= now; })));
        for (delayed& d : retries_) {
          if (d.due <= now) {
            due.push_back(std::move(d.job));
          } else {
            next = std::min(next, d.due);
          }
        }
        std::erase_if(retries_, [](const delayed& d) { return d.job == nullptr; });
      } catch (const std::bad_alloc&) {
        next = now + std::chrono::milliseconds(5);
      }
      if (!due.empty()) {
        lock.unlock();
        for (auto& j : due) static_cast<cluster_job*>(j.get())->resend(j);
        lock.lock();
        continue;
      }
      if (next == deadline::max()) {
        retry_cv_.wait(lock);
      } else {
        retry_cv_.wait_until(lock, next);
      }
    }
  }

  const std::uint64_t store_id_;
  std::mutex retry_mutex_;
  std::condition_variable retry_cv_;
  std::vector<delayed> retries_;  ///< guarded by retry_mutex_
  bool retry_stopping_ = false;   ///< guarded by retry_mutex_
  std::thread retrier_;
};

}  // namespace ratelimit::redis::detail
