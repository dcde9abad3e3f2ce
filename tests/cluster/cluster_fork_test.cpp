// SPDX-License-Identifier: Apache-2.0
// fork() with a cluster store whose background threads run: the child can
// destroy it without hanging, gets a clear error when using it, can use a new
// store, and the parent's store keeps working.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "cluster_harness.hpp"
#include "cluster_test_access.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "support/eventually.hpp"
#include "support/fork_child.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using std::chrono::microseconds;
using access_t = redis::detail::cluster_test_access;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

redis::cluster_options cluster_opts(std::string_view what) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlfork:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  return o;
}

/// A store with a slot map, pooled connections on every master, its refresher
/// thread asleep between reads and its prober thread asleep between probes.
void start_every_thread(redis::cluster_store& store) {
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  for (int i = 0; i < 30; ++i) {
    (void)store.apply(cfg, "warm" + std::to_string(i), microseconds{t0}, 1);
  }
  access_t::request_refresh(store);
  ASSERT_TRUE(rltest::eventually([&] { return store.stats().topology_refreshes >= 2; }));
  access_t::open_breakers(store);
  // The masters answer, so each probe closes its breaker; the thread stays.
  ASSERT_TRUE(rltest::eventually([&] { return store.stats().probes >= 3; }));
}

// Verifies the child of a fork made while the store's refresher and prober
// threads exist can destroy the store: it neither joins those threads (absent
// in the child) nor waits on their condition variables.
TEST(ClusterFork, ChildDestroysAStoreWhoseThreadsRun) {
  auto store = std::make_unique<redis::cluster_store>(cluster_opts("destroy"));
  start_every_thread(*store);
  const rltest::child_end end = rltest::in_child([&] {
    store.reset();
    return 0;
  });
  EXPECT_FALSE(end.hung) << "the child hung destroying the store";
  EXPECT_EQ(end.status, 0);
  // The parent's store, its threads and connections are untouched.
  const decision d = store->apply(token_bucket::config("5/1s", bucket_options{.name = "t"}),
                                  "after", microseconds{t0}, 1);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_TRUE(d.allowed);
}

// Verifies an inherited store refuses use in the child (its pooled sockets are
// the parent's) with std::logic_error, while a store made in the child works,
// and that the parent's store state and connections are unchanged afterwards.
TEST(ClusterFork, ChildUsingAnInheritedStoreGetsALogicErrorAndANewStoreWorks) {
  const auto o = cluster_opts("use");
  redis::cluster_store store(o);
  start_every_thread(store);
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 4);
  ASSERT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 3);
  const rltest::child_end end = rltest::in_child([&] {
    const auto refused = [](auto&& f) {
      try {
        f();
      } catch (const std::logic_error&) {
        return true;
      } catch (...) {
      }
      return false;
    };
    if (!refused([&] { (void)store.apply(cfg, "k", microseconds{t0}, 1); })) return 1;
    if (!refused([&] { (void)store.apply(cfg, "k", store_time, 1); })) return 2;
    const redis::batch_item items[] = {{"k", 1, microseconds{t0}}};
    if (!refused([&] { (void)store.apply_batch(cfg, items); })) return 3;
    if (!refused([&] { store.reset(cfg, "k"); })) return 4;
    if (!refused([&] { store.ping(); })) return 5;
    if (!refused([&] { store.refresh_topology(); })) return 6;
    redis::cluster_store fresh(o);
    const decision d = fresh.apply(cfg, "child", microseconds{t0}, 1);
    if (d.source != decision_source::store || d.remaining != 4) return 7;
    return 0;
  });
  ASSERT_FALSE(end.hung) << "the child hung";
  EXPECT_EQ(end.status, 0) << "1-6: an inherited store was used without error; 7: a new store "
                              "made in the child failed";
  // Nothing the child did reached "k", and every pooled connection still
  // pairs each command with its own reply.
  for (std::int64_t want = 2; want >= 0; --want) {
    const decision d = store.apply(cfg, "k", microseconds{t0}, 1);
    EXPECT_EQ(d.source, decision_source::store);
    EXPECT_EQ(d.remaining, want);
  }
  EXPECT_EQ(store.stats().errors, 0u);
}

}  // namespace
