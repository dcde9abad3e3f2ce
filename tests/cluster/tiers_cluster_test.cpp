// SPDX-License-Identifier: Apache-2.0
// Tiers on a real 3-master Redis Cluster: random traces with tier moves and
// runtime tier changes, with keys on every master, decide exactly as
// memory_store<tiered<P>>; a tiered_limiter on the cluster follows runtime
// changes while threads check one key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "ratelimit/tiers.hpp"
#include "support/tier_trace.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

redis::cluster_options cluster_opts(std::string_view what) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rltc:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  return o;
}

template <class P>
class TiersClusterDifferential : public ::testing::Test {};
using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(TiersClusterDifferential, policies);

// Verifies identical decisions, every field, with keys spread over the masters.
TYPED_TEST(TiersClusterDifferential, MatchesMemoryStoreWithTierChanges) {
  using P = TypeParam;
  redis::cluster_store store(cluster_opts(P::name));
  const int traces = rltest::diff_traces(80);
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7717u + 11u);
    const auto tr = rltest::tiers::random_trace<P>(rng, std::to_string(seed) + ":");
    const auto expected = rltest::tiers::replay_memory<P>(tr);
    const auto got = rltest::tiers::replay_store<P>(tr, store);
    for (std::size_t i = 0; i < tr.events.size(); ++i) {
      ASSERT_EQ(rltest::tiers::describe(got[i]), rltest::tiers::describe(expected[i]))
          << P::name << " seed " << seed << " " << rltest::tiers::describe_event(tr, i);
    }
  }
}

// Verifies a tiered_limiter on the cluster under runtime changes from one
// thread while three check one key at one instant: across GCRA conversions
// the key admits between 4 and 6 (as many as its configs' bursts), and every
// snapshot is freed.
TEST(TiersCluster, ChangesWhileThreadsCheck) {
  const auto cfg = [](units burst) {
    return gcra::config{rate(burst, std::chrono::hours(1)), bucket_options{burst, "plans"}};
  };
  // 4/h (T = 15 min) and 6/h (T = 10 min), both with a tolerance of 1 h: the
  // TAT never passes t0 + 1 h (so no conversion changes it) and every
  // admission adds 10 or 15 min to it, so 4 to 6 pass, whatever the order.
  tiered_limiter<gcra, redis::cluster_store> l(
      {{"a", cfg(4)}}, [](std::string_view) { return std::string_view("a"); }, {},
      redis::cluster_store(cluster_opts("threads")));
  const microseconds t0{1'732'950'000'000'000};
  std::atomic<bool> stop{false};
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 3; ++th) {
    threads.emplace_back([&] {
      int i = 0;
      while (!stop.load() || i < 30) {
        const decision d = l.try_acquire("shared", t0);
        EXPECT_EQ(d.source, decision_source::store);
        if (d.allowed) admitted.fetch_add(1);
        ++i;
      }
    });
  }
  for (int i = 0; i < 40; ++i) l.set_tier("a", cfg(i % 2 == 0 ? 6 : 4));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_GE(admitted.load(), 4);
  EXPECT_LE(admitted.load(), 6);
  EXPECT_EQ(l.table().live_snapshots(), 1U);
}

}  // namespace
