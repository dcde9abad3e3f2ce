// SPDX-License-Identifier: Apache-2.0
// idempotent_store: request ids kept in the key's own node. The exact rules
// (shared with the other stores), the per-key cap, expiry with the key,
// memory under floods of ids, threads, and identical decisions to the
// limiter's own id table on random traces.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "support/request_id_rules.hpp"
#include "support/request_id_traces.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

template <class P>
using keyed_limiter = limiter<P, idempotent_store<P>>;

TEST(IdempotentStore, ExactRules) {
  keyed_limiter<fixed_window> lim{rltest::request_id_rules_config()};
  rltest::check_request_id_rules(lim, "");
}

TEST(IdempotentStore, ShadowModeForcesRecordsAndShadowsRepeats) {
  keyed_limiter<fixed_window> lim{rltest::request_id_rules_config()};
  rltest::check_request_id_shadow_rules(lim, "");
}

TEST(IdempotentStore, RetentionIsSetPerLimiterAndKeptById) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"100/s"}};
  EXPECT_EQ(lim.retention(), microseconds{1'000'000});
  lim.set_idempotency({.retention = microseconds{250}});
  const timestamp t0{1'000'000};
  EXPECT_FALSE(lim.try_acquire("k", request_id{"r"}, t0).repeat);
  EXPECT_TRUE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{249}).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{250}).repeat);
  // A new retention applies to ids recorded from then on; ids already held
  // keep theirs (the store keeps them, as Redis does).
  lim.set_idempotency({.retention = microseconds{1000}});
  EXPECT_TRUE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{499}).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{500}).repeat);
  EXPECT_TRUE(lim.try_acquire("k", request_id{"r"}, t0 + microseconds{1499}).repeat);
  EXPECT_EQ(lim.request_ids_held(), 0U);  // no table beside the store
  EXPECT_EQ(lim.request_id_table(), nullptr);
}

TEST(IdempotentStore, PlainAndIdempotentChecksShareOneState) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"3/s"}};
  const timestamp t0{7'000'000};
  EXPECT_EQ(lim.try_acquire("k", t0).remaining, 2);
  EXPECT_EQ(lim.try_acquire("k", request_id{"a"}, t0).remaining, 1);
  EXPECT_EQ(lim.try_acquire("k", request_id{"a"}, t0).remaining, 1);  // the repeat
  EXPECT_EQ(lim.try_acquire("k", t0).remaining, 0);
  EXPECT_EQ(lim.store().state_of("k").count, 3);
  EXPECT_EQ(lim.store().ids_of("k"), 1U);
}

TEST(IdempotentStore, BadOptionsAreRefusedNamingTheValue) {
  try {
    idempotent_store<gcra> s({}, {.max_ids_per_key = 4097});
    ADD_FAILURE() << "a cap of 4097 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("4097"), std::string::npos) << e.what();
  }
  EXPECT_EQ(idempotent_store<gcra>({}, {.max_ids_per_key = 4096}).max_ids_per_key(), 4096U);
  EXPECT_EQ(idempotent_store<gcra>().max_ids_per_key(), 64U);
  EXPECT_THROW(idempotent_store<gcra>({.shards = max_shards + 1}), std::invalid_argument);
}

// set_idempotency checks every option whatever the store: a store that
// keeps ids itself ignores `stripes`, but a count no store accepts is
// refused, naming the value, and the limiter is left as it was.
TEST(IdempotentStore, BadIdempotencyOptionsAreRefusedNamingTheValue) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"100/s"}};
  lim.set_idempotency({.retention = microseconds{250}});
  const auto refused = [&](const idempotency_options& o, const std::string& value) {
    try {
      lim.set_idempotency(o);
      ADD_FAILURE() << value << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(value), std::string::npos) << e.what();
    }
    EXPECT_EQ(lim.retention(), microseconds{250});
  };
  refused({.retention = microseconds{-1}}, "-1us");
  refused({.retention = max_time + microseconds{1}},
          std::to_string((max_time + microseconds{1}).count()));
  refused({.retention = microseconds{100}, .stripes = 65537}, "65537");
  refused({.stripes = std::size_t{1} << 40}, std::to_string(std::size_t{1} << 40));
  lim.set_idempotency({.retention = microseconds{100}, .max_ids = 1, .stripes = 65536});
  EXPECT_EQ(lim.retention(), microseconds{100});
}

TEST(IdempotentStore, DegradedDecisionsAreNotRecorded) {
  keyed_limiter<fixed_window> lim{
      fixed_window::config{"5/s"},
      idempotent_store<fixed_window>{{.max_keys = 1, .on_full = when_full::fail_closed}}};
  const timestamp t0{10'000'000};
  EXPECT_TRUE(lim.try_acquire("a", t0).allowed);
  const decision full = lim.try_acquire("b", request_id{"r"}, t0);
  EXPECT_EQ(full.source, decision_source::fail_closed);
  EXPECT_FALSE(full.repeat);
  EXPECT_EQ(lim.try_acquire("b", request_id{"r"}, t0).source, decision_source::fail_closed);
  // "a" is idle from the next window on: its place goes to "b", decided as new.
  const decision later = lim.try_acquire("b", request_id{"r"}, t0 + microseconds{1'000'000});
  EXPECT_EQ(later.source, decision_source::store);
  EXPECT_TRUE(later.allowed);
  EXPECT_FALSE(later.repeat);
  EXPECT_TRUE(lim.try_acquire("b", request_id{"r"}, t0 + microseconds{1'000'001}).repeat);
}

// The cap: a new id of a key at its cap takes the place of the key's id
// whose retention ends first; a retry of that id is then a new request.
TEST(IdempotentStore, AtTheKeysCapANewIdEvictsTheIdEndingFirst) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"1000/s"},
                                  idempotent_store<fixed_window>{{}, {.max_ids_per_key = 3}}};
  const timestamp t0{5'000'000};
  EXPECT_FALSE(lim.try_acquire("k", request_id{"1"}, t0 + microseconds{2}).repeat);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"2"}, t0).repeat);  // ends first
  EXPECT_FALSE(lim.try_acquire("k", request_id{"3"}, t0 + microseconds{1}).repeat);
  EXPECT_EQ(lim.store().ids_of("k"), 3U);
  EXPECT_FALSE(lim.try_acquire("k", request_id{"4"}, t0 + microseconds{3}).repeat);
  EXPECT_EQ(lim.store().ids_of("k"), 3U);
  EXPECT_TRUE(lim.peek("k", request_id{"1"}, t0 + microseconds{4}).repeat);
  EXPECT_TRUE(lim.peek("k", request_id{"3"}, t0 + microseconds{4}).repeat);
  EXPECT_TRUE(lim.peek("k", request_id{"4"}, t0 + microseconds{4}).repeat);
  const decision retried = lim.try_acquire("k", request_id{"2"}, t0 + microseconds{4});
  EXPECT_FALSE(retried.repeat);
  EXPECT_EQ(retried.remaining, 1000 - 5);  // consumed again
  // ... and it evicted "3" (ending at t0 + 1 us + 1 s), the first to end now.
  EXPECT_FALSE(lim.peek("k", request_id{"3"}, t0 + microseconds{5}).repeat);
  EXPECT_TRUE(lim.peek("k", request_id{"1"}, t0 + microseconds{5}).repeat);
  EXPECT_EQ(lim.store().ids_of("k"), 3U);
}

// Below the cap, a new id takes the place of an id dropped (its retention
// ended at least one retention ago) before the key holds one more.
TEST(IdempotentStore, DroppedIdsArePlacesForNewOnes) {
  keyed_limiter<gcra> lim{gcra::config{"1000/s"},
                          idempotent_store<gcra>{{}, {.max_ids_per_key = 4}}};
  lim.set_idempotency({.retention = microseconds{100}});
  const timestamp t0{1'000'000};
  (void)lim.try_acquire("k", request_id{"a"}, t0);
  (void)lim.try_acquire("k", request_id{"b"}, t0 + microseconds{150});
  (void)lim.try_acquire("k", request_id{"c"}, t0 + microseconds{150});
  EXPECT_EQ(lim.store().ids_of("k"), 3U);
  // At t0 + 199 "a" (ended at t0 + 100) is kept for out-of-order checks ...
  EXPECT_TRUE(lim.peek("k", request_id{"a"}, t0 + microseconds{99}).repeat);
  (void)lim.try_acquire("k", request_id{"d"}, t0 + microseconds{199});
  EXPECT_EQ(lim.store().ids_of("k"), 4U);
  // ... at t0 + 200 it is dropped: "e" takes its place.
  (void)lim.try_acquire("k", request_id{"e"}, t0 + microseconds{200});
  EXPECT_EQ(lim.store().ids_of("k"), 4U);
  EXPECT_FALSE(lim.peek("k", request_id{"a"}, t0 + microseconds{99}).repeat);
  for (const char* id : {"b", "c", "d", "e"}) {
    EXPECT_TRUE(lim.peek("k", request_id{id}, t0 + microseconds{201}).repeat) << id;
  }
}

TEST(IdempotentStore, AFloodOfIdsOnOneKeyHoldsTheCap) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"1000000/h"}};
  lim.set_idempotency({.retention = std::chrono::hours{1}});
  const timestamp t0{5'000'000};
  for (int i = 0; i < 10000; ++i) {
    (void)lim.try_acquire("+15551234567", request_id{"id" + std::to_string(i)},
                          t0 + microseconds{i});
  }
  EXPECT_EQ(lim.store().ids_of("+15551234567"), 64U);
  const timestamp after = t0 + microseconds{10000};
  for (int i = 10000 - 64; i < 10000; ++i) {
    EXPECT_TRUE(lim.peek("+15551234567", request_id{"id" + std::to_string(i)}, after).repeat) << i;
  }
  EXPECT_FALSE(lim.peek("+15551234567", request_id{"id9935"}, after).repeat);
  EXPECT_EQ(lim.peek("+15551234567", after).remaining, 1000000 - 10000 - 1);
}

TEST(IdempotentStore, AFloodOfIdsOnManyKeysHoldsMaxKeys) {
  keyed_limiter<fixed_window> lim{
      fixed_window::config{"1000/h"},
      idempotent_store<fixed_window>{{.max_keys = 100}, {.max_ids_per_key = 8}}};
  const timestamp t0{5'000'000};
  std::size_t degraded = 0;
  for (int k = 0; k < 1000; ++k) {
    for (int i = 0; i < 20; ++i) {
      const decision d = lim.try_acquire("key" + std::to_string(k),
                                         request_id{"id" + std::to_string(i)}, t0);
      degraded += d.degraded() ? 1 : 0;
    }
  }
  EXPECT_EQ(lim.store().size(), 100U);
  EXPECT_EQ(degraded, 900U * 20U);
  EXPECT_EQ(lim.store().ids_of("key0"), 8U);
}

// A key stays while any of its ids is held: it is idle when its policy
// state is and every id was dropped, one retention after its own ended.
TEST(IdempotentStore, AKeyIsReclaimedOneRetentionAfterItsLastIdEnded) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"10/s"}};
  const timestamp t0{3'000'000};  // a window start
  (void)lim.try_acquire("k", request_id{"x"}, t0);
  auto& store = lim.store();
  EXPECT_EQ(store.sweep(lim.config(), t0 + microseconds{1'999'999}), 0U);
  EXPECT_TRUE(lim.try_acquire("k", request_id{"x"}, t0 - microseconds{1}).repeat);
  EXPECT_EQ(store.sweep(lim.config(), t0 + microseconds{2'000'000}), 1U);
  EXPECT_EQ(store.size(), 0U);
  // reset(key) keeps the ids, so the key stays too.
  (void)lim.try_acquire("r", request_id{"x"}, t0);
  lim.reset("r");
  EXPECT_EQ(store.size(), 1U);
  EXPECT_EQ(store.state_of("r"), fixed_window::state{});
  EXPECT_TRUE(lim.try_acquire("r", request_id{"x"}, t0 + microseconds{1}).repeat);
  // A reset of a key never seen records nothing.
  lim.reset("never");
  EXPECT_EQ(store.size(), 1U);
}

TEST(IdempotentStore, IdsBeyondTwoGoToOneHeapBlockPerKey) {
  keyed_limiter<sliding_window_log> lim{sliding_window_log::config{"100/min"}};
  const timestamp t0{60'000'000};
  (void)lim.try_acquire("k", request_id{"1"}, t0);
  (void)lim.try_acquire("k", request_id{"2"}, t0);
  EXPECT_EQ(lim.store().memory().state_of("k").heap_records(), 0U);
  (void)lim.try_acquire("k", request_id{"3"}, t0);
  EXPECT_EQ(lim.store().memory().state_of("k").heap_records(), 2U);
  for (int i = 4; i <= 10; ++i) (void)lim.try_acquire("k", request_id{std::to_string(i)}, t0);
  EXPECT_EQ(lim.store().memory().state_of("k").heap_records(), 8U);
  for (int i = 1; i <= 10; ++i) {
    EXPECT_TRUE(lim.try_acquire("k", request_id{std::to_string(i)}, t0).repeat) << i;
  }
  EXPECT_EQ(lim.peek("k", t0).remaining, 100 - 10 - 1);
}

TEST(IdempotentStore, SixteenThreadsRetryingOneRequestConsumeOnce) {
  for (int round = 0; round < 20; ++round) {
    keyed_limiter<sliding_window_log> lim{sliding_window_log::config{"100/min"}};
    const timestamp t0{60'000'000};
    std::atomic<int> firsts{0};
    std::atomic<int> repeats{0};
    std::vector<std::thread> pool;
    for (int i = 0; i < 16; ++i) {
      pool.emplace_back([&] {
        const decision d = lim.try_acquire("+15551234567", request_id{"call-1;1 INVITE"}, t0);
        ++(d.repeat ? repeats : firsts);
      });
    }
    for (auto& t : pool) t.join();
    EXPECT_EQ(firsts.load(), 1);
    EXPECT_EQ(repeats.load(), 15);
    EXPECT_EQ(lim.peek("+15551234567", t0).remaining, 98);  // after the peeked one
  }
}

TEST(IdempotentStore, ThreadsWithDistinctIdsOnOneKeyConsumeEach) {
  keyed_limiter<fixed_window> lim{fixed_window::config{"1000000/min"},
                                  idempotent_store<fixed_window>{{}, {.max_ids_per_key = 4096}}};
  const timestamp t0{60'000'000};
  std::vector<std::thread> pool;
  for (int i = 0; i < 8; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < 500; ++j) {
        const std::string id = std::to_string(i) + ":" + std::to_string(j);
        EXPECT_FALSE(lim.try_acquire("k", request_id{id}, t0).repeat);
        EXPECT_TRUE(lim.try_acquire("k", request_id{id}, t0).repeat);
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(lim.peek("k", t0).remaining, 1000000 - 8 * 500 - 1);
  EXPECT_EQ(lim.store().ids_of("k"), 4000U);
}

// Retries of a few ids on a few keys from several threads, while another
// thread sweeps, another resets keys and another peeks: each (key, id) is
// decided once (a sweep never drops a key holding a live id, a reset keeps
// the ids).
TEST(IdempotentStore, RetriesWhileSweepsResetsAndPeeksRunConsumeOncePerId) {
  keyed_limiter<gcra> lim{gcra::config{"100000/s"},
                          idempotent_store<gcra>{{.shards = 2}, {.max_ids_per_key = 16}}};
  const timestamp t0{1'000'000};
  std::atomic<int> firsts{0};
  std::vector<std::thread> pool;
  for (int th = 0; th < 6; ++th) {
    pool.emplace_back([&, th] {
      for (int j = 0; j < 3000; ++j) {
        const std::string key = "k" + std::to_string(j % 7);
        const std::string id = "i" + std::to_string(j % 5);
        if (th == 5) {
          if (j % 50 == 0) (void)lim.store().sweep(lim.config(), t0 + microseconds{j % 3});
        } else if (th == 4) {
          if (j % 97 == 0) lim.reset(key);
        } else if (th == 3) {
          (void)lim.peek(key, request_id{id}, t0);
        } else if (!lim.try_acquire(key, request_id{id}, t0 + microseconds{j % 3}).repeat) {
          firsts.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(firsts.load(), 7 * 5);
  EXPECT_EQ(lim.store().size(), 7U);
}

// A key the store does not hold is decided at the shard's last reclaim when
// that is later than the check (memory_store's reclaim rule), but its id's
// retention still runs from the check's own time, as in the limiter's table
// and on Redis: a retry at exactly t + retention is a new request.
TEST(IdempotentStore, AnIdsRetentionRunsFromItsCheckAfterAReclaim) {
  const fixed_window::config cfg{"10/s"};
  limiter<fixed_window> table{cfg, memory_store<fixed_window>{{.shards = 1}}};
  keyed_limiter<fixed_window> node{cfg, idempotent_store<fixed_window>{{.shards = 1}}};
  const timestamp t0{10'000'000};
  (void)table.try_acquire("old", t0);
  (void)node.try_acquire("old", t0);
  // A new key at t1 reclaims "old" (idle since t0 + 1 s): the shard's mark is t1.
  const timestamp t1{20'000'000};
  (void)table.try_acquire("new", t1);
  (void)node.try_acquire("new", t1);
  ASSERT_EQ(node.store().size(), 1U);
  // A check stamped half a retention before t1 (out of order, within the rules).
  const timestamp early = t1 - microseconds{500'000};
  const decision first = node.try_acquire("k", request_id{"x"}, early);
  EXPECT_EQ(rltest::describe_id(first),
            rltest::describe_id(table.try_acquire("k", request_id{"x"}, early)));
  const timestamp end = early + node.retention();
  EXPECT_TRUE(node.try_acquire("k", request_id{"x"}, end - microseconds{1}).repeat);
  EXPECT_TRUE(table.try_acquire("k", request_id{"x"}, end - microseconds{1}).repeat);
  const decision again = node.try_acquire("k", request_id{"x"}, end);
  EXPECT_FALSE(again.repeat);
  EXPECT_EQ(rltest::describe_id(again),
            rltest::describe_id(table.try_acquire("k", request_id{"x"}, end)));
}

/// One limiter over memory_store<P> (ids in the table) and one over
/// idempotent_store<P>, each holding every key of a random trace (ids shared
/// between keys, peeks, resets, plain checks, sweeps). With times in order
/// every decision is equal field for field. With times running back by less
/// than a retention, whether a check is a repeat is still equal; the other
/// fields of a new request may differ, since each store decides a key it no
/// longer holds at its shard's last reclaim, and keys holding ids are
/// reclaimed later.
template <class P>
void shared_store_trace(const typename P::config& cfg, std::uint64_t seed, bool in_order) {
  std::mt19937_64 rng(seed);
  limiter<P> table{cfg};
  keyed_limiter<P> node{cfg, idempotent_store<P>{{}, {.max_ids_per_key = 4096}}};
  const std::int64_t w = detail::natural_period_us(cfg);
  const std::int64_t r = rltest::id_uniform(rng, 1, 3) * std::max<std::int64_t>(1, w / 2);
  table.set_idempotency({.retention = microseconds{r}});
  node.set_idempotency({.retention = microseconds{r}});
  std::int64_t t = 100'000'000'000'000;
  std::int64_t latest = t;
  for (int i = 0; i < 1500; ++i) {
    switch (rltest::id_uniform(rng, 0, in_order ? 4 : 5)) {
      case 0: break;
      case 1: t += rltest::id_uniform(rng, 0, 3); break;
      case 2: t += rltest::id_uniform(rng, 0, w / 4 + 1); break;
      case 3: t += r - rltest::id_uniform(rng, -1, 1); break;
      case 4: t += 1; break;
      default: t -= rltest::id_uniform(rng, 0, r - 1);
    }
    t = std::max(t, latest - (r - 1));
    latest = std::max(latest, t);
    const std::string key = "k" + std::to_string(rltest::id_uniform(rng, 0, 20));
    const std::string id_bytes = "i" + std::to_string(rltest::id_uniform(rng, 0, 30));
    const request_id id{id_bytes};
    const units cost = rltest::id_uniform(rng, 0, 5) == 0
                           ? rltest::id_uniform(rng, 1, cfg.limit() + 2)
                           : 1;
    const timestamp now{t};
    decision a;
    decision b;
    switch (rltest::id_uniform(rng, 0, 19)) {
      case 0:
        table.reset(key);
        node.reset(key);
        continue;
      case 1:
        if (in_order) {
          (void)table.store().sweep(cfg, now);
          (void)node.store().sweep(cfg, now);
        }
        continue;
      case 2:
        a = table.peek(key, id, now, cost);
        b = node.peek(key, id, now, cost);
        break;
      case 3:
        a = table.try_acquire(key, now, cost);
        b = node.try_acquire(key, now, cost);
        break;
      default: a = table.try_acquire(key, id, now, cost); b = node.try_acquire(key, id, now, cost);
    }
    if (in_order) {
      ASSERT_EQ(rltest::describe_id(b), rltest::describe_id(a))
          << P::name << " seed " << seed << " event " << i << " t=" << t;
    } else {
      ASSERT_EQ(b.repeat, a.repeat) << P::name << " seed " << seed << " event " << i << " t=" << t;
    }
  }
}

TEST(IdempotentStoreDifferential, OneStoreForEveryKeyMatchesTheLimitersIdTable) {
  for (std::uint64_t seed = 0; seed < 24; ++seed) {
    std::mt19937_64 rng(seed * 104729u + 5u);
    const bool in_order = seed % 2 == 0;
    shared_store_trace<fixed_window>(rltest::random_id_config<fixed_window>(rng), seed, in_order);
    shared_store_trace<sliding_window_log>(rltest::random_id_config<sliding_window_log>(rng), seed,
                                           in_order);
    shared_store_trace<sliding_window_counter>(
        rltest::random_id_config<sliding_window_counter>(rng), seed, in_order);
    shared_store_trace<token_bucket>(rltest::random_id_config<token_bucket>(rng), seed, in_order);
    shared_store_trace<gcra>(rltest::random_id_config<gcra>(rng), seed, in_order);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

/// A fresh idempotent_store per key, called as the Redis stores are, so
/// that compare_id_traces holds it to the limiter's table and to
/// limiter<P, idempotent_store<P>> (one store per key: see the helper).
template <class P>
struct per_key_stores {
  std::map<std::string, idempotent_store<P>> stores;
  idempotent_store<P>& of(std::string_view key) { return stores[std::string(key)]; }
  decision apply(const typename P::config& cfg, std::string_view key, timestamp now, units cost,
                 ratelimit::access a) {
    return of(key).apply(cfg, key, now, cost, a);
  }
  decision apply_once(const typename P::config& cfg, std::string_view key, request_id id,
                      microseconds retention, timestamp now, units cost, ratelimit::access a) {
    return of(key).apply_once(cfg, key, id, retention, now, cost, a);
  }
  void reset(const typename P::config& cfg, std::string_view key) { of(key).reset(cfg, key); }
};

template <class P>
class IdempotentStoreDifferential : public ::testing::Test {};
using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(IdempotentStoreDifferential, policies);

TYPED_TEST(IdempotentStoreDifferential, MatchesTheLimitersIdTable) {
  using P = TypeParam;
  for (int seed = 0; seed < rltest::scaled(300); ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 6151u + 11u);
    const auto cfg = rltest::random_id_config<P>(rng);
    per_key_stores<P> store;
    rltest::compare_id_traces(cfg, rng, store, seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(IdempotentStoreDifferential, CompoundMatchesTheLimitersIdTable) {
  using mixed = compound<fixed_window, gcra>;
  for (int seed = 0; seed < rltest::scaled(200); ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919u + 3u);
    if (seed % 2 == 0) {
      const compound_of<sliding_window_log>::config cfg{
          {"2/s", "4/10s"}, window_options{.count_rejected = seed % 4 == 0, .name = "d"}};
      per_key_stores<compound_of<sliding_window_log>> store;
      rltest::compare_id_traces(cfg, rng, store, seed);
    } else {
      const mixed::config cfg{compound_options{.name = "d"}, fixed_window::config{"3/s"},
                              gcra::config{"1/300ms"}};
      per_key_stores<mixed> store;
      rltest::compare_id_traces(cfg, rng, store, seed);
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
