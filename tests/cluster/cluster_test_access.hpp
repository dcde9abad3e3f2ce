// SPDX-License-Identifier: Apache-2.0
// Test seam into cluster_store: starts its background threads and hooks its slot-map reads.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "ratelimit/redis/cluster_store.hpp"

namespace ratelimit::redis::detail {

/// Declared (befriended) by cluster_store, defined here for tests only.
struct cluster_test_access {
  /// Wakes the background slot-map refresher, starting it first if needed.
  static void request_refresh(cluster_store& s) { s.shared_->request_refresh(); }

  /// Counts failures of every master of the current map until its breaker
  /// opens, which has the prober thread started (it then probes each one).
  static void open_breakers(cluster_store& s) {
    for (const auto& n : s.shared_->masters()) {
      while (!n->gate.is_open()) s.shared_->gate_failed(*n);
    }
  }

  /// Installs the slot map of a CLUSTER SLOTS reply `r` as if just read from
  /// `host`; false when the reply is refused as unreadable.
  static bool install_slots(cluster_store& s, const redisReply& r, const std::string& host) {
    std::uint64_t started = 0;
    {
      std::shared_lock<std::shared_mutex> lock(s.shared_->topo_mutex);
      started = s.shared_->generation;
    }
    using install = std::remove_reference_t<decltype(*s.shared_)>::install;
    return s.shared_->apply_slots(r, host, started) != install::bad;
  }

  /// Runs `f` between reading CLUSTER SLOTS and installing its map (every
  /// read, in whichever thread makes it). Set before the store is used.
  static void on_slots_read(cluster_store& s, std::function<void()> f) {
    s.shared_->slots_read_hook = std::move(f);
  }
};

}  // namespace ratelimit::redis::detail
