// SPDX-License-Identifier: Apache-2.0
// A master of a real Redis Cluster killed mid-run: checks on its slots follow
// the failure policy within their timeout, the other masters are unaffected,
// and after its replica is promoted the store recovers without user action.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

constexpr auto margin = 500ms;

struct outcome {
  decision d;
  bool threw = false;
  clk::duration took{};
};

outcome check(redis::cluster_store& store, const gcra::config& cfg, std::string_view key) {
  outcome r;
  const auto start = clk::now();
  try {
    r.d = store.apply(cfg, key, store_time, 1, access::consume);
  } catch (const store_error&) {
    r.threw = true;
  }
  r.took = clk::now() - start;
  return r;
}

bool degraded_as(redis::failure_policy p, const outcome& r) {
  switch (p) {
    case redis::failure_policy::throw_error: return r.threw;
    case redis::failure_policy::fail_open:
      return !r.threw && r.d.allowed && r.d.source == decision_source::fail_open;
    case redis::failure_policy::fail_closed:
      return !r.threw && !r.d.allowed && r.d.source == decision_source::fail_closed;
    case redis::failure_policy::fallback:
      return !r.threw && r.d.source == decision_source::fallback;
  }
  return false;
}

// Verifies, for all four failure policies at once, bounded latency and the
// policy's answer on the dead master's slots, normal answers on the other
// masters, and recovery once the replica is promoted.
TEST(ClusterFailover, KilledMasterFollowsPolicyThenRecoversWithoutUserAction) {
  auto& cluster = rltest::shared_cluster();
  const std::vector<redis::failure_policy> policies = {
      redis::failure_policy::throw_error, redis::failure_policy::fail_open,
      redis::failure_policy::fail_closed, redis::failure_policy::fallback};
  std::vector<redis::cluster_store> stores;
  for (const auto p : policies) {
    auto o = cluster.options();
    o.node.connect_timeout = 200ms;
    o.node.command_timeout = 200ms;
    o.node.breaker_threshold = 3;
    o.node.breaker_cooldown = 100ms;
    o.node.breaker_max_cooldown = 400ms;
    o.node.on_failure = p;
    o.node.fallback_divisor = 2;
    o.node.prefix = "fo:" + std::to_string(static_cast<int>(p)) + ":";
    stores.emplace_back(o);
  }
  const auto bound = 200ms + 200ms + margin;
  const gcra::config cfg("1000/1h", bucket_options{.name = "t"});

  // A key on the victim master and one on another master.
  const int victim = cluster.master_of(0);
  ASSERT_GT(victim, 0);
  std::string on_victim, elsewhere;
  for (int i = 0; on_victim.empty() || elsewhere.empty(); ++i) {
    const std::string k = "sub" + std::to_string(i);
    const int m = cluster.master_of(stores[0].slot_for<gcra>(k));
    (m == victim ? on_victim : elsewhere) = k;
  }
  const std::uint16_t victim_slot = stores[0].slot_for<gcra>(on_victim);
  for (auto& s : stores) {
    for (const auto& k : {on_victim, elsewhere}) {
      const auto r = check(s, cfg, k);
      ASSERT_FALSE(r.threw);
      ASSERT_EQ(r.d.source, decision_source::store);
    }
  }

  // Started again, and the cluster whole, before the next test of this process.
  const rltest::node_revival revival(cluster);
  cluster.kill(victim);
  const auto killed = clk::now();
  std::vector<int> degraded(stores.size(), 0);
  int slow = 0, other_master_failures = 0;
  clk::duration longest{};
  while (cluster.master_of(victim_slot) == victim && clk::now() - killed < 20s) {
    for (std::size_t i = 0; i < stores.size(); ++i) {
      const auto r = check(stores[i], cfg, on_victim);
      longest = std::max(longest, r.took);
      slow += r.took > bound ? 1 : 0;
      if (degraded_as(policies[i], r)) {
        ++degraded[i];
      } else {
        EXPECT_FALSE(r.threw);
        EXPECT_EQ(r.d.source, decision_source::store);  // only once the replica took over
      }
      const auto o = check(stores[i], cfg, elsewhere);
      other_master_failures += (o.threw || o.d.source != decision_source::store) ? 1 : 0;
    }
    std::this_thread::sleep_for(20ms);
  }
  const auto promoted = clk::now();
  ASSERT_NE(cluster.master_of(victim_slot), victim) << "the replica was never promoted";
  EXPECT_EQ(slow, 0) << "longest check "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(longest).count()
                     << " ms";
  EXPECT_EQ(other_master_failures, 0);
  for (std::size_t i = 0; i < stores.size(); ++i) {
    EXPECT_GT(degraded[i], 0) << "policy " << i;
  }

  // Recovery without user action: the next checks reach the promoted replica.
  std::vector<clk::duration> recovered(stores.size(), clk::duration::max());
  const auto until = clk::now() + 10s;
  for (bool all = false; !all && clk::now() < until; std::this_thread::sleep_for(20ms)) {
    all = true;
    for (std::size_t i = 0; i < stores.size(); ++i) {
      if (recovered[i] != clk::duration::max()) continue;
      const auto r = check(stores[i], cfg, on_victim);
      EXPECT_LE(r.took, bound);
      if (!r.threw && r.d.source == decision_source::store) {
        recovered[i] = clk::now() - promoted;
      } else {
        all = false;
      }
    }
  }
  // The dead master left the slot map: no store keeps its pool (or probes it).
  const std::string victim_name = "127.0.0.1:" + std::to_string(victim);
  for (auto& s : stores) {
    // (Every live node agrees on the new map soon after the promotion.)
    std::vector<std::string> known;
    for (const auto until = clk::now() + 10s; clk::now() < until;
         std::this_thread::sleep_for(50ms)) {
      s.refresh_topology();
      known = s.known_nodes();
      if (std::count(known.begin(), known.end(), victim_name) == 0) break;
    }
    EXPECT_EQ(std::count(known.begin(), known.end(), victim_name), 0) << victim_name;
    EXPECT_EQ(known.size(), 3u);
  }
  for (std::size_t i = 0; i < stores.size(); ++i) {
    ASSERT_NE(recovered[i], clk::duration::max()) << "policy " << i << " never recovered";
    const auto s = stores[i].stats();
    std::cout << "[ failover ] policy " << i << ": " << degraded[i]
              << " degraded checks in the gap, recovered "
              << std::chrono::duration_cast<std::chrono::milliseconds>(recovered[i]).count()
              << " ms after promotion; errors " << s.errors << ", short-circuited "
              << s.short_circuited << ", breaker opened " << s.breaker_opened << ", MOVED "
              << s.moved << ", slot-map reads " << s.topology_refreshes << "\n";
  }
  std::cout << "[ failover ] promotion took "
            << std::chrono::duration_cast<std::chrono::milliseconds>(promoted - killed).count()
            << " ms; longest check "
            << std::chrono::duration_cast<std::chrono::milliseconds>(longest).count() << " ms\n";
}

}  // namespace
