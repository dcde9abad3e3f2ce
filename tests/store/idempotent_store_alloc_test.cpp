// SPDX-License-Identifier: Apache-2.0
// idempotent_store under std::bad_alloc: a check whose id needs the key's
// heap block (or whose policy step allocates) fails with the store as it
// was: the key's policy state, its ids and their decisions unchanged.
//
// This binary replaces the global operator new so that the n-th allocation
// from now throws std::bad_alloc.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>

#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/store/idempotent_store.hpp"
#include "support/replaced_new.hpp"

bool rltest::allocation_fails() noexcept {
  return rltest::countdown_fails();
}

namespace {
using rltest::allocations_before_failure;
}  // namespace

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

/// Runs `check` with the 0th, 1st, ... allocation failing until it
/// succeeds; after each failure asserts that `unchanged()` holds.
template <class Check, class Unchanged>
void fail_each_allocation(Check check, Unchanged unchanged) {
  for (long n = 0;; ++n) {
    allocations_before_failure = n;
    bool failed = false;
    try {
      check();
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    allocations_before_failure = -1;
    if (!failed) return;
    unchanged();
    ASSERT_LT(n, 100) << "the check never succeeded";
  }
}

template <class Lim>
void expect_ids(Lim& lim, const std::string& key, int first, int last, timestamp at) {
  for (int i = first; i <= last; ++i) {
    EXPECT_TRUE(lim.peek(key, request_id{std::to_string(i)}, at).repeat) << i;
  }
}

// The third id of a key needs its heap block: when that allocation fails,
// the check throws and neither the policy state nor the ids changed.
TEST(IdempotentStoreAlloc, AFailedHeapBlockLeavesTheKeyAsItWas) {
  limiter<fixed_window, idempotent_store<fixed_window>> lim{fixed_window::config{"100/min"}};
  const timestamp t0{60'000'000};
  (void)lim.try_acquire("k", request_id{"1"}, t0);
  (void)lim.try_acquire("k", request_id{"2"}, t0);
  const auto before = lim.store().state_of("k");
  int failures = 0;
  fail_each_allocation([&] { (void)lim.try_acquire("k", request_id{"3"}, t0); },
                       [&] {
                         ++failures;
                         EXPECT_EQ(lim.store().state_of("k"), before);
                         EXPECT_EQ(lim.store().ids_of("k"), 2U);
                         EXPECT_FALSE(lim.peek("k", request_id{"3"}, t0).repeat);
                         expect_ids(lim, "k", 1, 2, t0);
                       });
  EXPECT_GE(failures, 1);
  EXPECT_EQ(lim.store().ids_of("k"), 3U);
  expect_ids(lim, "k", 1, 3, t0);
  EXPECT_EQ(lim.peek("k", t0).remaining, 100 - 3 - 1);
}

// A policy whose step allocates (sliding log) fails after the id's place
// was made: the decision is not recorded and no id is written.
TEST(IdempotentStoreAlloc, AFailedPolicyStepRecordsNoId) {
  limiter<sliding_window_log, idempotent_store<sliding_window_log>> lim{
      sliding_window_log::config{"1000/min"}};
  const timestamp t0{60'000'000};
  for (int i = 1; i <= 6; ++i) (void)lim.try_acquire("k", request_id{std::to_string(i)}, t0);
  const auto before = lim.store().state_of("k");
  int failures = 0;
  for (int i = 7; i <= 12; ++i) {
    const timestamp at = t0 + microseconds{i};
    fail_each_allocation([&] { (void)lim.try_acquire("k", request_id{std::to_string(i)}, at); },
                         [&] {
                           ++failures;
                           EXPECT_EQ(lim.store().ids_of("k"), static_cast<std::size_t>(i - 1));
                           EXPECT_FALSE(lim.peek("k", request_id{std::to_string(i)}, at).repeat);
                           expect_ids(lim, "k", 1, i - 1, at);
                         });
  }
  EXPECT_GE(failures, 1);
  EXPECT_NE(lim.store().state_of("k"), before);
  expect_ids(lim, "k", 1, 12, t0 + microseconds{20});
  EXPECT_EQ(lim.peek("k", t0 + microseconds{20}).remaining, 1000 - 12 - 1);
}

// A peek, state_of and ids_of read the key's ids in place: with the key's
// heap block of ids held and every allocation failing, none of them throws,
// and they see what a check would.
TEST(IdempotentStoreAlloc, PeekingAKeyNeverAllocates) {
  limiter<fixed_window, idempotent_store<fixed_window>> lim{fixed_window::config{"100/min"}};
  const timestamp t0{60'000'000};
  for (int i = 1; i <= 5; ++i) (void)lim.try_acquire("k", request_id{std::to_string(i)}, t0);
  const auto before = lim.store().memory().state_of("k");
  ASSERT_GT(before.heap_records(), 0U);  // ids 3 to 5 live in the heap block
  decision fresh;
  decision held;
  decision plain;
  fixed_window::state inner;
  std::size_t ids = 0;
  allocations_before_failure = 0;  // the next allocation throws
  try {
    fresh = lim.peek("k", request_id{"6"}, t0);
    held = lim.peek("k", request_id{"4"}, t0);
    plain = lim.peek("k", t0);
    inner = lim.store().state_of("k");
    ids = lim.store().ids_of("k");
  } catch (const std::bad_alloc&) {
    allocations_before_failure = -1;
    FAIL() << "a peek allocated";
  }
  const bool nothing_allocated = allocations_before_failure == 0;
  allocations_before_failure = -1;
  EXPECT_TRUE(nothing_allocated);
  EXPECT_FALSE(fresh.repeat);
  EXPECT_EQ(fresh.remaining, 100 - 6);
  EXPECT_TRUE(held.repeat);
  EXPECT_EQ(held.remaining, 100 - 4);
  EXPECT_FALSE(plain.repeat);
  EXPECT_EQ(plain.remaining, 100 - 6);
  EXPECT_EQ(inner.count, 5);
  EXPECT_EQ(ids, 5U);
  EXPECT_TRUE(lim.store().memory().state_of("k") == before);
  expect_ids(lim, "k", 1, 5, t0);
}

}  // namespace
