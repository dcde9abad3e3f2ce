// SPDX-License-Identifier: Apache-2.0
// Test helper: the exact rules of idempotent checks, run against any limiter
// of fixed_window "2/10s" whose store takes caller-supplied times (in process,
// Redis, cluster), so every store is held to the same assertions.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "ratelimit/ratelimit.hpp"

namespace rltest {

/// A config the rules below are written for: 2 per 10 s, retention 10 s.
inline ratelimit::fixed_window::config request_id_rules_config() {
  return ratelimit::fixed_window::config{"2/10s", ratelimit::window_options{.name = "ids"}};
}

/// Runs every rule on `lim` (a fresh limiter of request_id_rules_config(),
/// default retention), with keys prefixed by `prefix`.
template <class Limiter>
void check_request_id_rules(Limiter& lim, const std::string& prefix) {
  using namespace ratelimit;
  using std::chrono::microseconds;
  ASSERT_EQ(lim.retention(), microseconds{10'000'000});
  const std::string k = prefix + "+15551234567";
  const std::string k2 = prefix + "+15557654321";
  const std::string k3 = prefix + "peek";
  // A window start, so that t0 + retention starts the next window.
  const timestamp t0{1'700'000'000'000'000};
  const microseconds r = lim.retention();

  // The first check decides; a retry within the retention is that decision again.
  const decision first = lim.try_acquire(k, request_id{"INVITE 1"}, t0);
  EXPECT_TRUE(first.allowed);
  EXPECT_FALSE(first.repeat);
  EXPECT_EQ(first.remaining, 1);
  decision again = lim.try_acquire(k, request_id{"INVITE 1"}, t0 + microseconds{5});
  EXPECT_TRUE(again.repeat);
  decision expected = first;
  expected.repeat = true;
  EXPECT_EQ(again, expected);
  // ... which consumed nothing.
  EXPECT_EQ(lim.peek(k, t0 + microseconds{6}).remaining, 0);  // after the peeked one

  // A rejected first decision is rejected again, with its own retry_after.
  EXPECT_TRUE(lim.try_acquire(k, request_id{"INVITE 2"}, t0 + microseconds{7}).allowed);
  const decision refused = lim.try_acquire(k, request_id{"INVITE 3"}, t0 + microseconds{8});
  EXPECT_FALSE(refused.allowed);
  EXPECT_FALSE(refused.repeat);
  EXPECT_EQ(refused.retry_after, microseconds{10'000'000 - 8});
  const decision refused_again = lim.try_acquire(k, request_id{"INVITE 3"},
                                                 t0 + microseconds{9'000'000});
  expected = refused;
  expected.repeat = true;
  EXPECT_EQ(refused_again, expected);

  // The same id on another key is another request.
  const decision other = lim.try_acquire(k2, request_id{"INVITE 1"}, t0 + microseconds{10});
  EXPECT_TRUE(other.allowed);
  EXPECT_FALSE(other.repeat);
  EXPECT_EQ(other.remaining, 1);

  // Ids are binary safe: "a\0b" and "a" differ, and so do "a" and "a\0".
  EXPECT_FALSE(
      lim.try_acquire(k2, request_id{std::string_view("a\0b", 3)}, t0 + microseconds{11}).repeat);
  EXPECT_FALSE(lim.try_acquire(k2, request_id{"a"}, t0 + microseconds{12}).repeat);
  EXPECT_TRUE(
      lim.try_acquire(k2, request_id{std::string_view("a\0b", 3)}, t0 + microseconds{13}).repeat);

  // peek with an id records nothing; a peek of a recorded id is its repeat.
  const decision peeked = lim.peek(k3, request_id{"p"}, t0);
  EXPECT_TRUE(peeked.allowed);
  EXPECT_FALSE(peeked.repeat);
  EXPECT_EQ(peeked.remaining, 1);
  const decision taken = lim.try_acquire(k3, request_id{"p"}, t0 + microseconds{1});
  EXPECT_FALSE(taken.repeat);
  EXPECT_EQ(taken.remaining, 1);
  EXPECT_TRUE(lim.peek(k3, request_id{"p"}, t0 + microseconds{2}).repeat);
  EXPECT_EQ(lim.peek(k3, t0 + microseconds{3}).remaining, 0);

  // reset(key) forgets the state, not the ids decided for the key.
  lim.reset(k3);
  EXPECT_EQ(lim.peek(k3, t0 + microseconds{4}).remaining, 1);
  EXPECT_TRUE(lim.try_acquire(k3, request_id{"p"}, t0 + microseconds{5}).repeat);
  EXPECT_EQ(lim.peek(k3, t0 + microseconds{6}).remaining, 1);

  // The microsecond before the retention ends: still a repeat; at its end: a new request.
  EXPECT_TRUE(lim.try_acquire(k, request_id{"INVITE 1"}, t0 + r - microseconds{1}).repeat);
  const decision renewed = lim.try_acquire(k, request_id{"INVITE 1"}, t0 + r);
  EXPECT_FALSE(renewed.repeat);
  EXPECT_TRUE(renewed.allowed);
  EXPECT_EQ(renewed.remaining, 1);  // a new window, and this request counted in it
  EXPECT_TRUE(lim.try_acquire(k, request_id{"INVITE 1"}, t0 + r + microseconds{1}).repeat);
  // A time before the record (out of order) is within the retention too.
  EXPECT_TRUE(lim.try_acquire(k, request_id{"INVITE 1"}, t0).repeat);

  // Bad ids are refused before anything happens, naming the value.
  EXPECT_THROW((void)lim.try_acquire(k, request_id{""}, t0), std::invalid_argument);
  const std::string longest(max_request_id_bytes, 'x');
  EXPECT_NO_THROW((void)lim.try_acquire(k2, request_id{longest}, t0 + microseconds{20}));
  try {
    (void)lim.try_acquire(k, request_id{longest + "\x01"}, t0);
    ADD_FAILURE() << "a 257-byte id was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("257 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("xxxx"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)lim.try_acquire(k, request_id{"x"}, t0, 0), std::invalid_argument);
  EXPECT_THROW((void)lim.try_acquire("", request_id{"x"}, t0), std::invalid_argument);
}

/// Shadow mode with request ids on `lim` (a fresh limiter of
/// request_id_rules_config()): the first check of an id is forced and
/// recorded as the policy decided it; every answer in shadow mode is
/// shadowed; a repeat after shadow mode is switched off is the recorded
/// rejection.
template <class Limiter>
void check_request_id_shadow_rules(Limiter& lim, const std::string& prefix) {
  using namespace ratelimit;
  using std::chrono::microseconds;
  const std::string k = prefix + "+15550001111";
  const timestamp t0{1'700'000'000'000'000};
  lim.set_shadow(true);
  EXPECT_TRUE(lim.try_acquire(k, request_id{"a"}, t0).allowed);
  EXPECT_TRUE(lim.try_acquire(k, request_id{"b"}, t0).allowed);
  const decision over = lim.try_acquire(k, request_id{"c"}, t0 + microseconds{1});
  EXPECT_TRUE(over.allowed);
  EXPECT_TRUE(over.shadow_rejected);
  EXPECT_TRUE(over.counted);
  EXPECT_FALSE(over.repeat);
  // A retry in shadow mode: the same shadowed answer, consuming nothing.
  decision expected = over;
  expected.repeat = true;
  EXPECT_EQ(lim.try_acquire(k, request_id{"c"}, t0 + microseconds{2}), expected);
  // The forced request was recorded: 3 of 2 used (a peek sees the window full).
  EXPECT_FALSE(lim.peek(k, t0 + microseconds{3}).allowed);
  // Shadow off: a retry gets the recorded decision as the policy made it.
  lim.set_shadow(false);
  const decision enforced = lim.try_acquire(k, request_id{"c"}, t0 + microseconds{4});
  EXPECT_FALSE(enforced.allowed);
  EXPECT_FALSE(enforced.shadow_rejected);
  EXPECT_TRUE(enforced.repeat);
  EXPECT_EQ(enforced.retry_after, over.retry_after);
}

}  // namespace rltest
