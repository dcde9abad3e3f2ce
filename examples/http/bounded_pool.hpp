// SPDX-License-Identifier: Apache-2.0
// The HTTP example's worker pool: a fixed number of threads, and a bound on
// the accepted connections waiting for one of them.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace http_example {

/// httplib runs each accepted connection as one job on its task queue, and
/// the job holds a worker thread until the connection closes: a client that
/// sends its request slowly (a byte every few seconds keeps each read within
/// httplib's 5 s read timeout) holds a worker that long. httplib's own
/// ThreadPool queues every accepted connection for a worker without bound,
/// so many slow clients made the server hold any number of open sockets.
///
/// This pool takes at most `max_waiting` connections waiting for a worker:
/// past that, enqueue() (called by httplib's accept loop) waits for room, so
/// the server stops accepting, and further clients wait in the kernel's
/// listen backlog (then get refused) rather than in this process. The
/// server then holds at most threads + max_waiting + 1 accepted connections.
/// Slow clients can still hold every worker (the server answers nobody else
/// while they do): put a proxy that buffers whole requests in front of a
/// server that faces the Internet.
class bounded_pool final : public httplib::TaskQueue {
 public:
  /// @param threads      worker threads (at least 1)
  /// @param max_waiting  accepted connections waiting for a worker (at least 1)
  /// @param closing      set when the server stops: enqueue() waits no more
  bounded_pool(std::size_t threads, std::size_t max_waiting, const std::atomic<bool>& closing)
      : max_waiting_(max_waiting == 0 ? 1 : max_waiting), closing_(closing) {
    for (std::size_t i = 0; i < (threads == 0 ? 1 : threads); ++i) {
      workers_.emplace_back([this] { work(); });
    }
  }
  bounded_pool(const bounded_pool&) = delete;
  bounded_pool& operator=(const bounded_pool&) = delete;
  ~bounded_pool() override { shutdown(); }

  /// Queues one connection's job; waits while max_waiting are queued (until
  /// a worker takes one, or the server stops).
  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mutex_);
    while (jobs_.size() >= max_waiting_ && !closing_.load(std::memory_order_acquire)) {
      room_.wait_for(lock, std::chrono::milliseconds(50));
    }
    jobs_.push_back(std::move(fn));
    lock.unlock();
    ready_.notify_one();
  }

  /// Runs the jobs left, then joins the workers. Idempotent.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      room_.notify_one();
      fn();
    }
  }

  const std::size_t max_waiting_;
  const std::atomic<bool>& closing_;
  std::mutex mutex_;
  std::condition_variable ready_;  ///< a job was queued, or stopping
  std::condition_variable room_;   ///< a job left the queue
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace http_example
