// SPDX-License-Identifier: Apache-2.0
// Tests of memory_store's nodes: states of any alignment (1 to 128 bytes),
// keys of 1 to 512 bytes beside them, and the low 32 bits of the key's hash
// that a node keeps (keys sharing them, made-up hashes given to
// apply_hashed), and a state whose move throws (the key too long for a
// node: memory_store_long_key_test.cpp).
// Meant to run under AddressSanitizer and UBSan too (where the leak check
// below is live).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define RATELIMIT_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RATELIMIT_TEST_LSAN 1
#endif
#endif
#ifdef RATELIMIT_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace {

using namespace std::chrono_literals;
using ratelimit::access;
using ratelimit::decision;
using ratelimit::memory_store;
using ratelimit::memory_store_options;
using ratelimit::timestamp;
using ratelimit::units;

/// A user's policy whose state is a one-byte count aligned to `Align`:
/// `limit` requests per key, all forgotten (the key idle) in the second
/// half of every 2000 us.
template <std::size_t Align>
struct aligned_counter {
  static constexpr std::string_view name = "aligned_counter";
  struct config {
    using policy_type = aligned_counter;
    [[nodiscard]] units limit() const noexcept { return 3; }
  };
  struct alignas(Align) state {
    std::uint8_t count = 0;
    friend bool operator==(const state&, const state&) = default;
  };
  [[nodiscard]] static bool forgotten(timestamp now) noexcept { return now.count() % 2000 >= 1000; }
  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    if (forgotten(now)) s = state{};
    decision d;
    d.limit = cfg.limit();
    d.allowed = s.count + cost <= cfg.limit();
    if (d.allowed) s.count = static_cast<std::uint8_t>(s.count + cost);
    d.remaining = cfg.limit() - s.count;
    return d;
  }
  static bool idle(const config&, const state& s, timestamp now) noexcept {
    return s.count == 0 || forgotten(now);
  }
};
static_assert(alignof(aligned_counter<1>::state) == 1 && sizeof(aligned_counter<1>::state) == 1);
static_assert(alignof(aligned_counter<64>::state) == 64);

template <class P>
class MemoryStoreNodeAlignment : public ::testing::Test {};
using alignments = ::testing::Types<aligned_counter<1>, aligned_counter<4>, aligned_counter<8>,
                                    aligned_counter<16>, aligned_counter<32>, aligned_counter<64>,
                                    aligned_counter<128>>;
TYPED_TEST_SUITE(MemoryStoreNodeAlignment, alignments);

/// Keys of 1 to 24 bytes and of 100, 511 and 512, each length in variants
/// that differ only in the first, a middle or the last byte (what the two
/// overlapping 8-byte loads of a 8- to 16-byte key compare), with zero bytes.
std::vector<std::string> keys_of_every_length() {
  std::vector<std::string> keys;
  std::vector<std::size_t> lengths;
  for (std::size_t n = 1; n <= 24; ++n) lengths.push_back(n);
  for (const std::size_t n : {std::size_t{100}, std::size_t{511}, std::size_t{512}})
    lengths.push_back(n);
  for (const std::size_t n : lengths) {
    for (int variant = 0; variant < 40; ++variant) {
      std::string k(n, '\0');
      for (std::size_t i = 0; i < n; ++i) k[i] = static_cast<char>('a' + (i * 7) % 26);
      const auto byte = static_cast<char>(variant);
      switch (variant % 4) {
        case 0: k.front() = byte; break;
        case 1: k.back() = byte; break;
        case 2: k[n / 2] = byte; break;
        default: {
          const std::size_t at = (n - 1) * static_cast<std::size_t>(variant % 3) / 2;
          k[at] = static_cast<char>(0x80 + variant);
          break;
        }
      }
      keys.push_back(std::move(k));
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// Verifies that a node's state is aligned as its type requires (a state
// aligned to 32, 64 or 128 bytes was placed at 16 by plain operator new,
// undefined behaviour that UBSan reports), whatever the key beside it, and
// that every key is told from the others through growth, sweeps, shrinks
// and resets.
TYPED_TEST(MemoryStoreNodeAlignment, StatesAreAlignedAndKeysToldApart) {
  using P = TypeParam;
  using state = typename P::state;
  const typename P::config cfg;
  memory_store<P> store(memory_store_options{.shards = 2});
  const std::vector<std::string> keys = keys_of_every_length();
  ASSERT_GT(keys.size(), 900U);
  const auto aligned = [&](std::string_view key) {
    return store.inspect(key, [](const state* s) {
      return s != nullptr && reinterpret_cast<std::uintptr_t>(s) % alignof(state) == 0;
    });
  };
  // Twice: the second time into the tables the first sweep shrank.
  for (std::int64_t base = 0; base <= 2000; base += 2000) {
    for (const std::string& k : keys) {
      EXPECT_TRUE(store.apply(cfg, k, timestamp{base + 1}, 1, access::consume).allowed);
    }
    ASSERT_EQ(store.size(), keys.size());
    for (const std::string& k : keys) {
      EXPECT_TRUE(aligned(k)) << "key of " << k.size() << " bytes";
      EXPECT_EQ(store.state_of(k).count, 1) << "key of " << k.size() << " bytes";
      EXPECT_EQ(store.apply(cfg, k, timestamp{base + 2}, 2, access::consume).remaining, 0);
      EXPECT_FALSE(store.apply(cfg, k, timestamp{base + 3}, 1, access::consume).allowed);
    }
    // Prefixes and extensions of held keys that are not keys are not held.
    std::size_t strangers = 0;
    for (const std::string& k : keys) {
      for (const std::string& other : {k.substr(0, k.size() - 1), k + k.back()}) {
        if (std::binary_search(keys.begin(), keys.end(), other)) continue;
        ++strangers;
        EXPECT_FALSE(store.inspect(other, [](const state* s) { return s != nullptr; }))
            << "key of " << other.size() << " bytes";
      }
    }
    EXPECT_GT(strangers, keys.size());
    // Every other key reset: the rest keep their counts.
    for (std::size_t i = 0; i < keys.size(); i += 2) store.reset(cfg, keys[i]);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(store.state_of(keys[i]).count, i % 2 == 0 ? 0 : 3) << "key " << i;
    }
    // All idle: the sweep frees every node and shrinks the tables.
    EXPECT_EQ(store.sweep(cfg, timestamp{base + 1000}), keys.size() / 2);
    EXPECT_EQ(store.size(), 0U);
  }
}

// ------------------------------------------------- the hash a node keeps

/// The hash key under which each pair below shares the low 32 bits of its
/// keys' hashes (found by a search over 2 million keys; the test checks it).
constexpr std::uint64_t k0 = 0x5eed;
constexpr std::uint64_t k1 = 0xc0ffee;
/// 12-byte keys (compared with two 8-byte loads) and short ones (memcmp).
const std::vector<std::pair<std::string, std::string>> low32_pairs = {
    {"+15551051929", "+15551125900"},
    {"u11594", "u36909"},
};

memory_store_options fixed_hash(std::size_t shards) {
  return memory_store_options{.shards = shards, .hash_key = {{k0, k1}}};
}

// Verifies that two keys whose hashes share their low 32 bits (so one
// bucket of a one-shard store, and equal hashes in their nodes) keep their
// own states: counted, peeked, reset and looked up by hash apart.
TEST(MemoryStoreNodeHash, KeysSharingTheLow32BitsOfTheirHashAreToldApart) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{2, 1s}};
  for (const auto& [a, b] : low32_pairs) {
    memory_store<ratelimit::fixed_window> store(fixed_hash(1));
    const std::uint64_t ha = store.key_hash(a);
    const std::uint64_t hb = store.key_hash(b);
    ASSERT_EQ(static_cast<std::uint32_t>(ha), static_cast<std::uint32_t>(hb)) << a << " " << b;
    ASSERT_NE(ha, hb);

    EXPECT_EQ(store.apply(cfg, a, timestamp{1}, 1, access::consume).remaining, 1);
    EXPECT_EQ(store.state_of(b).count, 0);
    EXPECT_EQ(store.apply(cfg, b, timestamp{1}, 1, access::peek).remaining, 1);
    EXPECT_EQ(store.size(), 1U);
    EXPECT_EQ(store.apply(cfg, b, timestamp{1}, 1, access::consume).remaining, 1);
    EXPECT_EQ(store.size(), 2U);
    EXPECT_EQ(store.apply(cfg, a, timestamp{1}, 1, access::consume).remaining, 0);
    EXPECT_EQ(store.state_of(a).count, 2);
    EXPECT_EQ(store.state_of(b).count, 1);
    // The other key's hash (the same low 32 bits) decides the key given.
    EXPECT_EQ(store.apply_hashed(cfg, b, ha, timestamp{1}, 1, access::consume).remaining, 0);
    EXPECT_FALSE(store.apply_hashed(cfg, a, hb, timestamp{1}, 1, access::consume).allowed);
    EXPECT_EQ(store.state_of(a).count, 2);
    EXPECT_EQ(store.state_of(b).count, 2);
    EXPECT_EQ(store.longest_chain(), 2U);  // one bucket holds both
    store.reset(cfg, b);
    EXPECT_EQ(store.state_of(a).count, 2);
    EXPECT_EQ(store.state_of(b).count, 0);
    EXPECT_EQ(store.size(), 1U);
    EXPECT_EQ(store.longest_chain(), 1U);
  }
}

// Verifies that apply_hashed given a made-up hash that has the key's low
// 32 bits (what its node keeps) and other high bits (which pick the shard)
// decides as apply, on keys held and not, with many shards and one: it
// looks in another shard, or in the key's own, and finds the key's node or
// nothing, never another key's state.
TEST(MemoryStoreNodeHash, ApplyHashedWithTheKeysLow32BitsDecidesAsApply) {
  const ratelimit::fixed_window::config cfg{ratelimit::rate{3, 1s}};
  std::vector<std::string> keys;
  for (const auto& [a, b] : low32_pairs) {
    keys.push_back(a);
    keys.push_back(b);
  }
  for (int i = 0; i < 40; ++i) keys.push_back("key" + std::to_string(i));
  for (const std::size_t shards : {std::size_t{1}, std::size_t{64}, std::size_t{4096}}) {
    memory_store<ratelimit::fixed_window> hashed(fixed_hash(shards));
    memory_store<ratelimit::fixed_window> plain(fixed_hash(shards));
    std::mt19937_64 rng(shards);
    for (int i = 0; i < 3000; ++i) {
      const std::string& key = keys[rng() % keys.size()];
      const timestamp t{static_cast<std::int64_t>(i) * 20'000};
      const std::uint64_t own = hashed.key_hash(key);
      std::uint64_t h = own;
      switch (rng() % 3) {
        case 0: h = (rng() << 32) | (own & 0xffff'ffffU); break;  // other high bits
        case 1: h = own ^ (std::uint64_t{1} << (32 + rng() % 32)); break;
        default: h = hashed.key_hash(keys[rng() % keys.size()]); break;
      }
      const access how = rng() % 4 == 0 ? access::peek : access::consume;
      const decision x = hashed.apply_hashed(cfg, key, h, t, 1, how);
      const decision y = plain.apply(cfg, key, t, 1, how);
      ASSERT_EQ(x, y) << "shards " << shards << " step " << i << " key " << key;
      ASSERT_EQ(hashed.size(), plain.size()) << "shards " << shards << " step " << i;
    }
    for (const std::string& key : keys) {
      EXPECT_EQ(hashed.state_of(key), plain.state_of(key)) << key;
    }
  }
}

/// A user's policy whose state's move constructor throws while
/// `throwing_move::armed` is set (a state holding a container that may
/// allocate when moved, say): one request per key, never idle.
struct throwing_move {
  static constexpr std::string_view name = "throwing_move";
  static inline bool armed = false;
  struct config {
    using policy_type = throwing_move;
    [[nodiscard]] units limit() const noexcept { return 1; }
  };
  struct state {
    units used = 0;
    state() = default;
    state(const state&) = default;
    state& operator=(const state&) = default;
    state& operator=(state&&) = default;
    state(state&& o) : used(o.used) {
      if (armed) throw std::runtime_error("state move");
    }
    ~state() = default;
    friend bool operator==(const state&, const state&) = default;
  };
  static decision step(const config& cfg, state& s, timestamp, units cost) noexcept {
    decision d;
    d.limit = cfg.limit();
    d.allowed = s.used + cost <= cfg.limit();
    if (d.allowed) s.used += cost;
    d.remaining = cfg.limit() - s.used;
    return d;
  }
  static bool idle(const config&, const state&, timestamp) noexcept { return false; }
};

// Verifies that a new key whose state throws while moved into its node
// leaves nothing behind: the check throws, the store holds no key and its
// count is back, the node's memory is freed (LeakSanitizer, in the ASan
// build, finds the 20-odd bytes otherwise), and the key is inserted when
// the move succeeds.
TEST(MemoryStoreNodeFailure, StateWhoseMoveThrowsLeavesNothing) {
  memory_store<throwing_move> store;
  const throwing_move::config cfg;
  throwing_move::armed = true;
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW((void)store.apply(cfg, "+15551234567", timestamp{1000}, 1, access::consume),
                 std::runtime_error);
    EXPECT_EQ(store.size(), 0U);
  }
  throwing_move::armed = false;
#ifdef RATELIMIT_TEST_LSAN
  EXPECT_EQ(__lsan_do_recoverable_leak_check(), 0) << "a node's memory was leaked";
#endif
  EXPECT_TRUE(store.apply(cfg, "+15551234567", timestamp{1000}, 1, access::consume).allowed);
  EXPECT_FALSE(store.apply(cfg, "+15551234567", timestamp{2000}, 1, access::consume).allowed);
  EXPECT_EQ(store.size(), 1U);
}

}  // namespace
