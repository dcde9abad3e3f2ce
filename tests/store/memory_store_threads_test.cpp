// SPDX-License-Identifier: Apache-2.0
// memory_store under threads: checks on held keys while another thread inserts, resets and
// sweeps the same shards (growing and shrinking their tables); a forked child.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "support/fork_child.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::memory_store;
using ratelimit::memory_store_options;
using ratelimit::timestamp;

// Checkers work at this time; the churning thread works far earlier, so
// that its sweeps find its own keys idle and never the checkers' keys (a
// state recorded at a later time is not idle at an earlier one).
constexpr timestamp late = 1'000'000h;

/// Inserts keys at `round` times 2 hours, sweeps them all away an hour
/// later (the configs below have 1-hour windows, so every one of them is
/// idle then; the sweep shrinks the tables again), and resets a few on the
/// way, until `stop`; counts the rounds done in `rounds`.
template <class Store, class Config>
void churn(Store& store, const Config& cfg, const std::atomic<bool>& stop, std::atomic<int>& rounds,
           int keys_per_round) {
  for (int round = 0; !stop.load(std::memory_order_relaxed); ++round) {
    const timestamp at = std::chrono::hours(2 * round);
    for (int i = 0; i < keys_per_round; ++i) {
      const std::string key = "churn-" + std::to_string(round) + "-" + std::to_string(i);
      (void)store.apply(cfg, key, at, 1, access::consume);
      if (i % 7 == 0) store.reset(cfg, key);
    }
    (void)store.sweep(cfg, at + 1h);
    rounds.fetch_add(1);
  }
}

/// Checker threads on their own keys and on keys they all share, with one
/// more thread churning keys in the same shards: every key admits exactly
/// its limit, and the store ends holding exactly the checkers' keys.
template <class Store>
void checkers_with_churn(const typename Store::config_type& cfg, std::size_t limit,
                         memory_store_options options) {
  Store store(options);
  constexpr std::size_t threads = 3;
  constexpr std::size_t own_keys = 40;
  constexpr std::size_t shared_keys = 8;
  const auto attempts = static_cast<int>(limit) + 10;
  std::vector<std::size_t> own_admitted(threads, 0);
  std::vector<std::atomic<std::size_t>> shared_admitted(shared_keys);
  // Every key's first request comes before the churn: a new key's insertion
  // reclaims idle keys at the checkers' time, after which the shard decides
  // new keys at that time (the reclaimed_at rule), and the churn's keys
  // would no longer be idle at its own sweeps.
  for (std::size_t t = 0; t < threads; ++t) {
    for (std::size_t k = 0; k < own_keys; ++k) {
      const std::string key = "own-" + std::to_string(t) + "-" + std::to_string(k);
      if (store.apply(cfg, key, late, 1, access::consume).allowed) ++own_admitted[t];
    }
  }
  for (std::size_t k = 0; k < shared_keys; ++k) {
    if (store.apply(cfg, "shared-" + std::to_string(k), late, 1, access::consume).allowed) {
      shared_admitted[k].fetch_add(1);
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread churner([&] { churn(store, cfg, stop, rounds, 300); });
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // Until the churn has grown and shrunk the tables many times.
      for (int a = 0; a < attempts || rounds.load() < 30; ++a) {
        for (std::size_t k = 0; k < own_keys; ++k) {
          const std::string key = "own-" + std::to_string(t) + "-" + std::to_string(k);
          if (store.apply(cfg, key, late, 1, access::consume).allowed) ++own_admitted[t];
        }
        for (std::size_t k = 0; k < shared_keys; ++k) {
          const std::string key = "shared-" + std::to_string((k + t) % shared_keys);
          if (store.apply(cfg, key, late, 1, access::consume).allowed) {
            shared_admitted[(k + t) % shared_keys].fetch_add(1);
          }
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  stop = true;
  churner.join();
  for (std::size_t t = 0; t < threads; ++t) EXPECT_EQ(own_admitted[t], limit * own_keys) << t;
  for (std::size_t k = 0; k < shared_keys; ++k) EXPECT_EQ(shared_admitted[k].load(), limit) << k;
  for (std::size_t t = 0; t < threads; ++t) {
    for (std::size_t k = 0; k < own_keys; ++k) {
      const std::string key = "own-" + std::to_string(t) + "-" + std::to_string(k);
      EXPECT_FALSE(store.apply(cfg, key, late, 1, access::peek).allowed) << key;
    }
  }
  // The churn's keys are idle before the checkers' time, which keys are not.
  const std::size_t held = store.size();
  EXPECT_EQ(store.sweep(cfg, late - 1h), held - (threads * own_keys + shared_keys));
  // Every key is idle once its window is over, and the count agrees.
  EXPECT_EQ(store.sweep(cfg, late + 2h), threads * own_keys + shared_keys);
  EXPECT_EQ(store.size(), 0u);
}

// Verifies that checks on held keys, disjoint and shared, stay exact while
// another thread grows, shrinks, resets and sweeps the same shards, for a
// policy with an inline state, one with a heap-backed state (the log keeps
// more than two entries on the heap) and the GCRA.
TEST(MemoryStoreThreads, DisjointAndSharedKeysWhileAnotherThreadChurns) {
  checkers_with_churn<memory_store<ratelimit::fixed_window>>(
      ratelimit::fixed_window::config{ratelimit::rate{20, 1h}}, 20, {.shards = 4});
  checkers_with_churn<memory_store<ratelimit::sliding_window_log>>(
      ratelimit::sliding_window_log::config{ratelimit::rate{5, 1h}}, 5, {.shards = 2});
  checkers_with_churn<memory_store<ratelimit::gcra>>(
      ratelimit::gcra::config{ratelimit::rate{20, 1h}}, 20, {.shards = 1});
}

// Verifies atomicity on one key while its shard's table is rebuilt under it:
// with one shard every churned key lands in the hot key's shard, so its node
// is relinked by each growth and shrink. Exactly the limit is admitted.
TEST(MemoryStoreThreads, OneKeyAdmitsExactlyTheLimitWhileItsShardChurns) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{5000, 1h}};
  memory_store<ratelimit::fixed_window> store({.shards = 1});
  // Held before the churn starts (see checkers_with_churn).
  std::atomic<std::size_t> admitted{store.apply(cfg, "hot", late, 1, access::consume).allowed ? 1U
                                                                                              : 0U};
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread churner([&] { churn(store, cfg, stop, rounds, 500); });
  std::vector<std::thread> pool;
  for (int t = 0; t < 3; ++t) {
    pool.emplace_back([&] {
      std::size_t mine = 0;
      for (int i = 0; i < 3000 || rounds.load() < 30; ++i) {
        if (store.apply(cfg, "hot", late, 1, access::consume).allowed) ++mine;
      }
      admitted.fetch_add(mine);
    });
  }
  for (std::thread& th : pool) th.join();
  stop = true;
  churner.join();
  EXPECT_EQ(admitted.load(), 5000u);
  EXPECT_FALSE(store.apply(cfg, "hot", late, 1, access::peek).allowed);
  EXPECT_EQ(store.state_of("hot").count, 5000);
}

// Verifies the same through `apply_reading`, the path of a limiter that reads
// its own clock: it prefetches the key's bucket from the shard's table
// address read without the lock while the churn moves that table (run
// under ThreadSanitizer in CI). Exactly the limit is admitted and the clock
// is read once per check.
TEST(MemoryStoreThreads, ReadingTheClockAdmitsExactlyTheLimitWhileItsShardChurns) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{5000, 1h}};
  memory_store<ratelimit::fixed_window> store({.shards = 1});
  std::atomic<std::size_t> admitted{store.apply(cfg, "hot", late, 1, access::consume).allowed ? 1U
                                                                                              : 0U};
  std::atomic<std::size_t> readings{0};
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread churner([&] { churn(store, cfg, stop, rounds, 500); });
  std::vector<std::thread> pool;
  constexpr int threads = 3;
  std::atomic<std::size_t> checks{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::size_t mine = 0;
      std::size_t done = 0;
      const auto read_late = [&readings] {
        readings.fetch_add(1, std::memory_order_relaxed);
        return late;
      };
      for (int i = 0; i < 3000 || rounds.load() < 30; ++i, ++done) {
        if (store.apply_reading(cfg, "hot", read_late, 1, access::consume).allowed) ++mine;
      }
      admitted.fetch_add(mine);
      checks.fetch_add(done);
    });
  }
  for (std::thread& th : pool) th.join();
  stop = true;
  churner.join();
  EXPECT_EQ(admitted.load(), 5000u);
  EXPECT_EQ(readings.load(), checks.load());
  EXPECT_FALSE(store.apply(cfg, "hot", late, 1, access::peek).allowed);
  EXPECT_EQ(store.state_of("hot").count, 5000);
}

// Verifies the paths that now take a bucket's lock and then the shard's:
// threads that insert new keys into one shard at once (its table grows from
// nothing to 8192 buckets under them), each key checked right after by its
// own thread and by its neighbour, peeked through `inspect` and checked
// again through `apply_hashed`, while a sweeper drops nothing (every key is
// live). Each key admits exactly its limit, the store ends holding every
// key once, and no chain grows long.
TEST(MemoryStoreThreads, ConcurrentInsertsIntoOneShardAreExact) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{3, 1h}};
  memory_store<ratelimit::fixed_window> store({.shards = 1});
  constexpr std::size_t threads = 4;
  constexpr int keys_each = 1500;
  const auto key_of = [](std::size_t t, int i) {
    return "ins-" + std::to_string(t) + "-" + std::to_string(i);
  };
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> swept{0};
  std::thread sweeper([&] {
    while (!stop.load(std::memory_order_relaxed)) swept.fetch_add(store.sweep(cfg, late));
  });
  std::vector<std::size_t> admitted(threads, 0);
  std::vector<std::size_t> bad_peeks(threads, 0);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < keys_each; ++i) {
        const std::string mine = key_of(t, i);
        const std::string next = key_of((t + 1) % threads, i);
        for (const std::string* k : {&mine, &next, &mine}) {
          if (store.apply(cfg, *k, late, 1, access::consume).allowed) ++admitted[t];
        }
        // Between one and three requests are counted on `mine` by now.
        const long seen = store.inspect(mine, [](const auto* s) { return s ? s->count : -1L; });
        if (seen < 1 || seen > 3) ++bad_peeks[t];
        if (store.apply_hashed(cfg, mine, store.key_hash(mine), late, 1, access::consume).allowed) {
          ++admitted[t];
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  stop = true;
  sweeper.join();
  std::size_t total = 0;
  for (std::size_t t = 0; t < threads; ++t) {
    total += admitted[t];
    EXPECT_EQ(bad_peeks[t], 0u) << t;
  }
  // Four requests per key from its own thread, one from its neighbour's.
  EXPECT_EQ(total, std::size_t{3} * threads * keys_each);
  EXPECT_EQ(swept.load(), 0u);
  EXPECT_EQ(store.size(), std::size_t{threads} * keys_each);
  for (std::size_t t = 0; t < threads; ++t) {
    for (int i = 0; i < keys_each; i += 97) {
      EXPECT_EQ(store.state_of(key_of(t, i)).count, 3) << key_of(t, i);
    }
  }
  EXPECT_LE(store.longest_chain(), 12u);
}

// Verifies that a check that finds a held key without the shard's lock (by
// its bucket alone) always finds it while another thread grows the key's
// shard to 1,024 buckets and halves it back to 128, over and over: `inspect`
// sees every held key's state (it never falls back to the shard's lock, so
// a bucket taken under a mask that a resize changed meanwhile would show a
// held key as absent) and a peek through `apply_hashed` denies each full
// key. Every key admits exactly its limit.
TEST(MemoryStoreThreads, HeldKeysAreAlwaysFoundWhileTheirShardGrowsAndHalves) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1h}};
  memory_store<ratelimit::fixed_window> store({.shards = 1});
  constexpr std::size_t keys = 24;
  std::vector<std::string> held;
  for (std::size_t k = 0; k < keys; ++k) {
    held.push_back("held-" + std::to_string(k));
    EXPECT_TRUE(store.apply(cfg, held.back(), late, 2, access::consume).allowed);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread churner([&] { churn(store, cfg, stop, rounds, 500); });
  constexpr std::size_t threads = 2;
  std::vector<std::size_t> missed(threads, 0);
  std::vector<std::size_t> admitted(threads, 0);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < 2000 || rounds.load() < 20; ++i) {
        const std::string& key = held[(static_cast<std::size_t>(i) + t) % keys];
        if (store.inspect(key, [](const auto* s) { return s == nullptr ? 0L : s->count; }) != 2) {
          ++missed[t];
        }
        const std::uint64_t h = store.key_hash(key);
        if (store.apply_hashed(cfg, key, h, late, 1, access::peek).allowed) ++admitted[t];
        if (store.apply(cfg, key, late, 1, access::consume).allowed) ++admitted[t];
      }
    });
  }
  for (std::thread& th : pool) th.join();
  stop = true;
  churner.join();
  for (std::size_t t = 0; t < threads; ++t) {
    EXPECT_EQ(missed[t], 0U) << t;
    EXPECT_EQ(admitted[t], 0U) << t;
  }
  for (const std::string& key : held) EXPECT_EQ(store.state_of(key).count, 2) << key;
}

// Verifies that the child of a fork made while no thread held a lock (the
// threads that used the store have ended) checks, inserts, grows and sweeps
// the copied store normally.
TEST(MemoryStoreThreads, ForkedChildStillWorks) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{3, 1s}};
  memory_store<ratelimit::fixed_window> store({.shards = 2});
  std::thread user([&] {
    for (int i = 0; i < 100; ++i) {
      (void)store.apply(cfg, "k" + std::to_string(i), 0s, 1, access::consume);
    }
  });
  user.join();
  const rltest::child_end end = rltest::in_child([&] {
    if (store.apply(cfg, "k1", 0s, 1, access::consume).remaining != 1) return 1;
    for (int i = 100; i < 2000; ++i) {
      if (!store.apply(cfg, "k" + std::to_string(i), 0s, 1, access::consume).allowed) return 2;
    }
    if (store.size() != 2000) return 3;
    if (store.sweep(cfg, 1s) != 2000) return 4;
    return store.apply(cfg, "k1", 1s, 1, access::consume).remaining == 2 ? 0 : 5;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.status, 0);
  // The parent's store is untouched by the child.
  EXPECT_EQ(store.size(), 100u);
  EXPECT_EQ(store.apply(cfg, "k1", 0s, 1, access::peek).remaining, 1);
}

}  // namespace
