// SPDX-License-Identifier: Apache-2.0
// Which cluster store's I/O or retry thread the calling thread is, in one
// thread-local word: what a blocking check reads to refuse waiting for itself.
#pragma once

#include <atomic>
#include <cstdint>

namespace ratelimit::redis::detail {

/// A new cluster store's id: never 0, never reused in a process (a forked
/// child goes on from its parent's count, and holds only its own stores).
inline std::uint64_t next_cluster_store_id() noexcept {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

/// The id of the cluster store whose I/O or retry thread this is; 0 on
/// every other thread. Each such thread serves exactly one store, and the
/// mark ends with the thread: a thread started later reads 0, whatever
/// thread id it is given.
inline std::uint64_t& cluster_thread_mark() noexcept {
  static thread_local std::uint64_t id = 0;
  return id;
}

}  // namespace ratelimit::redis::detail
