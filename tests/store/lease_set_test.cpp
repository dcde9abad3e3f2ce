// SPDX-License-Identifier: Apache-2.0
// Tests of the in-process lease set's storage: ids of every length (held
// inline up to 15 bytes, on the heap beyond), ids that differ in one byte
// only, many leases on one key (the heap block of the leases after the
// first, grown and shrunk), and copies of a key's state, each operation
// checked against a model of the documented rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ratelimit/concurrency.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

constexpr microseconds D{1000};  // max duration

/// The documented rules of acquire, release and renew on one key, as a map
/// of id -> expiry (docs/semantics.md, "Concurrency limits (leases)").
struct model {
  units n;
  std::map<std::string, std::int64_t> live;

  decision apply(lease_op op, const std::string& id, std::int64_t t) {
    std::erase_if(live, [t](const auto& e) { return e.second <= t; });
    const auto it = live.find(id);
    const bool held = it != live.end();
    decision d;
    d.limit = n;
    bool done = held;
    if (op == lease_op::acquire) {
      if (!held && static_cast<units>(live.size()) < n) {
        live.emplace(id, t + D.count());
        done = true;
        d.counted = true;
      }
      d.repeat = held;
    } else if (op == lease_op::release) {
      if (held) live.erase(it);
      d.counted = held;
    } else {
      if (held) it->second = std::max(it->second, t + D.count());
      d.counted = held;
    }
    d.allowed = done;
    const auto size = static_cast<units>(live.size());
    d.remaining = size >= n ? 0 : n - size;
    std::int64_t earliest = INT64_MAX;
    std::int64_t latest = t;
    for (const auto& [k, e] : live) {
      earliest = std::min(earliest, e);
      latest = std::max(latest, e);
    }
    d.reset_after = microseconds{latest - t};
    if (!done) d.retry_after = op == lease_op::acquire ? microseconds{earliest - t} : never;
    return d;
  }
};

/// Ids of the lengths around each storage boundary; some pairs differ in one byte only.
std::vector<std::string> ids_of_every_shape() {
  std::vector<std::string> ids;
  const std::size_t lengths[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 40, 255, 256};
  for (const std::size_t len : lengths) {
    std::string base(len, 'a');
    for (std::size_t i = 0; i < len; ++i) base[i] = static_cast<char>('a' + (i * 7 + len) % 26);
    ids.push_back(base);
    // The same length, one byte different: first, middle, last.
    for (const std::size_t at : {std::size_t{0}, len / 2, len - 1}) {
      std::string other = base;
      other[at] = '\0';
      ids.push_back(other);
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// Runs `steps` random operations on one key with a limit of `n`, ids drawn
/// from `ids`, and checks every decision and the leases held (read through a
/// copy of the key's state) against the model.
void follow_the_model(units n, const std::vector<std::string>& ids, std::uint64_t seed, int steps,
                      std::int64_t max_gap) {
  concurrency_limiter<> c{concurrency_config{n, D}};
  model m{n, {}};
  std::mt19937_64 rng(seed);
  std::int64_t t = 1'000'000;
  for (int step = 0; step < steps; ++step) {
    const std::string& id = ids[rng() % ids.size()];
    const auto r = rng() % 10;
    const lease_op op = r < 5 ? lease_op::acquire : r < 9 ? lease_op::release : lease_op::renew;
    const timestamp now{t};
    const decision got = op == lease_op::acquire   ? c.acquire("k", id, now)
                         : op == lease_op::release ? c.release("k", id, now)
                                                   : c.renew("k", id, now);
    const decision want = m.apply(op, id, t);
    ASSERT_EQ(got, want) << "n " << n << " seed " << seed << " step " << step << " id of "
                         << id.size() << " bytes";
    const auto state = c.store().state_of("k");
    std::map<std::string, std::int64_t> held;
    for (std::size_t i = 0; i < state.held.size(); ++i) {
      if (state.held[i].expiry > t) {
        held.emplace(std::string(state.held[i].id()), state.held[i].expiry);
      }
    }
    ASSERT_EQ(held, m.live) << "n " << n << " seed " << seed << " step " << step;
    t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(max_gap));
  }
}

/// Verifies the rules with N = 40 (the set grows its heap block several
/// times and shrinks back) and ids of every shape.
TEST(LeaseSet, EveryIdShapeAndManyLeasesFollowTheModel) {
  const std::vector<std::string> ids = ids_of_every_shape();
  for (const std::uint64_t seed : {1U, 2U, 3U}) follow_the_model(40, ids, seed, 4000, 40);
}

/// Verifies the rules on keys that hold no lease or one (the fast path of a
/// first acquire and of the release of the only lease) with N = 1 and 2,
/// a few ids of one length or of lengths 8 and 9 apart in one byte, and
/// leases that expire between operations.
TEST(LeaseSet, KeysWithAtMostOneLeaseFollowTheModel) {
  const std::vector<std::vector<std::string>> id_sets = {
      {"call-0001", "call-0002", "call-0003"},
      {"call-001", "call-0001", "a", std::string(40, 'z')},
  };
  for (const units n : {1, 2}) {
    for (const auto& ids : id_sets) {
      for (const std::uint64_t seed : {4U, 5U}) follow_the_model(n, ids, seed, 3000, 600);
    }
  }
}

/// Verifies that a lease takes any id after any other (inline to heap, heap
/// to inline, a heap block reused for an id up to its capacity or replaced
/// by a larger one) and holds exactly that id: under AddressSanitizer a
/// block reused past its size is an error.
TEST(LeaseSet, ALeaseTakesAnyIdAfterAnyOther) {
  std::vector<std::string> ids;
  for (std::size_t len = 1; len <= max_lease_id_bytes; ++len) {
    ids.push_back(std::string(len, static_cast<char>('a' + len % 26)));
  }
  for (const std::string& a : ids) {
    for (const std::string& b : ids) {
      leases<>::lease l;
      l.assign(a);
      ASSERT_EQ(l.id(), a);
      l.assign(b);
      ASSERT_EQ(l.id(), b) << a.size() << " then " << b.size();
      ASSERT_TRUE(l.holds(b));
      ASSERT_EQ(l.holds(a), a == b);
      const leases<>::lease copy = l;
      ASSERT_EQ(copy.id(), b);
    }
  }
}

/// Verifies copies and moves of a key's state: equal and independent; an
/// emptied set equals a new one and is reused.
TEST(LeaseSet, CopiesAndMovesKeepEveryLease) {
  using state = leases<>::state;
  const std::vector<std::string> ids = ids_of_every_shape();
  state s;
  for (std::size_t i = 0; i < 20; ++i) s.held.add(ids[i], 100 + static_cast<std::int64_t>(i));
  ASSERT_EQ(s.held.size(), 20U);
  state copy = s;
  EXPECT_EQ(copy, s);
  copy.held.remove(3);
  EXPECT_FALSE(copy == s);
  EXPECT_EQ(s.held.size(), 20U);
  state moved = std::move(copy);
  EXPECT_EQ(moved.held.size(), 19U);
  EXPECT_EQ(copy.held.size(), 0U);  // NOLINT(bugprone-use-after-move): moved-from is empty
  copy = moved;
  EXPECT_EQ(copy, moved);
  // Emptied one by one (from the front: the last takes each place), then reused.
  while (!s.held.empty()) s.held.remove(0);
  EXPECT_EQ(s, state{});
  s.held.add(ids.back(), 7);
  EXPECT_EQ(s.held.size(), 1U);
  EXPECT_EQ(s.held[0].id(), ids.back());
}

/// Hostile ids: every length around the inline boundary (14..17) and the
/// heap-block granularity (24/25, 40/41), the longest, NUL and 0xFF bytes,
/// pairs equal but for their last or first byte.
std::vector<std::string> hostile_ids() {
  std::vector<std::string> ids;
  for (const std::size_t len : {1U, 2U, 7U, 8U, 14U, 15U, 16U, 17U, 24U, 25U, 40U, 41U, 256U}) {
    std::string base(len, '\0');
    for (std::size_t i = 0; i < len; ++i) base[i] = static_cast<char>(i % 3 == 0 ? 0xFF : i);
    ids.push_back(base);
    std::string last = base;
    last[len - 1] = static_cast<char>(last[len - 1] ^ 0x80);
    ids.push_back(last);
    std::string first = base;
    first[0] = '\0';
    ids.push_back(first);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// The live leases of a state at t, as the model holds them.
std::map<std::string, std::int64_t> live_of(const leases<>::state& s, std::int64_t t) {
  std::map<std::string, std::int64_t> held;
  for (std::size_t i = 0; i < s.held.size(); ++i) {
    if (s.held[i].expiry > t) held.emplace(std::string(s.held[i].id()), s.held[i].expiry);
  }
  return held;
}

/// Verifies random acquire/release/renew with N = 1, 2, 3 and 7 against the
/// model, at times that go forwards and backwards, land exactly on a live
/// lease's expiry or the microsecond before; between operations the key's
/// state is copied, moved, self-assigned and swapped through copies, and the
/// limiter (the short paths of memory_store) and a bare state stepped by the
/// policy must agree with the model and with each other.
TEST(LeaseSet, RandomOperationsAtAnyTimeFollowTheModel) {
  const std::vector<std::string> ids = hostile_ids();
  for (const units n : {1, 2, 3, 7}) {
    for (const std::uint64_t seed : {11U, 12U, 13U}) {
      const leases<>::settings settings{concurrency_config{n, D}};
      concurrency_limiter<> c{concurrency_config{n, D}};
      leases<>::state s;
      model m{n, {}};
      std::mt19937_64 rng(seed * 1000 + static_cast<std::uint64_t>(n));
      std::int64_t t = 10'000;
      for (int step = 0; step < 3000; ++step) {
        // The time: forwards, backwards, or at an edge of a live lease.
        const auto how = rng() % 8;
        if (how < 3) {
          t += static_cast<std::int64_t>(rng() % 700);
        } else if (how < 5) {
          t = std::max<std::int64_t>(0, t - static_cast<std::int64_t>(rng() % 700));
        } else if (!m.live.empty()) {
          auto it = m.live.begin();
          std::advance(it, static_cast<long>(rng() % m.live.size()));
          t = it->second - (how == 5 ? 1 : 0);
        }
        const std::string& id = ids[rng() % ids.size()];
        const auto r = rng() % 10;
        const lease_op op = r < 5 ? lease_op::acquire : r < 8 ? lease_op::release : lease_op::renew;
        const timestamp now{t};
        const decision want = m.apply(op, id, t);
        const decision got = op == lease_op::acquire   ? c.acquire("k", id, now)
                             : op == lease_op::release ? c.release("k", id, now)
                                                       : c.renew("k", id, now);
        ASSERT_EQ(got, want) << "n " << n << " seed " << seed << " step " << step << " t " << t
                             << " id of " << id.size() << " bytes";
        const decision bare = leases<>::step(leases<>::config(settings, op, id), s, now, 1);
        ASSERT_EQ(bare, want) << "n " << n << " seed " << seed << " step " << step;
        ASSERT_EQ(live_of(s, t), m.live) << "n " << n << " seed " << seed << " step " << step;
        ASSERT_EQ(live_of(c.store().state_of("k"), t), m.live);
        // Copies, moves and self-assignment of the state between operations.
        switch (rng() % 6) {
          case 0: {
            leases<>::state copy = s;
            ASSERT_EQ(copy, s);
            s = std::move(copy);
            break;
          }
          case 1: {
            leases<>::state copy;
            copy.held.add(ids[rng() % ids.size()], 5);  // overwritten by the assignment
            copy = s;
            ASSERT_EQ(copy, s);
            s = copy;  // copy-assign over a live set
            ASSERT_EQ(copy, s);
            break;
          }
          case 2: {
            leases<>::state& alias = s;
            s = alias;             // self copy-assignment
            s = std::move(alias);  // self move-assignment
            break;
          }
          case 3: {
            leases<>::state moved(std::move(s));
            ASSERT_TRUE(s.held.empty());  // NOLINT(bugprone-use-after-move)
            s = std::move(moved);
            break;
          }
          default: break;
        }
        ASSERT_EQ(live_of(s, t), m.live) << "n " << n << " seed " << seed << " step " << step;
      }
    }
  }
}

/// Verifies that a lease renamed to an id taken from its own storage (a
/// view of its id, or of part of it) holds exactly those bytes.
TEST(LeaseSet, ALeaseTakesAnIdThatAliasesItsOwn) {
  for (std::size_t len = 2; len <= max_lease_id_bytes; ++len) {
    std::string id(len, 'x');
    for (std::size_t i = 0; i < len; ++i) id[i] = static_cast<char>('a' + i % 26);
    leases<>::lease l;
    l.assign(id);
    l.assign(l.id());
    ASSERT_EQ(l.id(), id);
    l.assign(l.id().substr(1));
    ASSERT_EQ(l.id(), id.substr(1)) << len;
    l.assign(id);
    l.assign(l.id().substr(len / 2));  // a heap id's tail, inline or on the heap
    ASSERT_EQ(l.id(), id.substr(len / 2)) << len;
    l.assign(id);
    l.assign(l.id().substr(0, 3));
    ASSERT_EQ(l.id(), id.substr(0, 3)) << len;
  }
}

/// Verifies a lease store driven without the limiter's checks (a
/// memory_store of leases<> given a config directly): an acquire of an empty
/// id or one over 256 bytes throws std::invalid_argument and records
/// nothing (it had stored a wrong id, leaking or overrunning its block).
TEST(LeaseSet, TheStoreRefusesIdsOutOfRangeWithoutTheLimiter) {
  const leases<>::settings settings{concurrency_config{4, D}};
  memory_store<leases<>> store;
  const std::string ok(40, 'o');
  (void)store.apply(leases<>::config(settings, lease_op::acquire, ok), "k", timestamp{10}, 1,
                    access::consume);
  for (const std::size_t len : {std::size_t{0}, max_lease_id_bytes + 1, std::size_t{300}}) {
    const std::string id(len, 'x');
    EXPECT_THROW((void)store.apply(leases<>::config(settings, lease_op::acquire, id), "k",
                                   timestamp{20}, 1, access::consume),
                 std::invalid_argument)
        << len;
    EXPECT_THROW((void)store.apply(leases<>::config(settings, lease_op::acquire, id), "new",
                                   timestamp{20}, 1, access::consume),
                 std::invalid_argument)
        << len;
    const auto s = store.state_of("k");
    ASSERT_EQ(s.held.size(), 1U) << len;
    EXPECT_EQ(s.held[0].id(), ok);
    EXPECT_EQ(store.state_of("new").held.size(), 0U);
  }
  leases<>::lease l;
  EXPECT_THROW(l.assign(std::string(257, 'x')), std::invalid_argument);
  EXPECT_THROW(l.assign({}), std::invalid_argument);
}

}  // namespace
