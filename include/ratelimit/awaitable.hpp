// SPDX-License-Identifier: Apache-2.0
// C++20 coroutine form of limiter::async_try_acquire:
// `decision d = co_await limiter.async_try_acquire(key);`
#pragma once

#include <atomic>
#include <coroutine>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// What `limiter::async_try_acquire(key[, cost])` returns: awaiting it starts
/// the check and resumes the coroutine with its decision, on the store's I/O
/// thread (Redis) or at once without suspending (memory_store, or a check
/// decided without I/O). The error the handler form would receive is thrown
/// from the co_await; bad input throws std::invalid_argument from it too.
/// The key is copied: the awaitable may outlive the caller's string.
/// Resumed on a Redis store's I/O thread, the coroutine runs there until it
/// next suspends: every other check's reply waits meanwhile, and a blocking
/// check on that store there throws std::logic_error (co_await it instead).
///
/// Awaited once; not copyable. The check's handler writes into the
/// awaitable (in the coroutine's frame) and resumes the coroutine: a
/// coroutine suspended on it must not be destroyed before it is resumed
/// (nothing cancels the check; destroying the frame first is undefined
/// behaviour), and the limiter and its store must outlive the check.
template <class Limiter>
class acquire_awaitable {
 public:
  acquire_awaitable(Limiter& l, std::string_view key, units cost)
      : limiter_(&l), key_(key), cost_(cost) {}
  acquire_awaitable(const acquire_awaitable&) = delete;
  acquire_awaitable& operator=(const acquire_awaitable&) = delete;
  acquire_awaitable(acquire_awaitable&& o) noexcept
      : limiter_(o.limiter_), key_(std::move(o.key_)), cost_(o.cost_) {}
  acquire_awaitable& operator=(acquire_awaitable&&) = delete;
  ~acquire_awaitable() = default;

  [[nodiscard]] bool await_ready() const noexcept { return false; }

  /// Starts the check; false (do not suspend) when it completed already.
  bool await_suspend(std::coroutine_handle<> h) {
    limiter_->async_try_acquire(key_, cost_, [this, h](decision d, std::exception_ptr e) {
      decision_ = d;
      error_ = std::move(e);
      // The second of the two sides to arrive resumes (or does not suspend).
      if (arrived_.exchange(true, std::memory_order_acq_rel)) h.resume();
    });
    return !arrived_.exchange(true, std::memory_order_acq_rel);
  }

  /// The decision. @throws what the check failed with
  decision await_resume() {
    if (error_) std::rethrow_exception(error_);
    return decision_;
  }

 private:
  Limiter* limiter_;
  std::string key_;
  units cost_;
  decision decision_{};
  std::exception_ptr error_;
  std::atomic<bool> arrived_{false};
};

}  // namespace ratelimit
