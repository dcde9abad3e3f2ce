// SPDX-License-Identifier: Apache-2.0
// fork() with a Redis store whose prober runs and with a memory store: the
// child can destroy them without hanging, gets a clear error when using an
// inherited Redis store, can use a new one, and the parent's store keeps working.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "redis_server.hpp"
#include "support/eventually.hpp"
#include "support/fork_child.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using std::chrono::microseconds;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

redis::options live(std::string_view what) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(what);
  return o;
}

// Verifies the child of a fork made while a store's prober thread exists (its
// breaker open on an unreachable server) and while another store holds pooled
// connections can destroy both without joining or waiting on the parent's threads.
TEST(RedisFork, ChildDestroysStoresWhoseProberRuns) {
  redis::options down;
  down.port = rltest::free_port();  // nothing listens there
  down.connect_timeout = 200ms;
  down.command_timeout = 200ms;
  down.on_failure = redis::failure_policy::fail_open;
  auto broken = std::make_unique<redis::redis_store>(down);
  auto working = std::make_unique<redis::redis_store>(live("destroy"));
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  ASSERT_TRUE(working->apply(cfg, "k", microseconds{t0}, 1).allowed);
  while (!broken->circuit_open()) (void)broken->apply(cfg, "k", microseconds{t0}, 1);
  ASSERT_TRUE(rltest::eventually([&] { return broken->stats().probes >= 1; }));
  const rltest::child_end end = rltest::in_child([&] {
    broken.reset();
    working.reset();
    return 0;
  });
  EXPECT_FALSE(end.hung) << "the child hung destroying a store";
  EXPECT_EQ(end.status, 0);
  EXPECT_EQ(working->apply(cfg, "k", microseconds{t0}, 1).remaining, 3);
  EXPECT_TRUE(broken->circuit_open());
}

// Verifies an inherited store refuses use in the child with std::logic_error
// (its pooled connection is the parent's: a command written there would be
// answered on the parent's socket), a store made in the child works, and the
// parent's key and connection are unchanged afterwards.
TEST(RedisFork, ChildUsingAnInheritedStoreGetsALogicErrorAndANewStoreWorks) {
  const redis::options o = live("use");
  redis::redis_store store(o);
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
    redis::redis_store fresh(o);
    const decision d = fresh.apply(cfg, "child", microseconds{t0}, 1);
    if (d.source != decision_source::store || d.remaining != 4) return 6;
    return 0;
  });
  ASSERT_FALSE(end.hung) << "the child hung";
  EXPECT_EQ(end.status, 0) << "1-5: an inherited store was used without error; 6: a new store "
                              "made in the child failed";
  for (std::int64_t want = 2; want >= 0; --want) {
    const decision d = store.apply(cfg, "k", microseconds{t0}, 1);
    EXPECT_EQ(d.source, decision_source::store);
    EXPECT_EQ(d.remaining, want);
  }
  EXPECT_EQ(store.stats().errors, 0u);
}

// Verifies an in-process store (no threads, no sockets) inherited by a child
// can be used there, on the child's copy of the state, and destroyed.
TEST(MemoryFork, ChildUsesAndDestroysAnInheritedStore) {
  auto store = std::make_unique<memory_store<token_bucket>>();
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  ASSERT_EQ(store->apply(cfg, "k", microseconds{t0}, 1, access::consume).remaining, 4);
  const rltest::child_end end = rltest::in_child([&] {
    if (store->apply(cfg, "k", microseconds{t0}, 1, access::consume).remaining != 3) return 1;
    store.reset();
    return 0;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.status, 0);
  EXPECT_EQ(store->apply(cfg, "k", microseconds{t0}, 1, access::consume).remaining, 3);
}

}  // namespace
