// SPDX-License-Identifier: Apache-2.0
// Asio initiating functions for limiter checks (target ratelimit::asio, standalone
// Asio): any completion token, the handler's executor, per-operation cancellation.
#pragma once

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/system_executor.hpp>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit::asio {

/// The completion signature of every operation here: a null exception_ptr and
/// the decision, or the error and a default decision. The error is exactly
/// what the blocking try_acquire would throw (store_error subclasses under
/// failure_policy::throw_error, redis::multiplexer_stopped), or a
/// std::system_error holding ::asio::error::operation_aborted after a
/// cancellation. `asio::use_awaitable` and `asio::use_future` rethrow it.
using signature = void(std::exception_ptr, decision);

namespace detail {

/// One check in flight: whichever of the store's reply and a terminal
/// cancellation arrives first completes the handler; the other is dropped.
template <class Handler>
class acquire_op : public std::enable_shared_from_this<acquire_op<Handler>> {
 public:
  using executor_type = ::asio::associated_executor_t<Handler, ::asio::system_executor>;

  /// Takes the handler by value: a named (lvalue) callback is copied, as
  /// Asio's own operations copy it.
  explicit acquire_op(Handler h)
      : handler_(std::move(h)),
        work_(::asio::make_work_guard(
            ::asio::get_associated_executor(*handler_, ::asio::system_executor()))),
        slot_(::asio::get_associated_cancellation_slot(*handler_)) {}

  /// Connects the handler's cancellation slot (if any) to this operation.
  void connect_cancellation() {
    if (!slot_.is_connected()) return;
    slot_.template emplace<canceller>(this->weak_from_this());
  }

  /// Completes with the first result to arrive; later ones are ignored.
  /// The handler is posted to its executor, never invoked here, unless
  /// posting throws (memory ran short, or the executor refused the work):
  /// then it is invoked here, on this thread, with what post() threw, so
  /// that it still runs exactly once (the decision is lost; the check may
  /// have consumed).
  void finish(std::exception_ptr e, decision d) {
    if (done_.exchange(true, std::memory_order_acq_rel)) return;
    std::exception_ptr refused;
    try {
      ::asio::post(work_->get_executor(), [self = this->shared_from_this(), e = std::move(e),
                                           d]() mutable { self->complete(std::move(e), d); });
    } catch (...) {
      refused = std::current_exception();
    }
    if (refused) {
      // The cancellation slot is left as it is: this may run inside the
      // canceller, which clearing the slot would destroy under its feet
      // (a later cancellation finds the operation done and does nothing).
      Handler h = std::move(*handler_);
      handler_.reset();
      work_.reset();
      std::move(h)(std::move(refused), decision{});
      return;
    }
    // Released only once post() has returned: the posted completion holds
    // work of its own, and an io_context whose run() returns as soon as it
    // ran is not destroyed while post() is still waking its thread.
    work_.reset();
  }

 private:
  struct canceller {
    explicit canceller(std::weak_ptr<acquire_op> o) : op(std::move(o)) {}
    std::weak_ptr<acquire_op> op;
    void operator()(::asio::cancellation_type_t type) const {
      // Only terminal cancellation: a check already sent may have consumed,
      // so partial (well-defined side effects) and total (none) cannot be met.
      if ((type & ::asio::cancellation_type::terminal) == ::asio::cancellation_type::none) return;
      if (auto self = op.lock()) {
        self->finish(std::make_exception_ptr(std::system_error(
                         make_error_code(::asio::error::operation_aborted),
                         "ratelimit: asio: check cancelled (it may still be decided and consume)")),
                     decision{});
      }
    }
  };

  /// Runs on the handler's executor.
  void complete(std::exception_ptr e, decision d) {
    if (slot_.is_connected()) slot_.clear();
    Handler h = std::move(*handler_);
    handler_.reset();
    std::move(h)(std::move(e), d);
  }

  std::optional<Handler> handler_;
  std::optional<::asio::executor_work_guard<executor_type>> work_;
  ::asio::cancellation_slot slot_;
  std::atomic<bool> done_{false};
};

/// The initiation object passed to ::asio::async_initiate.
template <class Limiter>
struct initiate_acquire {
  Limiter* limiter;

  /// Checks at the limiter's clock.
  template <class Handler>
  void operator()(Handler&& handler, const std::string& key, units cost) const {
    run(std::forward<Handler>(handler),
        [&](auto on_done) { limiter->async_try_acquire(key, cost, std::move(on_done)); });
  }
  /// Checks at `now`.
  template <class Handler>
  void operator()(Handler&& handler, const std::string& key, timestamp now, units cost) const {
    run(std::forward<Handler>(handler),
        [&](auto on_done) { limiter->async_try_acquire(key, now, cost, std::move(on_done)); });
  }

 private:
  template <class Handler, class Start>
  static void run(Handler&& handler, Start&& start_check) {
    auto op = std::make_shared<acquire_op<std::decay_t<Handler>>>(std::forward<Handler>(handler));
    op->connect_cancellation();
    try {
      start_check([op](decision d, std::exception_ptr e) { op->finish(std::move(e), d); });
    } catch (...) {
      // The check did not start (the limiter then calls no handler).
      op->finish(std::current_exception(), decision{});
    }
  }
};

template <class Limiter, class Token, class... Args>
auto start(Limiter& l, std::string_view key, units cost, Token&& token, Args... now) {
  ratelimit::detail::check_key(key);
  ratelimit::detail::check_cost(cost);
  (ratelimit::detail::check_time(now), ...);
  // A store whose range of times is narrower (the Redis stores: 2^52 us)
  // says so here: once the operation is initiated an error can only reach
  // the handler (use_awaitable initiates inside a noexcept await_suspend).
  if constexpr (requires(timestamp t) { Limiter::store_type::check_caller_time(t); }) {
    (Limiter::store_type::check_caller_time(now), ...);
  }
  return ::asio::async_initiate<Token, signature>(initiate_acquire<Limiter>{&l}, token,
                                                  std::string(key), now..., cost);
}

}  // namespace detail

/// limiter::try_acquire as an Asio asynchronous operation: consumes `cost`
/// units of `key` and completes with `void(std::exception_ptr, decision)`.
///
/// Works with any completion token (a callback, ::asio::use_future,
/// ::asio::use_awaitable, deferred) and with any store: the Redis store
/// answers on its I/O thread, memory_store decides during the call; either
/// way the handler is never invoked inside this function but posted to its
/// associated executor (::asio::system_executor when it has none), and that
/// executor has outstanding work while the check is in flight. Should posting
/// it throw (no memory, or an executor refusing work), the handler is invoked
/// on the thread that finished the check, with the exception post() threw:
/// never lost, never twice.
///
/// Cancellation (the handler's associated cancellation slot): a terminal
/// cancellation that arrives before the decision completes the handler at
/// once with operation_aborted (see `signature`); the check itself is not
/// withdrawn: its script, queued or already sent, runs and may consume, and
/// its reply is dropped. Partial and total cancellation are ignored (the operation cannot
/// promise their "no side effect" guarantees). A cancellation after the
/// decision arrived changes nothing.
///
/// `l` must outlive the operation (until the handler ran). The key is
/// copied; with a deferred token the check starts when the operation is
/// launched.
/// @throws std::invalid_argument for a bad key or cost, from this call, for
///   every token (the handler is then never called)
template <class Limiter, class CompletionToken>
auto async_try_acquire(Limiter& l, std::string_view key, units cost, CompletionToken&& token) {
  return detail::start(l, key, cost, std::forward<CompletionToken>(token));
}

/// As above, cost 1.
template <class Limiter, class CompletionToken>
auto async_try_acquire(Limiter& l, std::string_view key, CompletionToken&& token) {
  return detail::start(l, key, units{1}, std::forward<CompletionToken>(token));
}

/// As above, decided at `now` (microseconds since the limiter clock's epoch;
/// for limiters whose store takes explicit times).
/// @throws std::invalid_argument for a bad key, cost or time (also a time
///   outside the store's `check_caller_time`, when it has one)
template <class Limiter, class CompletionToken>
auto async_try_acquire(Limiter& l, std::string_view key, timestamp now, units cost,
                       CompletionToken&& token) {
  return detail::start(l, key, cost, std::forward<CompletionToken>(token), now);
}

/// As above, cost 1.
/// @throws std::invalid_argument for a bad key or time
template <class Limiter, class CompletionToken>
auto async_try_acquire(Limiter& l, std::string_view key, timestamp now, CompletionToken&& token) {
  return detail::start(l, key, units{1}, std::forward<CompletionToken>(token), now);
}

}  // namespace ratelimit::asio
