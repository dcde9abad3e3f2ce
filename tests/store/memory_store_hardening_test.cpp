// SPDX-License-Identifier: Apache-2.0
// Tests of memory_store under attack: flooding keys, the reclaim race, its lock and chunked sweeps.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/detail/spin_lock.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "stdhash_collisions.hpp"

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::decision;
using ratelimit::memory_store;
using ratelimit::memory_store_options;
using ratelimit::timestamp;
using ratelimit::units;
using ratelimit::detail::siphash_key;

// ---------------------------------------------------------------- SipHash

/// The reference vectors of the SipHash paper (vectors_sip64 of the
/// reference implementation): SipHash-2-4, key 00 01 .. 0f, message
/// 00 01 .. (n - 1) for n = 0 .. 63.
constexpr std::uint64_t sip24_vectors[64] = {
    0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
    0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
    0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
    0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
    0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
    0xbed65cf21aa2ee98, 0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
    0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3, 0x2f2e6163076bcfad,
    0xde4daaaca71dc9a5, 0xa6a2506687956571, 0xad87a3535c49ef28, 0x32d892fad841c342,
    0x7127512f72f27cce, 0xa7f32346f95978e3, 0x12e0b01abb051238, 0x15e034d40fa197ae,
    0x314dffbe0815a3b4, 0x027990f029623981, 0xcadcd4e59ef40c4d, 0x9abfd8766a33735c,
    0x0e3ea96b5304a7d0, 0xad0c42d6fc585992, 0x187306c89bc215a9, 0xd4a60abcf3792b95,
    0xf935451de4f21df2, 0xa9538f0419755787, 0xdb9acddff56ca510, 0xd06c98cd5c0975eb,
    0xe612a3cb9ecba951, 0xc766e62cfcadaf96, 0xee64435a9752fe72, 0xa192d576b245165a,
    0x0a8787bf8ecb74b2, 0x81b3e73d20b49b6f, 0x7fa8220ba3b2ecea, 0x245731c13ca42499,
    0xb78dbfaf3a8d83bd, 0xea1ad565322a1a0b, 0x60e61c23a3795013, 0x6606d7e446282b93,
    0x6ca4ecb15c5f91e1, 0x9f626da15c9625f3, 0xe51b38608ef25f57, 0x958a324ceb064572,
};

constexpr siphash_key reference_key{0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};

// Named, so that the template's comma stays out of the test macros.
std::uint64_t sip24(const siphash_key& k, std::string_view m) {
  return ratelimit::detail::siphash<2, 4>(k, m);
}
std::uint64_t sip13(const siphash_key& k, std::string_view m) {
  return ratelimit::detail::siphash<1, 3>(k, m);
}

std::string reference_message(std::size_t n) {
  std::string m;
  for (std::size_t i = 0; i < n; ++i) m.push_back(static_cast<char>(i));
  return m;
}

// Verifies the shared SipHash code (rounds as template parameters) against
// every published SipHash-2-4 vector: all tail lengths 0..7 and 0..7 words.
TEST(SipHash, MatchesTheReferenceVectorsFor24) {
  for (std::size_t n = 0; n < 64; ++n) {
    EXPECT_EQ(sip24(reference_key, reference_message(n)), sip24_vectors[n]) << "n=" << n;
  }
}

TEST(SipHash, Variant13IsDeterministicAndDiffersFrom24) {
  for (std::size_t n = 0; n < 64; ++n) {
    const std::string m = reference_message(n);
    EXPECT_EQ(sip13(reference_key, m), sip13(reference_key, m));
    EXPECT_NE(sip13(reference_key, m), sip24(reference_key, m)) << "n=" << n;
  }
}

// Verifies that every bit of the key matters: a hash a caller could predict
// without the whole key would let them aim keys at one bucket.
TEST(SipHash, Variant13DependsOnEveryKeyBit) {
  const std::string m = "+15551234567";
  const std::uint64_t base = sip13(reference_key, m);
  std::set<std::uint64_t> seen{base};
  for (int bit = 0; bit < 128; ++bit) {
    siphash_key k = reference_key;
    (bit < 64 ? k.k0 : k.k1) ^= std::uint64_t{1} << (bit % 64);
    seen.insert(sip13(k, m));
  }
  EXPECT_EQ(seen.size(), 129U);
}

TEST(SipHash, Variant13SeparatesNearbyMessages) {
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 10'000; ++i) seen.insert(sip13(reference_key, std::to_string(i)));
  seen.insert(sip13(reference_key, std::string_view{}));
  seen.insert(sip13(reference_key, std::string_view("\0", 1)));
  EXPECT_EQ(seen.size(), 10'002U);
}

// ---------------------------------------------------------------- flooding

// Verifies that keys built to share one std::hash value (a hash flood) still
// spread over the store's buckets. With the store's old unkeyed std::hash
// they all landed in one chain of one shard (longest_chain() == 4096), and
// every check on them walked it under the shard's lock.
TEST(MemoryStoreFlooding, KeysCollidingUnderStdHashSpreadOverBuckets) {
  const std::vector<std::string> keys = ratelimit::test::stdhash_colliding_keys(12);
  ASSERT_EQ(keys.size(), 4096U);
  ASSERT_EQ(keys.front().size(), 192U);
  ASSERT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
#if defined(__GLIBCXX__) && SIZE_MAX == UINT64_MAX
  // The attack is real: every key has the same std::hash value.
  const std::size_t h = std::hash<std::string_view>{}(keys.front());
  for (const std::string& k : keys) ASSERT_EQ(std::hash<std::string_view>{}(k), h);
#endif

  const ratelimit::fixed_window::config cfg{"5/1s"};
  memory_store<ratelimit::fixed_window> store;
  for (const std::string& k : keys) {
    ASSERT_TRUE(store.apply(cfg, k, timestamp{1'000}, 1, access::consume).allowed);
  }
  EXPECT_EQ(store.size(), keys.size());
  // 4096 keys over 64 shards, at most one key per bucket on average: with a
  // keyed hash a chain of 16 has a probability far below 1e-20.
  EXPECT_LE(store.longest_chain(), 16U);
  for (const std::string& k : keys) {
    ASSERT_EQ(store.state_of(k), (ratelimit::fixed_window::state{0, 1}));
  }
}

// Verifies that two stores hash with different keys (seeds), so learning one
// process's layout teaches nothing about another's. Observed through the
// incremental sweep, which walks buckets in order: after the same 64 keys,
// the first new key drops the idle keys of the first buckets, which are the
// same keys in two stores only if they hash alike.
TEST(MemoryStoreFlooding, EveryStoreHasItsOwnSeed) {
  const ratelimit::fixed_window::config cfg{"5/1s"};
  memory_store_options o;
  o.shards = 1;
  const auto first_dropped = [&] {
    memory_store<ratelimit::fixed_window> store(o);
    for (int i = 0; i < 64; ++i) {
      (void)store.apply(cfg, "k" + std::to_string(i), timestamp{0}, 1, access::consume);
    }
    (void)store.apply(cfg, "new", timestamp{2'000'000}, 1, access::consume);
    std::set<int> dropped;
    for (int i = 0; i < 64; ++i) {
      if (store.state_of("k" + std::to_string(i)) == ratelimit::fixed_window::state{}) {
        dropped.insert(i);
      }
    }
    return dropped;
  };
  int same = 0;
  for (int pair = 0; pair < 3; ++pair) {
    const std::set<int> a = first_dropped();
    const std::set<int> b = first_dropped();
    ASSERT_FALSE(a.empty());
    if (a == b) ++same;
  }
  EXPECT_LT(same, 3);
}

// ---------------------------------------------------------------- reclaim race

// The race: a thread reads the clock (t1), then waits for the shard's lock;
// meanwhile another thread finds the key idle at a later t2 and drops it.
// These tests replay that interleaving deterministically through the store's
// API: the key is filled to its limit, dropped at t2, then decided at t1.

constexpr std::int64_t W = 1'000;  // the window, microseconds

// Verifies that a request read at t1 and decided after the key was swept at
// t2 > t1 is counted at t2, not in the window of t1 that is already full.
// The old store decided it at t1 on an empty state: limit + 1 in window 0.
TEST(MemoryStoreReclaimRace, FixedWindowRequestReadBeforeASweepIsNotAnExtraInItsWindow) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1ms}};
  memory_store<ratelimit::fixed_window> store;
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{100}, 1, access::consume).allowed);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{200}, 1, access::consume).allowed);
  // Window 0 is full; thread A reads t1 = 900, then is preempted.
  ASSERT_EQ(store.sweep(cfg, timestamp{W}), 1U);  // thread B, at t2 = 1000
  const decision d = store.apply(cfg, "k", timestamp{900}, 1, access::consume);
  EXPECT_TRUE(d.allowed);
  // Counted in window 1 (decided at t2), so window 0 kept its two.
  EXPECT_EQ(store.state_of("k"), (ratelimit::fixed_window::state{1, 1}));
  EXPECT_EQ(d.reset_after, 1000us);  // measured from t2, the decision time
}

// Verifies the same for the sliding log, whose windows are not aligned: the
// third admission must be a full window after the first.
TEST(MemoryStoreReclaimRace, SlidingLogNeverAdmitsLimitPlusOneInAWindow) {
  const ratelimit::sliding_window_log::config cfg{ratelimit::rate{2, 1ms}};
  memory_store<ratelimit::sliding_window_log> store;
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{100}, 1, access::consume).allowed);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{200}, 1, access::consume).allowed);
  // Thread A reads t1 = 500; thread B sweeps at 1300, when the log is idle.
  ASSERT_EQ(store.sweep(cfg, timestamp{1'300}), 1U);
  EXPECT_TRUE(store.apply(cfg, "k", timestamp{500}, 1, access::consume).allowed);
  const auto st = store.state_of("k");
  ASSERT_EQ(st.size(), 1U);
  EXPECT_GE(st.back().ts, 100 + W);  // not within (t - W, t] of the first two
  EXPECT_EQ(st.back().ts, 1'300);
}

// Verifies it for the token bucket: two at t = 0 empty a bucket of 2 that
// refills 2 per ms; a third admission stamped 10 us later would exceed it.
TEST(MemoryStoreReclaimRace, TokenBucketRequestIsDecidedAtTheReclaimTime) {
  const ratelimit::token_bucket::config cfg{ratelimit::rate{2, 1ms}};
  memory_store<ratelimit::token_bucket> store;
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{0}, 1, access::consume).allowed);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{0}, 1, access::consume).allowed);
  ASSERT_EQ(store.sweep(cfg, timestamp{W}), 1U);
  EXPECT_TRUE(store.apply(cfg, "k", timestamp{10}, 1, access::consume).allowed);
  EXPECT_EQ(store.state_of("k").last, W);
}

// Verifies the incremental reclaim (new keys arriving in the shard) closes
// the race too, and that peek answers as try_acquire would.
TEST(MemoryStoreReclaimRace, IncrementalReclaimByNewKeysIsCoveredToo) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1ms}};
  memory_store_options o;
  o.shards = 1;  // every key in the shard of "k"
  memory_store<ratelimit::fixed_window> store(o);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{100}, 1, access::consume).allowed);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{200}, 1, access::consume).allowed);
  // Other callers' new keys at t2 = 1500 sweep a few keys each, until "k" goes.
  int arrivals = 0;
  while (store.state_of("k") != ratelimit::fixed_window::state{} && arrivals < 10'000) {
    (void)store.apply(cfg, "other" + std::to_string(arrivals++), timestamp{1'500}, 1,
                      access::consume);
  }
  ASSERT_EQ(store.state_of("k"), ratelimit::fixed_window::state{});
  const decision peeked = store.apply(cfg, "k", timestamp{900}, 1, access::peek);
  const decision d = store.apply(cfg, "k", timestamp{900}, 1, access::consume);
  EXPECT_EQ(peeked, d);
  EXPECT_EQ(store.state_of("k"), (ratelimit::fixed_window::state{1, 1}));
}

// Verifies the full store's reclaim: a new key at t2 reclaims "k" to fit;
// "k" read at t1 and decided afterwards is counted at t2.
TEST(MemoryStoreReclaimRace, FullStoreReclaimIsCoveredToo) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1ms}};
  memory_store_options o;
  o.shards = 1;
  o.max_keys = 1;
  memory_store<ratelimit::fixed_window> store(o);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{100}, 1, access::consume).allowed);
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{200}, 1, access::consume).allowed);
  const decision other = store.apply(cfg, "x", timestamp{1'200}, 1, access::consume);
  ASSERT_EQ(other.source, ratelimit::decision_source::store);  // "k" was reclaimed for it
  store.reset(cfg, "x");  // make room again; forgetting a key moves no clock
  const decision d = store.apply(cfg, "k", timestamp{900}, 1, access::consume);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(store.state_of("k"), (ratelimit::fixed_window::state{1, 1}));
}

// Verifies that the mark changes nothing for requests in time order: a key
// never dropped is decided at its own time, and so is a new key at or after
// the last reclaim.
TEST(MemoryStoreReclaimRace, RequestsInTimeOrderAreDecidedAtTheirOwnTime) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1ms}};
  memory_store<ratelimit::fixed_window> store;
  ASSERT_TRUE(store.apply(cfg, "k", timestamp{100}, 1, access::consume).allowed);
  ASSERT_EQ(store.sweep(cfg, timestamp{5'000}), 1U);
  const decision d = store.apply(cfg, "k", timestamp{5'500}, 1, access::consume);
  EXPECT_EQ(d.reset_after, 500us);
  EXPECT_EQ(store.state_of("k"), (ratelimit::fixed_window::state{5, 1}));
  // A key held is never moved forward by the mark.
  const decision held = store.apply(cfg, "k", timestamp{5'100}, 1, access::consume);
  EXPECT_EQ(held.reset_after, 900us);
}

// ---------------------------------------------------------------- lock

// Verifies mutual exclusion under contention, including waiters that went to
// sleep: the lock is held for a long section while others queue.
TEST(SpinLock, ExcludesUnderContentionIncludingSleepingWaiters) {
  ratelimit::detail::spin_lock lock;
  std::uint64_t counter = 0;  // plain: only the lock protects it
  constexpr int threads = 8;
  constexpr int rounds = 20'000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        std::lock_guard<ratelimit::detail::spin_lock> guard(lock);
        const std::uint64_t before = counter;
        // Every 1000th section is long, so waiters exhaust their spins and sleep.
        if ((i + t) % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds{200});
        counter = before + 1;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(counter, std::uint64_t{threads} * rounds);
}

TEST(SpinLock, TryLockFailsWhileHeldAndSucceedsAfter) {
  ratelimit::detail::spin_lock lock;
  ASSERT_TRUE(lock.try_lock());
  bool other = true;
  std::thread([&] { other = lock.try_lock(); }).join();
  EXPECT_FALSE(other);
  lock.unlock();
  std::thread([&] {
    other = lock.try_lock();
    if (other) lock.unlock();
  }).join();
  EXPECT_TRUE(other);
}

// Verifies a store shared by many threads on one key admits exactly the
// limit, whatever the lock's contended path does.
TEST(SpinLock, StoreAdmitsExactlyTheLimitAcrossThreads) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{5'000, 1s}};
  memory_store<ratelimit::fixed_window> store;
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < 2'000; ++i) {
        if (store.apply(cfg, "hot", timestamp{10}, 1, access::consume).allowed) ++admitted;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(admitted.load(), 5'000);
}

// ---------------------------------------------------------------- sweep

/// A policy that lets a test see which keys a sweep examines. A key's state
/// is the cost of its first request (its id). Keys with an id at or above
/// `victim_ids` are idle from t = 2 on; the others never are, and
/// every time the sweeping thread asks about one, its id is recorded. Nothing
/// else depends on time; the tests insert at t = 1 and sweep at t = 2.
struct probe_policy {
  static constexpr std::string_view name = "probe";
  static constexpr units victim_ids = 1'000'000;
  struct config {
    using policy_type = probe_policy;
    [[nodiscard]] units limit() const noexcept { return units{1} << 40; }
  };
  struct state {
    units id = 0;
    friend bool operator==(const state&, const state&) = default;
  };
  static inline std::thread::id sweeper{};
  static inline std::set<units>* examined = nullptr;

  static decision step(const config& cfg, state& s, timestamp, units cost) noexcept {
    if (s.id == 0) s.id = cost;
    decision d;
    d.allowed = true;
    d.limit = cfg.limit();
    d.remaining = d.limit;
    return d;
  }
  static bool idle(const config&, const state& s, timestamp now) noexcept {
    if (s.id >= victim_ids) return now.count() >= 2;
    if (examined != nullptr && std::this_thread::get_id() == sweeper) examined->insert(s.id);
    return false;
  }
};
static_assert(ratelimit::policy<probe_policy>);

/// Records what `sweep` examines for the duration of a test.
class sweep_probe {
 public:
  sweep_probe() {
    probe_policy::sweeper = std::this_thread::get_id();
    probe_policy::examined = &examined_;
  }
  ~sweep_probe() { probe_policy::examined = nullptr; }
  sweep_probe(const sweep_probe&) = delete;
  sweep_probe& operator=(const sweep_probe&) = delete;
  [[nodiscard]] const std::set<units>& examined() const { return examined_; }

 private:
  std::set<units> examined_;
};

// Verifies that a sweep examines every key held throughout while its own
// drops shrink the table between its chunks (32768 buckets down to a few
// hundred). Walking the buckets in index order would skip keys here: a
// halving moves the keys of bucket b + n/2, not yet examined, into bucket b,
// already examined. Deterministic: one thread.
TEST(MemoryStoreSweep, ChunkedSweepExaminesEveryKeyWhileItsDropsShrinkTheTable) {
  const probe_policy::config cfg;
  memory_store_options o;
  o.shards = 1;
  memory_store<probe_policy> store(o);
  constexpr units kept = 500;
  constexpr units victims = 30'000;
  for (units i = 1; i <= kept; ++i) {
    (void)store.apply(cfg, "kept" + std::to_string(i), timestamp{1}, i, access::consume);
  }
  for (units i = 0; i < victims; ++i) {
    (void)store.apply(cfg, "victim" + std::to_string(i), timestamp{1}, probe_policy::victim_ids + i,
                      access::consume);
  }
  ASSERT_EQ(store.size(), std::size_t{kept + victims});
  sweep_probe probe;
  EXPECT_EQ(store.sweep(cfg, timestamp{2}), std::size_t{victims});
  EXPECT_EQ(store.size(), std::size_t{kept});
  EXPECT_EQ(probe.examined().size(), std::size_t{kept});
  for (units i = 1; i <= kept; ++i) {
    EXPECT_EQ(probe.examined().count(i), 1U) << "key kept" << i << " was never examined";
  }
}

// Verifies that a sweep examines every key held throughout while another
// thread grows the same shard's table (16 buckets up to 32768) between its
// chunks. The writer's keys are never idle, so nothing the writer does can
// stand in for the sweep; how the two interleave is up to the scheduler.
TEST(MemoryStoreSweep, ChunkedSweepExaminesEveryKeyWhileTheTableGrows) {
  const probe_policy::config cfg;
  memory_store_options o;
  o.shards = 1;
  memory_store<probe_policy> store(o);
  constexpr units old_keys = 3'000;
  for (units i = 1; i <= old_keys; ++i) {
    (void)store.apply(cfg, "old" + std::to_string(i), timestamp{1}, i, access::consume);
  }
  constexpr units new_keys = 20'000;
  sweep_probe probe;
  std::atomic<bool> started{false};
  std::thread writer([&] {
    for (units i = 0; i < new_keys; ++i) {
      (void)store.apply(cfg, "new" + std::to_string(i), timestamp{1}, old_keys + 1 + i,
                        access::consume);
      started.store(true, std::memory_order_relaxed);
    }
  });
  while (!started.load(std::memory_order_relaxed)) std::this_thread::yield();
  EXPECT_EQ(store.sweep(cfg, timestamp{2}), 0U);
  writer.join();
  EXPECT_EQ(store.size(), std::size_t{old_keys + new_keys});
  for (units i = 1; i <= old_keys; ++i) {
    ASSERT_EQ(probe.examined().count(i), 1U) << "key old" << i << " was never examined";
  }
}

}  // namespace
