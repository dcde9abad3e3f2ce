// SPDX-License-Identifier: Apache-2.0
// Tests of lease_hint: an operation given a hint decides exactly as the same
// operation without one, whatever the hint (fresh, stale, from another key,
// lease, limiter or store, never filled), in process; and the store's
// apply_hashed with any hash decides as apply.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/concurrency.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

const timestamp t0{1'000'000};

std::string describe(const decision& d) {
  return std::string(d.allowed ? "allowed" : "rejected") + (d.counted ? " counted" : "") +
         (d.repeat ? " repeat" : "") + " limit " + std::to_string(d.limit) + " remaining " +
         std::to_string(d.remaining) + " retry " + std::to_string(d.retry_after.count()) +
         " reset " + std::to_string(d.reset_after.count());
}

/// Replays one random trace on two limiters with the same config, the one
/// with hints (picked at random among the hints of every earlier acquire,
/// of any key and id, of a second limiter, or a default one), the other
/// without, and requires identical decisions. Steps land on expiries and the
/// microseconds around them; keys are also reset and swept away and come
/// back, so hints outlive their keys' nodes.
template <class R, class... RateConfig>
void same_decisions(unsigned seed, const RateConfig&... rate) {
  const concurrency_config cc{2, microseconds{1000}, concurrency_options{.name = "calls"}};
  // The two compared stores share their hash key: times here run backwards
  // now and then, and then a decision may depend on which idle keys a store
  // reclaimed (see memory_store_options::hash_key), which follows the key.
  // The third store's differs, so that its hints are foreign.
  const auto store = [](std::uint64_t k) {
    return memory_store<leases<R>>{memory_store_options{.hash_key = {{k, ~k}}}};
  };
  concurrency_limiter<R> hinted{cc, rate..., store(seed)};
  concurrency_limiter<R> plain{cc, rate..., store(seed)};
  concurrency_limiter<R> other{cc, rate..., store(seed + 77)};  // fills foreign hints
  std::mt19937 rng(seed);
  std::vector<lease_hint> hints(1);                                 // a default one first
  std::map<std::pair<std::string, std::string>, std::size_t> last;  // (key, id) -> its hint
  const std::vector<std::string> keys = {"+15551234567", "k2", std::string("n\0l", 3),
                                         std::string(40, 'x')};
  timestamp t = t0;
  int used_own = 0;
  int used_foreign = 0;
  int freed = 0;
  for (int i = 0; i < 3000; ++i) {
    t += microseconds{static_cast<int>(rng() % 8) * 25 + static_cast<int>(rng() % 3) - 1};
    if (t < t0) t = t0;
    const std::string& key = keys[rng() % keys.size()];
    const std::string id = rng() % 4 == 0
                               ? "a-lease-id-longer-than-15-bytes-" + std::to_string(rng() % 3)
                               : "call-" + std::to_string(rng() % 6);
    const auto op = static_cast<unsigned>(rng() % 20);
    decision a;
    decision b;
    if (op < 10) {
      if (rng() % 4 == 0) {
        lease_hint h;
        (void)other.acquire(key, id, t, h);  // another limiter's hint for this key
        hints.push_back(h);
      }
      lease_hint h;
      a = hinted.acquire(key, id, t, h);
      ASSERT_TRUE(h.filled());
      last[{key, id}] = hints.size();
      hints.push_back(h);
      b = plain.acquire(key, id, t);
    } else if (op < 18) {
      // The hint of this lease's last acquire (often stale), or any other.
      const auto mine = last.find({key, id});
      const bool own = mine != last.end() && rng() % 3 != 0;
      const lease_hint& h = own ? hints[mine->second] : hints[rng() % hints.size()];
      ++(own ? used_own : used_foreign);
      if (op < 15) {
        a = hinted.release(key, id, t, h);
        b = plain.release(key, id, t);
        if (a.allowed) ++freed;
      } else {
        a = hinted.renew(key, id, t, h);
        b = plain.renew(key, id, t);
      }
    } else if (op == 18) {
      hinted.reset(key);
      plain.reset(key);
      continue;
    } else {
      // (How many keys each drops may differ: the stores' hash keys differ,
      // so their incremental reclaim on inserts examines different keys.)
      (void)hinted.sweep(t);
      (void)plain.sweep(t);
      continue;
    }
    ASSERT_EQ(a, b) << "step " << i << " op " << op << " key " << key << " id " << id << " at "
                    << t.count() << ": hinted " << describe(a) << ", plain " << describe(b);
  }
  EXPECT_GT(used_own, 300);
  EXPECT_GT(used_foreign, 300);
  EXPECT_GT(freed, 40);
}

// Verifies identical decisions with and without hints, alone and with rates.
TEST(LeaseHint, AnyHintGivesTheDecisionOfNoHint) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    same_decisions<no_rate>(seed);
    same_decisions<gcra>(seed, gcra::config{"3/4ms", bucket_options{.name = "calls"}});
    same_decisions<fixed_window>(seed,
                                 fixed_window::config{"6/4ms", window_options{.name = "calls"}});
  }
}

// Verifies the documented cases one by one: a hint from another key, from
// another limiter (another store and hash key), after its lease expired, was
// released or acquired again, after the key was reset, and a default hint.
TEST(LeaseHint, StaleAndForeignHintsAreSafe) {
  const concurrency_config cc{2, microseconds{1000}, concurrency_options{.name = "calls"}};
  concurrency_limiter<> c{cc};
  concurrency_limiter<> d{cc};
  lease_hint ha;
  lease_hint hb;
  lease_hint foreign;
  EXPECT_FALSE(ha.filled());
  ASSERT_TRUE(c.acquire("a", "x", t0, ha).allowed);
  ASSERT_TRUE(c.acquire("b", "x", t0, hb).allowed);
  ASSERT_TRUE(d.acquire("a", "x", t0, foreign).allowed);
  EXPECT_TRUE(ha.filled());
  // b's hint used for a: a's lease is still found and freed.
  EXPECT_TRUE(c.release("a", "x", t0, hb).allowed);
  EXPECT_FALSE(c.release("a", "x", t0, ha).allowed);  // released: rejected, never
  EXPECT_EQ(c.release("a", "x", t0, ha).retry_after, never);
  // Another limiter's hint for the same key.
  ASSERT_TRUE(c.acquire("a", "y", t0, ha).allowed);
  EXPECT_TRUE(c.renew("a", "y", t0 + microseconds{10}, foreign).allowed);
  EXPECT_TRUE(c.release("a", "y", t0 + microseconds{10}, foreign).allowed);
  // A default hint.
  ASSERT_TRUE(c.acquire("a", "z", t0).allowed);
  EXPECT_TRUE(c.release("a", "z", t0, lease_hint{}).allowed);
  // Expired: at its expiry exactly the lease is gone, with or without a hint.
  lease_hint hz;
  ASSERT_TRUE(c.acquire("a", "z", t0, hz).allowed);
  EXPECT_FALSE(c.renew("a", "z", t0 + microseconds{1000}, hz).allowed);
  EXPECT_FALSE(c.release("a", "z", t0 + microseconds{1000}, hz).allowed);
  // Acquired again after a release: the old hint frees the new lease.
  ASSERT_TRUE(c.acquire("a", "w", t0, hz).allowed);
  lease_hint old = hz;
  ASSERT_TRUE(c.release("a", "w", t0, old).allowed);
  ASSERT_TRUE(c.acquire("a", "w", t0 + microseconds{5}).allowed);
  EXPECT_TRUE(c.release("a", "w", t0 + microseconds{5}, old).allowed);
  // The key reset and taken again: a hint from before the reset still works.
  ASSERT_TRUE(c.acquire("b", "v", t0).allowed);
  c.reset("b");
  EXPECT_FALSE(c.release("b", "v", t0, hb).allowed);
  ASSERT_TRUE(c.acquire("b", "v", t0).allowed);
  EXPECT_TRUE(c.release("b", "v", t0, hb).allowed);
  // A hint from a limiter since destroyed (its store's address may be reused).
  lease_hint gone;
  {
    concurrency_limiter<> e{cc};
    ASSERT_TRUE(e.acquire("a", "u", t0, gone).allowed);
  }
  concurrency_limiter<> f{cc};
  ASSERT_TRUE(f.acquire("a", "u", t0).allowed);
  EXPECT_TRUE(f.release("a", "u", t0, gone).allowed);
}

// Verifies that bad input throws as without a hint and leaves the hint as it was.
TEST(LeaseHint, BadInputThrowsAndLeavesTheHint) {
  concurrency_limiter<> c{concurrency_config{2, microseconds{1000}, {.name = "calls"}}};
  lease_hint h;
  EXPECT_THROW((void)c.acquire("", "x", t0, h), std::invalid_argument);
  EXPECT_THROW((void)c.acquire("k", "", t0, h), std::invalid_argument);
  EXPECT_THROW((void)c.acquire("k", std::string(257, 'i'), t0, h), std::invalid_argument);
  EXPECT_THROW((void)c.acquire(std::string(513, 'k'), "x", t0, h), std::invalid_argument);
  EXPECT_THROW((void)c.acquire("k", "x", timestamp{-1}, h), std::invalid_argument);
  EXPECT_FALSE(h.filled());
  ASSERT_TRUE(c.acquire("k", "x", t0, h).allowed);
  const lease_hint before = h;
  EXPECT_THROW((void)c.release("k", "", t0, h), std::invalid_argument);
  EXPECT_THROW((void)c.renew("", "x", t0, h), std::invalid_argument);
  EXPECT_TRUE(h.filled());
  EXPECT_TRUE(c.release("k", "x", t0, before).allowed);
}

// Verifies that threads taking and freeing leases on one key with hints
// never hold more than N (hints only shorten the lookup).
TEST(LeaseHint, ThreadsOnOneKeyNeverHoldMoreThanN) {
  concurrency_limiter<> c{concurrency_config{3, std::chrono::hours{1}, {.name = "calls"}}};
  constexpr int threads = 4;
  std::atomic<int> live{0};
  std::atomic<int> most{0};
  std::atomic<int> granted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < 1000; ++j) {
        const std::string id = std::to_string(i) + ":" + std::to_string(j);
        lease_hint h;
        if (!c.acquire("k", id, t0, h).allowed) continue;
        const int now_live = ++live;
        int seen = most.load();
        while (now_live > seen && !most.compare_exchange_weak(seen, now_live)) {
        }
        ++granted;
        --live;
        ASSERT_TRUE(c.release("k", id, t0, h).allowed);
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(c.acquire("k", "final", t0).remaining, 2);
}

// Verifies that memory_store::apply_hashed decides as apply for the key's
// own hash, another key's, another store's, and a made-up one.
TEST(LeaseHint, ApplyHashedWithAnyHashDecidesAsApply) {
  const fixed_window::config cfg{"3/1s"};
  memory_store<fixed_window> a;
  memory_store<fixed_window> b;
  memory_store<fixed_window> other;
  std::mt19937_64 rng(3);
  const std::vector<std::string> keys = {"k1", "k2", "+15551234567"};
  for (int i = 0; i < 400; ++i) {
    const std::string& key = keys[rng() % keys.size()];
    const timestamp t = t0 + microseconds{static_cast<std::int64_t>(i) * 100'000};
    std::uint64_t h = 0;
    switch (rng() % 4) {
      case 0: h = a.key_hash(key); break;
      case 1: h = a.key_hash(keys[rng() % keys.size()]); break;
      case 2: h = other.key_hash(key); break;
      default: h = rng(); break;
    }
    const decision x = a.apply_hashed(cfg, key, h, t, 1, access::consume);
    const decision y = b.apply(cfg, key, t, 1, access::consume);
    ASSERT_EQ(x, y) << "step " << i << " key " << key;
  }
  EXPECT_EQ(a.size(), b.size());
}

// Verifies that memory_store::apply_keeping_hash (what an acquire filling
// a hint calls) decides as apply on new keys, held keys and a full store,
// sets the key's own hash, and that apply_hashed then finds the key with it.
TEST(LeaseHint, ApplyKeepingHashDecidesAsApplyAndKeepsTheKeyHash) {
  const fixed_window::config cfg{"2/1s"};
  const memory_store_options o{.max_keys = 3, .hash_key = {{5, 6}}};
  memory_store<fixed_window> a{o};
  memory_store<fixed_window> b{o};
  std::mt19937_64 rng(4);
  const std::vector<std::string> keys = {"k1", "k2", "k3", "k4", "+15551234567"};
  for (int i = 0; i < 400; ++i) {
    const std::string& key = keys[rng() % keys.size()];
    const timestamp t = t0 + microseconds{static_cast<std::int64_t>(i) * 150'000};
    const ratelimit::access how = rng() % 5 == 0 ? ratelimit::access::peek
                                                 : ratelimit::access::consume;
    std::uint64_t h = 0;
    const decision x = a.apply_keeping_hash(cfg, key, h, t, 1, how);
    const decision y = b.apply(cfg, key, t, 1, how);
    ASSERT_EQ(x, y) << "step " << i << " key " << key;
    ASSERT_EQ(h, a.key_hash(key));
    ASSERT_EQ(a.size(), b.size()) << "step " << i;
  }
  // A new key: one apply_keeping_hash records it under the hash it gives.
  memory_store<fixed_window> c;
  std::uint64_t h = 0;
  EXPECT_EQ(c.apply_keeping_hash(cfg, "fresh", h, t0, 1, access::consume).remaining, 1);
  EXPECT_EQ(c.size(), 1U);
  EXPECT_EQ(c.apply_hashed(cfg, "fresh", h, t0, 1, access::consume).remaining, 0);
  EXPECT_EQ(c.apply_hashed(cfg, "fresh", h, t0, 1, access::peek).allowed, false);
}

// Verifies that a hinted acquire of a key the store does not hold yet
// grants as the plain acquire, fills the hint with the key's hash, and that
// the release given that hint frees the lease.
TEST(LeaseHint, HintedAcquireOfANewKeyFillsTheHint) {
  const concurrency_config cc{1, microseconds{1000}, concurrency_options{.name = "calls"}};
  concurrency_limiter<> c{cc};
  lease_hint h;
  const decision d = c.acquire("new-key", "id", t0, h);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_TRUE(h.filled());
  EXPECT_EQ(c.store().size(), 1U);
  EXPECT_FALSE(c.acquire("new-key", "other", t0 + microseconds{1}).allowed);
  EXPECT_TRUE(c.release("new-key", "id", t0 + microseconds{2}, h).allowed);
  EXPECT_TRUE(c.acquire("new-key", "other", t0 + microseconds{3}).allowed);
}

// Verifies hinted acquire, renew and release from several threads on a few
// keys that a sweeping thread keeps dropping while they hold no lease, so
// that acquires keep inserting the keys anew (apply_keeping_hash) while
// other threads use hints from before: never more than N live per key, each
// granted lease renewed and released by any thread's hint, and all freed.
TEST(LeaseHint, ThreadsWithSharedHintsOnSweptKeysNeverHoldMoreThanN) {
  concurrency_limiter<> c{concurrency_config{2, std::chrono::hours{1}, {.name = "calls"}}};
  constexpr int threads = 4;
  const std::vector<std::string> keys = {"a", "b", "c"};
  std::array<std::atomic<int>, 3> live{};
  std::atomic<int> most{0};
  std::atomic<int> granted{0};
  std::atomic<bool> done{false};
  std::mutex pool_mutex;
  std::vector<lease_hint> pool(1);  // hints of every thread, copied under the mutex
  std::thread sweeper([&] {
    while (!done.load()) (void)c.sweep(t0);
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      std::mt19937 rng(static_cast<unsigned>(i) + 1);
      for (int j = 0; j < 2000; ++j) {
        if (j % 50 == 0) (void)c.sweep(t0);  // the sweeper may not have started yet
        const std::size_t k = rng() % keys.size();
        const std::string id = std::to_string(i) + ":" + std::to_string(j);
        lease_hint mine;
        if (!c.acquire(keys[k], id, t0, mine).allowed) continue;
        const int now_live = ++live[k];
        int seen = most.load();
        while (now_live > seen && !most.compare_exchange_weak(seen, now_live)) {
        }
        ++granted;
        lease_hint other;
        {
          const std::lock_guard<std::mutex> lock(pool_mutex);
          other = pool[rng() % pool.size()];
          if (pool.size() < 64) pool.push_back(mine);
        }
        EXPECT_TRUE(c.renew(keys[k], id, t0, other).allowed);
        --live[k];
        EXPECT_TRUE(c.release(keys[k], id, t0, rng() % 2 == 0 ? mine : other).allowed);
      }
    });
  }
  for (auto& t : workers) t.join();
  done = true;
  sweeper.join();
  EXPECT_LE(most.load(), 2);
  EXPECT_GT(granted.load(), 1000);
  for (const auto& k : keys) EXPECT_EQ(c.acquire(k, "final", t0).remaining, 1) << k;
}

}  // namespace
