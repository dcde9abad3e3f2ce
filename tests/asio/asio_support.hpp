// SPDX-License-Identifier: Apache-2.0
// Helpers of the Asio tests: the deferred token of this Asio version, and a
// recorder of completions.
#pragma once

#include <asio/version.hpp>
#if ASIO_VERSION >= 102400
#include <asio/deferred.hpp>
#else
#include <asio/experimental/deferred.hpp>
#endif

#include <exception>
#include <mutex>
#include <system_error>
#include <vector>

#include "ratelimit/decision.hpp"

namespace rltest {

#if ASIO_VERSION >= 102400
inline constexpr const auto& deferred_token = ::asio::deferred;
#else
inline constexpr const auto& deferred_token = ::asio::experimental::deferred;
#endif

/// Completions of n operations, each slot counted per call (exactly once is checked).
struct completions {
  explicit completions(std::size_t n) : calls(n, 0), decisions(n), errors(n) {}

  auto handler(std::size_t i) {
    return [this, i](std::exception_ptr e, ratelimit::decision d) {
      std::lock_guard<std::mutex> lock(m);
      ++calls[i];
      decisions[i] = d;
      errors[i] = std::move(e);
    };
  }

  std::mutex m;
  std::vector<int> calls;
  std::vector<ratelimit::decision> decisions;
  std::vector<std::exception_ptr> errors;
};

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

/// True for the error a cancelled operation completes with.
inline bool aborted(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const std::system_error& s) {
    return s.code() == std::error_code(::asio::error::operation_aborted);
  } catch (...) {
    return false;
  }
}

}  // namespace rltest
