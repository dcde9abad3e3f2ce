// SPDX-License-Identifier: Apache-2.0
// Idempotent checks on a real 3-master Redis Cluster: the exact rules, the id
// key in the user key's slot, the wrapped scripts reloaded on every node, two
// processes retrying one request on each master, and random traces decided as
// the in-process limiter decides them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "support/request_id_rules.hpp"
#include "support/request_id_traces.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

redis::cluster_options options_for(std::string_view what) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlci:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  return o;
}

TEST(ClusterRequestId, ExactRules) {
  // Three prefixes of the user keys, so the rules run against several masters.
  for (const char* p : {"a/", "bb/", "ccc/"}) {
    limiter<fixed_window, redis::cluster_store> lim{rltest::request_id_rules_config(),
                                                    redis::cluster_store{options_for("rules")}};
    rltest::check_request_id_rules(lim, p);
  }
}

// Verifies shadow mode with request ids on the cluster.
TEST(ClusterRequestId, ShadowModeForcesRecordsAndShadowsRepeats) {
  limiter<fixed_window, redis::cluster_store> lim{rltest::request_id_rules_config(),
                                                  redis::cluster_store{options_for("shadow")}};
  rltest::check_request_id_shadow_rules(lim, "s/");
}

TEST(ClusterRequestId, IdKeyIsInTheUserKeysSlot) {
  redis::cluster_store store(options_for("slot"));
  const gcra::config cfg{"5/s", bucket_options{.name = "ids"}};
  for (const std::string key : {"+15551234567", "}{x", "{}", "a{b}c"}) {
    const std::string base = store.key_for(cfg, key);
    const std::string id_key = redis::detail::request_id_key(base, "INVITE}{1");
    EXPECT_EQ(redis::key_slot(id_key), redis::key_slot(base)) << key;
    // And the script writes exactly that key.
    const decision d = store.apply_once(cfg, key, request_id{"INVITE}{1"}, microseconds{1'000'000},
                                        timestamp{1'700'000'000'000'000}, 1);
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.source, decision_source::store);
    EXPECT_TRUE(store
                    .apply_once(cfg, key, request_id{"INVITE}{1"}, microseconds{1'000'000},
                                timestamp{1'700'000'000'000'001}, 1)
                    .repeat);
  }
}

TEST(ClusterRequestId, WrappedScriptsAreReloadedOnEveryNode) {
  redis::cluster_store store(options_for("flush"));
  const fixed_window::config cfg{"5/s", window_options{.name = "ids"}};
  const timestamp t0{1'700'000'000'000'000};
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) keys.push_back("k" + std::to_string(i));
  for (const auto& k : keys)
    (void)store.apply_once(cfg, k, request_id{"1"}, microseconds{1'000'000}, t0, 1);
  for (const int p : rltest::shared_cluster().ports()) {
    redis::options node;
    node.host = "127.0.0.1";
    node.port = p;
    rltest::command(node, {"SCRIPT", "FLUSH"});
  }
  for (const auto& k : keys) {
    const decision d = store.apply_once(cfg, k, request_id{"1"}, microseconds{1'000'000}, t0, 1);
    EXPECT_EQ(d.source, decision_source::store) << k;
    EXPECT_TRUE(d.repeat) << k;
  }
  EXPECT_GE(store.stats().script_reloads, 1u);
}

// Verifies atomicity on each master: 2 processes x 8 threads retrying one
// request consume once.
TEST(ClusterRequestId, TwoProcessesSixteenThreadsRetryingOneRequestConsumeOnce) {
  const auto o = options_for("procs");
  const sliding_window_log::config cfg{"100/1h", window_options{.name = "ids"}};
  const timestamp t0{1'700'000'000'000'000};
  redis::cluster_store probe(o);
  probe.refresh_topology();
  std::set<std::string> nodes;
  for (int i = 0; nodes.size() < 3 && i < 1000; ++i) {
    const std::string key = "hot" + std::to_string(i);
    if (!nodes.insert(probe.node_for_slot(probe.slot_for<sliding_window_log>(key))).second) {
      continue;
    }
    std::vector<std::pair<pid_t, int>> children;
    for (int p = 0; p < 2; ++p) {
      int fds[2];
      ASSERT_EQ(::pipe(fds), 0);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(fds[0]);
        long firsts = -1;
        try {
          redis::cluster_store store(o);
          std::atomic<long> n{0};
          std::vector<std::thread> pool;
          for (int t = 0; t < 8; ++t) {
            pool.emplace_back([&] {
              const decision d = store.apply_once(cfg, key, request_id{"call;1 INVITE"},
                                                  microseconds{3'600'000'000}, t0, 1);
              if (d.source != decision_source::store) {
                n += 1000;
              } else if (!d.repeat) {
                ++n;
              }
            });
          }
          for (auto& t : pool) t.join();
          firsts = n.load();
        } catch (...) {
        }
        (void)!::write(fds[1], &firsts, sizeof firsts);
        ::_exit(0);
      }
      ::close(fds[1]);
      children.emplace_back(pid, fds[0]);
    }
    long total = 0;
    for (auto [pid, fd] : children) {
      long n = -1;
      EXPECT_EQ(::read(fd, &n, sizeof n), static_cast<ssize_t>(sizeof n));
      EXPECT_GE(n, 0);
      total += n;
      ::close(fd);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
    EXPECT_EQ(total, 1) << key;
    redis::cluster_store store(o);
    EXPECT_EQ(store.apply(cfg, key, t0, 1, access::peek).remaining, 98) << key;
  }
  EXPECT_EQ(nodes.size(), 3u);
}

TEST(ClusterRequestId, MatchesTheInProcessLimiterOnRandomTraces) {
  redis::cluster_store store(options_for("diff"));
  const int traces = rltest::diff_traces(60);
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 15485863u + 11u);
    switch (seed % 3) {
      case 0:
        rltest::compare_id_traces(rltest::random_id_config<gcra>(rng), rng, store, seed);
        break;
      case 1:
        rltest::compare_id_traces(rltest::random_id_config<sliding_window_log>(rng), rng, store,
                                  seed);
        break;
      default: {
        const compound_of<fixed_window>::config cfg{{"2/s", "4/10s"}, window_options{.name = "d"}};
        rltest::compare_id_traces(cfg, rng, store, seed);
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
