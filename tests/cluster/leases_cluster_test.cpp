// SPDX-License-Identifier: Apache-2.0
// The lease limiter on a real 3-master Redis Cluster: the lease set and the
// rate key of one user key in one slot, decisions identical to the
// in-process limiter with user keys on every master, and exactly N leases
// granted to threads and processes on one key.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/concurrency.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "support/fork_child.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using ratelimit_test::reference::describe;
using std::chrono::microseconds;

std::string unique_prefix(std::string_view what) {
  static int n = 0;
  return "rllc:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
         std::string(what) + ":";
}

redis::cluster_options cluster_opts(std::string_view what) {
  auto o = rltest::shared_cluster().options();
  o.node.prefix = unique_prefix(what);
  o.node.on_failure = redis::failure_policy::throw_error;
  o.node.command_timeout = 5000ms;  // every answer must come from Redis, even on a loaded machine
  return o;
}

long long keyslot(int port, std::string_view key) {
  const auto r = rltest::command(rltest::redis_cluster::node(port), {"CLUSTER", "KEYSLOT", key});
  EXPECT_EQ(r->type, REDIS_REPLY_INTEGER);
  return r->integer;
}

const timestamp t0{1'700'000'000'000'000};

using rated = concurrency_limiter<gcra, redis::cluster_store>;

rated make_rated(const redis::cluster_store& store) {
  return rated{concurrency_config{3, 10s, concurrency_options{.name = "calls"}},
               gcra::config{"5/1min", bucket_options{.name = "calls"}}, store};
}

// Verifies that the lease set and the rate key share the user key's slot.
TEST(LeasesCluster, BothKeysAreInTheUserKeysSlot) {
  const int port = rltest::shared_cluster().ports().front();
  redis::cluster_store store(cluster_opts("slot"));
  auto c = make_rated(store);
  const leases<gcra>::config req(c.settings(), lease_op::acquire, "id");
  for (const std::string user : {"+15551234567", "a{b}c", "}alice", "{}", "two words"}) {
    const auto keys = store.keys_for(req, user);
    ASSERT_EQ(keys.size(), 2u);
    EXPECT_EQ(keyslot(port, keys[0]), keyslot(port, keys[1])) << keys[0];
    EXPECT_EQ(keyslot(port, keys[0]), store.slot_for(req, user));
    // And the script runs there (no CROSSSLOT).
    EXPECT_TRUE(c.acquire(user, "id", t0).allowed) << keys[0];
    EXPECT_TRUE(c.release(user, "id", t0).allowed) << keys[0];
  }
}

// Verifies identical decisions to the in-process limiter on a random trace
// over user keys spread across the masters.
TEST(LeasesCluster, DifferentialAgainstTheInProcessLimiter) {
  redis::cluster_store store(cluster_opts("diff"));
  auto red = make_rated(store);
  concurrency_limiter<gcra> mem{concurrency_config{3, 10s, concurrency_options{.name = "calls"}},
                                gcra::config{"5/1min", bucket_options{.name = "calls"}}};
  std::set<std::uint16_t> slots;
  std::vector<std::string> users;
  for (int i = 0; i < 9; ++i) users.push_back("user-" + std::to_string(i));
  for (const auto& u : users) slots.insert(store.slot_for<leases<gcra>>(u));
  ASSERT_GE(slots.size(), 3u);
  std::mt19937 rng(7);
  timestamp t = t0;
  std::map<std::string, lease_hint> hints;
  lease_hint unused;
  for (int i = 0; i < 600; ++i) {
    t += microseconds{static_cast<std::int64_t>(rng() % 8) * 250'000};
    const std::string& key = users[rng() % users.size()];
    const std::string id = "call-" + std::to_string(rng() % 5);
    const auto op = static_cast<unsigned>(rng() % 10);
    decision a;
    decision b;
    // Every other operation through lease_hint in process (hints[key] is
    // the last acquire's on that key, any id); the cluster ignores hints.
    const bool hinted = i % 2 == 0;
    lease_hint& h = hints[key];
    if (op < 6) {
      a = hinted ? mem.acquire(key, id, t, h) : mem.acquire(key, id, t);
      b = hinted ? red.acquire(key, id, t, unused) : red.acquire(key, id, t);
    } else if (op < 9) {
      a = hinted ? mem.release(key, id, t, h) : mem.release(key, id, t);
      b = hinted ? red.release(key, id, t, unused) : red.release(key, id, t);
    } else {
      a = hinted ? mem.renew(key, id, t, h) : mem.renew(key, id, t);
      b = hinted ? red.renew(key, id, t, unused) : red.renew(key, id, t);
    }
    ASSERT_EQ(a, b) << "step " << i << ": memory " << describe(a) << " cluster " << describe(b);
  }
  EXPECT_FALSE(unused.filled());
}

/// Unique lease ids on one key from 8 threads; returns the grants.
long grab(rated& c, int process) {
  std::atomic<long> won{0};
  std::vector<std::thread> pool;
  for (int th = 0; th < 8; ++th) {
    pool.emplace_back([&, th] {
      for (int j = 0; j < 20; ++j) {
        const std::string id = std::to_string(process) + "/" + std::to_string(th) + "/" +
                               std::to_string(j);
        if (c.acquire("+15551234567", id, t0).allowed) ++won;
      }
    });
  }
  for (auto& t : pool) t.join();
  return won.load();
}

// Verifies that 16 threads in 2 processes (each with its own store) are
// granted exactly N = 3 leases on one key (the rate, 5, does not bind).
TEST(LeasesCluster, ProcessesAndThreadsGrantExactlyN) {
  const auto o = cluster_opts("procs");
  const long total = rltest::sum_in_children(2, [&](int p) {
    redis::cluster_store store(o);
    auto c = make_rated(store);
    return grab(c, p);
  });
  EXPECT_EQ(total, 3);
  // And threads of this process on another key of the same store.
  redis::cluster_store store(o);
  auto c = make_rated(store);
  std::atomic<long> won{0};
  std::vector<std::thread> pool;
  for (int th = 0; th < 8; ++th) {
    pool.emplace_back([&, th] {
      for (int j = 0; j < 20; ++j) {
        if (c.acquire("other", std::to_string(th * 100 + j), t0).allowed) ++won;
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(won.load(), 3);
}

}  // namespace
