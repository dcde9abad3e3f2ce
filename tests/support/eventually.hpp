// SPDX-License-Identifier: Apache-2.0
// eventually(): polls a condition with a bound, for tests that wait on a background thread or a server.
#pragma once

#include <chrono>
#include <thread>

namespace rltest {

/// Polls `done` every `poll` until it holds (true) or 20 s passed (false).
/// The 20 s bound catches a hang; it is not a speed check.
template <class F>
bool eventually(F done, std::chrono::milliseconds poll = std::chrono::milliseconds{5}) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{20};
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace rltest
