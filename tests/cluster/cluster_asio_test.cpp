// SPDX-License-Identifier: Apache-2.0
// ratelimit::asio over the cluster store: the same decisions as in process
// through use_awaitable and use_future, completed without blocking the
// io_context's thread (cluster_store::async_apply).
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/asio.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;

struct step {
  std::string key;
  std::int64_t t;  // us
  units cost;
};

template <class L>
::asio::awaitable<std::vector<decision>> run_trace(L& l, const std::vector<step>& trace) {
  std::vector<decision> out;
  for (const step& s : trace) {
    out.push_back(co_await ratelimit::asio::async_try_acquire(l, s.key, timestamp{s.t}, s.cost,
                                                              ::asio::use_awaitable));
  }
  co_return out;
}

// Verifies that the coroutine and future forms of ratelimit::asio give the
// in-process decisions on the cluster for a trace over keys of every master
// (edges: the microsecond before a window ends, exactly one window later, a
// cost above the limit).
TEST(AsioCluster, SameDecisionsAsInProcess) {
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlasio:" + std::to_string(::getpid()) + ":";
  const fixed_window::config cfg("3/1s", window_options{.name = "t"});
  limiter<fixed_window, redis::cluster_store, manual_clock> remote(cfg, redis::cluster_store(o));
  limiter<fixed_window, memory_store<fixed_window>, manual_clock> local(cfg);
  const std::int64_t base = 1'000'000'000;
  std::vector<step> trace;
  for (int k = 0; k < 6; ++k) {
    const std::string key = "user" + std::to_string(k);
    trace.push_back({key, base, 1});
    trace.push_back({key, base, 2});
    trace.push_back({key, base + 999'999, 1});
    trace.push_back({key, base + 1'000'000, 4});
    trace.push_back({key, base + 1'000'000, 3});
  }
  ::asio::io_context io;
  std::vector<decision> got, want;
  ::asio::co_spawn(io, run_trace(remote, trace),
                   [&](std::exception_ptr e, std::vector<decision> d) {
                     EXPECT_FALSE(e);
                     got = std::move(d);
                   });
  ::asio::co_spawn(io, run_trace(local, trace), [&](std::exception_ptr e, std::vector<decision> d) {
    EXPECT_FALSE(e);
    want = std::move(d);
  });
  io.run();
  ASSERT_EQ(got.size(), trace.size());
  ASSERT_EQ(want.size(), trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << i;
    EXPECT_EQ(got[i].source, decision_source::store) << i;
  }
  std::future<decision> f = ratelimit::asio::async_try_acquire(
      remote, "user0", timestamp{base + 1'000'001}, 1, ::asio::use_future);
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(f.get().allowed);  // 3 of 3 used at base + 1 s
  std::set<std::string> nodes;
  for (int k = 0; k < 6; ++k) {
    nodes.insert(
        remote.store().node_for_slot(remote.store().slot_for(cfg, "user" + std::to_string(k))));
  }
  EXPECT_EQ(nodes.size(), 3u);
}

// Verifies that a time only the scripts refuse (over 2^52 us, which the
// limiter itself accepts) throws from the initiating call, as on redis_store,
// and the last microsecond the scripts take is decided.
TEST(AsioCluster, TimeOnlyTheStoreRefusesThrowsFromTheCall) {
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlasio-t:" + std::to_string(::getpid()) + ":";
  const fixed_window::config cfg("5/1s", window_options{.name = "t"});
  limiter<fixed_window, redis::cluster_store> l(cfg, redis::cluster_store(o));
  const timestamp too_late{(std::int64_t{1} << 52) + 1};
  EXPECT_THROW((void)ratelimit::asio::async_try_acquire(l, "k", too_late, 1, ::asio::use_future),
               std::invalid_argument);
  std::future<decision> f = ratelimit::asio::async_try_acquire(
      l, "k", timestamp{std::int64_t{1} << 52}, 1, ::asio::use_future);
  EXPECT_TRUE(f.get().allowed);
}

}  // namespace
