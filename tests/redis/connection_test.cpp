// SPDX-License-Identifier: Apache-2.0
// Connections against a real redis-server: idle connections the server closed,
// answers meaning "wrong node", bounded name resolution, authentication,
// URL parsing and the maxmemory-policy warning.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

redis::options store_options(const rltest::redis_server& server, redis::failure_policy p) {
  auto o = server.options();
  o.connect_timeout = 500ms;
  o.command_timeout = 1000ms;
  o.pool_size = 4;
  o.breaker_threshold = 3;
  o.breaker_cooldown = 50ms;
  o.breaker_max_cooldown = 200ms;
  o.on_failure = p;
  return o;
}

std::string str(const redis::reply_ptr& r) {
  return r->str == nullptr ? std::string() : std::string(r->str, r->len);
}

/// `threads` threads making `per_thread` checks each at once, so that the
/// store's pool holds several connections afterwards.
void fill_pool(redis::redis_store& store, int threads, int per_thread) {
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&store, t, per_thread] {
      const gcra::config cfg("1000000/1s", bucket_options{.name = "c"});
      for (int i = 0; i < per_thread; ++i) {
        (void)store.apply(cfg, "fill" + std::to_string(t), store_time, 1, access::consume);
      }
    });
  }
  for (auto& t : ts) t.join();
}

/// Checks from several threads; every one must be decided by Redis.
void expect_all_decided_by_redis(redis::redis_store& store) {
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&store, &bad, t] {
      const gcra::config cfg("1000000/1s", bucket_options{.name = "c"});
      for (int i = 0; i < 25; ++i) {
        try {
          const auto d = store.apply(cfg, "after" + std::to_string(t), store_time, 1,
                                     access::consume);
          if (d.source != decision_source::store) ++bad;
        } catch (const store_error&) {
          ++bad;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

/// Normal client connections the server has now, CLIENT LIST's own included.
int connected_clients(const redis::options& o) {
  const std::string list = str(rltest::command(o, {"CLIENT", "LIST", "TYPE", "normal"}));
  int n = 0;
  for (std::size_t at = list.find("id="); at != std::string::npos; at = list.find("id=", at + 1)) {
    ++n;
  }
  return n;
}

// Verifies that pooled connections closed by the server's idle `timeout` are
// found closed before anything is sent and replaced: no check fails, no error
// is counted and the breaker stays closed.
TEST(RedisConnection, IdleConnectionsClosedByTheServerTimeoutAreReplaced) {
  rltest::redis_server server;
  const auto o = store_options(server, redis::failure_policy::throw_error);
  redis::redis_store store(o);
  fill_pool(store, 8, 20);
  ASSERT_GE(connected_clients(o), 3);  // the store's pooled connections + CLIENT LIST's
  ASSERT_EQ(str(rltest::command(o, {"CONFIG", "SET", "timeout", "1"})), "OK");
  // A fault test: the server drops clients idle for more than 1 s (counted in
  // whole seconds, so after 2 s at most), in a cron that runs 10 times a second.
  std::this_thread::sleep_for(2500ms);
  for (const auto until = clk::now() + 10s; connected_clients(o) > 1 && clk::now() < until;) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(connected_clients(o), 1);  // only CLIENT LIST's: the pooled ones are gone
  expect_all_decided_by_redis(store);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.breaker_opened, 0u);
  EXPECT_FALSE(store.circuit_open());
}

// Verifies the same after CLIENT KILL of every normal client.
TEST(RedisConnection, IdleConnectionsKilledByClientKillAreReplaced) {
  rltest::redis_server server;
  const auto o = store_options(server, redis::failure_policy::throw_error);
  redis::redis_store store(o);
  fill_pool(store, 8, 20);
  const auto killed = rltest::command(o, {"CLIENT", "KILL", "TYPE", "normal"});
  ASSERT_EQ(killed->type, REDIS_REPLY_INTEGER);
  ASSERT_GE(killed->integer, 2);
  std::this_thread::sleep_for(100ms);  // the closes reach our sockets
  expect_all_decided_by_redis(store);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.breaker_opened, 0u);
}

// Verifies the race after the pool's look at an idle connection: when the
// write itself finds the connection closed before a byte left, the lease
// writes on a new connection; a plain connection reports that nothing was sent.
TEST(RedisConnection, WriteOnAConnectionClosedBeforeAnyByteGoesToANewConnection) {
  rltest::redis_server server;
  const auto o = server.options();
  const std::string_view ping[] = {"PING"};
  std::string bytes;
  redis::append_command(bytes, ping, 1);

  redis::connection c(o);
  ASSERT_EQ(::shutdown(c.native_handle(), SHUT_WR), 0);
  EXPECT_THROW(c.send(bytes, redis::deadline_clock::now() + 1s), redis::connection_error);
  EXPECT_TRUE(c.closed_before_send());
  EXPECT_TRUE(c.broken());

  redis::connection_pool pool(o);
  {
    auto lease = pool.acquire(redis::deadline_clock::now() + 1s);
    EXPECT_EQ(str(lease->command(ping, 1, redis::deadline_clock::now() + 1s)), "PONG");
  }
  auto lease = pool.acquire(redis::deadline_clock::now() + 1s);
  const int old_fd = lease->native_handle();
  ASSERT_EQ(::shutdown(old_fd, SHUT_WR), 0);  // as if closed just after acquire() looked
  auto until = redis::deadline_clock::now() + 1s;
  lease.send(bytes, until);
  EXPECT_EQ(str(lease->receive(until)), "PONG");
  EXPECT_FALSE(lease->broken());
}

// Verifies that a check whose script was sent and whose connection was then
// killed fails (through the failure policy) and is never sent again: the
// server had it queued (CLIENT PAUSE), so a resend would have run it.
TEST(RedisConnection, ConnectionKilledAfterTheScriptWasSentIsNotRetried) {
  rltest::redis_server server;
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.command_timeout = 5000ms;
  redis::redis_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "c"});
  ASSERT_EQ(store.apply(cfg, "k", store_time, 1, access::consume).remaining, 9);

  redis::connection admin(o);
  const auto cmd = [&](std::initializer_list<std::string_view> args) {
    const std::vector<std::string_view> v(args);
    return admin.command(v.data(), v.size(), redis::deadline_clock::now() + 5s);
  };
  ASSERT_EQ(str(cmd({"CLIENT", "PAUSE", "10000", "WRITE"})), "OK");
  std::atomic<int> outcome{0};  // 1 = connection_error, 2 = decided, 3 = other
  std::thread checker([&] {
    try {
      (void)store.apply(cfg, "k", store_time, 1, access::consume);
      outcome = 2;
    } catch (const redis::connection_error&) {
      outcome = 1;
    } catch (...) {
      outcome = 3;
    }
  });
  // Wait until the server holds the script (parsed, paused).
  bool queued = false;
  for (const auto until = clk::now() + 5s; !queued && clk::now() < until;) {
    queued = str(cmd({"CLIENT", "LIST"})).find("cmd=evalsha") != std::string::npos;
    if (!queued) std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(queued);
  EXPECT_GE(cmd({"CLIENT", "KILL", "TYPE", "normal"})->integer, 1);  // not this one (SKIPME)
  checker.join();
  EXPECT_EQ(outcome.load(), 1);
  ASSERT_EQ(str(cmd({"CLIENT", "UNPAUSE"})), "OK");
  // Only the first check ran: the killed one was neither run nor resent.
  EXPECT_EQ(store.apply(cfg, "k", store_time, 1, access::consume).remaining, 8);
  EXPECT_EQ(store.stats().errors, 1u);
}

/// Whether detail::is_node_failure holds for an error reply saying `text`.
bool node_failure(std::string text) {
  redisReply r{};
  r.type = REDIS_REPLY_ERROR;
  r.str = text.data();
  r.len = text.size();
  return redis::detail::is_node_failure(r);
}

TEST(RedisReplies, NodeFailuresAreToldFromScriptErrorsAndRedirects) {
  for (const char* yes :
       {"READONLY You can't write against a read only replica.", "LOADING Redis is loading",
        "MASTERDOWN Link with MASTER is down", "BUSY Redis is busy running a script.",
        "MISCONF Redis is configured to save RDB snapshots", "NOREPLICAS Not enough good replicas",
        "NOAUTH Authentication required.", "WRONGPASS invalid username-password pair", "LOADING",
        "READONLY You can't write against a read only replica. script: 1f2e, on @user_script:9.",
        "ERR Error running script (call to f_1f2e): @user_script:9: @user_script: 9: -READONLY "
        "You can't write against a read only replica. ",
        "ERR Error running script (call to f_1f2e): @user_script:12: -MISCONF Errors writing",
        "ERR Error running script (call to f_1f2e): @user_script:12: @user_script: 12: "
        "-NOREPLICAS Not enough good replicas to write."}) {
    EXPECT_TRUE(node_failure(yes)) << yes;
  }
  for (const char* no :
       {"NOSCRIPT No matching script.", "MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down", "BUSYKEY Target key name already exists.",
        "BUSYGROUP Consumer Group name already exists",
        "NOTBUSY No scripts in execution right now.", "OOM command not allowed",
        "NOPERM this user has no permissions", "ERR wrong number of arguments",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR Error running script (call to f_1f2e): @user_script:9: user_script:9: "
        "attempt to compare nil with number",
        "ERR READONLY in a message", "READONLYX",
        // A script's own error quoting a user key and a stored value that hold
        // error codes (the key and the value are the attacker's text).
        "ERR Error running script (call to f_1f2e): @user_script:57: user_script:57: ratelimit: "
        "foreign or corrupt state in rl:{a: -READONLY b}:gcra:n: not an integer: -READONLY",
        "ERR Error running script (call to f_1f2e): @user_script:9: ratelimit: x: -MISCONF y",
        "ERR Error running script (call to f_1f2e): @user_script:9: @user_script: 9: ERR x: "
        "-READONLY y"}) {
    EXPECT_FALSE(node_failure(no)) << no;
  }
  redisReply status{};
  status.type = REDIS_REPLY_STATUS;
  std::string ro = "READONLY";
  status.str = ro.data();
  status.len = ro.size();
  EXPECT_FALSE(redis::detail::is_node_failure(status));
}

/// A thread making checks until stopped, tallying how each was decided.
struct load {
  explicit load(redis::redis_store& store) {
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([this, &store, t] {
        const gcra::config cfg("1000000/1s", bucket_options{.name = "c"});
        while (!stop) {
          try {
            const auto d = store.apply(cfg, "load" + std::to_string(t), store_time, 1,
                                       access::consume);
            (d.source == decision_source::store ? by_store : by_policy)++;
          } catch (const redis::script_error&) {
            ++script_errors;
          } catch (const store_error&) {
            ++other_errors;
          }
          std::this_thread::sleep_for(1ms);
        }
      });
    }
  }
  load(const load&) = delete;
  load& operator=(const load&) = delete;
  ~load() { finish(); }
  void finish() {
    stop = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<int> by_store{0}, by_policy{0}, script_errors{0}, other_errors{0};
  std::vector<std::thread> threads;
};

// Verifies that a master demoted to a replica under load (its answers are
// READONLY) is a node failure: checks go through the failure policy, the
// breaker is fed and opens, no check is decided by a script error; and that
// once it is a master again checks are decided by Redis without user action.
TEST(RedisConnection, DemotedMasterIsANodeFailureAndRecovers) {
  rltest::redis_server a;
  rltest::redis_server b;
  const auto o = store_options(a, redis::failure_policy::fail_open);
  redis::redis_store store(o);
  load l(store);
  const auto deadline = clk::now() + 10s;
  while (l.by_store < 50 && clk::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_GE(l.by_store.load(), 50);

  const std::string bport = std::to_string(b.port());
  ASSERT_EQ(str(rltest::command(o, {"REPLICAOF", "127.0.0.1", bport})), "OK");
  const auto demoted = clk::now();
  while (store.stats().breaker_opened == 0 && clk::now() - demoted < 10s) {
    std::this_thread::sleep_for(5ms);
  }
  std::this_thread::sleep_for(300ms);  // a few probe rounds under load
  const auto s = store.stats();
  EXPECT_GE(s.breaker_opened, 1u);
  EXPECT_GE(s.errors, o.breaker_threshold);
  EXPECT_GT(s.fail_open, 0u);
  EXPECT_EQ(l.script_errors.load(), 0);
  EXPECT_EQ(l.other_errors.load(), 0);  // fail_open never throws

  // Under throw_error the error is a connection_error, never a script_error.
  auto to = o;
  to.on_failure = redis::failure_policy::throw_error;
  redis::redis_store strict(to);
  try {
    (void)strict.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "strict", store_time, 1,
                       access::consume);
    ADD_FAILURE() << "a replica decided a check";
  } catch (const redis::script_error& e) {
    ADD_FAILURE() << "script_error: " << e.what();
  } catch (const redis::connection_error& e) {
    const std::string what = e.what();  // LOADING while it loads its master's data
    EXPECT_TRUE(what.find("READONLY") != std::string::npos ||
                what.find("LOADING") != std::string::npos)
        << what;
  }

  ASSERT_EQ(str(rltest::command(o, {"REPLICAOF", "NO", "ONE"})), "OK");
  const int before = l.by_store;
  const auto promoted = clk::now();
  while (l.by_store < before + 50 && clk::now() - promoted < 10s) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_GE(l.by_store.load(), before + 50) << "checks never went back to the master";
  l.finish();
  expect_all_decided_by_redis(store);
  EXPECT_EQ(l.script_errors.load(), 0);
}

// Verifies that NOAUTH (a server that wants a password the options lack) is
// a connection error that feeds the breaker, not a script error.
TEST(RedisConnection, NoauthIsAConnectionErrorAndOpensTheBreaker) {
  rltest::redis_server server;
  auto o = store_options(server, redis::failure_policy::throw_error);
  ASSERT_EQ(str(rltest::command(o, {"CONFIG", "SET", "requirepass", "s3cret"})), "OK");
  redis::redis_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "c"});
  for (std::uint32_t i = 0; i < o.breaker_threshold; ++i) {
    try {
      (void)store.apply(cfg, "k", store_time, 1, access::consume);
      ADD_FAILURE() << "decided without AUTH";
    } catch (const redis::script_error& e) {
      ADD_FAILURE() << "script_error: " << e.what();
    } catch (const redis::connection_error& e) {
      EXPECT_NE(std::string(e.what()).find("NOAUTH"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(store.circuit_open());
  EXPECT_EQ(store.stats().breaker_opened, 1u);

  o.password = "wrong";
  redis::redis_store wrong(o);
  EXPECT_THROW((void)wrong.apply(cfg, "k", store_time, 1, access::consume),
               redis::connection_error);
  o.password = "s3cret";
  redis::redis_store right(o);
  EXPECT_EQ(right.apply(cfg, "k", store_time, 1, access::consume).source, decision_source::store);
}

// Verifies that a slow name resolution is bounded by connect_timeout: the
// check is answered by the failure policy long before the resolver returns.
TEST(RedisResolve, SlowResolverIsBoundedByTheConnectTimeout) {
  rltest::redis_server server;
  auto o = store_options(server, redis::failure_policy::fail_open);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  o.host = "slow.invalid";
  o.connect_timeout = 50ms;
  o.command_timeout = 50ms;
  o.resolver = [finished](const std::string&) {
    std::this_thread::sleep_for(2s);
    finished->store(true);
    return std::vector<std::string>{"127.0.0.1"};
  };
  redis::redis_store store(o);
  const auto start = clk::now();
  const auto d = store.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                             access::consume);
  const auto took = clk::now() - start;
  EXPECT_EQ(d.source, decision_source::fail_open);
  EXPECT_LT(took, 1500ms);  // a hang test: the resolver alone takes 2 s
  EXPECT_FALSE(finished->load());
  EXPECT_EQ(store.stats().timeouts, 1u);
  // The resolver thread finishes on its own, after the store is gone.
  store = redis::redis_store(server.options());
  for (const auto until = clk::now() + 10s; !finished->load() && clk::now() < until;) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(finished->load());
}

// Verifies that the resolver's addresses are used (tried in order), and that
// a failing resolver is a connection error.
TEST(RedisResolve, ResolverAddressesAreTriedInOrder) {
  rltest::redis_server server;
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.host = "redis.test";
  std::atomic<int> calls{0};
  o.resolver = [&calls](const std::string& host) {
    ++calls;
    EXPECT_EQ(host, "redis.test");
    // Nothing listens on the first: refused, then the second answers.
    return std::vector<std::string>{"127.0.0.2", "127.0.0.1"};
  };
  redis::redis_store store(o);
  EXPECT_EQ(store
                .apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                       access::consume)
                .source,
            decision_source::store);
  EXPECT_EQ(calls.load(), 1);

  o.resolver = [](const std::string&) -> std::vector<std::string> {
    throw std::runtime_error("no such host");
  };
  redis::redis_store failing(o);
  EXPECT_THROW((void)failing.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k",
                                   store_time, 1, access::consume),
               redis::connection_error);
  o.resolver = [](const std::string&) { return std::vector<std::string>{}; };
  redis::redis_store empty(o);
  EXPECT_THROW((void)empty.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k",
                                 store_time, 1, access::consume),
               redis::connection_error);
  // A name (which hiredis would resolve with no deadline) is refused.
  o.resolver = [](const std::string&) { return std::vector<std::string>{"localhost"}; };
  redis::redis_store by_name(o);
  try {
    (void)by_name.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                        access::consume);
    ADD_FAILURE() << "a resolver's host name was accepted";
  } catch (const redis::connection_error& e) {
    EXPECT_NE(std::string(e.what()).find("no numeric address"), std::string::npos) << e.what();
  }
}

// Verifies that a first address that never answers gets only its share of
// connect_timeout: 127.0.0.3 on the server's port has a full accept queue
// (backlog 0, one connection waiting), so the kernel drops further SYNs and
// a connect there hangs; with 1000 ms to connect and two addresses, it gets
// 500 ms and 127.0.0.1 the rest. Before, it took all 1000 ms and the connect
// failed with timeout_error.
TEST(RedisResolve, DeadFirstAddressGetsOnlyItsShareOfTheConnectTimeout) {
  rltest::redis_server server;
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(server.port()));
  ASSERT_EQ(::inet_pton(AF_INET, "127.0.0.3", &a.sin_addr), 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  // Fills the accept queue (never accepted).
  const int filler = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(filler, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.host = "redis.test";
  o.connect_timeout = 1000ms;
  o.resolver = [](const std::string&) {
    return std::vector<std::string>{"127.0.0.3", "127.0.0.1"};
  };
  redis::redis_store store(o);
  const auto start = clk::now();
  EXPECT_EQ(store
                .apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                       access::consume)
                .source,
            decision_source::store);
  const auto took = clk::now() - start;
  EXPECT_GE(took, 450ms) << "the first address was not tried";
  EXPECT_LT(took, 1000ms);
  ::close(filler);
  ::close(listener);
}

// The share arithmetic at its edges: 1000 addresses that never answer end at
// connect_timeout (each tried gets 50 ms, not 1/1000 of it; the last one tried
// all that is left), and a connect_timeout below 50 ms goes to the first
// address whole; either way the check fails with a connection_error, never
// later than the deadline plus scheduling slack.
TEST(RedisResolve, ManyDeadAddressesEndAtTheConnectTimeout) {
  rltest::redis_server server;
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  ASSERT_EQ(::inet_pton(AF_INET, "127.0.0.4", &a.sin_addr), 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int filler = ::socket(AF_INET, SOCK_STREAM, 0);  // fills the accept queue
  ASSERT_EQ(::connect(filler, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
  for (const auto timeout : {300ms, 30ms}) {
    SCOPED_TRACE(timeout.count());
    auto o = store_options(server, redis::failure_policy::throw_error);
    o.host = "redis.test";
    o.port = ntohs(a.sin_port);
    o.connect_timeout = timeout;
    std::atomic<int> resolved{0};
    o.resolver = [&resolved](const std::string&) {
      ++resolved;
      return std::vector<std::string>(1000, "127.0.0.4");
    };
    redis::redis_store store(o);
    const auto start = clk::now();
    EXPECT_THROW((void)store.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k",
                                   store_time, 1, access::consume),
                 redis::connection_error);
    const auto took = clk::now() - start;
    EXPECT_GE(took, timeout - 2ms);
    EXPECT_LT(took, timeout + 400ms);
    EXPECT_GE(resolved.load(), 1);
  }
  ::close(filler);
  ::close(listener);
}

// Verifies that a zone id reaches getaddrinfo: [::1%251] (zone 1, the
// loopback's interface index; glibc takes interface names for link-local
// addresses only) connects to a server on ::1.
TEST(RedisResolve, Ipv6ZoneIdIsConnectedTo) {
  rltest::redis_server server({"--bind", "127.0.0.1 ::1"});
  auto o = redis::parse_url("redis://[::1%251]:" + std::to_string(server.port()));
  EXPECT_EQ(o.host, "::1%1");
  o.connect_timeout = 10s;
  redis::redis_store store(o);
  EXPECT_EQ(store
                .apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                       access::consume)
                .source,
            decision_source::store);
}

// Verifies the system resolver (localhost, from /etc/hosts) and an IPv6 URL.
TEST(RedisResolve, LocalhostAndIpv6Url) {
  rltest::redis_server server({"--bind", "127.0.0.1 -::1"});
  auto o = server.options();
  o.host = "localhost";
  // The first getaddrinfo of a process loads NSS modules: slow under sanitizers.
  o.connect_timeout = 10s;
  redis::redis_store by_name(o);
  EXPECT_EQ(by_name
                .apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                       access::consume)
                .source,
            decision_source::store);
  auto v6 = redis::parse_url("redis://[::1]:" + std::to_string(server.port()));
  EXPECT_EQ(v6.host, "::1");
  v6.connect_timeout = 10s;
  v6.command_timeout = 2000ms;
  redis::redis_store by_v6(v6);
  try {
    const auto d = by_v6.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time,
                               1, access::consume);
    EXPECT_EQ(d.source, decision_source::store);
    EXPECT_EQ(d.remaining, 8);  // the same server as 127.0.0.1
  } catch (const redis::connection_error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
}

/// Collects the warnings of a store.
struct warnings {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(std::string_view)> hook() {
    return [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.emplace_back(line);
    };
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return lines.size();
  }
};

/// Many checks from several threads, with every connection killed twice
/// in between, so that the store makes many connections.
void churn(redis::redis_store& store, const redis::options& admin) {
  for (int round = 0; round < 3; ++round) {
    fill_pool(store, 6, 30);
    if (round < 2) {
      (void)rltest::command(admin, {"CLIENT", "KILL", "TYPE", "normal"});
      std::this_thread::sleep_for(50ms);
    }
  }
}

// Verifies one warning per store for an allkeys-* maxmemory-policy, however
// many connections it makes.
TEST(RedisWarning, AllkeysEvictionPolicyWarnsOncePerStore) {
  rltest::redis_server server({"--maxmemory-policy", "allkeys-lru"});
  warnings w;
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.on_warning = w.hook();
  redis::redis_store store(o);
  churn(store, server.options());
  ASSERT_EQ(w.count(), 1u);
  EXPECT_NE(w.lines[0].find("allkeys-lru"), std::string::npos) << w.lines[0];
  EXPECT_NE(w.lines[0].find("noeviction"), std::string::npos) << w.lines[0];
  EXPECT_EQ(store.stats().errors, 0u);
  redis::redis_store another(o);
  (void)another.apply(gcra::config("10/1h", bucket_options{.name = "c"}), "k", store_time, 1,
                      access::consume);
  EXPECT_EQ(w.count(), 2u);  // its own warning
}

// Verifies volatile-ttl warns too: it evicts the keys nearest to expiry
// first, and the limiter's keys are short-lived.
TEST(RedisWarning, VolatileTtlWarnsOncePerStore) {
  rltest::redis_server server({"--maxmemory-policy", "volatile-ttl"});
  warnings w;
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.on_warning = w.hook();
  redis::redis_store store(o);
  churn(store, server.options());
  ASSERT_EQ(w.count(), 1u);
  EXPECT_NE(w.lines[0].find("volatile-ttl"), std::string::npos) << w.lines[0];
}

TEST(RedisWarning, NoevictionDoesNotWarn) {
  rltest::redis_server server;
  warnings w;
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.on_warning = w.hook();
  redis::redis_store store(o);
  churn(store, server.options());
  EXPECT_EQ(w.count(), 0u);
}

// Verifies that a user denied CONFIG gets no warning (the error is ignored)
// and that its checks work.
TEST(RedisWarning, ConfigDeniedByAclIsIgnored) {
  rltest::redis_server server({"--maxmemory-policy", "allkeys-lru"});
  const auto admin = server.options();
  ASSERT_EQ(str(rltest::command(
                admin, {"ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-config"})),
            "OK");
  warnings w;
  auto o = store_options(server, redis::failure_policy::throw_error);
  o.user = "limiter";
  o.password = "pw";
  o.on_warning = w.hook();
  redis::redis_store store(o);
  churn(store, admin);
  EXPECT_EQ(w.count(), 0u);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_GT(s.store, 0u);
}

/// The message of the invalid_argument that parse_url throws for `url`.
std::string url_error(const std::string& url) {
  try {
    (void)redis::parse_url(url);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << url << " was accepted";
  return {};
}

TEST(RedisUrl, PortsOutsideOneTo65535AreRejectedUnquoted) {
  // Digits out of range: not quoted either (`redis://:123456` may be a
  // numeric password whose "USER@" was left out), their number given.
  for (const std::string port : {"0", "65536", "99999999999", "123456"}) {
    const std::string what = url_error("redis://h:" + port);
    EXPECT_NE(what.find("port is not a number from 1 to 65535 (" + std::to_string(port.size()) +
                        (port.size() == 1 ? " digit," : " digits,")),
              std::string::npos)
        << port << ": " << what;
    EXPECT_EQ(what.find(":" + port), std::string::npos) << port << ": " << what;
  }
  EXPECT_NE(url_error("redis://h:").find("port \"\""), std::string::npos);
  // Not a number: not quoted (it may be a password whose "USER@" was left
  // out), its length given.
  for (const std::string port : {"-1", "abc", "63 79", "6379x", "+80", "0x10"}) {
    const std::string what = url_error("redis://h:" + port);
    EXPECT_NE(what.find("port is not a number (" + std::to_string(port.size()) + " bytes"),
              std::string::npos)
        << port << ": " << what;
    EXPECT_EQ(what.find(port), std::string::npos) << port << ": " << what;
  }
  EXPECT_EQ(redis::parse_url("redis://h:1").port, 1);
  EXPECT_EQ(redis::parse_url("redis://h:65535").port, 65535);
  EXPECT_EQ(redis::parse_url("redis://h:06380").port, 6380);
}

TEST(RedisUrl, Ipv6HostsInBrackets) {
  const auto a = redis::parse_url("redis://[::1]:6380/2");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.database, 2);
  const auto b = redis::parse_url("redis://u:p@[2001:db8::7]");
  EXPECT_EQ(b.host, "2001:db8::7");
  EXPECT_EQ(b.port, 6379);
  EXPECT_EQ(b.user, "u");
  EXPECT_EQ(b.password, "p");
  const auto c = redis::parse_url("redis://[::ffff:127.0.0.1]:7000/");
  EXPECT_EQ(c.host, "::ffff:127.0.0.1");
  EXPECT_EQ(c.port, 7000);
  EXPECT_EQ(c.database, 0);
  EXPECT_NE(url_error("redis://[::1").find("without closing ]"), std::string::npos);
  EXPECT_NE(url_error("redis://[::1]6379").find("4 bytes after the IPv6 address"),
            std::string::npos);
  EXPECT_NE(url_error("redis://::1").find("without brackets"), std::string::npos);
  EXPECT_NE(url_error("redis://::1:6379").find("without brackets"), std::string::npos);
  EXPECT_NE(url_error("redis://[]:6379").find("\"[]\""), std::string::npos);
  // Bracketed text without ':' may be anything: given by its length only.
  EXPECT_NE(url_error("redis://[localhost]:6379")
                .find("\"redis://[***]:6379\" holds a bracketed host of 9 bytes without ':'"),
            std::string::npos);
  EXPECT_NE(url_error("redis://h]:6379").find("bracket"), std::string::npos);
  EXPECT_NE(
      url_error("redis://[::1]:0").find("\"redis://[::1]:***\": the port is not a number from 1"),
      std::string::npos);
  EXPECT_NE(url_error("redis://[::1]:").find("port \"\""), std::string::npos);
}

// Verifies unix socket paths holding '@' (read as a userinfo before) and
// that a userinfo still ends at "@/"; and messages hide only the password.
TEST(RedisUrl, UnixSocketPathsMayHoldAnAt) {
  const auto a = redis::parse_url("unix:///tmp/a@b.sock");
  EXPECT_EQ(a.unix_socket, "/tmp/a@b.sock");
  EXPECT_EQ(a.password, "");
  EXPECT_EQ(a.user, "");
  const auto b = redis::parse_url("unix://u:p@ss@/tmp/x@y/s.sock?db=3");
  EXPECT_EQ(b.user, "u");
  EXPECT_EQ(b.password, "p@ss");
  EXPECT_EQ(b.unix_socket, "/tmp/x@y/s.sock");
  EXPECT_EQ(b.database, 3);
  const auto c = redis::parse_url("unix://:pw@/tmp/s");
  EXPECT_EQ(c.password, "pw");
  EXPECT_EQ(c.unix_socket, "/tmp/s");
  const std::string what = url_error("unix:///tmp/a@b.sock?db=x");
  // The path is shown whole; a database that is no number is not.
  EXPECT_NE(what.find("unix:///tmp/a@b.sock?db=***"), std::string::npos) << what;
  EXPECT_EQ(url_error("unix://:s3cret@/tmp/a@b?db=x").find("s3cret"), std::string::npos);
}

// Verifies IPv6 zone ids (RFC 6874: %25 then the zone, percent-decoded), and
// that a zone id with anything but letters, digits and -._~ is refused.
TEST(RedisUrl, Ipv6ZoneIds) {
  const auto a = redis::parse_url("redis://[fe80::1%25eth0]:6380/1");
  EXPECT_EQ(a.host, "fe80::1%eth0");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.database, 1);
  EXPECT_EQ(redis::parse_url("redis://[fe80::1%25en%30]").host, "fe80::1%en0");
  EXPECT_EQ(redis::parse_url("rediss://[fe80::a%252]:7000").host, "fe80::a%2");
  const auto s = redis::parse_url("redis-sentinel://[fe80::1%25eth0]:26380/m");
  ASSERT_EQ(s.sentinel.sentinels.size(), 1u);
  EXPECT_EQ(s.sentinel.sentinels[0].host, "fe80::1%eth0");
  EXPECT_EQ(s.sentinel.sentinels[0].port, 26380);
  for (const std::string bad :
       {"redis://[fe80::1%eth0]", "redis://[fe80::1%25]", "redis://[fe80::1%]",
        "redis://[fe80::1%25eth%000]", "redis://[fe80::1%25eth%0A]", "redis://[fe80::1%25eth%0d]",
        "redis://[fe80::1%25a%20b]", "redis://[fe80::1%25a%2Fb]", "redis://[fe80::1%25a%2]",
        "redis://[fe80::1%25a%zz]", "redis://[fe80::1%25a%25]", "redis://[fe80::1%25eth0%25x]"}) {
    const std::string what = url_error(bad);
    EXPECT_NE(what.find("zone id"), std::string::npos) << bad << ": " << what;
  }
  EXPECT_NE(url_error("redis://[fe80::1%25" + std::string(65, 'a') + "]").find("64 bytes"),
            std::string::npos);
  EXPECT_EQ(redis::parse_url("redis://[fe80::1%25" + std::string(64, 'a') + "]").host.size(),
            8u + 64u);
}

// Verifies ?multiplex=N on redis://, rediss:// (among the TLS parameters)
// and redis-sentinel://, refused out of 0..256, twice, malformed, on a
// unix:// URL, or holding an '@' that would make the query the userinfo.
TEST(RedisUrl, MultiplexParameter) {
  auto o = redis::parse_url("redis://h:7000/2?multiplex=4");
  EXPECT_EQ(o.multiplex, 4u);
  EXPECT_EQ(o.host, "h");
  EXPECT_EQ(o.port, 7000);
  EXPECT_EQ(o.database, 2);
  EXPECT_FALSE(o.tls.enabled);
  EXPECT_EQ(redis::parse_url("redis://u:p@h").multiplex, 0u);
  o = redis::parse_url("rediss://u:p@h?sni=x&multiplex=256&verify=chain");
  EXPECT_EQ(o.multiplex, 256u);
  EXPECT_EQ(o.password, "p");
  EXPECT_EQ(o.tls.server_name, "x");
  EXPECT_EQ(o.tls.verify, redis::tls_verify::chain);
  o = redis::parse_url("unix:///tmp/a@b.sock?db=3&multiplex=5");
  EXPECT_EQ(o.multiplex, 5u);
  EXPECT_EQ(o.database, 3);
  EXPECT_EQ(o.unix_socket, "/tmp/a@b.sock");
  o = redis::parse_url("redis-sentinel://a,b:1/mymaster?db=1&multiplex=2");
  EXPECT_EQ(o.multiplex, 2u);
  EXPECT_EQ(o.database, 1);
  EXPECT_EQ(o.sentinel.master_name, "mymaster");
  for (const char* bad :
       {"redis://h?multiplex=257", "redis://h?multiplex=", "redis://h?multiplex",
        "redis://h?multiplex=-1", "redis://h?multiplex=1&multiplex=2", "redis://h?multiplex=2x",
        "redis://h?multiplex=1&sni=x", "redis://h?multiplex=2@evil:1",
        "rediss://h?multiplex=2@evil:1", "redis-sentinel://a/m?multiplex=1&multiplex=1",
        "redis-sentinel://a/m?multiplex=300", "redis-sentinel://a/m?multiplex=2@evil"}) {
    EXPECT_THROW((void)redis::parse_url(bad), std::invalid_argument) << bad;
  }
  try {
    (void)redis::parse_url("redis://h?multiplex=999");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"999\""), std::string::npos) << e.what();
  }
}

// What each URL connects to and with which credentials, for hostile
// combinations of '@', '?', '&', '%25', brackets, '/', NUL, CR/LF, duplicate
// and empty parameters and overflowing numbers; "!" in host: refused with
// std::invalid_argument. An empty parameter (`redis://h?`, `?&multiplex=2`,
// `rediss://h?&&sni=x`) was dropped without a word once multiplex= was taken
// out of the query (it is refused, as before ?multiplex= existed).
TEST(RedisUrl, HostileUrlsTable) {
  struct row {
    row(std::string u, std::string h, int p = 6379, std::string us = {}, std::string pw = {},
        int d = 0, std::size_t m = 0, std::string un = {})
        : url(std::move(u)),
          host(std::move(h)),
          port(p),
          user(std::move(us)),
          password(std::move(pw)),
          db(d),
          multiplex(m),
          unix_socket(std::move(un)) {}
    std::string url, host;
    int port;
    std::string user, password;
    int db;
    std::size_t multiplex;
    std::string unix_socket;
  };
  using namespace std::string_literals;
  const row rows[] = {
      {"redis://h?", "!"},
      {"redis://h?&", "!"},
      {"redis://h?multiplex=2&", "!"},
      {"redis://h?&multiplex=2", "!"},
      {"rediss://h?&&sni=x", "!"},
      {"rediss://h?sni=x&&multiplex=1", "!"},
      {"redis-cluster://h?&multiplex=2", "!"},
      {"redis-sentinel://s/m?", "!"},
      {"redis-sentinel://s/m?multiplex=2&", "!"},
      {"redis://h:6379/?multiplex=2", "h", 6379, "", "", 0, 2},
      {"redis://h/3?multiplex=2", "h", 6379, "", "", 3, 2},
      {"redis://h?multiplex=2/3", "!"},
      {"redis://u:p@h?multiplex=2", "h", 6379, "u", "p", 0, 2},
      {"redis://u:p?multiplex=2@h", "!"},
      {"redis://u:p@h?multiplex=2@e", "!"},
      {"redis://u:p&multiplex=2@h", "h", 6379, "u", "p&multiplex=2"},  // no '?': no query
      {"redis://u:multiplex=2@h", "h", 6379, "u", "multiplex=2"},
      {"redis://u:p%40@h", "h", 6379, "u", "p%40"},  // no percent-decoding outside zone ids
      {"redis://u:p@@h", "h", 6379, "u", "p@"},
      {"redis://u:p@h@e:1", "e", 1, "u", "p@h"},  // the last '@' ends the userinfo
      {"redis://@h", "!"},  // an empty password is refused, not read as no AUTH
      {"redis://:@h", "!"},
      {"redis://u:@h", "!"},
      {"redis://u:@@h", "h", 6379, "u", "@"},
      {"redis://[::1]@h", "h", 6379, "[", ":1]"},
      {"redis://u@[::1]:5/2", "::1", 5, "", "u", 2},
      {"redis://u:p\r\nQUIT@h"s, "h", 6379, "u", "p\r\nQUIT"},  // sent length-prefixed
      {"redis://u:p\0q@h"s, "h", 6379, "u", "p\0q"s},
      {"redis://[fe80::1%25eth0]:1", "fe80::1%eth0", 1},
      {"redis://[fe80::1%25eth%30]:1?multiplex=3", "fe80::1%eth0", 1, "", "", 0, 3},
      {"redis://[fe80::1%25eth0%2F]:1", "!"},
      {"redis://[fe80::1%25eth0%0D%0A]:1", "!"},
      {"redis://[fe80::1%25eth0%00]:1", "!"},
      {"redis://[fe80::1%25eth0%]:1", "!"},
      {"redis://[fe80::1%25eth0%4]:1", "!"},
      {"redis://[fe80::1%25]:1", "!"},
      {"redis://[fe80::1%eth0]:1", "!"},
      {"redis://[::1]%25x:1", "!"},
      {"redis://[fe80::1%25" + std::string(65, 'a') + "]:1", "!"},
      {"redis://[fe80::1%25" + std::string(64, 'a') + "]:1", "fe80::1%" + std::string(64, 'a'), 1},
      {"redis://[::1:1", "!"},
      {"redis://::1:1", "!"},
      {"redis://h]:1", "!"},
      {"redis://h:0", "!"},
      {"redis://h:65536", "!"},
      {"redis://h:99999999999", "!"},
      {"redis://h:4294967297", "!"},
      {"redis://h:+1", "!"},
      {"redis://h:", "!"},
      {"redis://h/1000000000", "!"},
      {"redis://h/999999999", "h", 6379, "", "", 999'999'999},
      {"redis://h?multiplex=257", "!"},
      {"redis://h?multiplex=256", "h", 6379, "", "", 0, 256},
      {"redis://h?multiplex=4294967298", "!"},
      {"redis://h?Multiplex=2", "!"},
      {"redis://h?multiplex=2&multiplex=2", "!"},
      {"redis://h?multiplex=2#x", "!"},
      {"unix:///tmp/a@b?multiplex=2", "127.0.0.1", 6379, "", "", 0, 2, "/tmp/a@b"},
      {"unix://:p@/tmp/a@b?multiplex=2&db=3", "127.0.0.1", 6379, "", "p", 3, 2, "/tmp/a@b"},
      {"unix://u:p@/t@/s", "127.0.0.1", 6379, "u", "p", 0, 0, "/t@/s"},
      {"unix://u:p@@/t/s", "127.0.0.1", 6379, "u", "p@", 0, 0, "/t/s"},
      {"unix://?multiplex=2@/t/s", "!"},
      {"unix://pw@run/s.sock", "!"},  // a relative path holding '@': no password in it
      {"unix://u:pw@s.sock?multiplex=1", "!"},
      {"unix://run/s.sock", "127.0.0.1", 6379, "", "", 0, 0, "run/s.sock"},
      {"unix:///tmp/a?db=1&db=2", "!"},
      {"unix:///tmp/a?multiplex=1?db=2", "!"},
      {"unix:///t/s?db=", "!"},
      {"unix:///t/s?x=1", "127.0.0.1", 6379, "", "", 0, 0, "/t/s?x=1"},  // a path may hold '?'
      {"redis-sentinel://u:p@a,b:2/m?multiplex=3&db=1", "127.0.0.1", 6379, "u", "p", 1, 3},
      {"redis-sentinel://a/m?multiplex=1@x", "!"},
      {"redis-sentinel://a?multiplex=1/m", "!"},
      {"redis-sentinel://a/m?db=1?multiplex=2", "!"},
      {"redis-sentinel://a/m/?multiplex=1", "!"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const bool cluster = r.url.find("-cluster://") != std::string::npos;
    if (r.host == "!") {
      if (cluster) {
        EXPECT_THROW((void)redis::parse_cluster_url(r.url), std::invalid_argument);
      } else {
        EXPECT_THROW((void)redis::parse_url(r.url), std::invalid_argument);
      }
      continue;
    }
    redis::options o;
    ASSERT_NO_THROW(o = redis::parse_url(r.url));
    EXPECT_EQ(o.host, r.host);
    EXPECT_EQ(o.port, r.port);
    EXPECT_EQ(o.user, r.user);
    EXPECT_EQ(o.password, r.password);
    EXPECT_EQ(o.database, r.db);
    EXPECT_EQ(o.multiplex, r.multiplex);
    EXPECT_EQ(o.unix_socket, r.unix_socket);
  }
}

TEST(RedisUrl, HostsPortsAndDatabases) {
  const auto a = redis::parse_url("redis://example.com");
  EXPECT_EQ(a.host, "example.com");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.database, 0);
  const auto b = redis::parse_url("redis://user:pa:ss@h:7000/15");
  EXPECT_EQ(b.user, "user");
  EXPECT_EQ(b.password, "pa:ss");
  EXPECT_EQ(b.port, 7000);
  EXPECT_EQ(b.database, 15);
  EXPECT_NE(url_error("redis://:6379").find("no host"), std::string::npos);
  EXPECT_NE(url_error("redis://").find("no host"), std::string::npos);
  // A database that is no number is not quoted (it may be a secret), only its length.
  EXPECT_NE(url_error("redis://h/x")
                .find("database in redis URL \"redis://h/***\": it is not a "
                      "number (1 byte, not quoted; parameters follow '?'"),
            std::string::npos);
  EXPECT_NE(url_error("redis://h/-1").find("not a number (2 bytes"), std::string::npos);
  EXPECT_NE(url_error("unix:///tmp/s?db=z").find("bad database in redis URL"), std::string::npos);
  // Nor is one of more than 10 digits (NumberOfMoreThanTenDigitsIsNotQuoted).
  EXPECT_NE(url_error("redis://h/99999999999")
                .find("\"redis://h/***\": it is not a number from 0 to 999999999 (11 digits"),
            std::string::npos);
  EXPECT_NE(url_error("redis://h/9999999999").find("database \"9999999999\""), std::string::npos);
  EXPECT_NE(url_error("http://h").find("must start with"), std::string::npos);
  EXPECT_NE(url_error("redis://h?ca=/x").find("need rediss://"), std::string::npos);
}

TEST(RedisUrl, ClusterUrlsShareTheChecks) {
  const auto c = redis::parse_cluster_url("redis-cluster://a:7000,[::1]:7001,b");
  ASSERT_EQ(c.seeds.size(), 3u);
  EXPECT_EQ(c.seeds[1].host, "::1");
  EXPECT_EQ(c.seeds[1].port, 7001);
  EXPECT_EQ(c.seeds[2].port, 6379);
  EXPECT_THROW((void)redis::parse_cluster_url("redis-cluster://a:0"), std::invalid_argument);
  EXPECT_THROW((void)redis::parse_cluster_url("redis-cluster://a:65536,b"), std::invalid_argument);
  EXPECT_THROW((void)redis::parse_cluster_url("redis-cluster://::1"), std::invalid_argument);
}

// Verifies that the message of a bad URL never holds its password (it quoted
// the whole URL, so a typo in a port wrote the secret to the logs), while it
// still names the bad part, the user and the host.
TEST(RedisUrl, MessagesDoNotQuoteThePassword) {
  for (const std::string url :
       {"redis://user:s3cret@h:0", "redis://:s3cret@h:99999", "redis://s3cret@h:x",
        "redis://user:s3:cr@et@h/db", "unix://:s3cret@/tmp/s?db=z", "redis://:s3cret@[::1",
        "unix://:s3cret@run/s.sock", "unix://s3cret@s.sock?db=1", "redis://u:s3cret@::1"}) {
    const std::string what = url_error(url);
    EXPECT_EQ(what.find("s3"), std::string::npos) << what;
    EXPECT_NE(what.find("***"), std::string::npos) << what;
  }
  EXPECT_NE(url_error("redis://user:s3cret@h:0").find("redis://user:***@h:***"), std::string::npos);
  for (const std::string url : {"redis-cluster://:s3cret@a:0", "redis-cluster://u:s3cret@a,b:x"}) {
    try {
      (void)redis::parse_cluster_url(url);
      ADD_FAILURE() << url << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
