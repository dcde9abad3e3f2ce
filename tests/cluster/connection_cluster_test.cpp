// SPDX-License-Identifier: Apache-2.0
// The cluster store's per-node connections against a real Redis Cluster: idle
// connections closed by the nodes are replaced, and a master that cannot
// serve checks (BUSY) is a node failure, not a script error.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
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

/// Checks of many keys (every master) from several threads; returns how many
/// were not decided by Redis.
int spread_checks(redis::cluster_store& store) {
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t) {
    ts.emplace_back([&store, &bad, t] {
      const gcra::config cfg("1000000/1s", bucket_options{.name = "c"});
      for (int i = 0; i < 50; ++i) {
        try {
          const auto d = store.apply(cfg, "idle" + std::to_string(t * 100 + i), store_time, 1,
                                     access::consume);
          if (d.source != decision_source::store) ++bad;
        } catch (const store_error&) {
          ++bad;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  return bad.load();
}

/// Normal client connections of the node on `port`, CLIENT LIST's own included.
int normal_clients(int port) {
  const std::string list = rltest::redis_cluster::ask(port, {"CLIENT", "LIST", "TYPE", "normal"});
  int n = 0;
  for (std::size_t at = list.find("id="); at != std::string::npos; at = list.find("id=", at + 1)) {
    ++n;
  }
  return n;
}

void set_on_every_node(const char* name, const char* value) {
  auto& cluster = rltest::shared_cluster();
  for (const int p : cluster.live_ports()) {
    ASSERT_EQ(rltest::redis_cluster::ask(p, {"CONFIG", "SET", name, value}), "OK") << p;
  }
}

// Verifies that pooled connections the nodes closed after their idle
// `timeout` are replaced without an error or a breaker opening.
TEST(ClusterConnection, IdleConnectionsClosedByTheNodesAreReplaced) {
  auto o = rltest::shared_cluster().options();
  o.node.on_failure = redis::failure_policy::throw_error;
  redis::cluster_store store(o);
  ASSERT_EQ(spread_checks(store), 0);
  set_on_every_node("timeout", "1");
  // A fault test: the nodes drop clients idle for more than 1 s (counted in
  // whole seconds, so after 2 s at most), in a cron that runs 10 times a second.
  std::this_thread::sleep_for(2500ms);
  for (const int p : rltest::shared_cluster().live_ports()) {
    const auto until = clk::now() + 10s;
    while (normal_clients(p) > 1 && clk::now() < until) std::this_thread::sleep_for(50ms);
    ASSERT_EQ(normal_clients(p), 1) << p;  // only CLIENT LIST's own
  }
  EXPECT_EQ(spread_checks(store), 0);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.breaker_opened, 0u);
  set_on_every_node("timeout", "0");
}

// Verifies that BUSY (a master stuck in a script) fails the check with a
// connection_error that counts for the node's breaker, not a script_error,
// and that the node serves checks again once the script is killed.
TEST(ClusterConnection, BusyMasterIsANodeFailure) {
  auto& cluster = rltest::shared_cluster();
  auto o = cluster.options();
  o.node.on_failure = redis::failure_policy::throw_error;
  o.node.command_timeout = 2000ms;
  o.node.breaker_threshold = 100;  // keep trying the node
  redis::cluster_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "c"});
  ASSERT_EQ(store.apply(cfg, "busy", store_time, 1, access::consume).source,
            decision_source::store);
  // Every node runs an endless script, so whichever master owns the key is stuck.
  const std::vector<int> ports = cluster.live_ports();
  for (const int p : ports) {
    ASSERT_EQ(rltest::redis_cluster::ask(p, {"CONFIG", "SET", "busy-reply-threshold", "10"}), "OK");
  }
  std::vector<std::thread> stuck;
  for (const int p : ports) {
    stuck.emplace_back([p] {
      try {
        (void)rltest::command(rltest::redis_cluster::node(p), {"EVAL", "while true do end", "0"});
      } catch (const store_error&) {
      }
    });
  }
  // Past busy-reply-threshold, well within cluster-node-timeout (1 s).
  std::this_thread::sleep_for(50ms);
  bool busy = false;
  try {
    (void)store.apply(cfg, "busy", store_time, 1, access::consume);
  } catch (const redis::script_error& e) {
    ADD_FAILURE() << "script_error: " << e.what();
  } catch (const redis::connection_error& e) {
    busy = std::string(e.what()).find("BUSY") != std::string::npos;
    EXPECT_TRUE(busy) << e.what();
  }
  EXPECT_TRUE(busy);
  EXPECT_GE(store.stats().errors, 1u);
  for (const int p : ports) {
    for (const auto until = clk::now() + 10s; clk::now() < until;) {
      try {
        (void)rltest::command(rltest::redis_cluster::node(p), {"SCRIPT", "KILL"});
        break;
      } catch (const store_error&) {
        std::this_thread::sleep_for(10ms);
      }
    }
  }
  for (auto& t : stuck) t.join();
  for (const int p : ports) {
    (void)rltest::redis_cluster::ask(p, {"CONFIG", "SET", "busy-reply-threshold", "5000"});
  }
  bool served = false;
  for (const auto until = clk::now() + 10s; !served && clk::now() < until;) {
    try {
      served = store.apply(cfg, "busy", store_time, 1, access::consume).source ==
               decision_source::store;
    } catch (const store_error&) {
      std::this_thread::sleep_for(20ms);
    }
  }
  EXPECT_TRUE(served) << "the node never served checks again";
}

}  // namespace
