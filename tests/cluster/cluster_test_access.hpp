// SPDX-License-Identifier: Apache-2.0
// Test seam into cluster_store: starts its background threads.
#pragma once

#include <functional>
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

};

}  // namespace ratelimit::redis::detail
