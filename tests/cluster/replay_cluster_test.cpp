// SPDX-License-Identifier: Apache-2.0
// ratelimit-replay --decisions prints byte-identical output on the in-process store and on Redis Cluster.
#include <gtest/gtest.h>

#include <string>

#include "cluster/cluster_harness.hpp"
#include "support/replay_compare.hpp"

// Verifies "output is identical whatever the store" for
// --store redis-cluster://HOST:PORT,HOST:PORT (keys spread over 3 masters).
TEST(ReplayTool, DecisionsAreByteIdenticalOnMemoryAndRedisCluster) {
  const auto& cluster = rltest::shared_cluster();
  const std::vector<int>& ports = cluster.ports();
  const std::string url = "redis-cluster://127.0.0.1:" + std::to_string(ports.at(0)) +
                          ",127.0.0.1:" + std::to_string(ports.at(1));
  rltest::expect_identical_replay(url);
}
