// SPDX-License-Identifier: Apache-2.0
// Tests that a cluster store destroyed while memory runs short (every
// allocation of the destroying thread, and of the store's own threads,
// failing) calls each handler of a check in flight exactly once with an
// error and returns, rather than end the process.
//
// This binary replaces the global operator new (support/replaced_new.hpp):
// while `failing` is set, every allocation off the test's main thread throws
// std::bad_alloc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "support/replaced_new.hpp"

namespace {

std::atomic<bool> failing{false};
std::atomic<long> failures_injected{0};
const std::thread::id main_thread = std::this_thread::get_id();

}  // namespace

/// While `failing` is set, every allocation off the main thread fails.
bool rltest::allocation_fails() noexcept {
  if (failing.load(std::memory_order_relaxed) && std::this_thread::get_id() != main_thread) {
    failures_injected.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using rltest::redis_cluster;

/// What each handler got; sized before the allocations fail.
struct outcomes {
  explicit outcomes(std::size_t n) : calls(n, 0), errors(n), left(n) {}
  std::mutex m;
  std::condition_variable cv;
  std::vector<int> calls;
  std::vector<std::exception_ptr> errors;
  std::size_t left;
};

// Verifies that destroying a cluster store with async checks in flight (held
// by paused masters) while every allocation of the destroying thread fails
// calls each handler once with an error and returns. The retry thread's
// stop made its multiplexer_stopped and the I/O stop gathered the nodes into
// vectors, both in noexcept functions: the first std::bad_alloc ended the
// process.
TEST(ClusterAlloc, DestroyedWithChecksInFlightWhileMemoryIsShort) {
  auto& cluster = rltest::shared_cluster();
  auto o = cluster.options();
  o.node.prefix = "rlclalloc:" + std::to_string(::getpid()) + ":";
  o.node.multiplex = 1;
  o.node.command_timeout = 5000ms;
  o.node.breaker_threshold = 1000000;
  o.node.on_warning = [](std::string_view) {};
  const fixed_window::config cfg("1000000/1h", window_options{.name = "t"});
  constexpr std::size_t burst = 8;
  auto store = std::make_unique<redis::cluster_store>(o);
  for (std::size_t i = 0; i < burst; ++i) {
    ASSERT_EQ(store->apply(cfg, "k" + std::to_string(i), store_time, 1).source,
              decision_source::store);
  }
  const std::vector<int> ports = cluster.live_ports();
  for (const int p : ports) (void)redis_cluster::ask(p, {"CLIENT", "PAUSE", "1500", "WRITE"});
  outcomes out(burst);
  for (std::size_t i = 0; i < burst; ++i) {
    store->async_apply(cfg, "k" + std::to_string(i), store_time, 1, access::consume,
                       [&out, i](decision, std::exception_ptr e) {
                         std::lock_guard<std::mutex> lock(out.m);
                         ++out.calls[i];
                         out.errors[i] = std::move(e);
                         --out.left;
                         out.cv.notify_all();
                       });
  }
  std::this_thread::sleep_for(200ms);  // written, held by the paused masters
  failures_injected = 0;
  failing = true;
  std::thread destroyer([&store] { store.reset(); });
  destroyer.join();
  failing = false;
  EXPECT_GT(failures_injected.load(), 0);
  std::lock_guard<std::mutex> lock(out.m);
  EXPECT_EQ(out.left, 0u);
  for (std::size_t i = 0; i < burst; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(out.errors[i]) << i;
  }
  for (const int p : ports) (void)redis_cluster::ask(p, {"CLIENT", "UNPAUSE"});
}

}  // namespace
