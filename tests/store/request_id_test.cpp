// SPDX-License-Identifier: Apache-2.0
// Idempotent checks in process: the exact rules, retention defaults, the id
// table's cap and expiry, and 16 threads retrying one request.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "support/request_id_rules.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

TEST(RequestId, ExactRulesInProcess) {
  limiter<fixed_window> lim{rltest::request_id_rules_config()};
  rltest::check_request_id_rules(lim, "");
}

// Verifies shadow mode with request ids in process (see the helper).
TEST(RequestId, ShadowModeForcesRecordsAndShadowsRepeats) {
  limiter<fixed_window> lim{rltest::request_id_rules_config()};
  rltest::check_request_id_shadow_rules(lim, "");
}

TEST(RequestId, RetentionDefaultsToThePolicysPeriod) {
  EXPECT_EQ(limiter<sliding_window_log>(sliding_window_log::config{"10/15min"}).retention(),
            microseconds{900'000'000});
  EXPECT_EQ(limiter<gcra>(gcra::config{"5/2s"}).retention(), microseconds{2'000'000});
  EXPECT_EQ(limiter<token_bucket>(token_bucket::config{"5/3s"}).retention(),
            microseconds{3'000'000});
  EXPECT_EQ(limiter<sliding_window_counter>(sliding_window_counter::config{"5/min"}).retention(),
            microseconds{60'000'000});
  // A compound: the longest sub-limit, in either form.
  EXPECT_EQ(limiter<compound_of<sliding_window_log>>(
                compound_of<sliding_window_log>::config{"10/15min", "100/day", "3/s"})
                .retention(),
            microseconds{86'400'000'000});
  using mixed = compound<fixed_window, gcra>;
  EXPECT_EQ(
      limiter<mixed>(mixed::config{fixed_window::config{"10/h"}, gcra::config{"1/s"}}).retention(),
      microseconds{3'600'000'000});
}

TEST(RequestId, RetentionIsSetPerLimiter) {
  limiter<fixed_window> lim{fixed_window::config{"100/s"}};
  lim.set_idempotency({.retention = microseconds{250}});
  EXPECT_EQ(lim.retention(), microseconds{250});
  const timestamp t0{1'000'000};
  EXPECT_FALSE(lim.try_acquire("k", request_id{"r"}, t0).repeat);
  EXPECT_TRUE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{249}).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{250}).repeat);
  EXPECT_THROW(lim.set_idempotency({.retention = microseconds{-1}}), std::invalid_argument);
  EXPECT_THROW(lim.set_idempotency({.stripes = 65537}), std::invalid_argument);
}

TEST(RequestId, DegradedDecisionsAreNotRecorded) {
  // A full memory_store answers new keys with fail_closed: no id is kept, so
  // the retry is decided again once there is room.
  limiter<fixed_window> lim{
      fixed_window::config{"5/s"},
      memory_store<fixed_window>{{.max_keys = 1, .on_full = when_full::fail_closed}}};
  const timestamp t0{10'000'000};
  EXPECT_TRUE(lim.try_acquire("a", t0).allowed);
  const decision full = lim.try_acquire("b", request_id{"r"}, t0);
  EXPECT_EQ(full.source, decision_source::fail_closed);
  EXPECT_FALSE(full.repeat);
  lim.reset("a");
  const decision later = lim.try_acquire("b", request_id{"r"}, t0 + microseconds{1});
  EXPECT_EQ(later.source, decision_source::store);
  EXPECT_TRUE(later.allowed);
  EXPECT_FALSE(later.repeat);
}

TEST(RequestId, AtTheCapANewIdEvictsOneOfItsStripe) {
  limiter<fixed_window> lim{fixed_window::config{"1000/s"}};
  lim.set_idempotency({.max_ids = 3, .stripes = 1});
  const timestamp t0{5'000'000};
  EXPECT_FALSE(lim.try_acquire("k", request_id{"1"}, t0).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"2"}, t0 + microseconds{1}).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"3"}, t0 + microseconds{2}).repeat);
  EXPECT_EQ(lim.peek("k", t0 + microseconds{3}).remaining, 996);  // after the peeked one
  EXPECT_EQ(lim.request_ids_held(), 3U);
  // A fourth id evicts one of the three (the one ending first among the 8
  // slots examined, which depend on the table's secret hash key).
  EXPECT_FALSE(lim.try_acquire("k", request_id{"4"}, t0 + microseconds{3}).repeat);
  EXPECT_EQ(lim.request_ids_held(), 3U);
  const auto forgotten = [&](std::initializer_list<const char*> ids, timestamp at) {
    std::string out;
    for (const char* id : ids) {
      if (!lim.peek("k", request_id{id}, at).repeat) out += id;
    }
    return out;
  };
  EXPECT_TRUE(lim.peek("k", request_id{"4"}, t0 + microseconds{4}).repeat);
  const std::string evicted = forgotten({"1", "2", "3"}, t0 + microseconds{4});
  ASSERT_EQ(evicted.size(), 1U) << evicted;
  // The evicted id is decided as a new request: it consumes again, and
  // evicts another one.
  const decision retried = lim.try_acquire("k", request_id{evicted}, t0 + microseconds{4});
  EXPECT_FALSE(retried.repeat);
  EXPECT_EQ(retried.remaining, 995);
  EXPECT_EQ(lim.request_ids_held(), 3U);
  EXPECT_EQ(forgotten({"1", "2", "3", "4"}, t0 + microseconds{5}).size(), 1U);
}

TEST(RequestId, ManyIdsKeepProbesShort) {
  limiter<fixed_window> lim{fixed_window::config{"1000000/h"}};
  lim.set_idempotency({.stripes = 4});
  const timestamp t0{5'000'000};
  for (int i = 0; i < 20000; ++i) {
    (void)lim.try_acquire("+15551234567", request_id{"id" + std::to_string(i)}, t0);
  }
  EXPECT_EQ(lim.request_ids_held(), 20000U);
  // Linear probing at most half full: runs stay far below the table's size.
  EXPECT_LT(lim.request_id_table()->longest_probe(), 100U);
  for (int i = 0; i < 20000; i += 97) {
    EXPECT_TRUE(lim.try_acquire("+15551234567", request_id{"id" + std::to_string(i)}, t0).repeat);
  }
}

TEST(RequestId, IdsExpireWithTheirRetention) {
  limiter<gcra> lim{gcra::config{"1000/s"}};
  lim.set_idempotency({.retention = microseconds{1000}, .stripes = 1});
  const timestamp t0{1'000'000};
  for (int i = 0; i < 100; ++i) {
    (void)lim.try_acquire("k", request_id{std::to_string(i)}, t0 + microseconds{i});
  }
  // Each new id drops up to 4 ids whose retention ended a retention ago: the
  // table follows the live ids.
  for (int i = 0; i < 100; ++i) {
    (void)lim.try_acquire("k", request_id{"later" + std::to_string(i)},
                          t0 + microseconds{5000 + i});
  }
  // Only the 100 recent ids remain, never the 200 recorded.
  EXPECT_EQ(lim.request_ids_held(), 100U);
  EXPECT_TRUE(lim.try_acquire("k", request_id{"later1"}, t0 + microseconds{5999}).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"1"}, t0 + microseconds{5999}).repeat);
}

TEST(RequestId, SixteenThreadsRetryingOneRequestConsumeOnce) {
  for (int round = 0; round < 20; ++round) {
    limiter<sliding_window_log> lim{sliding_window_log::config{"100/min"}};
    const timestamp t0{60'000'000};
    std::atomic<int> firsts{0};
    std::atomic<int> repeats{0};
    std::vector<std::thread> pool;
    for (int i = 0; i < 16; ++i) {
      pool.emplace_back([&] {
        const decision d = lim.try_acquire("+15551234567", request_id{"call-1;1 INVITE"}, t0);
        ++(d.repeat ? repeats : firsts);
      });
    }
    for (auto& t : pool) t.join();
    EXPECT_EQ(firsts.load(), 1);
    EXPECT_EQ(repeats.load(), 15);
    EXPECT_EQ(lim.peek("+15551234567", t0).remaining, 98);  // after the peeked one
  }
}

TEST(RequestId, ThreadsWithDistinctIdsOnOneKeyConsumeEach) {
  limiter<fixed_window> lim{fixed_window::config{"1000000/min"}};
  const timestamp t0{60'000'000};
  std::vector<std::thread> pool;
  for (int i = 0; i < 8; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < 500; ++j) {
        // Each id twice: the second is a repeat.
        const std::string id = std::to_string(i) + ":" + std::to_string(j);
        EXPECT_FALSE(lim.try_acquire("k", request_id{id}, t0).repeat);
        EXPECT_TRUE(lim.try_acquire("k", request_id{id}, t0).repeat);
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(lim.peek("k", t0).remaining, 1000000 - 8 * 500 - 1);
}

}  // namespace
