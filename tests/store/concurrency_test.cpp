// SPDX-License-Identifier: Apache-2.0
// Tests of the lease limiter in process: exact rules of acquire, release and
// renew (edges to the microsecond), composition with a rate, bad input,
// threads on one key, reclaim of keys without live leases.
#include "ratelimit/concurrency.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

constexpr microseconds D{1000};  // max duration
const timestamp t0{1'000'000};

concurrency_config three() {
  return concurrency_config{3, D, concurrency_options{.name = "calls"}};
}

// Verifies grant, rejection with retry_after = earliest expiry - t, and the
// fields of each decision.
TEST(Leases, GrantsUpToNThenRejectsUntilTheEarliestExpires) {
  concurrency_limiter<> c{three()};
  decision d = c.acquire("k", "a", t0);
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_FALSE(d.repeat);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.retry_after, microseconds{0});
  EXPECT_EQ(d.reset_after, D);
  EXPECT_TRUE(c.acquire("k", "b", t0 + microseconds{10}).allowed);
  d = c.acquire("k", "c", t0 + microseconds{20});
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.reset_after, D);  // the latest lease expires at t0 + 20 + D
  d = c.acquire("k", "d", t0 + microseconds{500});
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, microseconds{500});  // "a" expires at t0 + D
  EXPECT_EQ(d.reset_after, microseconds{520});
  // The microsecond before "a" expires: still full, retry 1 us.
  d = c.acquire("k", "d", t0 + D - microseconds{1});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, microseconds{1});
  // Exactly at its expiry "a" is gone: retry_after was exact.
  d = c.acquire("k", "d", t0 + D);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.reset_after, D);
}

// Verifies that a live id is the same lease: no second slot, no renewal, a repeat.
TEST(Leases, AcquiringALiveIdIsIdempotentAndDoesNotRenew) {
  concurrency_limiter<> c{three()};
  ASSERT_TRUE(c.acquire("k", "a", t0).allowed);
  const decision d = c.acquire("k", "a", t0 + microseconds{400});
  EXPECT_TRUE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_TRUE(d.repeat);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after, microseconds{600});  // still expires at t0 + D
  // Still one slot: two more fit, a fourth does not.
  EXPECT_TRUE(c.acquire("k", "b", t0 + microseconds{401}).allowed);
  EXPECT_TRUE(c.acquire("k", "c", t0 + microseconds{402}).allowed);
  EXPECT_FALSE(c.acquire("k", "d", t0 + microseconds{403}).allowed);
  // A repeat is answered even when the key is full.
  EXPECT_TRUE(c.acquire("k", "a", t0 + microseconds{404}).repeat);
  // After its expiry the same id is a new lease.
  const decision again = c.acquire("k", "a", t0 + D);
  EXPECT_TRUE(again.allowed);
  EXPECT_FALSE(again.repeat);
  EXPECT_TRUE(again.counted);
}

// Verifies release: frees a live lease; an unknown or expired id changes nothing.
TEST(Leases, ReleaseFreesALiveLeaseAndRejectsUnknownOrExpiredIds) {
  concurrency_limiter<> c{three()};
  ASSERT_TRUE(c.acquire("k", "a", t0).allowed);
  ASSERT_TRUE(c.acquire("k", "b", t0).allowed);
  ASSERT_TRUE(c.acquire("k", "c", t0 + microseconds{5}).allowed);
  decision d = c.release("k", "b", t0 + microseconds{100});
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_EQ(d.reset_after, microseconds{905});
  d = c.release("k", "b", t0 + microseconds{101});  // twice
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, never);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_FALSE(c.release("k", "zzz", t0 + microseconds{102}).allowed);
  EXPECT_FALSE(c.release("other", "a", t0 + microseconds{102}).allowed);
  // "a" expired at t0 + D exactly: releasing it then is an unknown id.
  d = c.release("k", "a", t0 + D);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 2);  // only "c" is live
  EXPECT_EQ(d.reset_after, microseconds{5});
  // The slot freed by the release is usable at once.
  EXPECT_TRUE(c.acquire("k", "x", t0 + D).allowed);
}

// Verifies renew: extends a live lease to now + D; an expired one is not revived.
TEST(Leases, RenewExtendsALiveLeaseAndRefusesAnExpiredOne) {
  concurrency_limiter<> c{concurrency_config{1, D, concurrency_options{.name = "calls"}}};
  ASSERT_TRUE(c.acquire("k", "a", t0).allowed);
  decision d = c.renew("k", "a", t0 + D - microseconds{1});
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reset_after, D);  // now expires at t0 + 2D - 1
  EXPECT_FALSE(c.acquire("k", "b", t0 + D).allowed);
  EXPECT_EQ(c.acquire("k", "b", t0 + D).retry_after, D - microseconds{1});
  EXPECT_TRUE(c.acquire("k", "b", t0 + 2 * D - microseconds{1}).allowed);
  // "a" expired at t0 + 2D - 1: renewing it then fails and changes nothing.
  d = c.renew("k", "a", t0 + 2 * D - microseconds{1});
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.retry_after, never);
  EXPECT_EQ(d.remaining, 0);
  // A renew stamped earlier than a previous one never shortens the lease.
  ASSERT_TRUE(c.renew("k", "b", t0 + 2 * D + microseconds{500}).allowed);
  d = c.renew("k", "b", t0 + 2 * D);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.reset_after, D + microseconds{500});
}

// Verifies all or nothing with a rate: a refusal by either consumes from neither.
TEST(Leases, ComposesWithARateAllOrNothing) {
  concurrency_limiter<fixed_window> c{
      concurrency_config{2, D, concurrency_options{.name = "calls"}},
      fixed_window::config{"3/1s", window_options{.name = "calls"}}};
  const timestamp w{5'000'000};  // start of a 1 s window
  // Leases refuse: the rate is not consumed.
  ASSERT_TRUE(c.acquire("k", "a", w).allowed);
  ASSERT_TRUE(c.acquire("k", "b", w).allowed);
  decision d = c.acquire("k", "c", w + microseconds{1});
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.limit, 2);  // the binding part: the lease set
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, D - microseconds{1});
  // reset_after: the larger of the leases' and the window's.
  EXPECT_EQ(d.reset_after, microseconds{999'999});
  ASSERT_TRUE(c.release("k", "a", w + microseconds{2}).allowed);
  // The rate had 1 left (2 of 3 used), not 0: this one passes.
  d = c.acquire("k", "c", w + microseconds{3});
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 2);
  EXPECT_EQ(d.remaining, 0);  // leases 0 left, rate 0 left: the leases first on ties
  ASSERT_TRUE(c.release("k", "b", w + microseconds{4}).allowed);
  // Now the rate refuses (3 of 3): the free lease slot is not taken.
  d = c.acquire("k", "e", w + microseconds{5});
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 3);  // the binding part: the rate
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, microseconds{1'000'000 - 5});
  EXPECT_EQ(c.release("k", "e", w + microseconds{6}).allowed, false);
  // In the next window the rate admits again and the lease slot is still free.
  d = c.acquire("k", "e", w + microseconds{1'000'000});
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 2);      // "c" expired at w + 3 + D: 1 lease of 2, 1 of 3 in the window
  EXPECT_EQ(d.remaining, 1);  // the smaller remaining binds
}

// Verifies acquires on a key holding an expired lease (exactly at its
// expiry), with a rate: a repeat of a live id, a grant the rate refuses and
// one it admits; each drops the expired leases and decides on the live ones.
TEST(Leases, AcquireOverExpiredLeasesWithARate) {
  concurrency_limiter<fixed_window> c{
      concurrency_config{3, D, concurrency_options{.name = "calls"}},
      fixed_window::config{"2/1s", window_options{.name = "calls"}}};
  const timestamp w{5'000'000};  // start of a 1 s window
  ASSERT_TRUE(c.acquire("k", "a", w).allowed);
  ASSERT_TRUE(c.acquire("k", std::string(20, 'b'), w + microseconds{100}).allowed);
  // At w + D "a" has expired; the 20-byte id is live until w + 100 + D.
  decision d = c.acquire("k", std::string(20, 'b'), w + D);
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.repeat);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after, microseconds{100});
  EXPECT_EQ(c.store().state_of("k").held.size(), 1U);
  ASSERT_TRUE(c.acquire("k", "x", w + D - microseconds{1}).allowed == false);  // rate: 2 of 2
  EXPECT_EQ(c.store().state_of("k").held.size(), 1U);
  // A slot is free, the rate refuses: nothing granted.
  d = c.acquire("k", std::string(30, 'c'), w + D + microseconds{100});
  EXPECT_FALSE(d.allowed);
  EXPECT_FALSE(d.counted);
  EXPECT_EQ(d.limit, 2);  // the binding part: the rate
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, microseconds{1'000'000} - D - microseconds{100});
  EXPECT_EQ(c.store().state_of("k").held.size(), 0U);  // the 20-byte id expired exactly then
  // The next window: granted over the expired leases (none live).
  ASSERT_TRUE(c.acquire("k", "a", w + microseconds{1'000'000}).allowed);
  d = c.acquire("k", std::string(30, 'c'), w + microseconds{1'000'000} + D);
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.counted);
  EXPECT_EQ(d.limit, 2);  // rate 0 left of 2, leases 2 left of 3
  EXPECT_EQ(d.remaining, 0);
  const auto held = c.store().state_of("k").held;
  ASSERT_EQ(held.size(), 1U);
  EXPECT_EQ(held[0].id(), std::string(30, 'c'));
}

// Verifies threads on one key with ids of 15 to 40 bytes (inline, and heap
// blocks reused or replaced), leases left to expire (dropped by whichever
// thread comes later) and a thread copying the key's state and sweeping:
// clean under the sanitizers, never more than N live, all slots free at the end.
TEST(Leases, ThreadsOnOneKeyWithHeapIdsAndExpiries) {
  constexpr units n = 3;
  constexpr microseconds d{50};
  concurrency_limiter<> c{concurrency_config{n, d, {.name = "calls"}}};
  constexpr int threads = 4;
  constexpr int rounds = 1500;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const auto s = c.store().state_of("k");
      EXPECT_LE(s.held.size(), static_cast<std::size_t>(n));
      (void)c.sweep(t0);
    }
  });
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < rounds; ++j) {
        std::string id(15 + static_cast<std::size_t>((i * 7 + j) % 26), static_cast<char>('a' + i));
        id += std::to_string(j);
        const timestamp t = t0 + microseconds{j * 10};
        const decision a = c.acquire("k", id, t);
        if (a.allowed && j % 5 != 0) (void)c.release("k", id, t + microseconds{1});
        if (a.allowed && j % 5 == 0) (void)c.renew("k", id, t + microseconds{2});
      }
    });
  }
  for (auto& t : pool) t.join();
  done = true;
  reader.join();
  const decision last = c.acquire("k", "final", t0 + microseconds{rounds * 10 + 1000});
  EXPECT_TRUE(last.allowed);
  EXPECT_EQ(last.remaining, n - 1);
  EXPECT_EQ(c.store().state_of("k").held.size(), 1U);
}

// Verifies that a rate counting rejected attempts is refused: a refused
// acquire must consume nothing.
TEST(Leases, RefusesARateThatCountsRejectedAttempts) {
  EXPECT_THROW((concurrency_limiter<sliding_window_log>{
                   three(), sliding_window_log::config{"3/1s", window_options{true, "x"}}}),
               std::invalid_argument);
}

// Verifies every bad input throws std::invalid_argument and changes nothing.
TEST(Leases, BadInputThrowsNamingTheValue) {
  EXPECT_THROW(concurrency_config(0, D), std::invalid_argument);
  EXPECT_THROW(concurrency_config(max_leases + 1, D), std::invalid_argument);
  EXPECT_THROW(concurrency_config(1, microseconds{0}), std::invalid_argument);
  EXPECT_THROW(concurrency_config(1, max_period + microseconds{1}), std::invalid_argument);
  EXPECT_THROW(concurrency_config(1, D, concurrency_options{.name = "a:b"}), std::invalid_argument);
  concurrency_limiter<> c{three()};
  try {
    (void)c.acquire("k", "", t0);
    FAIL() << "empty lease id accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lease id must not be empty"), std::string::npos);
  }
  try {
    (void)c.acquire("k", std::string(max_lease_id_bytes + 1, 'x'), t0);
    FAIL() << "long lease id accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lease id of 257 bytes"), std::string::npos);
  }
  EXPECT_THROW((void)c.acquire("", "a", t0), std::invalid_argument);
  EXPECT_THROW((void)c.release("k", "", t0), std::invalid_argument);
  EXPECT_THROW((void)c.renew("k", std::string(300, 'x'), t0), std::invalid_argument);
  EXPECT_THROW((void)c.acquire("k", "a", timestamp{-1}), std::invalid_argument);
  EXPECT_EQ(c.store().size(), 0U);
  // Binary ids: NUL and high bytes are distinct ids; 256 bytes is accepted.
  const std::string nul("a\0b", 3);
  EXPECT_TRUE(c.acquire("k", nul, t0).allowed);
  EXPECT_TRUE(c.acquire("k", std::string("a\0c", 3), t0).allowed);
  EXPECT_TRUE(c.acquire("k", nul, t0).repeat);
  EXPECT_TRUE(c.acquire("k", std::string(max_lease_id_bytes, '\xff'), t0).allowed);
}

// Verifies that expired leases are dropped and a key with no live lease is reclaimed.
TEST(Leases, KeysWithoutLiveLeasesAreReclaimed) {
  concurrency_limiter<> c{three()};
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(c.acquire("k" + std::to_string(i), "a", t0).allowed);
  }
  EXPECT_EQ(c.store().size(), 1000U);
  EXPECT_EQ(c.sweep(t0 + D - microseconds{1}), 0U);
  EXPECT_EQ(c.sweep(t0 + D), 1000U);
  EXPECT_EQ(c.store().size(), 0U);
  // A released key is idle at once (reclaimable by the next sweep).
  ASSERT_TRUE(c.acquire("x", "a", t0).allowed);
  ASSERT_TRUE(c.release("x", "a", t0).allowed);
  EXPECT_EQ(c.sweep(t0), 1U);
  // Expired leases are dropped by the next operation on their key.
  // (After the sweep at t0 + D, a new key is decided no earlier than then.)
  ASSERT_TRUE(c.acquire("y", "a", t0 + D).allowed);
  ASSERT_TRUE(c.acquire("y", "b", t0 + 2 * D).allowed);
  const auto held = c.store().state_of("y").held.size();
  EXPECT_EQ(held, 1U);
}

// Verifies a full store (max_keys): an acquire on a new key follows on_full
// and, admitted under fail_open, records no lease.
TEST(Leases, FullStoreFollowsOnFull) {
  using store = memory_store<leases<>>;
  concurrency_limiter<> open{three(), store{memory_store_options{.max_keys = 1}}};
  ASSERT_TRUE(open.acquire("a", "x", t0).allowed);
  decision d = open.acquire("b", "x", t0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::fail_open);
  EXPECT_FALSE(open.release("b", "x", t0).allowed);  // nothing was recorded
  EXPECT_EQ(open.store().size(), 1U);
  concurrency_limiter<> closed{
      three(), store{memory_store_options{.max_keys = 1, .on_full = when_full::fail_closed}}};
  ASSERT_TRUE(closed.acquire("a", "x", t0).allowed);
  d = closed.acquire("b", "x", t0);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.source, decision_source::fail_closed);
  // Once "a" has no live lease it is reclaimed and "b" gets its place.
  ASSERT_TRUE(closed.release("a", "x", t0).allowed);
  EXPECT_TRUE(closed.acquire("b", "x", t0).allowed);
}

// Verifies that threads on one key never hold more than N live leases.
TEST(Leases, ThreadsOnOneKeyNeverHoldMoreThanN) {
  concurrency_limiter<> c{concurrency_config{5, std::chrono::hours{1}, {.name = "calls"}}};
  constexpr int threads = 8;
  constexpr int rounds = 2000;
  std::atomic<int> live{0};
  std::atomic<int> most{0};
  std::atomic<long> granted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < rounds; ++j) {
        const std::string id = std::to_string(i) + ":" + std::to_string(j);
        if (!c.acquire("k", id, t0).allowed) continue;
        const int now_live = ++live;
        int seen = most.load();
        while (now_live > seen && !most.compare_exchange_weak(seen, now_live)) {
        }
        ++granted;
        --live;
        ASSERT_TRUE(c.release("k", id, t0).allowed);
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_LE(most.load(), 5);
  EXPECT_GT(granted.load(), 0);
  // All released: the key has 5 free slots again.
  EXPECT_EQ(c.acquire("k", "final", t0).remaining, 4);
  // Without releases exactly N of many concurrent acquires are granted.
  concurrency_limiter<> d{concurrency_config{5, std::chrono::hours{1}, {.name = "calls"}}};
  std::atomic<int> won{0};
  pool.clear();
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (int j = 0; j < 200; ++j) {
        if (d.acquire("k", std::to_string(i * 1000 + j), t0).allowed) ++won;
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(won.load(), 5);
}

// Verifies the limiter reads its clock when no time is given.
TEST(Leases, ReadsItsClock) {
  concurrency_limiter<no_rate, memory_store<leases<>>, manual_clock> c{
      concurrency_config{1, D, {.name = "calls"}}, memory_store<leases<>>{}, manual_clock{}};
  c.clock().set(t0);
  ASSERT_TRUE(c.acquire("k", "a").allowed);
  c.clock().advance(D - microseconds{1});
  EXPECT_FALSE(c.acquire("k", "b").allowed);
  EXPECT_TRUE(c.renew("k", "a").allowed);
  c.clock().advance(D);
  EXPECT_TRUE(c.acquire("k", "b").allowed);
  EXPECT_FALSE(c.release("k", "a").allowed);
}

}  // namespace
