// SPDX-License-Identifier: Apache-2.0
// outcomes: collects what the handlers of async checks were called with;
// holds<E>(): whether an exception_ptr holds an E.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "ratelimit/decision.hpp"

namespace rltest {

/// Outcomes of async checks, each slot written by exactly one handler call.
struct outcomes {
  explicit outcomes(std::size_t n) : calls(n, 0), decisions(n), errors(n), left(n) {}

  /// The handler of check `i`: records its decision and error, and counts its calls.
  auto handler(std::size_t i) {
    return [this, i](ratelimit::decision d, std::exception_ptr e) {
      std::lock_guard<std::mutex> lock(m);
      ++calls[i];
      decisions[i] = d;
      errors[i] = std::move(e);
      if (left > 0) --left;
      cv.notify_all();
    };
  }

  /// Waits until every handler ran once (false when `limit` passed first).
  bool wait(std::chrono::milliseconds limit = std::chrono::seconds{10}) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, limit, [&] { return left == 0; });
  }

  std::mutex m;
  std::condition_variable cv;
  std::vector<int> calls;
  std::vector<ratelimit::decision> decisions;
  std::vector<std::exception_ptr> errors;
  std::size_t left;
};

/// True when `e` holds an exception of type E (false for a null `e`).
template <class E>
bool holds(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace rltest
