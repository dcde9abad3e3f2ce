// SPDX-License-Identifier: Apache-2.0
// redis_store behind Redis Sentinel, against real servers: one master, one
// replica and three sentinels (sentinel_harness.hpp). Discovery, an unknown
// master name, every sentinel down, a master demoted under the store
// (READONLY, then ROLE says replica), and the master killed under load.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "sentinel/sentinel_harness.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

/// A fixed caller time, so no window rolls during a test.
constexpr timestamp now_us{1'700'000'000'000'000};

std::string str(const redis::reply_ptr& r) {
  return std::string(r->str, r->len);
}

redis::options options_for(const std::string& url, redis::failure_policy p) {
  redis::options o = redis::parse_url(url);
  o.connect_timeout = 300ms;
  o.command_timeout = 500ms;
  o.pool_size = 4;
  o.breaker_threshold = 3;
  o.breaker_cooldown = 50ms;
  o.breaker_max_cooldown = 200ms;
  o.on_failure = p;
  o.prefix = "rlsent:";
  return o;
}

redis::options at_port(int port) {
  redis::options o;
  o.port = port;
  o.connect_timeout = 1000ms;
  return o;
}

/// What `f` throws as connection_error (empty when it throws nothing).
template <class F>
std::string connection_error_of(F&& f) {
  try {
    f();
  } catch (const redis::connection_error& e) {
    return e.what();
  }
  return {};
}

// Verifies that the store finds the master through the sentinels, decides
// there, and that the key is on the master.
TEST(Sentinel, DiscoversTheMasterAndDecidesThere) {
  rltest::sentinel_group g;
  redis::redis_store store(options_for(g.url(), redis::failure_policy::throw_error));
  const auto cfg = fixed_window::config("3/1min", window_options{.name = "calls"});
  int admitted = 0;
  for (int i = 0; i < 5; ++i) {
    const decision d = store.apply(cfg, "k", now_us, 1);
    EXPECT_EQ(d.source, decision_source::store);
    admitted += d.allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 3);
  const std::string key = store.key_for(cfg, "k");
  EXPECT_EQ(rltest::command(at_port(g.master().port()), {"EXISTS", key})->integer, 1);
  store.ping();

  // Multiplexed and async checks open their connections through the
  // sentinels too (not to options::host, which a Sentinel URL leaves at its
  // default).
  auto mo = options_for(g.url(), redis::failure_policy::throw_error);
  mo.multiplex = 2;
  redis::redis_store multiplexed(mo);
  EXPECT_EQ(multiplexed.apply(cfg, "m", now_us, 1).source, decision_source::store);
  std::promise<decision> async_result;
  multiplexed.async_apply(cfg, "a", now_us, 1, access::consume,
                          [&](decision d, std::exception_ptr e) {
                            if (e) {
                              async_result.set_exception(e);
                            } else {
                              async_result.set_value(d);
                            }
                          });
  EXPECT_EQ(async_result.get_future().get().source, decision_source::store);
  for (const char* k : {"m", "a"}) {
    EXPECT_EQ(
        rltest::command(at_port(g.master().port()), {"EXISTS", store.key_for(cfg, k)})->integer, 1)
        << k;
  }

  // The locator itself: a sentinel that is down is skipped, and the one that
  // led to the master is asked first from then on.
  auto o = options_for(g.url(), redis::failure_policy::throw_error);
  const int down = rltest::free_port();
  o.sentinel.sentinels.insert(o.sentinel.sentinels.begin(),
                              redis::sentinel_address{"127.0.0.1", down});
  redis::sentinel_locator locator(o);
  EXPECT_TRUE(locator.last_master().empty());
  ASSERT_EQ(locator.sentinels().front().port, down);
  const auto c = locator.connect(o);
  EXPECT_EQ(c->where(), "127.0.0.1:" + std::to_string(g.master().port()));
  EXPECT_EQ(locator.last_master(), c->where());
  const auto order = locator.sentinels();
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0].port, g.sentinel(0).port());
  EXPECT_EQ(order[1].port, down);
  EXPECT_EQ(order[2].port, g.sentinel(1).port());
}

// Verifies the two sets of credentials: an ACL user at the sentinels
// (sentinel_user, sentinel_password) and another at the master (the
// userinfo); a wrong password on either side is an error naming the user and
// the server, never the password.
TEST(Sentinel, AclUsersAtTheSentinelsAndAtTheMaster) {
  rltest::sentinel_group g(true);
  const std::string hosts = g.url().substr(std::string("redis-sentinel://").size());
  const auto url = [&](const std::string& master_pw, const std::string& sentinel_pw) {
    return "redis-sentinel://app:" + master_pw + "@" + hosts +
           "?sentinel_user=watch&sentinel_password=" + sentinel_pw;
  };
  const auto cfg = fixed_window::config("3/1min", window_options{.name = "calls"});
  redis::redis_store store(options_for(url("apw", "wpw"), redis::failure_policy::throw_error));
  EXPECT_EQ(store.apply(cfg, "k", now_us, 1).source, decision_source::store);

  redis::redis_store bad_sentinel(
      options_for(url("apw", "wrong-s"), redis::failure_policy::throw_error));
  const std::string s = connection_error_of([&] { (void)bad_sentinel.apply(cfg, "k", now_us, 1); });
  EXPECT_NE(s.find("AUTH as user \"watch\" at 127.0.0.1:" + std::to_string(g.sentinel(0).port())),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("wrong-s"), std::string::npos) << s;

  redis::redis_store bad_master(
      options_for(url("wrong-m", "wpw"), redis::failure_policy::throw_error));
  const std::string m = connection_error_of([&] { (void)bad_master.apply(cfg, "k", now_us, 1); });
  EXPECT_NE(m.find("AUTH as user \"app\" at 127.0.0.1:" + std::to_string(g.master().port())),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("wrong-m"), std::string::npos) << m;
}

// Verifies that a master name no sentinel knows is an error naming the name
// and every sentinel asked.
TEST(Sentinel, UnknownMasterNameIsAClearError) {
  rltest::sentinel_group g;
  redis::redis_store store(options_for(g.url("nosuchmaster"), redis::failure_policy::throw_error));
  const auto cfg = fixed_window::config("3/1min", window_options{.name = "calls"});
  const std::string what = connection_error_of([&] { (void)store.apply(cfg, "k", now_us, 1); });
  ASSERT_FALSE(what.empty());
  EXPECT_NE(what.find("no master \"nosuchmaster\""), std::string::npos) << what;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string at = "sentinel 127.0.0.1:" + std::to_string(g.sentinel(i).port()) +
                           " knows no master named \"nosuchmaster\"";
    EXPECT_NE(what.find(at), std::string::npos) << what;
  }
}

// Verifies that with every sentinel down (two refuse, one accepts the TCP
// connection but never answers) a check fails with an error naming each of
// them, within the connect timeouts, and the failure policy decides it.
TEST(Sentinel, AllSentinelsDownIsAClearErrorInBoundedTime) {
  const int refused1 = rltest::free_port();
  const int refused2 = rltest::free_port();
  // A listening socket that never accepts: connects succeed, nothing answers.
  const int mute = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(mute, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(mute, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(mute, 16), 0);
  ASSERT_EQ(::getsockname(mute, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int mute_port = ntohs(a.sin_port);
  const std::string url = "redis-sentinel://127.0.0.1:" + std::to_string(refused1) +
                          ",127.0.0.1:" + std::to_string(mute_port) +
                          ",127.0.0.1:" + std::to_string(refused2) + "/rlmaster";
  auto o = options_for(url, redis::failure_policy::throw_error);
  redis::redis_store strict(o);
  const auto cfg = fixed_window::config("3/1min", window_options{.name = "calls"});
  const auto start = clk::now();
  const std::string what = connection_error_of([&] { (void)strict.apply(cfg, "k", now_us, 1); });
  const auto took = clk::now() - start;
  ::close(mute);
  ASSERT_FALSE(what.empty());
  EXPECT_NE(what.find("no master \"rlmaster\""), std::string::npos) << what;
  for (const int p : {refused1, mute_port, refused2}) {
    EXPECT_NE(what.find("sentinel 127.0.0.1:" + std::to_string(p) + ": "), std::string::npos)
        << what;
  }
  EXPECT_NE(what.find("timed out"), std::string::npos) << what;  // the mute one
  EXPECT_GE(took, o.connect_timeout - 20ms);    // the mute sentinel was waited for...
  EXPECT_LT(took, 3 * o.connect_timeout + 1s);  // ...each one connect_timeout at most

  o.on_failure = redis::failure_policy::fail_closed;
  redis::redis_store closed(o);
  EXPECT_EQ(closed.apply(cfg, "k", now_us, 1).source, decision_source::fail_closed);
}

// Verifies the refusal of a "master" that ROLE says is a replica, and that a
// master demoted under the store answers READONLY to the check in flight, the
// store then asks the sentinels again for the next connections, and uses the
// master again once it is one.
TEST(Sentinel, DemotedMasterAnswersReadonlyAndIsRefusedByRole) {
  rltest::sentinel_group g;
  auto o = options_for(g.url(), redis::failure_policy::throw_error);
  o.breaker_threshold = 1000;  // every check goes to Redis here
  redis::redis_store store(o);
  const auto cfg = fixed_window::config("100/1min", window_options{.name = "calls"});
  ASSERT_EQ(store.apply(cfg, "k", now_us, 1).source, decision_source::store);
  // Several pooled connections to the master: checks from 4 threads at once.
  const auto master = at_port(g.master().port());
  const auto checking_clients = [&] {
    const auto list = rltest::command(master, {"CLIENT", "LIST"});
    const std::string text = str(list);
    int n = 0;
    for (auto at = text.find("cmd=evalsha"); at != std::string::npos;
         at = text.find("cmd=evalsha", at + 1)) {
      ++n;
    }
    return n;
  };
  const auto many = fixed_window::config("1000000/1min", window_options{.name = "many"});
  for (int round = 0; round < 20 && checking_clients() < 2; ++round) {
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&] {
        for (int i = 0; i < 50; ++i) (void)store.apply(many, "m", now_us, 1);
      });
    }
    for (auto& t : ts) t.join();
  }
  ASSERT_GE(checking_clients(), 2);

  // Demote the master behind the sentinels' back: it replicates a port where
  // nothing listens, so it stays a replica answering READONLY (the sentinels
  // react to a master claiming to be a replica only after about 10 s).
  ASSERT_EQ(
      str(rltest::command(master, {"REPLICAOF", "127.0.0.1", std::to_string(rltest::free_port())})),
      "OK");
  const std::string readonly = connection_error_of([&] { (void)store.apply(cfg, "k", now_us, 1); });
  EXPECT_NE(readonly.find("READONLY"), std::string::npos) << readonly;

  // The other idle connections were dropped with the one that failed: the
  // next check opens a new one, which asks the sentinels. They still name
  // the demoted master, and ROLE refuses it.
  const std::string role = connection_error_of([&] { (void)store.apply(cfg, "k", now_us, 1); });
  const std::string at = "127.0.0.1:" + std::to_string(g.master().port());
  EXPECT_NE(role.find("master \"rlmaster\" at " + at + " named by sentinel 127.0.0.1:"),
            std::string::npos)
      << role;
  EXPECT_NE(role.find("is a replica (ROLE), not a master"), std::string::npos) << role;
  EXPECT_NE(connection_error_of([&] { store.ping(); }).find("is a replica (ROLE)"),
            std::string::npos);

  ASSERT_EQ(str(rltest::command(master, {"REPLICAOF", "NO", "ONE"})), "OK");
  const decision d = store.apply(cfg, "k", now_us, 1);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(d.remaining, 98);  // the READONLY check did not count
}

// Verifies that a multiplexed check failing on a demoted master (READONLY)
// retires every shared connection, as the pool drops its idle ones: with two
// lanes both connected to the master, the first check after the demotion
// gets READONLY on one; the next goes out on the other lane, which must not
// be the old connection (READONLY again) but a new one asking the sentinels
// (which still name the demoted master: ROLE refuses it).
TEST(Sentinel, DemotedMasterRetiresEveryMultiplexedConnection) {
  rltest::sentinel_group g;
  auto o = options_for(g.url(), redis::failure_policy::throw_error);
  o.breaker_threshold = 1000;
  o.multiplex = 2;
  redis::redis_store store(o);
  const auto cfg = fixed_window::config("100/1min", window_options{.name = "calls"});
  // Lanes are used in turn: two checks connect both.
  ASSERT_EQ(store.apply(cfg, "k", now_us, 1).source, decision_source::store);
  ASSERT_EQ(store.apply(cfg, "k", now_us, 1).source, decision_source::store);
  const auto master = at_port(g.master().port());
  ASSERT_EQ(
      str(rltest::command(master, {"REPLICAOF", "127.0.0.1", std::to_string(rltest::free_port())})),
      "OK");
  const std::string readonly = connection_error_of([&] { (void)store.apply(cfg, "k", now_us, 1); });
  EXPECT_NE(readonly.find("READONLY"), std::string::npos) << readonly;
  const std::string second = connection_error_of([&] { (void)store.apply(cfg, "k", now_us, 1); });
  EXPECT_EQ(second.find("READONLY"), std::string::npos)
      << "a connection to the demoted master was used again: " << second;
  EXPECT_NE(second.find("is a replica (ROLE), not a master"), std::string::npos) << second;
  ASSERT_EQ(str(rltest::command(master, {"REPLICAOF", "NO", "ONE"})), "OK");
  const decision d = store.apply(cfg, "k", now_us, 1);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(d.remaining, 97);  // the two failed checks did not count
}

// Verifies a failover under load: the master is killed (SIGKILL) while three
// threads check; every check is decided (by Redis or, during the failover,
// by the failure policy) within a bounded time; after the sentinels promote
// the replica the checks are decided by it, and it holds the state that was
// replicated before the kill.
TEST(SentinelFailover, KilledMasterUnderLoadFailsOverToTheReplica) {
  rltest::sentinel_group g;
  ASSERT_TRUE(g.wait_ready()) << "the sentinels did not find each other and the replica";
  auto o = options_for(g.url(), redis::failure_policy::fail_closed);
  o.connect_timeout = 200ms;
  o.command_timeout = 300ms;
  redis::redis_store store(o);
  const auto cfg = fixed_window::config("10/1min", window_options{.name = "calls"});
  const auto load_cfg = fixed_window::config("1000000/1min", window_options{.name = "load"});

  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.apply(cfg, "before", now_us, 1).allowed);
  // Make sure the replica has it: replication is asynchronous.
  const auto old_master = at_port(g.master().port());
  ASSERT_EQ(rltest::command(old_master, {"WAIT", "1", "2000"})->integer, 1);

  std::atomic<bool> stop{false};
  std::atomic<long long> switched_at{0};  // clk ticks when the sentinels named the replica
  std::atomic<int> by_store{0}, by_policy{0}, by_store_after{0}, errors{0};
  std::atomic<long long> slowest{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = "load-" + std::to_string(t);
      while (!stop.load()) {
        const auto start = clk::now();
        try {
          const decision d = store.apply(load_cfg, key, now_us, 1);
          const long long took = (clk::now() - start).count();
          long long prev = slowest.load();
          while (took > prev && !slowest.compare_exchange_weak(prev, took)) {
          }
          if (d.source == decision_source::store) {
            ++by_store;
            const long long sw = switched_at.load();
            if (sw != 0 && start.time_since_epoch().count() > sw) ++by_store_after;
          } else if (d.source == decision_source::fail_closed) {
            ++by_policy;
            std::this_thread::sleep_for(1ms);  // the breaker answers at once: do not spin
          }
        } catch (...) {
          ++errors;
        }
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  const int before_kill = by_store.load();
  g.master().stop();  // SIGKILL
  const auto killed_at = clk::now();
  const bool switched = g.wait_master(g.replica().port(), 15s);
  switched_at = clk::now().time_since_epoch().count();
  const auto wait_from = clk::now();
  while (switched && by_store_after.load() < 20 && clk::now() - wait_from < 10s) {
    std::this_thread::sleep_for(10ms);
  }
  const auto decided_at = clk::now();
  stop = true;
  for (auto& th : threads) th.join();
  std::printf(
      "failover: sentinels named the replica %lld ms after the kill, new master deciding "
      "%lld ms later; checks by Redis %d, by the failure policy %d, slowest %lld ms\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 clk::time_point(clk::duration(switched_at.load())) - killed_at)
                                 .count()),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(decided_at - wait_from).count()),
      by_store.load(), by_policy.load(), static_cast<long long>(slowest.load() / 1'000'000));
  ASSERT_TRUE(switched) << "the sentinels did not promote the replica";
  EXPECT_GT(before_kill, 0);
  EXPECT_EQ(errors.load(), 0);          // fail_closed never throws
  EXPECT_GT(by_policy.load(), 0);       // the failover was seen by the checks
  EXPECT_GE(by_store_after.load(), 20)  // and the new master decides after it
      << "store " << by_store << ", policy " << by_policy;
  // Each check: at most 2 x 3 sentinels x connect_timeout, plus command_timeout.
  EXPECT_LT(std::chrono::nanoseconds(slowest.load()),
            6 * o.connect_timeout + o.command_timeout + 1s);

  // The new master holds what was replicated: 4 of 10 were used before.
  int admitted = 0;
  for (int i = 0; i < 10; ++i) {
    const decision d = store.apply(cfg, "before", now_us, 1);
    EXPECT_EQ(d.source, decision_source::store);
    admitted += d.allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 6);
  const auto new_master = at_port(g.replica().port());
  const auto role = rltest::command(new_master, {"ROLE"});
  ASSERT_EQ(role->type, REDIS_REPLY_ARRAY);
  EXPECT_EQ(std::string(role->element[0]->str, role->element[0]->len), "master");
  for (const char* k : {"before", "load-0", "after"}) {
    if (std::string(k) == "after") (void)store.apply(cfg, "after", now_us, 1);
    const std::string key = std::string(k) == "before" || std::string(k) == "after"
                                ? store.key_for(cfg, k)
                                : store.key_for(load_cfg, k);
    EXPECT_GT(rltest::command(new_master, {"PTTL", key})->integer, 0) << key;
  }
}

// Verifies a failover that Sentinel is asked for (SENTINEL FAILOVER) under
// load. The old master stays up and, for some seconds, a master: only the
// +switch-master announcement tells the store to leave it. The checks go on
// without an exception, and once the sentinels name the replica the old
// master gets no more checks.
void requested_failover_moves_the_checks(std::size_t multiplex) {
  rltest::sentinel_group g;
  ASSERT_TRUE(g.wait_ready()) << "the sentinels did not find each other and the replica";
  auto o = options_for(g.url(), redis::failure_policy::fail_closed);
  o.multiplex = multiplex;
  redis::redis_store store(o);
  const auto cfg = fixed_window::config("1000000/1min", window_options{.name = "load"});
  std::atomic<bool> stop{false};
  std::atomic<long long> switched_at{0};
  std::atomic<int> by_store{0}, by_store_after{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        const auto start = clk::now();
        try {
          const decision d = store.apply(cfg, "shared", now_us, 1);
          if (d.source == decision_source::store) {
            ++by_store;
            const long long sw = switched_at.load();
            if (sw != 0 && start.time_since_epoch().count() > sw) ++by_store_after;
          } else {
            std::this_thread::sleep_for(1ms);
          }
        } catch (...) {
          ++errors;
        }
      }
    });
  }
  std::this_thread::sleep_for(200ms);
  const auto answer = rltest::command(g.sentinel(1).options(),
                                      {"SENTINEL", "FAILOVER", "rlmaster"});
  const bool asked = answer->type == REDIS_REPLY_STATUS && str(answer) == "OK";
  const bool switched = asked && g.wait_master(g.replica().port(), 15s);
  switched_at = clk::now().time_since_epoch().count();
  const auto wait_from = clk::now();
  while (switched && by_store_after.load() < 20 && clk::now() - wait_from < 10s) {
    std::this_thread::sleep_for(10ms);
  }
  // The old master is still up: it must get no more checks now (the watcher
  // hears of the switch within milliseconds; give it some).
  std::this_thread::sleep_for(200ms);
  const auto old_master = at_port(g.master().port());
  const auto evalsha_calls = [&] {
    const std::string text = str(rltest::command(old_master, {"INFO", "commandstats"}));
    const auto at = text.find("cmdstat_evalsha:calls=");
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + 22));
  };
  const long long calls_then = evalsha_calls();
  const int store_then = by_store.load();
  std::this_thread::sleep_for(300ms);
  const long long calls_later = evalsha_calls();
  const int store_later = by_store.load();
  stop = true;
  for (auto& th : threads) th.join();
  ASSERT_TRUE(asked) << str(answer);
  ASSERT_TRUE(switched) << "the sentinels did not promote the replica";
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GE(by_store_after.load(), 20) << "store " << by_store;
  EXPECT_GT(store_later, store_then + 20);
  EXPECT_EQ(calls_later, calls_then) << "checks still went to the old master";
  const auto new_master = at_port(g.replica().port());
  EXPECT_GT(rltest::command(new_master, {"PTTL", store.key_for(cfg, "shared")})->integer, 0);
}

TEST(SentinelFailover, RequestedFailoverMovesTheChecksToTheReplica) {
  requested_failover_moves_the_checks(0);
}

// The same with checks multiplexed on two shared connections: the
// announcement retires them, so no check is written to the old master once
// the ones in flight have their answers.
TEST(SentinelFailover, RequestedFailoverMovesMultiplexedChecksToTheReplica) {
  requested_failover_moves_the_checks(2);
}

}  // namespace
