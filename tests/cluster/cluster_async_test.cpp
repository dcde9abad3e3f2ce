// SPDX-License-Identifier: Apache-2.0
// Multiplexed and async checks on a real Redis Cluster: exact admission
// across threads and processes, a node's connection killed mid-pipeline,
// MOVED and ASK followed from completions, a node that is down, destruction
// and fork with checks in flight, the limiter's async forms, and the
// `multiplex` URL parameter.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "cluster_test_access.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "support/async_outcomes.hpp"
#include "support/eventually.hpp"
#include "support/fork_child.hpp"

namespace {

using namespace ratelimit;
using rltest::holds;
using rltest::outcomes;
using namespace std::chrono_literals;
using rltest::redis_cluster;
using std::chrono::microseconds;
using access_t = redis::detail::cluster_test_access;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

redis::cluster_options cluster_opts(std::string_view what, std::size_t multiplex = 1) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlasync:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  o.node.multiplex = multiplex;
  return o;
}

/// A CLUSTER SLOTS reply giving every slot to 127.0.0.1:`port`.
redis::reply_ptr whole_map_on(int port) {
  const std::string p = std::to_string(port);
  const std::string resp = "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + p + "\r\n";
  redisReader* reader = redisReaderCreate();
  void* got = nullptr;
  if (reader == nullptr || redisReaderFeed(reader, resp.data(), resp.size()) != REDIS_OK ||
      redisReaderGetReply(reader, &got) != REDIS_OK || got == nullptr) {
    if (reader != nullptr) redisReaderFree(reader);
    throw std::runtime_error("cannot build a CLUSTER SLOTS reply");
  }
  redisReaderFree(reader);
  return redis::reply_ptr(static_cast<redisReply*>(got));
}

/// A port on 127.0.0.1 where nothing listens.
int closed_port() {
  return rltest::free_port();
}

// ---- URL ---------------------------------------------------------------------

// Verifies `?multiplex=N` on both cluster schemes, beside the TLS parameters,
// and that bad values are refused naming the value.
TEST(ClusterMultiplexUrl, ParsesMultiplexOnBothSchemes) {
  auto o = redis::parse_cluster_url("redis-cluster://a:7000,b:7001?multiplex=4");
  EXPECT_EQ(o.node.multiplex, 4u);
  EXPECT_EQ(o.seeds.size(), 2u);
  EXPECT_EQ(o.seeds[1].port, 7001);
  EXPECT_FALSE(o.node.tls.enabled);
  o = redis::parse_cluster_url("redis-cluster://u:p@a:7000");
  EXPECT_EQ(o.node.multiplex, 0u);
  EXPECT_EQ(o.node.password, "p");
  o = redis::parse_cluster_url("rediss-cluster://a:7000?sni=x&multiplex=256&verify=chain");
  EXPECT_EQ(o.node.multiplex, 256u);
  EXPECT_TRUE(o.node.tls.enabled);
  EXPECT_EQ(o.node.tls.server_name, "x");
  EXPECT_EQ(o.node.tls.verify, redis::tls_verify::chain);
  o = redis::parse_cluster_url("rediss-cluster://a:7000?multiplex=0");
  EXPECT_EQ(o.node.multiplex, 0u);
  for (const char* bad :
       {"redis-cluster://a?multiplex=257",
        "redis-cluster://a?multiplex=", "redis-cluster://a?multiplex",
        "redis-cluster://a?multiplex=-1", "redis-cluster://a?multiplex=1&multiplex=2",
        "redis-cluster://a?multiplex=2x", "redis-cluster://a?multiplex=1&sni=x"}) {
    EXPECT_THROW((void)redis::parse_cluster_url(bad), std::invalid_argument) << bad;
  }
  try {
    (void)redis::parse_cluster_url("redis-cluster://a?multiplex=999");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"999\""), std::string::npos) << e.what();
  }
  auto big = cluster_opts("big");
  big.node.multiplex = 257;
  EXPECT_THROW(redis::cluster_store{big}, std::invalid_argument);
}

// ---- concurrency -------------------------------------------------------------

/// Admissions of 16 threads x `per_thread` multiplexed checks on one key.
long run_threads(const redis::cluster_options& o, const fixed_window::config& cfg, int per_thread) {
  redis::cluster_store store(o);
  std::atomic<long> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < 16; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < per_thread; ++j) {
        // Half sync through the multiplexers, half async (waited for here).
        decision d;
        if ((i + j) % 2 == 0) {
          d = store.apply(cfg, "+15551234567", store_time, 1, access::consume);
        } else {
          outcomes out(1);
          store.async_apply(cfg, "+15551234567", store_time, 1, access::consume, out.handler(0));
          if (!out.wait() || out.errors[0]) return;
          d = out.decisions[0];
        }
        if (d.allowed) ++admitted;
      }
    });
  }
  for (auto& t : pool) t.join();
  return store.stats().store == static_cast<std::uint64_t>(16 * per_thread) ? admitted.load() : -1;
}

// Verifies atomicity through shared connections on the cluster: 16 threads x
// 2 processes, 1280 multiplexed checks (sync and async) on one key, admit
// exactly the limit; every check was decided by Redis.
TEST(ClusterMultiplex, SixteenThreadsTwoProcessesAdmitExactlyTheLimit) {
  (void)rltest::shared_cluster();  // started before the fork
  const auto o = cluster_opts("conc", 2);
  const fixed_window::config cfg("100/1h", window_options{.name = "t"});
  // -1: a child failed, or a check was not decided by Redis.
  EXPECT_EQ(rltest::sum_in_children(2, [&](int) { return run_threads(o, cfg, 40); }), 100);
}

// ---- faults ------------------------------------------------------------------

// Verifies that a node's multiplexed connection killed with checks written
// on it fails exactly those checks, each once, through the failure policy
// (fail_closed), and that the next checks are decided by Redis on a new
// connection. The master holds the checks (CLIENT PAUSE WRITE) while CLIENT
// KILL drops our connections to it.
TEST(ClusterMultiplex, ConnectionKilledMidPipelineFailsExactlyTheChecksInFlight) {
  auto o = cluster_opts("kill", 1);
  o.node.command_timeout = 5000ms;
  o.node.on_failure = redis::failure_policy::fail_closed;
  o.node.breaker_threshold = 1000;
  redis::cluster_store store(o);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  // Keys of one master (same hash tag user part prefix: pick by slot owner).
  ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
  const std::string master = store.node_for_slot(store.slot_for(cfg, "warm"));
  const int port = std::stoi(master.substr(master.rfind(':') + 1));
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 20; ++i) {
    std::string k = "k" + std::to_string(i);
    if (store.node_for_slot(store.slot_for(cfg, k)) == master) keys.push_back(k);
  }
  const std::size_t n = keys.size();
  outcomes out(n);
  (void)redis_cluster::ask(port, {"CLIENT", "PAUSE", "3000", "WRITE"});
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, keys[i], store_time, 1, access::consume, out.handler(i));
  }
  std::this_thread::sleep_for(200ms);  // written, held by the server
  (void)redis_cluster::ask(port, {"CLIENT", "KILL", "TYPE", "normal"});
  ASSERT_TRUE(out.wait());
  (void)redis_cluster::ask(port, {"CLIENT", "UNPAUSE"});
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_FALSE(out.decisions[i].allowed) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::fail_closed) << i;
  }
  const auto s = store.stats();
  EXPECT_EQ(s.fail_closed, n);
  EXPECT_EQ(s.errors, n);
  EXPECT_EQ(s.store, 1u);
  // The next checks are decided by Redis; the killed checks never ran.
  for (std::size_t i = 0; i < n; ++i) {
    const decision d = store.apply(cfg, keys[i], store_time, 1);
    EXPECT_EQ(d.source, decision_source::store) << i;
    EXPECT_EQ(d.remaining, 999u) << i;
  }
  std::this_thread::sleep_for(50ms);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(out.calls[i], 1) << i;
}

// Verifies async checks to a master that is down: a store whose slot map
// names a port where nothing listens decides each check through the failure
// policy (fail_open: allowed, no error; throw_error: the connection_error in
// the handler), each handler once, and opens that node's breaker.
TEST(ClusterAsync, NodeDownFollowsTheFailurePolicy) {
  for (const auto policy : {redis::failure_policy::fail_open, redis::failure_policy::throw_error}) {
    auto o = cluster_opts("down", 0);  // async checks multiplex on one connection per node
    o.node.on_failure = policy;
    o.node.breaker_threshold = 3;
    o.node.connect_timeout = 200ms;
    o.refresh_interval = 60000ms;  // keep the stale map for the test's length
    redis::cluster_store store(o);
    const fixed_window::config cfg("10/1h", window_options{.name = "t"});
    const int dead = closed_port();
    access_t::on_slots_read(store, [] { std::this_thread::sleep_for(300ms); });
    ASSERT_TRUE(access_t::install_slots(store, *whole_map_on(dead), "127.0.0.1"));
    constexpr std::size_t n = 8;
    outcomes out(n);
    for (std::size_t i = 0; i < n; ++i) {
      store.async_apply(cfg, "k" + std::to_string(i), microseconds{t0}, 1, access::consume,
                        out.handler(i));
    }
    ASSERT_TRUE(out.wait());
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(out.calls[i], 1) << i;
      if (policy == redis::failure_policy::fail_open) {
        EXPECT_FALSE(out.errors[i]) << i;
        EXPECT_TRUE(out.decisions[i].allowed) << i;
        EXPECT_EQ(out.decisions[i].source, decision_source::fail_open) << i;
      } else {
        EXPECT_TRUE(holds<redis::connection_error>(out.errors[i])) << i;
      }
    }
    const auto s = store.stats();
    EXPECT_EQ(s.store, 0u);
    EXPECT_EQ(s.errors + s.short_circuited, n);
    EXPECT_GE(s.breaker_opened, 1u);
    if (policy == redis::failure_policy::fail_open) {
      EXPECT_EQ(s.fail_open, n);
    }
  }
}

// ---- redirects ---------------------------------------------------------------

// Verifies that async checks follow MOVED from the completion: a store given
// a stale map (every slot on one master) sends each check there; the keys of
// the other masters are answered MOVED, resent to their owner and decided by
// Redis, exactly as sync checks decide the same keys.
TEST(ClusterAsync, MovedFromAStaleMapIsFollowed) {
  auto o = cluster_opts("moved", 2);
  o.refresh_interval = 60000ms;
  redis::cluster_store store(o);
  const fixed_window::config cfg("3/1h", window_options{.name = "t"});
  store.refresh_topology();
  const std::string first = store.node_for_slot(0);
  const int port = std::stoi(first.substr(first.rfind(':') + 1));
  // Hold the refresher's read (it would undo the stale map at once).
  access_t::on_slots_read(store, [] { std::this_thread::sleep_for(300ms); });
  ASSERT_TRUE(access_t::install_slots(store, *whole_map_on(port), "127.0.0.1"));
  constexpr std::size_t n = 24;
  outcomes out(n);
  std::size_t elsewhere = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string k = "m" + std::to_string(i % 8);
    if (i < 8 && rltest::shared_cluster().master_of(store.slot_for(cfg, k)) != port) ++elsewhere;
    store.async_apply(cfg, k, microseconds{t0}, 1, access::consume, out.handler(i));
  }
  ASSERT_TRUE(out.wait());
  ASSERT_GT(elsewhere, 0u);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::store) << i;
  }
  // Three checks per key: 3/1h admits each; the sync check after is the 4th.
  for (std::size_t k = 0; k < 8; ++k) {
    const decision d = store.apply(cfg, "m" + std::to_string(k), microseconds{t0}, 1);
    EXPECT_FALSE(d.allowed) << k;
    EXPECT_EQ(d.source, decision_source::store) << k;
  }
  const auto s = store.stats();
  EXPECT_GE(s.moved, elsewhere);
  EXPECT_EQ(s.errors, 0u);
}

// Verifies ASK from the completion: with a slot MIGRATING on its master and
// IMPORTING on another, a check on a key absent from the source is answered
// ASK, resent with ASKING to the importing node and decided there; the map
// is not changed.
TEST(ClusterAsync, AskDuringMigrationIsFollowedWithAsking) {
  auto o = cluster_opts("ask", 3);
  redis::cluster_store store(o);
  const fixed_window::config cfg("5/1h", window_options{.name = "t"});
  store.refresh_topology();
  const std::uint16_t slot = store.slot_for(cfg, "asked");
  auto& cluster = rltest::shared_cluster();
  const int from = cluster.master_of(slot);
  int to = -1;
  for (const std::uint16_t s :
       {std::uint16_t{0}, std::uint16_t{6000}, std::uint16_t{12000}, std::uint16_t{16383}}) {
    if (const int p = cluster.master_of(s); p > 0 && p != from) to = p;
  }
  ASSERT_GT(to, 0);
  EXPECT_TRUE(redis_cluster::start_migration(slot, from, to));
  constexpr std::size_t n = 6;
  outcomes out(n);
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "asked", microseconds{t0}, 1, access::consume, out.handler(i));
  }
  const bool done = out.wait();
  // The key went to the importing node: remove it there, end the migration.
  EXPECT_TRUE(redis_cluster::end_migration(slot, from, to, store.key_for(cfg, "asked")));
  ASSERT_TRUE(done);
  std::size_t admitted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::store) << i;
    admitted += out.decisions[i].allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 5u);
  const auto s = store.stats();
  EXPECT_GE(s.ask, n);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(store.node_for_slot(slot), "127.0.0.1:" + std::to_string(from));
}

using two_limits = compound<token_bucket, fixed_window>;

// Verifies TRYAGAIN from the completion: a compound key whose two sub-keys
// are split between the nodes of a migrating slot is answered TRYAGAIN; the
// check is sent again every 5 ms (by the retry thread, the I/O thread does
// not wait) until max_redirects, then the failure policy decides it
// (fail_open, one error). Once the slot is handed over, MOVED takes the next
// check to the new owner.
TEST(ClusterAsync, TryagainIsRetriedAfterAPauseThenGivenUp) {
  auto o = cluster_opts("tryagain", 1);
  o.node.on_failure = redis::failure_policy::fail_open;
  o.max_redirects = 5;
  redis::cluster_store store(o);
  store.refresh_topology();
  const two_limits::config cfg(compound_options{.name = "two"}, token_bucket::config("5/1s"),
                               fixed_window::config("9/1min"));
  const std::string user = "split-async";
  const std::uint16_t slot = store.slot_for<two_limits>(user);
  auto& cluster = rltest::shared_cluster();
  const int from = cluster.master_of(slot);
  int to = -1;
  for (const std::uint16_t s :
       {std::uint16_t{0}, std::uint16_t{6000}, std::uint16_t{12000}, std::uint16_t{16383}}) {
    if (const int p = cluster.master_of(s); p > 0 && p != from) to = p;
  }
  ASSERT_GT(to, 0);
  ASSERT_TRUE(store.apply(cfg, user, microseconds{t0}, 1).allowed);
  const std::vector<std::string> keys = store.keys_for(cfg, user);
  ASSERT_EQ(keys.size(), 2u);
  const std::string sl = std::to_string(slot);
  const std::string from_id = redis_cluster::id_of(from), to_id = redis_cluster::id_of(to);
  const auto migrate = [&](const std::string& k) {
    EXPECT_EQ(redis_cluster::ask(
                  from, {"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000", "KEYS", k}),
              "OK");
  };
  EXPECT_EQ(redis_cluster::ask(to, {"CLUSTER", "SETSLOT", sl, "IMPORTING", from_id}), "OK");
  EXPECT_EQ(redis_cluster::ask(from, {"CLUSTER", "SETSLOT", sl, "MIGRATING", to_id}), "OK");
  migrate(keys.front());

  const auto before = store.stats();
  outcomes out(1);
  const auto start = std::chrono::steady_clock::now();
  store.async_apply(cfg, user, microseconds{t0}, 1, access::consume, out.handler(0));
  const bool done = out.wait();
  const auto took = std::chrono::steady_clock::now() - start;

  migrate(keys.back());
  EXPECT_EQ(redis_cluster::ask(to, {"CLUSTER", "SETSLOT", sl, "NODE", to_id}), "OK");
  EXPECT_EQ(redis_cluster::ask(from, {"CLUSTER", "SETSLOT", sl, "NODE", to_id}), "OK");
  ASSERT_TRUE(done);
  EXPECT_EQ(out.calls[0], 1);
  EXPECT_FALSE(out.errors[0]);
  EXPECT_EQ(out.decisions[0].source, decision_source::fail_open);
  const auto during = store.stats();
  EXPECT_EQ(during.tryagain - before.tryagain, 6u);  // max_redirects resends, then given up
  EXPECT_EQ(during.errors - before.errors, 1u);
  EXPECT_GE(took, 25ms);  // five pauses of 5 ms

  outcomes next(1);
  store.async_apply(cfg, user, microseconds{t0}, 1, access::consume, next.handler(0));
  ASSERT_TRUE(next.wait());
  EXPECT_FALSE(next.errors[0]);
  EXPECT_EQ(next.decisions[0].source, decision_source::store);
  EXPECT_EQ(next.decisions[0].remaining, 3);  // the given-up check never ran
  EXPECT_GT(store.stats().moved, during.moved);
}

// Verifies that the first async checks of a store that never read the slot
// map go to a seed, which answers or redirects them, without blocking the
// caller on CLUSTER SLOTS; the map is then read in the background.
TEST(ClusterAsync, FirstChecksBeforeAnyMapAreDecided) {
  redis::cluster_store store(cluster_opts("first", 0));
  const fixed_window::config cfg("2/1h", window_options{.name = "t"});
  constexpr std::size_t n = 12;
  outcomes out(n);
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "f" + std::to_string(i % 4), microseconds{t0}, 1, access::consume,
                      out.handler(i));
  }
  ASSERT_TRUE(out.wait());
  std::size_t admitted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::store) << i;
    admitted += out.decisions[i].allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 8u);
  EXPECT_TRUE(rltest::eventually([&] { return store.stats().topology_refreshes >= 1; }));
}

// ---- lifetime ----------------------------------------------------------------

// Verifies that checks in flight when the store's last copy is destroyed
// each get multiplexer_stopped exactly once, before the destructor returns.
TEST(ClusterAsync, DestructionWithChecksInFlightGivesEachAnError) {
  auto o = cluster_opts("destroy", 1);
  o.node.command_timeout = 5000ms;
  o.node.on_failure = redis::failure_policy::fail_open;
  const fixed_window::config cfg("10/s", window_options{.name = "t"});
  constexpr std::size_t n = 16;
  outcomes out(n);
  int port = 0;
  {
    redis::cluster_store store(o);
    ASSERT_EQ(store.apply(cfg, "warm", store_time, 1).source, decision_source::store);
    const std::string master = store.node_for_slot(store.slot_for(cfg, "warm"));
    port = std::stoi(master.substr(master.rfind(':') + 1));
    (void)redis_cluster::ask(port, {"CLIENT", "PAUSE", "2000", "WRITE"});
    for (std::size_t i = 0; i < n; ++i) {
      store.async_apply(cfg, "warm", store_time, 1, access::consume, out.handler(i));
    }
    std::this_thread::sleep_for(200ms);
  }
  (void)redis_cluster::ask(port, {"CLIENT", "UNPAUSE"});
  std::lock_guard<std::mutex> lock(out.m);
  EXPECT_EQ(out.left, 0u);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(holds<redis::multiplexer_stopped>(out.errors[i])) << i;
  }
}

// Verifies a handler holding the last copy of the store: destroying it on
// the I/O thread neither joins that thread from itself nor hangs.
TEST(ClusterAsync, HandlerHoldingTheLastCopyOfTheStore) {
  const fixed_window::config cfg("10/s", window_options{.name = "t"});
  outcomes out(1);
  {
    auto store = std::make_shared<redis::cluster_store>(cluster_opts("last", 1));
    auto copy = *store;
    store.reset();
    copy.async_apply(cfg, "k", microseconds{t0}, 1, access::consume,
                     [held = std::make_shared<redis::cluster_store>(copy), &out](
                         decision d, std::exception_ptr e) mutable {
                       held.reset();
                       out.handler(0)(d, std::move(e));
                     });
  }
  ASSERT_TRUE(out.wait());
  EXPECT_EQ(out.calls[0], 1);
  EXPECT_FALSE(out.errors[0]);
}

// Verifies that a blocking check inside a handler (on an I/O thread) throws
// std::logic_error rather than wait for itself.
TEST(ClusterAsync, BlockingCheckOnTheIoThreadThrows) {
  redis::cluster_store store(cluster_opts("block", 1));
  const fixed_window::config cfg("10/s", window_options{.name = "t"});
  outcomes out(1);
  store.async_apply(cfg, "k", microseconds{t0}, 1, access::consume,
                    [&](decision, std::exception_ptr) {
                      std::exception_ptr e;
                      try {
                        (void)store.apply(cfg, "k", microseconds{t0}, 1);
                      } catch (...) {
                        e = std::current_exception();
                      }
                      out.handler(0)(decision{}, e);
                    });
  ASSERT_TRUE(out.wait());
  EXPECT_TRUE(holds<std::logic_error>(out.errors[0]));
}

/// In a child forked with the parent's I/O threads running: the parent's
/// store refuses checks and is destroyed touching nothing; a store of its own works.
int child_with_the_parents_store(redis::cluster_store parents, const redis::cluster_options& o) {
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  int calls = 0;
  try {
    parents.async_apply(cfg, "c", store_time, 1, access::consume,
                        [&](decision, std::exception_ptr) { ++calls; });
    return 1;
  } catch (const std::logic_error&) {
  }
  try {
    (void)parents.apply(cfg, "c", store_time, 1);
    return 2;
  } catch (const std::logic_error&) {
  }
  if (calls != 0) return 3;
#if defined(__SANITIZE_THREAD__)
  return 0;  // TSan kills children that start threads after a multi-threaded fork
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return 0;
#endif
#endif
  redis::cluster_store own(o);
  if (own.apply(cfg, "c", store_time, 1).remaining != 9) return 4;
  outcomes out(1);
  own.async_apply(cfg, "c", store_time, 1, access::consume, out.handler(0));
  if (!out.wait(5s)) return 5;
  return out.decisions[0].remaining == 8 ? 0 : 6;
}

// Verifies fork() with I/O threads running and checks in flight in the
// parent: the child refuses the parent's store (std::logic_error, no handler
// call) and destroys its copy without joining anything; the parent's checks
// complete once each.
TEST(ClusterAsync, ForkWithTheIoThreadsRunning) {
  auto o = cluster_opts("fork", 2);
  o.node.command_timeout = 5000ms;
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  redis::cluster_store store(o);
  ASSERT_EQ(store.apply(cfg, "p", store_time, 1).source, decision_source::store);
  constexpr std::size_t n = 8;
  outcomes out(n);
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, "p", store_time, 1, access::consume, out.handler(i));
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // An exception must not reach GoogleTest in the child: it would run the
    // remaining tests there, and at exit kill the parent's cluster nodes.
    int code = 7;
    try {
      code = child_with_the_parents_store(store, o);
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(out.wait());
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_TRUE(out.decisions[i].allowed) << i;
  }
  EXPECT_EQ(store.apply(cfg, "p", store_time, 1).remaining, 0);  // 10 - 1 - 8 - 1
}

// ---- the limiter's async forms -----------------------------------------------

/// A minimal eager coroutine type.
struct task {
  struct promise_type {
    task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

template <class L>
task acquire_twice(L& l, outcomes& out) {
  for (std::size_t i = 0; i < 2; ++i) {
    try {
      const decision d = co_await l.async_try_acquire("k");
      out.handler(i)(d, nullptr);
    } catch (...) {
      out.handler(i)(decision{}, std::current_exception());
    }
  }
}

// Verifies limiter::async_try_acquire (callback and co_await) over the
// cluster store: completed on an I/O thread (not inline), the decisions of
// try_acquire; bad input throws and calls no handler.
TEST(ClusterAsync, LimiterCallbackAndCoAwait) {
  const fixed_window::config cfg("2/1h", window_options{.name = "t"});
  limiter<fixed_window, redis::cluster_store, redis::server_clock> remote(
      cfg, redis::cluster_store(cluster_opts("limiter", 0)));
  for (int round = 0; round < 3; ++round) {
    outcomes out(1);
    const auto caller = std::this_thread::get_id();
    std::thread::id ran_on;
    remote.async_try_acquire("cb", [&](decision d, std::exception_ptr e) {
      ran_on = std::this_thread::get_id();
      out.handler(0)(d, std::move(e));
    });
    ASSERT_TRUE(out.wait());
    EXPECT_NE(ran_on, caller);
    EXPECT_FALSE(out.errors[0]);
    EXPECT_EQ(out.decisions[0].allowed, round < 2);
  }
  outcomes co(2);
  acquire_twice(remote, co);
  ASSERT_TRUE(co.wait());
  EXPECT_TRUE(co.decisions[0].allowed);
  EXPECT_TRUE(co.decisions[1].allowed);
  outcomes third(2);
  acquire_twice(remote, third);
  ASSERT_TRUE(third.wait());
  EXPECT_FALSE(third.decisions[0].allowed);
  int calls = 0;
  EXPECT_THROW(remote.async_try_acquire("", [&](decision, std::exception_ptr) { ++calls; }),
               std::invalid_argument);
  EXPECT_EQ(calls, 0);
}

}  // namespace
