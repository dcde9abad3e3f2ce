// SPDX-License-Identifier: Apache-2.0
// ratelimit-replay --decisions prints byte-identical output on the in-process store and on Redis.
#include <gtest/gtest.h>

#include <string>

#include "redis/redis_server.hpp"
#include "support/replay_compare.hpp"

// Verifies "output is identical whatever the store": every policy, with and
// without count_rejected or a burst, on a generated and a hand-written trace.
TEST(ReplayTool, DecisionsAreByteIdenticalOnMemoryAndRedis) {
  const ratelimit::redis::options o = rltest::shared_redis();
  rltest::expect_identical_replay("redis://" + o.host + ":" + std::to_string(o.port));
}
