// SPDX-License-Identifier: Apache-2.0
// Tests of the pooled single check's fast path (redis_store::run_pooled):
// the command it formats in place is byte for byte the one append_eval
// formats, the reply's integers read without hiredis are the ones hiredis
// reads, NOSCRIPT is still resent once, a check allocates nothing once
// the connection's buffers have grown, and a bad prefix is refused before a
// connection is taken; and a multiplexed check's allocations.
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
