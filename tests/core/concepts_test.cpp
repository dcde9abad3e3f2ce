// SPDX-License-Identifier: Apache-2.0
// The library's concepts, checked both ways: what models them and what must not.
#include "ratelimit/concepts.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string_view>

#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace {

using ratelimit::clock_source;
using ratelimit::fixed_window;
using ratelimit::gcra;
using ratelimit::memory_store;
using ratelimit::policy;
using ratelimit::sliding_window_counter;
using ratelimit::sliding_window_log;
using ratelimit::store_for;
using ratelimit::token_bucket;

// The five policies.
static_assert(policy<fixed_window>);
static_assert(policy<sliding_window_log>);
static_assert(policy<sliding_window_counter>);
static_assert(policy<token_bucket>);
static_assert(policy<gcra>);

// The memory store serves each policy, and only the policy it was built for.
static_assert(store_for<memory_store<fixed_window>, fixed_window>);
static_assert(store_for<memory_store<sliding_window_log>, sliding_window_log>);
static_assert(store_for<memory_store<sliding_window_counter>, sliding_window_counter>);
static_assert(store_for<memory_store<token_bucket>, token_bucket>);
static_assert(store_for<memory_store<gcra>, gcra>);
static_assert(!store_for<memory_store<gcra>, token_bucket>);
static_assert(!store_for<memory_store<fixed_window>, sliding_window_counter>);

// Clocks.
static_assert(clock_source<ratelimit::steady_clock>);
static_assert(clock_source<ratelimit::system_clock>);
static_assert(clock_source<ratelimit::manual_clock>);
static_assert(clock_source<std::chrono::steady_clock>);  // a standard clock has all it needs
static_assert(!ratelimit::store_clock<ratelimit::steady_clock>);
static_assert(!ratelimit::store_clock<ratelimit::manual_clock>);

}  // namespace

// Probe types live in a named namespace: unused internal types would warn.
namespace concepts_test {

using ratelimit::clock_source;
using ratelimit::gcra;
using ratelimit::memory_store;
using ratelimit::policy;
using ratelimit::store_for;

// Types that must not pass.
struct no_clock_members {};
struct throwing_clock {  // now() is not noexcept
  using duration = std::chrono::microseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  time_point now() const { return {}; }
};
struct wrong_now_type {  // now() returns something else than time_point
  using duration = std::chrono::microseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  long now() const noexcept { return 0; }
};
struct mutable_now_clock {  // now() needs a non-const object
  using duration = std::chrono::microseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  time_point now() noexcept { return {}; }
};
static_assert(!clock_source<no_clock_members>);
static_assert(!clock_source<throwing_clock>);
static_assert(!clock_source<wrong_now_type>);
static_assert(!clock_source<mutable_now_clock>);
static_assert(!clock_source<int>);

/// A step that may throw (std::bad_alloc, leaving the state unchanged) is
/// allowed: the sliding log and compound_of allocate in theirs.
struct throwing_step_policy {
  static constexpr std::string_view name = "bad";
  struct config {
    using policy_type = throwing_step_policy;
    ratelimit::units limit() const noexcept { return 1; }
  };
  struct state {
    friend bool operator==(const state&, const state&) = default;
  };
  static ratelimit::decision step(const config&, state&, ratelimit::timestamp, ratelimit::units) {
    return {};
  }
  static bool idle(const config&, const state&, ratelimit::timestamp) noexcept { return true; }
};

/// The same with a noexcept step: a valid policy too.
struct minimal_policy {
  static constexpr std::string_view name = "minimal";
  struct config {
    using policy_type = minimal_policy;
    ratelimit::units limit() const noexcept { return 1; }
  };
  struct state {
    friend bool operator==(const state&, const state&) = default;
  };
  static ratelimit::decision step(const config&, state&, ratelimit::timestamp,
                                  ratelimit::units) noexcept {
    return {};
  }
  static bool idle(const config&, const state&, ratelimit::timestamp) noexcept { return true; }
};

/// A config naming another policy.
struct mismatched_config_policy {
  static constexpr std::string_view name = "mismatched";
  using config = minimal_policy::config;
  using state = minimal_policy::state;
  static ratelimit::decision step(const config&, state&, ratelimit::timestamp,
                                  ratelimit::units) noexcept {
    return {};
  }
  static bool idle(const config&, const state&, ratelimit::timestamp) noexcept { return true; }
};

static_assert(policy<minimal_policy>);
static_assert(policy<throwing_step_policy>);
static_assert(!policy<mismatched_config_policy>);
static_assert(!policy<int>);
static_assert(!policy<memory_store<gcra>>);

/// Not a store: apply has the wrong signature.
struct not_a_store {
  void apply() {}
};
static_assert(!store_for<not_a_store, gcra>);
static_assert(!store_for<int, gcra>);
static_assert(store_for<memory_store<minimal_policy>, minimal_policy>);

}  // namespace concepts_test

namespace {

TEST(Concepts, ArePinnedDownByStaticAssertions) {
  // Everything above is checked at compile time; this gives the file a test
  // case so that it shows up in ctest.
  SUCCEED();
}

}  // namespace
