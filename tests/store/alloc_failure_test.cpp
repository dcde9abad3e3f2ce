// SPDX-License-Identifier: Apache-2.0
// Tests that std::bad_alloc during a check reaches the caller and leaves the store as it was.
//
// This binary replaces the global operator new so that a test can make the
// n-th allocation from now throw std::bad_alloc. Each scenario runs one check
// with the 0th, 1st, 2nd, ... allocation failing until the check succeeds,
// and after every failure asserts that the key's state and the store's size
// are unchanged and that the store still works. Before the fix, policy steps
// that allocate were noexcept, so the first failure terminated the process.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/concurrency.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "support/replaced_new.hpp"

bool rltest::allocation_fails() noexcept {
  return rltest::countdown_fails();
}

namespace {
using rltest::allocations_before_failure;
}  // namespace

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::decision;
using ratelimit::memory_store;
using ratelimit::memory_store_options;
using ratelimit::timestamp;

/// Runs `check` on `store` with allocation n failing, for n = 0, 1, ...,
/// until it succeeds; `twin` got the same history and runs `check` once,
/// without failures. Asserts that each failure changed nothing and that the
/// final success matches the twin exactly. Returns how many checks failed.
template <class P>
int fail_each_allocation_in_turn(memory_store<P>& store, memory_store<P>& twin,
                                 std::string_view key,
                                 const std::function<decision(memory_store<P>&)>& check) {
  const decision expected = check(twin);
  int failures = 0;
  for (long n = 0; n < 100; ++n) {
    const typename P::state before = store.state_of(key);
    const std::size_t size_before = store.size();
    decision got;
    bool threw = false;
    allocations_before_failure = n;
    try {
      got = check(store);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    allocations_before_failure = -1;
    if (!threw) {
      EXPECT_EQ(got, expected);
      EXPECT_EQ(store.state_of(key), twin.state_of(key));
      EXPECT_EQ(store.size(), twin.size());
      return failures;
    }
    ++failures;
    EXPECT_EQ(store.state_of(key), before) << "allocation " << n;
    EXPECT_EQ(store.size(), size_before) << "allocation " << n;
  }
  ADD_FAILURE() << "the check never succeeded";
  return failures;
}

template <class P>
void prepare(memory_store<P>& a, memory_store<P>& b, const typename P::config& cfg,
             std::string_view key, std::initializer_list<std::int64_t> times) {
  for (const std::int64_t t : times) {
    (void)a.apply(cfg, key, timestamp{t}, 1, access::consume);
    (void)b.apply(cfg, key, timestamp{t}, 1, access::consume);
  }
}

// Verifies the sliding log's growth: its third entry moves the log to the heap.
TEST(AllocationFailure, SlidingLogGrowthLeavesTheLogIntact) {
  using P = ratelimit::sliding_window_log;
  const P::config cfg{"10/1s"};
  memory_store<P> store;
  memory_store<P> twin;
  prepare(store, twin, cfg, "k", {1, 2});
  const int failures = fail_each_allocation_in_turn<P>(store, twin, "k", [&](memory_store<P>& s) {
    return s.apply(cfg, "k", timestamp{3}, 1, access::consume);
  });
  EXPECT_GE(failures, 1);
  EXPECT_EQ(store.state_of("k").size(), 3U);
}

// Verifies a peek, which copies the log, and that it then still decides.
TEST(AllocationFailure, PeekCopyFailureChangesNothing) {
  using P = ratelimit::sliding_window_log;
  const P::config cfg{"10/1s"};
  memory_store<P> store;
  memory_store<P> twin;
  prepare(store, twin, cfg, "k", {1, 2, 3, 4});
  const int failures = fail_each_allocation_in_turn<P>(store, twin, "k", [&](memory_store<P>& s) {
    return s.apply(cfg, "k", timestamp{5}, 1, access::peek);
  });
  EXPECT_GE(failures, 1);
}

// Verifies a run-time compound of sliding logs: every step copies vectors.
TEST(AllocationFailure, CompoundOfStepIsAllOrNothing) {
  using P = ratelimit::compound_of<ratelimit::sliding_window_log>;
  const P::config cfg{"10/1s", "20/1min"};
  memory_store<P> store;
  memory_store<P> twin;
  prepare(store, twin, cfg, "k", {1, 2});
  const int failures = fail_each_allocation_in_turn<P>(store, twin, "k", [&](memory_store<P>& s) {
    return s.apply(cfg, "k", timestamp{3}, 1, access::consume);
  });
  EXPECT_GE(failures, 3);
}

// Verifies a new key of a compound_of, whose first step builds its sub-states.
TEST(AllocationFailure, CompoundOfNewKeyIsNotInserted) {
  using P = ratelimit::compound_of<ratelimit::sliding_window_log>;
  const P::config cfg{"10/1s", "20/1min"};
  memory_store<P> store;
  memory_store<P> twin;
  prepare(store, twin, cfg, "other", {1});
  const int failures = fail_each_allocation_in_turn<P>(store, twin, "k", [&](memory_store<P>& s) {
    return s.apply(cfg, "k", timestamp{3}, 1, access::consume);
  });
  EXPECT_GE(failures, 3);
  EXPECT_EQ(store.size(), 2U);
}

// Verifies a compile-time compound where the sliding log counts rejected
// attempts: the fixed window rejects, the log admits and records the attempt
// (growing to the heap), then probes copies of itself for retry_after. A
// failure anywhere must leave both sub-states as they were.
TEST(AllocationFailure, CompoundCommitsNoSubLimitWhenAnyAllocationFails) {
  using P = ratelimit::compound<ratelimit::sliding_window_log, ratelimit::fixed_window>;
  const P::config cfg{
      ratelimit::sliding_window_log::config{"3/1s", ratelimit::window_options{true}},
      ratelimit::fixed_window::config{"2/1s"}};
  memory_store<P> store;
  memory_store<P> twin;
  prepare(store, twin, cfg, "k", {1, 2});
  const int failures = fail_each_allocation_in_turn<P>(store, twin, "k", [&](memory_store<P>& s) {
    return s.apply(cfg, "k", timestamp{3}, 1, access::consume);
  });
  EXPECT_GE(failures, 2);
  const decision d = store.apply(cfg, "k", timestamp{4}, 1, access::peek);
  EXPECT_FALSE(d.allowed);
}

// Verifies the store's own insertion: the node and, for the 17th key of a
// shard, a larger bucket array.
TEST(AllocationFailure, FailedInsertionKeepsTheCountRight) {
  using P = ratelimit::fixed_window;
  const P::config cfg{"10/1s"};
  memory_store_options o;
  o.shards = 1;
  o.max_keys = 17;
  memory_store<P> store(o);
  memory_store<P> twin(o);
  for (int i = 0; i < 16; ++i) prepare(store, twin, cfg, "k" + std::to_string(i), {1});
  const int failures = fail_each_allocation_in_turn<P>(store, twin, "new", [&](memory_store<P>& s) {
    return s.apply(cfg, "new", timestamp{2}, 1, access::consume);
  });
  EXPECT_EQ(failures, 2);  // the bucket array, then the node
  EXPECT_EQ(store.size(), 17U);
  // The cap still counts right: one more key is over it.
  EXPECT_EQ(store.apply(cfg, "one-too-many", timestamp{2}, 1, access::consume).source,
            ratelimit::decision_source::fail_open);
}

// Verifies the table's memory rule (docs/semantics.md, "Table memory"): a
// shard that grows to 1,024 buckets allocates its segments once (16, 16, 32,
// ..., 512 buckets: seven arrays) besides one node per key; after a sweep
// drops every key and shrinks the table, growing it to the same size again
// allocates the nodes alone, and a shard that grows no larger never
// allocates a bucket array again.
TEST(AllocationFailure, ATableRegrownAfterItsShrinkReusesItsSegments) {
  using P = ratelimit::fixed_window;
  const P::config cfg{"1/1s"};
  memory_store<P> store(memory_store_options{.shards = 1});
  constexpr long budget = 1'000'000;  // far more than a round allocates
  const auto allocations_for_keys = [&](const char* prefix, timestamp at) {
    allocations_before_failure = budget;
    for (int i = 0; i < 1000; ++i) {
      char key[16];
      (void)std::snprintf(key, sizeof key, "%s%d", prefix, i);
      (void)store.apply(cfg, key, at, 1, access::consume);
    }
    const long used = budget - allocations_before_failure;
    allocations_before_failure = -1;
    return used;
  };
  EXPECT_EQ(allocations_for_keys("a", timestamp{0}), 1000 + 7);
  EXPECT_EQ(store.size(), 1000U);
  EXPECT_EQ(store.sweep(cfg, timestamp{std::chrono::seconds{10}}), 1000U);
  EXPECT_EQ(store.size(), 0U);
  EXPECT_EQ(allocations_for_keys("b", timestamp{std::chrono::seconds{20}}), 1000);
  EXPECT_EQ(store.sweep(cfg, timestamp{std::chrono::seconds{30}}), 1000U);
  EXPECT_EQ(allocations_for_keys("c", timestamp{std::chrono::seconds{40}}), 1000);
  EXPECT_EQ(store.size(), 1000U);
}

}  // namespace

namespace {

// Verifies idempotent checks under allocation failure: when the id table
// cannot grow, the check's decision is returned (it consumed) and only the id
// goes unrecorded; when the store's own insertion fails, bad_alloc reaches the
// caller with nothing consumed and no id recorded.
TEST(AllocationFailure, RequestIdTableGrowthFailureReturnsTheDecision) {
  using P = ratelimit::fixed_window;
  ratelimit::limiter<P> lim{P::config{"10/1s"}};
  const timestamp t{1'000'000};
  EXPECT_TRUE(lim.try_acquire("k", t).allowed);  // the key is held: its check allocates nothing
  allocations_before_failure = 0;                // the id table's first table
  const decision d = lim.try_acquire("k", ratelimit::request_id{"r"}, t);
  allocations_before_failure = -1;
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 8);
  EXPECT_EQ(lim.request_ids_held(), 0U);
  // Unrecorded: the retry is a new request.
  const decision again = lim.try_acquire("k", ratelimit::request_id{"r"}, t);
  EXPECT_FALSE(again.repeat);
  EXPECT_EQ(again.remaining, 7);
  EXPECT_TRUE(lim.try_acquire("k", ratelimit::request_id{"r"}, t).repeat);

  // A new key: the store's node allocation fails first.
  allocations_before_failure = 0;
  EXPECT_THROW((void)lim.try_acquire("new", ratelimit::request_id{"n"}, t), std::bad_alloc);
  allocations_before_failure = -1;
  EXPECT_EQ(lim.peek("new", t).remaining, 9);  // nothing consumed
  EXPECT_FALSE(lim.try_acquire("new", ratelimit::request_id{"n"}, t).repeat);
}

}  // namespace

namespace {

using L = ratelimit::leases<>;
using LR = ratelimit::leases<ratelimit::sliding_window_log>;
constexpr std::chrono::microseconds lease_duration{1000};

/// A lease id of `len` bytes, distinct per `i`.
std::string lease_id(std::size_t len, int i) {
  std::string id(len, 'x');
  id[0] = static_cast<char>('a' + i);
  return id;
}

// Verifies acquires that allocate in the lease set: the fifth lease of a key
// grows the block of the leases after the first (3 slots) and copies its
// 40-byte id; a failure of either leaves the key's leases as they were.
TEST(AllocationFailure, LeaseSetGrowthAndHeapIdAreAllOrNothing) {
  const L::settings settings{ratelimit::concurrency_config{8, lease_duration}};
  memory_store<L> store;
  memory_store<L> twin;
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(lease_id(40, i));
  for (int i = 0; i < 4; ++i) {
    const L::config c(settings, ratelimit::lease_op::acquire, ids[static_cast<std::size_t>(i)]);
    prepare(store, twin, c, "k", {10 + i});
  }
  const L::config c(settings, ratelimit::lease_op::acquire, ids[4]);
  const int failures = fail_each_allocation_in_turn<L>(store, twin, "k", [&](memory_store<L>& s) {
    return s.apply(c, "k", timestamp{20}, 1, access::consume);
  });
  EXPECT_EQ(failures, 2);  // the block, then the id
  EXPECT_EQ(store.state_of("k").held.size(), 5U);
}

// Verifies an acquire on a key whose leases have expired (the acquire drops
// them) when the new lease's heap id cannot be allocated: the key's state is
// as it was, its expired leases included.
TEST(AllocationFailure, LeaseAcquireOverExpiredLeasesChangesNothingOnFailure) {
  const L::settings settings{ratelimit::concurrency_config{2, lease_duration}};
  memory_store<L> store;
  memory_store<L> twin;
  const std::string a = lease_id(15, 0);
  const std::string b = lease_id(16, 1);
  const std::string fresh = lease_id(200, 2);
  prepare(store, twin, L::config(settings, ratelimit::lease_op::acquire, a), "k", {10});
  prepare(store, twin, L::config(settings, ratelimit::lease_op::acquire, b), "k", {500});
  // At 1010 lease a has expired (exactly at its expiry), b is live.
  const L::config c(settings, ratelimit::lease_op::acquire, fresh);
  const int failures = fail_each_allocation_in_turn<L>(store, twin, "k", [&](memory_store<L>& s) {
    return s.apply(c, "k", timestamp{1010}, 1, access::consume);
  });
  EXPECT_EQ(failures, 1);
  EXPECT_EQ(store.state_of("k").held.size(), 2U);
}

// Verifies the all-or-nothing acquire with a rate: the sliding log's copy
// and growth and the lease's heap id; a failure anywhere commits neither.
TEST(AllocationFailure, RatedLeaseAcquireCommitsNeitherPartOnFailure) {
  const LR::settings settings{ratelimit::concurrency_config{8, lease_duration},
                              ratelimit::sliding_window_log::config{"10/1s"}};
  memory_store<LR> store;
  memory_store<LR> twin;
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(lease_id(17 + static_cast<std::size_t>(i), i));
  for (int i = 0; i < 4; ++i) {
    const LR::config c(settings, ratelimit::lease_op::acquire, ids[static_cast<std::size_t>(i)]);
    prepare(store, twin, c, "k", {10 + i});
  }
  const LR::config c(settings, ratelimit::lease_op::acquire, ids[4]);
  const int failures = fail_each_allocation_in_turn<LR>(store, twin, "k", [&](memory_store<LR>& s) {
    return s.apply(c, "k", timestamp{20}, 1, access::consume);
  });
  EXPECT_GE(failures, 3);  // the log's copy, the block, the id
  EXPECT_EQ(store.state_of("k").held.size(), 5U);
}

// Verifies copies of a key's lease set (what state_of and a peek do) under
// allocation failure: the exception reaches the caller, nothing leaks (under
// LeakSanitizer) and the original is untouched.
TEST(AllocationFailure, LeaseSetCopyFailsCleanly) {
  L::state s;
  std::vector<std::string> ids;
  for (int i = 0; i < 9; ++i) ids.push_back(lease_id(i % 2 == 0 ? 30 : 9, i));
  for (int i = 0; i < 9; ++i) s.held.add(ids[static_cast<std::size_t>(i)], 100 + i);
  int failures = 0;
  for (long n = 0; n < 100; ++n) {
    allocations_before_failure = n;
    try {
      const L::state copy = s;
      allocations_before_failure = -1;
      EXPECT_EQ(copy, s);
      break;
    } catch (const std::bad_alloc&) {
      allocations_before_failure = -1;
      ++failures;
    }
    L::state target;
    target.held.add(ids[0], 1);
    allocations_before_failure = n;
    try {
      target = s;
    } catch (const std::bad_alloc&) {
      allocations_before_failure = -1;
      EXPECT_EQ(target.held.size(), 1U);  // copy-assignment: all or nothing
      EXPECT_EQ(target.held[0].id(), ids[0]);
    }
    allocations_before_failure = -1;
  }
  EXPECT_EQ(failures, 6);  // the first lease's id, the block, four heap ids
  EXPECT_EQ(s.held.size(), 9U);
}

// Verifies the rated acquire over expired leases: the sliding log's copy and
// growth and the new lease's heap id; a failure changes neither the rate
// nor the lease set (expired leases included).
TEST(AllocationFailure, RatedLeaseAcquireOverExpiredLeasesChangesNothingOnFailure) {
  const LR::settings settings{ratelimit::concurrency_config{2, lease_duration},
                              ratelimit::sliding_window_log::config{"10/1s"}};
  memory_store<LR> store;
  memory_store<LR> twin;
  const std::string a = lease_id(40, 0);
  const std::string b = lease_id(3, 1);
  const std::string fresh = lease_id(100, 2);
  prepare(store, twin, LR::config(settings, ratelimit::lease_op::acquire, a), "k", {10});
  prepare(store, twin, LR::config(settings, ratelimit::lease_op::acquire, b), "k", {500});
  const LR::config c(settings, ratelimit::lease_op::acquire, fresh);
  const int failures = fail_each_allocation_in_turn<LR>(store, twin, "k", [&](memory_store<LR>& s) {
    return s.apply(c, "k", timestamp{1010}, 1, access::consume);
  });
  EXPECT_GE(failures, 2);
  const auto held = store.state_of("k").held;
  ASSERT_EQ(held.size(), 2U);
}

// Verifies a hinted acquire of a key the store does not hold yet
// (apply_keeping_hash: the key's node is allocated under the lock) with
// each of its allocations failing in turn: bad_alloc reaches the caller, the
// store holds nothing, the hint is filled with the key's hash anyway, and
// the operations after it, given that hint, decide as without one.
TEST(AllocationFailure, HintedAcquireOfANewKeyChangesNothingOnFailure) {
  const ratelimit::concurrency_config cc{1, lease_duration};
  ratelimit::concurrency_limiter<> hinted{cc};
  ratelimit::concurrency_limiter<> plain{cc};
  const std::string id = lease_id(40, 0);  // a heap id: one more allocation
  const timestamp t{1'000};
  int failures = 0;
  for (long n = 0; n < 100; ++n) {
    ratelimit::lease_hint h;
    allocations_before_failure = n;
    try {
      const decision d = hinted.acquire("new-key", id, t, h);
      allocations_before_failure = -1;
      EXPECT_EQ(d, plain.acquire("new-key", id, t));
      EXPECT_TRUE(h.filled());
      EXPECT_EQ(hinted.store().size(), 1U);
      EXPECT_EQ(hinted.acquire("new-key", "other", t, h), plain.acquire("new-key", "other", t));
      EXPECT_EQ(hinted.release("new-key", id, t, h), plain.release("new-key", id, t));
      EXPECT_EQ(hinted.acquire("new-key", "other", t, h), plain.acquire("new-key", "other", t));
      break;
    } catch (const std::bad_alloc&) {
      allocations_before_failure = -1;
      ++failures;
      EXPECT_TRUE(h.filled()) << "allocation " << n;
      EXPECT_EQ(hinted.store().size(), 0U) << "allocation " << n;
      // The hint filled by the failed acquire finds nothing and decides as none.
      EXPECT_EQ(hinted.release("new-key", id, t, h), plain.release("new-key", id, t));
      EXPECT_EQ(hinted.renew("new-key", id, t, h), plain.renew("new-key", id, t));
      EXPECT_EQ(hinted.store().size(), 0U) << "allocation " << n;
    }
  }
  EXPECT_GE(failures, 2);  // the key's node, the lease id
}

}  // namespace
