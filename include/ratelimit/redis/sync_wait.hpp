// SPDX-License-Identifier: Apache-2.0
// A blocking check that waits for its multiplexed (async) completion: the
// calling thread sleeps on one futex word until the thread that completes it
// (the I/O thread, or a blocking caller driving the connection) hands over the
// outcome, one wake-up at most per check (two when it is handed the
// connection to drive on the way).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <utility>

#include "ratelimit/decision.hpp"
#include "ratelimit/errors.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/multiplexer.hpp"
#include "ratelimit/redis/transport.hpp"

namespace ratelimit::redis::detail {

/// `out` set to a new `E` with `x`'s message when `x` is exactly an `E`.
/// @throws std::bad_alloc
template <class E>
bool fresh_if(const std::exception& x, std::exception_ptr& out) {
  if (typeid(x) != typeid(E)) return false;
  out = std::make_exception_ptr(E(std::string(x.what())));
  return true;
}

/// An exception of the same type and message as `e`'s, owned by nobody else
/// (for the library's error types, std::bad_alloc and the standard ones it
/// throws; `e` itself for any other type, or when memory is short).
///
/// Why: the thread that completes a check often still holds `e` (a shared
/// error failing every check of a connection, a temporary in the caller)
/// and may drop the last reference, destroying the exception, after the
/// waiter read it. That is well-defined (the count is atomic), but the
/// count lives in the uninstrumented libstdc++, so ThreadSanitizer sees a
/// destructor racing the waiter's what(). A copy only the waiter holds is
/// read and destroyed on one thread. Errors are the rare path: the copy
/// costs nothing on a decided check.
[[nodiscard]] inline std::exception_ptr own_copy(const std::exception_ptr& e) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc& x) {
    if (typeid(x) != typeid(std::bad_alloc)) return e;
    try {
      return std::make_exception_ptr(std::bad_alloc());
    } catch (...) {
      return e;
    }
  } catch (const std::exception& x) {
    try {
      std::exception_ptr out;
      if (fresh_if<timeout_error>(x, out) || fresh_if<connection_error>(x, out) ||
          fresh_if<multiplexer_stopped>(x, out) || fresh_if<multiplexer_full>(x, out) ||
          fresh_if<tls_error>(x, out) || fresh_if<script_error>(x, out) ||
          fresh_if<store_error>(x, out) || fresh_if<ratelimit::error>(x, out) ||
          fresh_if<std::invalid_argument>(x, out) || fresh_if<std::logic_error>(x, out) ||
          fresh_if<std::runtime_error>(x, out)) {
        return out;
      }
    } catch (...) {
    }
    return e;
  } catch (...) {
    return e;
  }
}

/// The outcome of one async check, handed from the thread that completes it
/// to the one thread waiting for it.
///
/// The waiter sleeps on a futex word (no mutex, no condition variable, see
/// mux_waiter): the completing thread publishes the outcome with one atomic
/// read-modify-write and makes a wake-up system call only when the waiter is
/// already asleep; a waiter handed a connection to drive drives it (from
/// get()) and waits again. The waiter
/// may return (and its frame be reused) between that exchange and the
/// wake-up: a FUTEX_WAKE on the address then wakes nothing, or wakes a later
/// waiter there spuriously, which re-checks its own word and sleeps again.
class sync_waiter : public mux_waiter {
 public:
  sync_waiter() = default;

  /// Hands over the outcome (exactly once). Does not block. An error handed
  /// over from another thread is copied first (see own_copy).
  void set(decision d, std::exception_ptr e) noexcept {
    d_ = d;
    e_ = e && std::this_thread::get_id() != waiter_ ? own_copy(e) : std::move(e);
    signal(done);
  }

  /// Waits for set() (driving the multiplexer's connection meanwhile when a
  /// leader hands it over).
  /// @return the decision
  /// @throws the error set() handed over
  decision get() {
    wait_done();
    if (e_) std::rethrow_exception(e_);
    return d_;
  }

 private:
  const std::thread::id waiter_ = std::this_thread::get_id();
  decision d_{};
  std::exception_ptr e_;
};

/// Runs `start(handler)`, which must call `handler(decision,
/// std::exception_ptr)` exactly once (on any thread, or inline before it
/// returns), and waits on this thread for that call.
/// @return the decision handed to the handler
/// @throws the exception handed to the handler; whatever `start` throws (the
///   handler must then never be called)
template <class Start>
decision sync_wait(Start&& start) {
  sync_waiter w;
  std::forward<Start>(start)([&w](decision d, std::exception_ptr e) { w.set(d, std::move(e)); });
  return w.get();
}

}  // namespace ratelimit::redis::detail
