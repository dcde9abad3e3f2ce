// SPDX-License-Identifier: Apache-2.0
// Verifies that the Redis scripts decide exactly as the C++ policies: for the
// same seeded random traces and caller-supplied time, redis_store and
// memory_store return identical decisions, every field, every policy.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "redis_server.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

struct event {
  std::string key;
  std::int64_t t = 0;
  units cost = 1;
  enum kind_t { consume, peek, reset, force } kind = consume;
};

ratelimit::access access_of(event::kind_t k) {
  return k == event::peek ? access::peek : (k == event::force ? access::force : access::consume);
}

std::string describe(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted << " source=" << to_string(d.source)
    << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == never ? -1 : d.retry_after.count())
    << " reset_after=" << d.reset_after.count() << "}";
  return o.str();
}

int traces_per_policy() {
  return rltest::diff_traces(600);
}

std::int64_t pick(std::mt19937_64& rng, std::initializer_list<std::int64_t> xs) {
  std::uniform_int_distribution<std::size_t> d(0, xs.size() - 1);
  return *(xs.begin() + static_cast<std::ptrdiff_t>(d(rng)));
}

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

rate random_rate(std::mt19937_64& rng) {
  const std::int64_t limit = uniform(rng, 0, 9) == 0
                                 ? uniform(rng, 1, 5000)
                                 : pick(rng, {1, 2, 3, 4, 5, 7, 10, 16, 37, 100});
  std::int64_t period = pick(rng, {1, 2, 7, 10, 64, 1000, 999'983, 1'000'000, 60'000'000,
                                   900'000'000, 3'600'000'000, 86'400'000'000});
  if (uniform(rng, 0, 4) == 0) period = uniform(rng, 1, 5'000'000);
  return rate(limit, microseconds{period});
}

template <class P>
typename P::config random_config(std::mt19937_64& rng) {
  for (;;) {
    try {
      const rate r = random_rate(rng);
      if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
        bucket_options o;
        o.name = "t";
        if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 2 * r.limit() + 3);
        return typename P::config(r, o);
      } else {
        return typename P::config(r, window_options{uniform(rng, 0, 2) == 0, "t"});
      }
    } catch (const std::invalid_argument&) {
      // e.g. GCRA faster than 1/us: draw again
    }
  }
}

std::int64_t period_of(const rate& r) {
  return r.period().count();
}

template <class P>
std::vector<event> random_trace(std::mt19937_64& rng, const typename P::config& cfg) {
  const std::int64_t w = period_of(cfg.get_rate());
  const units limit = cfg.limit();
  static const std::vector<std::string> key_pool = {
      "+15551234567", std::string("a\0b", 3), "{braces}", "two words", "\xc3\xa9t\xc3\xa9", "}{:"};
  const auto nkeys = static_cast<std::size_t>(uniform(rng, 1, 3));
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < nkeys; ++i) {
    keys.push_back(key_pool[static_cast<std::size_t>(uniform(rng, 0, 5))] + std::to_string(i));
  }
  std::int64_t t = uniform(rng, 0, 1) == 0 ? uniform(rng, 0, 3 * w)
                                           : 1'732'950'000'000'000 + uniform(rng, 0, 1'000'000'000);
  const auto n = uniform(rng, 20, 120);
  // Forced checks (shadow mode): none, some, or most of the trace, so that
  // states far past the limit (debt, a TAT far ahead, long logs) occur.
  const std::int64_t forced_share = pick(rng, {0, 15, 60});
  std::vector<event> trace;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 9)) {
      case 0:
      case 1: break;  // same microsecond
      case 2:
      case 3: t += uniform(rng, 1, 3); break;
      case 4: t += uniform(rng, 1, std::max<std::int64_t>(1, w / std::max<units>(1, limit))); break;
      case 5: t += uniform(rng, 0, w); break;
      case 6: t += pick(rng, {w - 1, w, w + 1, 2 * w - 1, 2 * w}); break;
      case 7: t += uniform(rng, 0, 3 * w); break;
      case 8: t -= uniform(rng, 0, 2 * w); break;  // time going backwards
      default: t += uniform(rng, 0, 1000); break;
    }
    t = std::clamp<std::int64_t>(t, 0, std::int64_t{1} << 52);
    event e;
    e.key = keys[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(nkeys) - 1))];
    e.t = t;
    switch (uniform(rng, 0, 9)) {
      case 0: e.cost = uniform(rng, 1, limit + 2); break;
      case 1: e.cost = limit + uniform(rng, 1, 3); break;  // above the limit: never
      case 2: e.cost = uniform(rng, 2, 4); break;
      default: e.cost = 1; break;
    }
    const auto k = uniform(rng, 0, 49);
    e.kind = k < 4 ? event::peek : (k == 4 ? event::reset : event::consume);
    if (e.kind == event::consume && uniform(rng, 0, 99) < forced_share) e.kind = event::force;
    trace.push_back(std::move(e));
  }
  return trace;
}

template <class P>
class RedisDifferential : public ::testing::Test {};

using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(RedisDifferential, policies);

// Verifies identical decisions on thousands of random traces (count_rejected,
// costs > 1, cost > limit, time going backwards, periods down to 1 us, binary
// keys, peeks, forced checks and resets), half sent one check per round trip and half as batches.
TYPED_TEST(RedisDifferential, MatchesMemoryStoreOnRandomTraces) {
  using P = TypeParam;
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(P::name);
  redis::redis_store store(o);
  // Async checks pipelined on one multiplexed connection (same key space).
  redis::options mo = o;
  mo.multiplex = 1;
  redis::redis_store async_store(mo);
  const int traces = traces_per_policy();
  std::int64_t checks = 0;
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919u + 17u);
    const auto cfg = random_config<P>(rng);
    const auto trace = random_trace<P>(rng, cfg);
    const bool batched = seed % 2 == 1;
    const bool async = seed % 4 == 2;
    // One memory_store per key: a store's sweep of another idle key could
    // otherwise forget state that a request stamped earlier still sees.
    std::map<std::string, memory_store<P>> memory;
    std::vector<decision> expected;
    for (const event& e : trace) {
      auto& m = memory[e.key];
      if (e.kind == event::reset) {
        m.reset(cfg, e.key);
        expected.push_back(decision{});
      } else {
        expected.push_back(m.apply(cfg, e.key, microseconds{e.t}, e.cost, access_of(e.kind)));
      }
    }
    std::vector<decision> got(trace.size());
    std::size_t i = 0;
    while (i < trace.size()) {
      const event& e = trace[i];
      if (e.kind == event::reset) {
        store.reset(cfg, e.key);
        ++i;
      } else if (async) {
        // Every event up to the next reset in flight at once, in order.
        std::mutex m;
        std::condition_variable cv;
        std::size_t left = 0;
        std::vector<std::exception_ptr> errors(trace.size());
        std::vector<int> calls(trace.size(), 0);
        const std::size_t first = i;
        while (i < trace.size() && trace[i].kind != event::reset) ++i;
        {
          std::lock_guard<std::mutex> lock(m);
          left = i - first;
        }
        for (std::size_t j = first; j < i; ++j) {
          async_store.async_apply(cfg, trace[j].key, microseconds{trace[j].t}, trace[j].cost,
                                  access_of(trace[j].kind),
                                  [&, j](decision d, std::exception_ptr err) {
                                    std::lock_guard<std::mutex> lock(m);
                                    got[j] = d;
                                    errors[j] = err;
                                    ++calls[j];
                                    --left;
                                    cv.notify_one();
                                  });
        }
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [&] { return left == 0; });
        }
        for (std::size_t j = first; j < i; ++j) {
          ASSERT_EQ(calls[j], 1) << "event " << j;
          ASSERT_FALSE(errors[j]) << "event " << j;
        }
      } else if (!batched) {
        got[i] = store.apply(cfg, e.key, microseconds{e.t}, e.cost, access_of(e.kind));
        ++i;
      } else {
        // The longest run of events of one kind (consume, peek or force) without a reset.
        std::vector<redis::batch_item> batch;
        const auto kind = e.kind;
        const std::size_t first = i;
        while (i < trace.size() && trace[i].kind == kind) {
          batch.push_back({trace[i].key, trace[i].cost, microseconds{trace[i].t}});
          ++i;
        }
        auto ds = store.apply_batch(cfg, std::span<const redis::batch_item>(batch),
                                    access_of(kind));
        std::copy(ds.begin(), ds.end(), got.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    for (std::size_t j = 0; j < trace.size(); ++j) {
      ++checks;
      if (trace[j].kind == event::reset) continue;
      ASSERT_EQ(describe(got[j]), describe(expected[j]))
          << P::name << " seed " << seed << " event " << j << " t=" << trace[j].t
          << " cost=" << trace[j].cost << " peek=" << (trace[j].kind == event::peek)
          << " force=" << (trace[j].kind == event::force) << " limit=" << cfg.limit()
          << " period=" << period_of(cfg.get_rate())
          << (batched ? " (batched)" : (async ? " (async)" : ""));
      ASSERT_EQ(got[j], expected[j]);
    }
    // Start every trace from empty keys.
    for (const auto& [key, m] : memory) store.reset(cfg, key);
  }
  const redis::store_stats s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.fail_open + s.fail_closed + s.fallback, 0u);
  const redis::store_stats as = async_store.stats();
  EXPECT_GT(as.store, 0u);
  EXPECT_EQ(as.errors, 0u);
  this->RecordProperty("checks", static_cast<int>(checks));
}

// Verifies the sliding log's running totals stay exact in Lua (rebased before
// 2^52) when huge counted costs pile up under count_rejected.
TEST(RedisDifferential, SlidingLogRebasesHugeRunningTotals) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix("rebase");
  redis::redis_store store(o);
  const sliding_window_log::config cfg(rate(max_units, std::chrono::hours(1)),
                                       window_options{true, "t"});
  memory_store<sliding_window_log> memory;
  std::int64_t t = 1'000'000;
  for (int i = 0; i < 40; ++i) {
    const units cost = i % 3 == 0 ? max_units : (i % 3 == 1 ? max_units / 2 + 1 : 3);
    t += i % 5 == 0 ? 900'000'000 : 1;
    const auto want = memory.apply(cfg, "k", microseconds{t}, cost, access::consume);
    const auto got = store.apply(cfg, "k", microseconds{t}, cost, access::consume);
    ASSERT_EQ(describe(got), describe(want)) << "step " << i;
  }
}

// Verifies identical decisions and saturation at 2^52 when huge costs are
// forced again and again past the limit: the fixed window's and sliding
// counter's counts, the bucket's debt and GCRA's TAT stop at their ceilings
// in both stores, and what the scripts wrote is read back by their strict
// readers (no script error).
template <class P>
void forced_saturation(const typename P::config& cfg, const char* name) {
  redis::options o = rltest::shared_redis();
  o.prefix = rltest::unique_prefix(std::string("saturate-") + name);
  redis::redis_store store(o);
  memory_store<P> memory;
  std::int64_t t = 1'000'000;
  for (int i = 0; i < 60; ++i) {
    const units cost = i % 4 == 3 ? 1 : (i % 4 == 2 ? cfg.limit() : max_units);
    t += i % 7 == 0 ? 1'000 : 0;
    const ratelimit::access a = i % 5 == 4 ? access::peek
                                           : (i % 6 == 5 ? access::consume : access::force);
    const auto want = memory.apply(cfg, "k", microseconds{t}, cost, a);
    const auto got = store.apply(cfg, "k", microseconds{t}, cost, a);
    ASSERT_EQ(describe(got), describe(want)) << name << " step " << i << " cost " << cost;
  }
  EXPECT_EQ(store.stats().errors, 0u);
}

TEST(RedisDifferential, ForcedChecksSaturateIdentically) {
  forced_saturation<fixed_window>(fixed_window::config("10/1h", window_options{false, "t"}),
                                  "fixed");
  forced_saturation<sliding_window_counter>(
      sliding_window_counter::config("10/1h", window_options{false, "t"}), "counter");
  forced_saturation<sliding_window_log>(
      sliding_window_log::config("10/1h", window_options{false, "t"}), "log");
  forced_saturation<token_bucket>(token_bucket::config("10/1h", bucket_options{{}, "t"}), "bucket");
  forced_saturation<token_bucket>(token_bucket::config("7/1us", bucket_options{{}, "t"}),
                                  "fast-bucket");
  forced_saturation<gcra>(gcra::config("10/1h", bucket_options{{}, "t"}), "gcra");
  forced_saturation<gcra>(gcra::config("1/1us", bucket_options{{}, "t"}), "fast-gcra");
}

}  // namespace
