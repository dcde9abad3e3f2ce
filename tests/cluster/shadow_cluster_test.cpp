// SPDX-License-Identifier: Apache-2.0
// Shadow mode on Redis Cluster: the exact rules per policy and compound, and threads on one key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/http_headers.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "ratelimit/redis/scripts/compound.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using ratelimit_test::reference::describe;
using std::chrono::microseconds;

constexpr std::int64_t s = 1'000'000;
constexpr std::int64_t t0 = 1'732'950'000'000'000;

redis::cluster_options cluster_opts(std::string_view what) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlsh:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  return o;
}

/// `n` shadow checks of `cost` on the cluster and in process, then one
/// enforced check: identical decisions, `flagged` of them shadow_rejected.
template <class P>
void same_on_cluster(const typename P::config& cfg, int n, units cost, int flagged) {
  limiter<P, redis::cluster_store> remote{cfg, redis::cluster_store{cluster_opts(P::name)}};
  limiter<P> local{cfg};
  remote.set_shadow(true);
  local.set_shadow(true);
  int seen = 0;
  for (int i = 0; i < n; ++i) {
    const microseconds at{t0 + i * 1000};
    const decision want = local.try_acquire("{user}7", at, cost);
    const decision got = remote.try_acquire("{user}7", at, cost);
    ASSERT_EQ(describe(got), describe(want)) << P::name << " check " << i;
    ASSERT_EQ(got.shadow_rejected, want.shadow_rejected);
    seen += got.shadow_rejected ? 1 : 0;
    if constexpr (requires { http::describe_policy(cfg); }) {
      ASSERT_EQ(http::headers(got, cfg), http::headers(want, cfg)) << P::name << " check " << i;
    }
  }
  EXPECT_EQ(seen, flagged) << P::name;
  remote.set_shadow(false);
  local.set_shadow(false);
  const microseconds at{t0 + n * 1000};
  const decision got = remote.try_acquire("{user}7", at, 1);
  EXPECT_EQ(describe(got), describe(local.try_acquire("{user}7", at, 1)));
  EXPECT_FALSE(got.allowed) << P::name;
}

// Verifies the exact shadow rules (and the HTTP header fields made from
// them) on the cluster for every policy and a
// compound of three (its keys in one slot), identical to the in-process limiter.
TEST(ClusterShadow, ExactRulesPerPolicy) {
  same_on_cluster<fixed_window>(fixed_window::config("3/10s", window_options{.name = "s"}), 8, 1,
                                5);
  same_on_cluster<sliding_window_log>(
      sliding_window_log::config("3/10s", window_options{.name = "s"}), 8, 1, 5);
  same_on_cluster<sliding_window_counter>(
      sliding_window_counter::config("3/10s", window_options{.name = "s"}), 8, 1, 5);
  same_on_cluster<token_bucket>(token_bucket::config("3/10s", bucket_options{.name = "s"}), 8, 2,
                                7);
  same_on_cluster<gcra>(gcra::config("3/10s", bucket_options{.name = "s"}), 8, 1, 5);
  same_on_cluster<compound<sliding_window_log, token_bucket, gcra>>(
      make_compound(compound_options{.name = "s"}, sliding_window_log::config("3/10s"),
                    token_bucket::config("5/1min"), gcra::config("4/1h")),
      8, 1, 5);
}

// Verifies shadow checks from 8 threads on one key of the cluster: all
// admitted, exactly `burst` unflagged, and the debt is their number x T.
TEST(ClusterShadow, ThreadsOnOneKey) {
  const auto o = cluster_opts("threads");
  const gcra::config cfg("10/10s", bucket_options{.name = "s"});
  limiter<gcra, redis::cluster_store> l{cfg, redis::cluster_store{o}};
  l.set_shadow(true);
  std::atomic<long> checks{0};
  std::atomic<long> flagged{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < 8; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < 40; ++j) {
        const decision d = l.try_acquire("+15551234567", microseconds{t0});
        if (!d.allowed || d.source != decision_source::store) return;
        ++checks;
        if (d.shadow_rejected) ++flagged;
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(checks.load(), 320);
  EXPECT_EQ(flagged.load(), 310);
  EXPECT_EQ(l.peek("+15551234567", microseconds{t0}).reset_after, microseconds{320 * s});
}

}  // namespace
