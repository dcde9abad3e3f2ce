// SPDX-License-Identifier: Apache-2.0
// Hostile review of the cluster store's async checks on a real Redis Cluster:
// checks parked after TRYAGAIN or completing on a node that left the slot map
// when the store is destroyed, a MOVED storm between two masters, ASKING kept
// right before its check under concurrency and counted once under the
// pending cap, ASK to a dead master, blocking
// checks inside handlers, and an '@' in the `multiplex` URL parameter.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
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

namespace {

using namespace ratelimit;
using rltest::holds;
using rltest::outcomes;
using namespace std::chrono_literals;
using rltest::redis_cluster;
using std::chrono::microseconds;
using access_t = redis::detail::cluster_test_access;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

redis::cluster_options cluster_opts(std::string_view what, std::size_t multiplex) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rlasyncrev:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  o.node.multiplex = multiplex;
  return o;
}

/// A master other than `from`.
int other_master(int from) {
  auto& cluster = rltest::shared_cluster();
  for (const std::uint16_t s :
       {std::uint16_t{0}, std::uint16_t{6000}, std::uint16_t{12000}, std::uint16_t{16383}}) {
    if (const int p = cluster.master_of(s); p > 0 && p != from) return p;
  }
  return -1;
}

using two_limits = compound<token_bucket, fixed_window>;

/// The message of the std::invalid_argument `f` throws ("" when none).
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

// Verifies that an '@' inside the value of `multiplex` does not turn what
// comes before it into a user and password for the host after it:
// `redis-cluster://h:7000?multiplex=2@evil:7000` is refused, as the same URL
// with a TLS parameter is, rather than connect to evil:7000 sending
// "7000?multiplex=2" as the password.
TEST(ClusterAsyncReview, AtSignInTheMultiplexValueIsRefused) {
  for (const char* url : {"redis-cluster://h:7000?multiplex=2@evil:7000",
                          "redis-cluster://u:p@h:7000?multiplex=2@evil:7000",
                          "rediss-cluster://h:7000?verify=none&multiplex=2@evil:7000",
                          "redis-cluster://h:7000,g:7001?multiplex=1@evil:7000"}) {
    const std::string why = refusal([&] { (void)redis::parse_cluster_url(url); });
    EXPECT_NE(why.find("'@'"), std::string::npos) << url << ": " << why;
    // All of the userinfo redacted; the text after its '@' is shown, as in
    // every URL (it read "evil" nowhere only while redacted_url hid the
    // value of multiplex=).
    EXPECT_NE(why.find("-cluster://***@evil:7000\""), std::string::npos) << why;
    EXPECT_EQ(why.find("h:7000"), std::string::npos) << why;
  }
  // An '@' in the password, before the query, is still a password.
  const auto o = redis::parse_cluster_url("redis-cluster://u:p%40@h:7000?multiplex=2");
  EXPECT_EQ(o.seeds.front().host, "h");
  EXPECT_EQ(o.node.multiplex, 2u);
}

// Verifies that checks waiting in the retry thread (sent again 5 ms after
// TRYAGAIN) when the store's last copy is destroyed get multiplexer_stopped
// once each, as docs/semantics.md says of every check in flight, and are not
// decided by the failure policy (fail_open would admit them unchecked).
TEST(ClusterAsyncReview, ChecksParkedAfterTryagainGetStoppedAtDestruction) {
  auto o = cluster_opts("parked", 1);
  o.node.on_failure = redis::failure_policy::fail_open;
  o.node.command_timeout = 10000ms;
  o.max_redirects = 100000;  // TRYAGAIN for as long as the test lasts
  const two_limits::config cfg(compound_options{.name = "two"}, token_bucket::config("5/1s"),
                               fixed_window::config("9/1min"));
  const std::string user = "parked-split";
  constexpr std::size_t n = 16;
  outcomes out(n);
  std::string sl, to_id;
  int from = -1, to = -1;
  std::vector<std::string> keys;
  redis::cluster_stats during{};
  {
    redis::cluster_store store(o);
    store.refresh_topology();
    const std::uint16_t slot = store.slot_for<two_limits>(user);
    from = rltest::shared_cluster().master_of(slot);
    to = other_master(from);
    ASSERT_GT(to, 0);
    ASSERT_TRUE(store.apply(cfg, user, microseconds{t0}, 1).allowed);
    keys = store.keys_for(cfg, user);
    ASSERT_EQ(keys.size(), 2u);
    sl = std::to_string(slot);
    to_id = redis_cluster::id_of(to);
    EXPECT_EQ(
        redis_cluster::ask(to, {"CLUSTER", "SETSLOT", sl, "IMPORTING", redis_cluster::id_of(from)}),
        "OK");
    EXPECT_EQ(redis_cluster::ask(from, {"CLUSTER", "SETSLOT", sl, "MIGRATING", to_id}), "OK");
    EXPECT_EQ(redis_cluster::ask(from, {"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000",
                                        "KEYS", keys.front()}),
              "OK");
    for (std::size_t i = 0; i < n; ++i) {
      store.async_apply(cfg, user, microseconds{t0}, 1, access::consume, out.handler(i));
    }
    std::this_thread::sleep_for(100ms);  // each check answered TRYAGAIN ~20 times by now
    during = store.stats();
  }
  // End the migration: the slot goes to `to` with both keys.
  EXPECT_EQ(redis_cluster::ask(from, {"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000",
                                      "KEYS", keys.back()}),
            "OK");
  EXPECT_EQ(redis_cluster::ask(to, {"CLUSTER", "SETSLOT", sl, "NODE", to_id}), "OK");
  EXPECT_EQ(redis_cluster::ask(from, {"CLUSTER", "SETSLOT", sl, "NODE", to_id}), "OK");
  EXPECT_GE(during.tryagain, n);
  std::lock_guard<std::mutex> lock(out.m);
  EXPECT_EQ(out.left, 0u);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(holds<redis::multiplexer_stopped>(out.errors[i])) << i;
    EXPECT_NE(out.decisions[i].source, decision_source::fail_open) << i;
  }
}

// Verifies a MOVED storm: the master of a slot is told another master owns
// it, which still names the first, so each answers MOVED to the other. Every
// check, async and sync through the multiplexers, is decided once with the
// script_error of too many redirects (throw_error), within the deadline,
// after max_redirects + 1 answers; none ran anywhere.
TEST(ClusterAsyncReview, MovedStormBetweenTwoMastersEndsAtTheRedirectCap) {
  auto o = cluster_opts("storm", 2);
  o.node.on_failure = redis::failure_policy::throw_error;
  o.max_redirects = 4;
  o.node.command_timeout = 3000ms;
  redis::cluster_store store(o);
  store.refresh_topology();
  const fixed_window::config cfg("5/1h", window_options{.name = "t"});
  const std::string user = "stormy";
  const std::uint16_t slot = store.slot_for(cfg, user);
  const int a = rltest::shared_cluster().master_of(slot);
  const int b = other_master(a);
  ASSERT_GT(b, 0);
  const std::string sl = std::to_string(slot);
  ASSERT_EQ(redis_cluster::ask(a, {"CLUSTER", "SETSLOT", sl, "NODE", redis_cluster::id_of(b)}),
            "OK");
  constexpr std::size_t n = 8;
  outcomes out(n);
  const auto before = store.stats();
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, user, microseconds{t0}, 1, access::consume, out.handler(i));
  }
  const bool done = out.wait();
  const auto took = std::chrono::steady_clock::now() - start;
  std::string sync_error;
  try {
    (void)store.apply(cfg, user, microseconds{t0}, 1);
  } catch (const redis::script_error& e) {
    sync_error = e.what();
  }
  const auto after = store.stats();
  EXPECT_EQ(redis_cluster::ask(a, {"CLUSTER", "SETSLOT", sl, "NODE", redis_cluster::id_of(a)}),
            "OK");
  ASSERT_TRUE(done);
  EXPECT_LT(took, 3000ms);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_TRUE(holds<redis::script_error>(out.errors[i])) << i;
  }
  EXPECT_NE(sync_error.find("more than 4 redirects"), std::string::npos) << sync_error;
  EXPECT_EQ(after.moved - before.moved, (n + 1) * 5);
  // None of them ran: the first check that reaches the owner is admitted with 4 left.
  EXPECT_TRUE(rltest::eventually([&] {
    try {
      return store.apply(cfg, user, microseconds{t0}, 1).remaining == 4;
    } catch (const redis::script_error&) {
      return false;
    }
  }));
}

// Verifies ASKING stays right before its check under concurrency: threads
// send async and sync (multiplexed) checks on one key of a slot MIGRATING
// from its master (the key absent there); each is answered ASK and decided
// by the importing node. Had an ASKING been separated from its check, that
// check would have bounced MOVED between the two nodes up to the cap.
// Exactly the limit is admitted and no check fails.
TEST(ClusterAsyncReview, ConcurrentAskedChecksKeepAskingAdjacent) {
  auto o = cluster_opts("askmany", 3);
  o.node.on_failure = redis::failure_policy::throw_error;
  redis::cluster_store store(o);
  store.refresh_topology();
  const fixed_window::config cfg("100/1h", window_options{.name = "t"});
  const std::string user = "asked-by-many";
  const std::uint16_t slot = store.slot_for(cfg, user);
  const int from = rltest::shared_cluster().master_of(slot);
  const int to = other_master(from);
  ASSERT_GT(to, 0);
  ASSERT_TRUE(redis_cluster::start_migration(slot, from, to));
  constexpr std::size_t threads = 6, per_thread = 30;  // 180 checks for a limit of 100
  outcomes out(threads * per_thread / 2);
  std::atomic<std::size_t> sync_admitted{0}, sync_failed{0};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) {
        if (i % 2 == 0) {
          store.async_apply(cfg, user, microseconds{t0}, 1, access::consume,
                            out.handler(t * per_thread / 2 + i / 2));
        } else {
          try {
            sync_admitted += store.apply(cfg, user, microseconds{t0}, 1).allowed ? 1 : 0;
          } catch (...) {
            ++sync_failed;
          }
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  const bool done = out.wait();
  EXPECT_TRUE(redis_cluster::end_migration(slot, from, to, store.key_for(cfg, user)));
  ASSERT_TRUE(done);
  std::size_t admitted = sync_admitted.load();
  for (std::size_t i = 0; i < out.calls.size(); ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    admitted += out.decisions[i].allowed ? 1 : 0;
  }
  EXPECT_EQ(sync_failed.load(), 0u);
  EXPECT_EQ(admitted, 100u);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_GE(s.ask, threads * per_thread);
  EXPECT_EQ(s.moved, 0u);
}

// Verifies the exact rule for blocking checks inside a handler (on an I/O
// thread): a sync check that would go through the multiplexers
// (node.multiplex > 0) throws std::logic_error, as it would wait for itself;
// with node.multiplex = 0 (async checks still multiplexed) the sync check
// goes through the pool and is decided there, blocking that I/O thread for
// its round trip. docs/semantics.md said both throw.
TEST(ClusterAsyncReview, BlockingCheckInAHandlerThrowsOnlyWhenMultiplexed) {
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  for (const std::size_t multiplex : {std::size_t{0}, std::size_t{1}}) {
    redis::cluster_store store(cluster_opts("inhandler", multiplex));
    outcomes out(1);
    store.async_apply(cfg, "k", microseconds{t0}, 1, access::consume,
                      [&](decision, std::exception_ptr) {
                        decision d;
                        std::exception_ptr e;
                        try {
                          d = store.apply(cfg, "k", microseconds{t0}, 1);
                        } catch (...) {
                          e = std::current_exception();
                        }
                        out.handler(0)(d, e);
                      });
    ASSERT_TRUE(out.wait());
    if (multiplex == 0) {
      EXPECT_FALSE(out.errors[0]);
      EXPECT_EQ(out.decisions[0].source, decision_source::store);
      EXPECT_EQ(out.decisions[0].remaining, 8);
    } else {
      EXPECT_TRUE(holds<std::logic_error>(out.errors[0]));
    }
  }
}

// Verifies that the refusal is per store: inside a handler on store A's I/O
// thread, a blocking multiplexed check on another store B is decided (B's
// I/O threads answer it), while one on A throws std::logic_error; and the
// same from B's handler. A thread that only called async_apply (no I/O
// thread of any store) makes blocking checks on both afterwards.
TEST(ClusterAsyncReview, BlockingCheckRefusedOnlyOnTheStoresOwnIoThread) {
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  redis::cluster_store a(cluster_opts("owna", 1));
  redis::cluster_store b(cluster_opts("ownb", 2));
  for (const bool from_a : {true, false}) {
    redis::cluster_store& here = from_a ? a : b;
    redis::cluster_store& there = from_a ? b : a;
    const std::string key = from_a ? "ka" : "kb";
    outcomes out(2);
    here.async_apply(cfg, key, microseconds{t0}, 1, access::consume,
                     [&](decision, std::exception_ptr) {
                       decision d;
                       std::exception_ptr e;
                       try {
                         d = there.apply(cfg, key, microseconds{t0}, 1);
                       } catch (...) {
                         e = std::current_exception();
                       }
                       out.handler(0)(d, e);
                       try {
                         (void)here.apply(cfg, key, microseconds{t0}, 1);
                       } catch (...) {
                         e = std::current_exception();
                       }
                       out.handler(1)(decision{}, e);
                     });
    ASSERT_TRUE(out.wait());
    EXPECT_FALSE(out.errors[0]) << from_a;
    EXPECT_EQ(out.decisions[0].source, decision_source::store);
    EXPECT_EQ(out.decisions[0].remaining, 9);  // the other store's prefix: its own count
    EXPECT_TRUE(holds<std::logic_error>(out.errors[1])) << from_a;
  }
  // This thread is no store's I/O thread: both decide here, in order.
  EXPECT_EQ(a.apply(cfg, "ka", microseconds{t0}, 1).remaining, 8);
  EXPECT_EQ(b.apply(cfg, "kb", microseconds{t0}, 1).remaining, 8);
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

// Verifies that destroying the store waits for a check completing on the
// I/O thread of a node that left the slot map: the check was sent to A (a
// stale map), A left the map while A was busy, A answered MOVED to B whose
// breaker is open, so the check is decided on A's I/O thread, and that was
// A's last check (A is no longer the store's). Its handler was still running
// when the store's last copy went: the destructor must not return before it
// did (it used to skip A, already unowned, and return at once; the check
// could then still touch the freed store).
// With `last_in_handler` the handler holds a copy of the store and drops the
// last copy itself, there: that must neither wait for itself nor hang.
void check_on_a_node_that_left_the_map(bool last_in_handler) {
  auto o = cluster_opts("orphan", 1);
  o.node.on_failure = redis::failure_policy::fail_open;
  o.node.command_timeout = 5000ms;
  o.node.breaker_threshold = 1;
  o.node.breaker_cooldown = 60000ms;  // B's breaker stays open (no probe)
  o.node.breaker_max_cooldown = 60000ms;
  o.refresh_interval = 60000ms;
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  std::mutex m;
  std::condition_variable cv;
  bool called = false, release = false;
  std::atomic<bool> returned{false};
  decision got;
  std::thread busy;
  std::optional<redis::cluster_store> held;
  {
    redis::cluster_store store(o);
    if (last_in_handler) held.emplace(store);
    store.refresh_topology();
    // The key lives on B; A is another master.
    std::string user;
    int a = -1, b = -1;
    for (int i = 0; i < 64 && a < 0; ++i) {
      user = "orphan" + std::to_string(i);
      b = rltest::shared_cluster().master_of(store.slot_for(cfg, user));
      a = other_master(b);
    }
    ASSERT_GT(a, 0);
    ASSERT_TRUE(access_t::install_slots(store, *whole_map_on(a), "127.0.0.1"));
    // A busy for ~800 ms: the check waits unanswered on A meanwhile.
    busy = std::thread([a] {
      (void)redis_cluster::ask(
          a, {"EVAL",
              "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] "
              "repeat local n = redis.call('TIME') until n[1] * 1000000 + n[2] - s > 800000 "
              "return 1",
              "0"});
    });
    std::this_thread::sleep_for(100ms);
    store.async_apply(cfg, user, microseconds{t0}, 1, access::consume,
                      [&](decision d, std::exception_ptr) {
                        std::unique_lock<std::mutex> lock(m);
                        got = d;
                        called = true;
                        cv.notify_all();
                        cv.wait(lock, [&] { return release; });
                        std::this_thread::sleep_for(50ms);
                        held.reset();  // the last copy when last_in_handler
                        // Unlocked before the flag: once the test sees it, it
                        // returns and `m` (on its stack) is gone.
                        lock.unlock();
                        returned = true;
                      });
    std::this_thread::sleep_for(100ms);
    // A leaves the map (every slot on B) and B's breaker opens.
    ASSERT_TRUE(access_t::install_slots(store, *whole_map_on(b), "127.0.0.1"));
    access_t::open_breakers(store);
    {
      std::unique_lock<std::mutex> lock(m);
      ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return called; }));
    }
    {
      std::lock_guard<std::mutex> lock(m);
      release = true;
      cv.notify_all();
    }
  }
  const bool done_before_destructor_returned = returned.load();
  busy.join();
  ASSERT_TRUE(rltest::eventually([&] { return returned.load(); }));
  EXPECT_EQ(got.source, decision_source::fail_open);  // B's breaker was open
  if (!last_in_handler) {
    EXPECT_TRUE(done_before_destructor_returned);
  }
}

TEST(ClusterAsyncReview, DestructionWaitsForACheckOnANodeThatLeftTheMap) {
  check_on_a_node_that_left_the_map(false);
}

TEST(ClusterAsyncReview, LastCopyDroppedInAHandlerOnANodeThatLeftTheMap) {
  check_on_a_node_that_left_the_map(true);
}

// Verifies that a check refused by a node's pending cap (multiplexer_full:
// local overload, nothing sent) is decided by the failure policy but is no
// failure of the node for its circuit breaker: with a threshold of one,
// three refusals used to open the node's breaker while it answered fine.
TEST(ClusterAsyncReview, PendingCapRefusalIsNoBreakerFailure) {
  auto o = cluster_opts("capbreaker", 1);
  o.node.multiplex_max_pending = 2;
  o.node.command_timeout = 5000ms;
  o.node.breaker_threshold = 1;
  o.node.on_failure = redis::failure_policy::fail_open;
  redis::cluster_store store(o);
  const fixed_window::config cfg("1000/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "k", store_time, 1).source, decision_source::store);
  const int port = rltest::shared_cluster().master_of(store.slot_for(cfg, "k"));
  ASSERT_GT(port, 0);
  outcomes held(2);
  // Long enough for slow sanitizer builds on a loaded machine: the refusals
  // below must all come while the two held checks are pending.
  (void)redis_cluster::ask(port, {"CLIENT", "PAUSE", "1500", "WRITE"});
  for (std::size_t i = 0; i < 2; ++i) {
    store.async_apply(cfg, "k", store_time, 1, access::consume, held.handler(i));
  }
  for (int i = 0; i < 3; ++i) {
    const decision d = store.apply(cfg, "k", store_time, 1);
    EXPECT_EQ(d.source, decision_source::fail_open) << i;
    EXPECT_TRUE(d.allowed) << i;
  }
  EXPECT_EQ(store.stats().breaker_opened, 0u);
  EXPECT_EQ(store.stats().errors, 3u);
  EXPECT_EQ(store.stats().fail_open, 3u);
  ASSERT_TRUE(held.wait());
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(held.errors[i]) << i;
    EXPECT_EQ(held.decisions[i].source, decision_source::store) << i;
  }
  const decision next = store.apply(cfg, "k", store_time, 1);
  EXPECT_EQ(next.source, decision_source::store);
  EXPECT_EQ(next.remaining, 1000u - 4);
  EXPECT_EQ(store.stats().short_circuited, 0u);
}

// Verifies that ASKING and the check behind it count as one check under a
// node's pending cap: with multiplex_max_pending = 1, checks (blocking and
// async, one at a time) on a slot MIGRATING from its master, the key absent
// there, are answered ASK and decided by the importing node. The ASKING
// used to take the one place, so every such check was refused with
// multiplexer_full (decided here by throw_error) after its ASKING went out
// alone.
TEST(ClusterAsyncReview, AskingAndItsCheckCountAsOneUnderThePendingCap) {
  auto o = cluster_opts("askcap", 1);
  o.node.multiplex_max_pending = 1;
  o.node.on_failure = redis::failure_policy::throw_error;
  redis::cluster_store store(o);
  store.refresh_topology();
  const fixed_window::config cfg("10/1h", window_options{.name = "t"});
  const std::string user = "asked-under-a-cap";
  const std::uint16_t slot = store.slot_for(cfg, user);
  const int from = rltest::shared_cluster().master_of(slot);
  const int to = other_master(from);
  ASSERT_GT(to, 0);
  ASSERT_TRUE(redis_cluster::start_migration(slot, from, to));
  std::vector<std::string> failures;
  std::vector<decision> sync;
  for (int i = 0; i < 3; ++i) {
    try {
      sync.push_back(store.apply(cfg, user, microseconds{t0}, 1));
    } catch (const std::exception& e) {
      failures.emplace_back(e.what());
    }
  }
  outcomes first(1), second(1);
  for (outcomes* out : {&first, &second}) {
    store.async_apply(cfg, user, microseconds{t0}, 1, access::consume, out->handler(0));
    EXPECT_TRUE(out->wait());  // one at a time: the cap is one check
  }
  EXPECT_TRUE(redis_cluster::end_migration(slot, from, to, store.key_for(cfg, user)));
  EXPECT_TRUE(failures.empty()) << failures.front();
  ASSERT_EQ(sync.size(), 3u);
  for (std::size_t i = 0; i < sync.size(); ++i) {
    EXPECT_EQ(sync[i].source, decision_source::store) << i;
    EXPECT_EQ(sync[i].remaining, 9u - i) << i;
  }
  unsigned remaining = 6;
  for (const outcomes* out : {&first, &second}) {
    EXPECT_EQ(out->calls[0], 1);
    EXPECT_FALSE(out->errors[0]);
    EXPECT_EQ(out->decisions[0].source, decision_source::store);
    EXPECT_EQ(out->decisions[0].remaining, remaining--);
  }
  const auto st = store.stats();
  EXPECT_EQ(st.errors, 0u);
  EXPECT_GE(st.ask, 5u);
  EXPECT_EQ(st.moved, 0u);
}

// Verifies ASK to a node that is down: a slot MIGRATING to a master that was
// then killed answers ASK naming the dead node; each async check is decided
// once by the failure policy (fail_open, one error each), within its
// deadline, and the check never runs on the source. Kills a master of this
// binary's cluster: keep it the last test.
TEST(ClusterAsyncReview, AskToADeadNodeIsDecidedByTheFailurePolicy) {
  auto o = cluster_opts("askdead", 1);
  o.node.on_failure = redis::failure_policy::fail_open;
  o.node.connect_timeout = 300ms;
  o.node.command_timeout = 1000ms;
  o.node.breaker_threshold = 1000;  // every check reaches the dead node
  redis::cluster_store store(o);
  store.refresh_topology();
  const fixed_window::config cfg("5/1h", window_options{.name = "t"});
  const std::string user = "asked-dead";
  const std::uint16_t slot = store.slot_for(cfg, user);
  auto& cluster = rltest::shared_cluster();
  const int from = cluster.master_of(slot);
  const int to = other_master(from);
  ASSERT_GT(to, 0);
  const std::string sl = std::to_string(slot);
  ASSERT_EQ(
      redis_cluster::ask(to, {"CLUSTER", "SETSLOT", sl, "IMPORTING", redis_cluster::id_of(from)}),
      "OK");
  ASSERT_EQ(
      redis_cluster::ask(from, {"CLUSTER", "SETSLOT", sl, "MIGRATING", redis_cluster::id_of(to)}),
      "OK");
  // Started again, and the cluster whole, before the next test of this process.
  const rltest::node_revival revival(cluster);
  cluster.kill(to);
  constexpr std::size_t n = 6;
  outcomes out(n);
  const auto before = store.stats();
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    store.async_apply(cfg, user, microseconds{t0}, 1, access::consume, out.handler(i));
  }
  const bool done = out.wait(5s);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(redis_cluster::ask(from, {"CLUSTER", "SETSLOT", sl, "STABLE"}), "OK");
  ASSERT_TRUE(done);
  EXPECT_LT(took, 1500ms);  // command_timeout plus a connect
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out.calls[i], 1) << i;
    EXPECT_FALSE(out.errors[i]) << i;
    EXPECT_EQ(out.decisions[i].source, decision_source::fail_open) << i;
  }
  const auto after = store.stats();
  EXPECT_EQ(after.ask - before.ask, n);
  EXPECT_EQ(after.errors - before.errors, n);
  EXPECT_EQ(after.fail_open - before.fail_open, n);
  // None ran on the source: the key is still absent there.
  EXPECT_EQ(redis_cluster::ask(from, {"EXISTS", store.key_for(cfg, user)}), "0");
}

}  // namespace
