// SPDX-License-Identifier: Apache-2.0
// Tests of the pooled single check's fast path (redis_store::run_pooled):
// the command it formats in place is byte for byte the one append_eval
// formats, the reply's integers read without hiredis are the ones hiredis
// reads, NOSCRIPT is still resent once, a check allocates nothing once
// the connection's buffers have grown, a bad prefix is refused before a
// connection is taken, a multiplexed check's allocations, and
// options::read_spin (read_spin_us=) is validated, decides as the blocking
// read and keeps the deadline.
//
// This binary replaces the global operator new (support/replaced_new.hpp) to
// count allocations; none fails.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "redis_server.hpp"
#include "support/replaced_new.hpp"

namespace {
/// Allocations through operator new on any thread while counting is on, and
/// those of them made on the test's main thread.
std::atomic<long> allocations{0};
std::atomic<long> main_thread_allocations{0};
std::atomic<bool> counting{false};
const std::thread::id main_thread = std::this_thread::get_id();
}  // namespace

bool rltest::allocation_fails() noexcept {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1);
    if (std::this_thread::get_id() == main_thread) main_thread_allocations.fetch_add(1);
  }
  return false;
}

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;

/// The command append_eval writes for one check (the batch path's bytes).
template <class Config>
std::string reference_command(bool with_text, std::string_view prefix, const Config& cfg,
                              std::string_view key, std::optional<timestamp> time, units cost,
                              ratelimit::access a, std::string_view floor) {
  using P = typename Config::policy_type;
  const std::vector<std::string> keys = redis::detail::redis_keys(prefix, cfg, key);
  std::vector<std::string> args;
  redis::script_for<P>::append_args(cfg, args);
  std::string out;
  redis::detail::append_eval<P>(out, with_text, keys,
                                time ? std::to_string(time->count()) : std::string(),
                                std::to_string(cost), a, args, floor);
  return out;
}

template <class Config>
void expect_same_bytes(const Config& cfg, std::string_view prefix, std::string_view key) {
  std::string out = "left over";  // appended to, as the store's cleared buffer
  std::vector<std::string> args = {"stale"};
  for (const bool with_text : {false, true}) {
    for (const std::optional<timestamp> t :
         {std::optional<timestamp>{}, std::optional<timestamp>{timestamp{0}},
          std::optional<timestamp>{timestamp{1'700'000'000'123'456}}}) {
      for (const ratelimit::access a : {access::consume, access::peek, access::force}) {
        for (const units cost : {units{1}, units{7}, max_units}) {
          const std::string_view floor = t ? "1500" : "0";
          out.resize(9);
          redis::detail::append_single_eval(out, args, with_text, prefix, cfg, key, t, cost, a,
                                            floor);
          EXPECT_EQ(out.substr(9),
                    reference_command(with_text, prefix, cfg, key, t, cost, a, floor))
              << "key \"" << key << "\" prefix \"" << prefix << "\"";
        }
      }
    }
  }
}

// Verifies the in-place command equals append_eval's bytes for every policy,
// caller and server time, every access, EVAL and EVALSHA, and keys and
// prefixes that take the other key form (a key starting with '}') or hold
// braces, NUL bytes, CRLF and spaces; and that a prefix with an empty hash
// tag is refused by value as before.
TEST(RedisSingleCheck, CommandBytesEqualTheBatchPath) {
  const std::string nul_key("a\0b", 3);
  const std::vector<std::string> keys = {
      "k",      "+15551234567",        "}x",    "}", "{}", "{a}b", "a}{b}", nul_key,
      "a\r\nb", std::string(512, 'z'), "sp ace"};
  const std::vector<std::string> prefixes = {"", "rl:", "p{", "{t}:", "a}b{c"};
  const fixed_window::config fw("10/1s", window_options{.name = "fw"});
  const sliding_window_log::config swl("10/1s", window_options{.name = "swl"});
  const sliding_window_counter::config swc("10/1s", window_options{.name = "swc"});
  const token_bucket::config tb("10/1s", bucket_options{.name = "tb"});
  const gcra::config g("10/15min", bucket_options{.burst = 3, .name = "g"});
  const compound<gcra, fixed_window>::config both(
      compound_options{.name = "both"}, gcra::config("5/1s"), fixed_window::config("100/1h"));
  for (const std::string& p : prefixes) {
    for (const std::string& k : keys) {
      expect_same_bytes(fw, p, k);
      expect_same_bytes(swl, p, k);
      expect_same_bytes(swc, p, k);
      expect_same_bytes(tb, p, k);
      expect_same_bytes(g, p, k);
      expect_same_bytes(both, p, k);
    }
  }
  std::string out;
  std::vector<std::string> args;
  EXPECT_THROW(redis::detail::append_single_eval(out, args, false, "x{}", g, "k", std::nullopt, 1,
                                                 access::consume, "0"),
               std::invalid_argument);
}

// Verifies that a prefix with an empty hash tag is refused by value on the
// pooled single check before a connection is taken: no Redis listens on
// port 1, so a check that reached for a connection would have been decided
// fail_open and counted an error. An unnamed limiter is named first, as on
// the batch path.
TEST(RedisSingleCheck, EmptyHashTagPrefixIsRefusedBeforeAConnection) {
  redis::options o;
  o.port = 1;
  o.prefix = "x{}:";
  o.on_failure = redis::failure_policy::fail_open;
  redis::redis_store store(o);
  const gcra::config g("10/15min", bucket_options{.name = "g"});
  for (const bool batch : {false, true}) {
    SCOPED_TRACE(batch);
    std::string why;
    try {
      if (batch) {
        const redis::batch_item items[] = {{"k", 1, timestamp{0}}};
        (void)store.apply_batch(g, items);
      } else {
        (void)store.apply(g, "k", store_time, 1);
      }
    } catch (const std::invalid_argument& e) {
      why = e.what();
    }
    EXPECT_NE(why.find("prefix \"x{}:\" holds an empty hash tag"), std::string::npos) << why;
  }
  std::string unnamed;
  try {
    (void)store.apply(gcra::config("10/15min"), "k", store_time, 1);
  } catch (const std::invalid_argument& e) {
    unnamed = e.what();
  }
  EXPECT_NE(unnamed.find("needs a name"), std::string::npos) << unnamed;
  EXPECT_EQ(store.stats().errors, 0u);
  EXPECT_EQ(store.stats().fail_open, 0u);
}

/// hiredis's reading of `bytes`: the integers of an array reply, or nullopt
/// for anything else (incomplete, another type, a protocol error).
std::optional<std::vector<long long>> hiredis_integers(std::string_view bytes) {
  redisReader* r = redisReaderCreate();
  std::optional<std::vector<long long>> out;
  void* reply = nullptr;
  if (redisReaderFeed(r, bytes.data(), bytes.size()) == REDIS_OK &&
      redisReaderGetReply(r, &reply) == REDIS_OK && reply != nullptr) {
    const auto* rr = static_cast<redisReply*>(reply);
    if (rr->type == REDIS_REPLY_ARRAY) {
      std::vector<long long> v;
      bool all = true;
      for (std::size_t i = 0; i < rr->elements; ++i) {
        all = all && rr->element[i]->type == REDIS_REPLY_INTEGER;
        if (all) v.push_back(rr->element[i]->integer);
      }
      if (all) out = v;
    }
  }
  if (reply != nullptr) freeReplyObject(reply);
  redisReaderFree(r);
  return out;
}

// Verifies the reply reader's fast path takes exactly one array of 5 to 7
// integers written as Redis writes them, with hiredis's values, and leaves
// everything else (other counts and types, leading zeros, "-0", 19 digits,
// '+', a missing CRLF, trailing or missing bytes) to hiredis.
TEST(RedisSingleCheck, IntegerArraysAreReadAsHiredisReadsThem) {
  const std::vector<std::string> taken = {
      "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:90000000\r\n",
      "*5\r\n:0\r\n:0\r\n:0\r\n:-1\r\n:0\r\n",
      "*6\r\n:0\r\n:0\r\n:0\r\n:123456789012345678\r\n:-123456789012345678\r\n:7\r\n",
      "*7\r\n:1\r\n:0\r\n:5\r\n:0\r\n:10\r\n:10\r\n:1\r\n",
  };
  for (const std::string& bytes : taken) {
    redis::script_reply r;
    ASSERT_TRUE(redis::detail::parse_integer_array(bytes, r)) << bytes;
    const auto expected = hiredis_integers(bytes);
    ASSERT_TRUE(expected.has_value()) << bytes;
    ASSERT_EQ(r.count, expected->size()) << bytes;
    for (std::size_t i = 0; i < r.count; ++i) EXPECT_EQ(r.values[i], (*expected)[i]) << bytes;
  }
  const std::vector<std::string> left = {
      "",
      "*5\r\n",
      "*4\r\n:1\r\n:1\r\n:9\r\n:0\r\n",
      "*8\r\n:1\r\n:1\r\n:9\r\n:0\r\n:1\r\n:1\r\n:1\r\n:1\r\n",
      "*05\r\n:1\r\n:1\r\n:9\r\n:0\r\n:9\r\n",
      "*5\r\n:01\r\n:1\r\n:9\r\n:0\r\n:9\r\n",
      "*5\r\n:-0\r\n:1\r\n:9\r\n:0\r\n:9\r\n",
      "*5\r\n:+1\r\n:1\r\n:9\r\n:0\r\n:9\r\n",
      "*5\r\n:1234567890123456789\r\n:1\r\n:9\r\n:0\r\n:9\r\n",
      "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:9\r",
      "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:9\n\r",
      "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:9\r\n+OK\r\n",
      "*5\r\n:1\r\n:1\r\n$1\r\n9\r\n:0\r\n:9\r\n",
      "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:\r\n",
      "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:-\r\n",
      "-NOSCRIPT No matching script. Please use EVAL.\r\n",
      ":5\r\n",
  };
  for (const std::string& bytes : left) {
    redis::script_reply r;
    EXPECT_FALSE(redis::detail::parse_integer_array(bytes, r)) << bytes;
    EXPECT_EQ(r.count, 0u) << bytes;
  }
}

// Verifies NOSCRIPT on the pooled path: after SCRIPT FLUSH the check is sent
// again with EVAL (the script did not run) and decided once, counting one
/// The std::invalid_argument message parse_url gives for `url` ("" when none).
std::string url_error(const std::string& url) {
  try {
    (void)redis::parse_url(url);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Verifies options::read_spin is refused outside 0..1000 us by the store's
// constructor, naming the value, and read_spin_us=N is read from redis://,
// unix:// and redis-sentinel:// URLs (beside the other parameters) and
// refused by name when bad, twice, empty, beside a foreign unix:// parameter
// or in a userinfo.
TEST(RedisSingleCheck, ReadSpinIsValidatedInOptionsAndUrls) {
  redis::options o;
  o.port = 1;  // nothing listens: the constructor does not connect
  for (const long bad : {-1L, 1001L, 1'000'000L}) {
    o.read_spin = std::chrono::microseconds(bad);
    try {
      redis::redis_store store(o);
      ADD_FAILURE() << "read_spin " << bad << " us was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("read_spin " + std::to_string(bad) + " us"),
                std::string::npos)
          << e.what();
    }
  }
  for (const long good : {0L, 1L, 1000L}) {
    o.read_spin = std::chrono::microseconds(good);
    EXPECT_NO_THROW(redis::redis_store store(o)) << good;
  }

  EXPECT_EQ(redis::parse_url("redis://h:7000").read_spin.count(), 0);
  EXPECT_EQ(redis::parse_url("redis://h:7000?read_spin_us=50").read_spin.count(), 50);
  EXPECT_EQ(redis::parse_url("redis://h:7000/3?read_spin_us=0").read_spin.count(), 0);
  const redis::options both = redis::parse_url("redis://:pw@h:7000?multiplex=2&read_spin_us=1000");
  EXPECT_EQ(both.read_spin.count(), 1000);
  EXPECT_EQ(both.multiplex, 2u);
  EXPECT_EQ(both.password, "pw");
  EXPECT_EQ(both.host, "h");
  const redis::options tls = redis::parse_url("rediss://h?verify=none&read_spin_us=20");
  EXPECT_EQ(tls.read_spin.count(), 20);
  EXPECT_EQ(tls.tls.verify, redis::tls_verify::none);
  const redis::options unix_url = redis::parse_url("unix:///run/r.sock?read_spin_us=7&db=2");
  EXPECT_EQ(unix_url.unix_socket, "/run/r.sock");
  EXPECT_EQ(unix_url.database, 2);
  EXPECT_EQ(unix_url.read_spin.count(), 7);
  const redis::options sentinel = redis::parse_url("redis-sentinel://s1,s2/m?read_spin_us=30&db=1");
  EXPECT_EQ(sentinel.read_spin.count(), 30);
  EXPECT_EQ(sentinel.database, 1);

  const auto refused = [](const std::string& url, const std::string& part) {
    const std::string why = url_error(url);
    EXPECT_NE(why.find(part), std::string::npos) << url << ": " << why;
  };
  refused("redis://h?read_spin_us=1001", "bad read_spin_us \"1001\"");
  // No number: not quoted (it may be a password pasted in the wrong place).
  refused("redis://h?read_spin_us=-1",
          "bad read_spin_us in redis URL \"redis://h?read_spin_us=***\": it is not a number (2 "
          "bytes, not quoted)");
  refused("redis://h?read_spin_us=5us", "it is not a number (3 bytes, not quoted)");
  refused("redis://h?read_spin_us=", "bad read_spin_us \"\"");
  refused("redis://h?read_spin_us", "bad read_spin_us \"\"");
  refused("redis://h?read_spin_us=5&read_spin_us=5", "\"read_spin_us\" twice");
  refused("redis://h?read_spin_us=5&", "stray '&'");
  refused("redis://u:p?read_spin_us=5@h", "'@' in a query value");
  refused("unix:///t/s?read_spin_us=5&dbx=1", "parameter \"dbx\" beside");
  refused("redis-sentinel://s/m?read_spin_us=5&read_spin_us=6", "\"read_spin_us\" twice");
  refused("redis-sentinel://s/m?read_spin_us=2000", "bad read_spin_us \"2000\"");
}

// Verifies a store that polls for its replies (read_spin 1000 us) decides
// as one that blocks at once, check by check on caller time; that a reply
// held back by CLIENT PAUSE well past the spin is still read (the blocking
// read after the spin); and that the check's deadline holds with the spin:
// with the server paused, a command_timeout of 30 ms (and of 1 ms, shorter
// than the spin) ends the check with timeout_error in time.
TEST(RedisSingleCheck, ReadSpinDecidesAsTheBlockingReadAndKeepsTheDeadline) {
  rltest::redis_server server;
  redis::options o = server.options();
  o.pool_size = 1;
  redis::options spin_o = o;
  spin_o.read_spin = std::chrono::microseconds(1000);
  o.prefix = "block:";
  spin_o.prefix = "spin:";
  redis::redis_store blocking(o);
  redis::redis_store spinning(spin_o);
  const gcra::config cfg("5/1s", bucket_options{.name = "t"});
  for (std::int64_t i = 0; i < 40; ++i) {
    const timestamp t{1'700'000'000'000'000 + i * 50'000};
    const std::string key = "k" + std::to_string(i % 3);
    const decision a = blocking.apply(cfg, key, t, 1);
    const decision b = spinning.apply(cfg, key, t, 1);
    ASSERT_EQ(a.source, decision_source::store);
    ASSERT_EQ(b.source, decision_source::store);
    ASSERT_EQ(a.allowed, b.allowed) << i;
    ASSERT_EQ(a.remaining, b.remaining) << i;
    ASSERT_EQ(a.retry_after, b.retry_after) << i;
  }

  // The reply comes when CLIENT PAUSE ends, some 60 ms after the spin gave up.
  (void)rltest::command(o, {"CLIENT", "PAUSE", "60", "ALL"});
  auto t0 = std::chrono::steady_clock::now();
  const decision late = spinning.apply(cfg, "late", store_time, 1);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);  // well after the 1 ms spin
  EXPECT_EQ(late.source, decision_source::store);
  EXPECT_TRUE(late.allowed);
  EXPECT_EQ(late.remaining, 4u);

  for (const auto timeout : {30ms, 1ms}) {
    redis::options short_o = spin_o;
    short_o.command_timeout = timeout;
    short_o.breaker_threshold = 100;
    redis::redis_store store(short_o);
    // Connected, script loaded: a round trip of 1 ms may take longer on a
    // busy machine, so the warm-up tries again (a new connection each time).
    bool warm = false;
    for (int i = 0; i < 200 && !warm; ++i) {
      try {
        (void)store.apply(cfg, "warm", store_time, 1);
        warm = true;
      } catch (const redis::timeout_error&) {
      }
    }
    ASSERT_TRUE(warm) << timeout.count();
    (void)rltest::command(o, {"CLIENT", "PAUSE", "400", "ALL"});
    t0 = std::chrono::steady_clock::now();
    EXPECT_THROW((void)store.apply(cfg, "paused", store_time, 1), redis::timeout_error)
        << timeout.count();
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(took, timeout);
    EXPECT_LT(took, timeout + 150ms) << timeout.count();
    (void)rltest::command(o, {"CLIENT", "UNPAUSE"});
  }
}

// reload.
TEST(RedisSingleCheck, NoscriptIsResentOnceOnThePool) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("single-noscript");
  o.pool_size = 1;
  redis::redis_store store(o);
  const fixed_window::config cfg("3/1h", window_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "k", store_time, 1).remaining, 2u);
  const auto reloads_before = store.stats().script_reloads;
  (void)rltest::command(o, {"SCRIPT", "FLUSH"});
  const decision d = store.apply(cfg, "k", store_time, 1);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(d.remaining, 1u);
  EXPECT_EQ(store.stats().script_reloads, reloads_before + 1);
  EXPECT_EQ(store.apply(cfg, "k", store_time, 1).remaining, 0u);
  EXPECT_FALSE(store.apply(cfg, "k", store_time, 1).allowed);
  EXPECT_EQ(store.stats().script_reloads, reloads_before + 1);
  EXPECT_EQ(store.stats().errors, 0u);
}

// Verifies a sequential check on a pool of one allocates nothing through
// operator new once the connection's buffers have grown (the batch path
// made about a dozen allocations per check), on caller and server time, and
// that the decisions are Redis's.
TEST(RedisSingleCheck, SequentialChecksAllocateNothing) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("single-alloc");
  o.pool_size = 1;
  redis::redis_store store(o);
  const gcra::config cfg("10/15min", bucket_options{.name = "bench"});
  const std::vector<std::string> keys = {"+15551234567", "+15557654321", "+15550000000"};
  for (std::size_t i = 0; i < 10; ++i) (void)store.apply(cfg, keys[i % 3], store_time, 1);
  (void)store.apply(cfg, keys[0], timestamp{1'700'000'000'000'000}, 1);
  allocations = 0;
  counting = true;
  int from_store = 0;
  for (std::size_t i = 0; i < 300; ++i) {
    const timestamp t{1'700'000'000'000'000 + static_cast<std::int64_t>(i)};
    const decision d = i % 2 == 0 ? store.apply(cfg, keys[i % 3], store_time, 1)
                                  : store.apply(cfg, keys[i % 3], t, 1);
    from_store += d.source == decision_source::store ? 1 : 0;
  }
  counting = false;
  EXPECT_EQ(from_store, 300);
  EXPECT_EQ(allocations.load(), 0);
}

// Verifies that a multiplexed check (options::multiplex = 1) formats its
// command in place, as the pooled check does: a single-key policy's check
// allocates on the calling thread only its job and the job's command buffer
// (key and limiter name short enough for std::string's inline buffer), on
// caller and server time; writing a vector of key strings and one of policy
// arguments per check made it 7.5 allocations per check. The decisions are
// Redis's.
TEST(RedisSingleCheck, MultiplexedCheckAllocatesOnlyItsJobAndCommand) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("mux-alloc");
  o.multiplex = 1;
  redis::redis_store store(o);
  const gcra::config cfg("10/15min", bucket_options{.name = "bench"});
  const std::vector<std::string> keys = {"+15551234567", "+15557654321", "+15550000000"};
  const auto check = [&](std::size_t i) {
    const timestamp t{1'700'000'000'000'000 + static_cast<std::int64_t>(i)};
    const decision d = i % 2 == 0 ? store.apply(cfg, keys[i % 3], store_time, 1)
                                  : store.apply(cfg, keys[i % 3], t, 1);
    return d.source == decision_source::store ? 1 : 0;
  };
  for (std::size_t i = 0; i < 20; ++i) (void)check(i);
  allocations = 0;
  main_thread_allocations = 0;
  counting = true;
  int from_store = 0;
  for (std::size_t i = 0; i < 300; ++i) from_store += check(i);
  counting = false;
  EXPECT_EQ(from_store, 300);
  std::printf("multiplexed gcra check: %.2f allocations on the calling thread, %.2f in all\n",
              static_cast<double>(main_thread_allocations.load()) / 300.0,
              static_cast<double>(allocations.load()) / 300.0);
  EXPECT_LE(main_thread_allocations.load(), 2 * 300);
  EXPECT_EQ(store.stats().errors, 0u);
}

}  // namespace
