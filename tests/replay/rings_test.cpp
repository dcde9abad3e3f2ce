// SPDX-License-Identifier: Apache-2.0
// The summary's window rings (and the buffer pool they grow from) against a plain model, on
// adversarial call patterns: a sanitizer cannot see one ring writing into another's buffer
// inside a pool block, but every count after it would differ from the model's.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "replay.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit::replay;

/// What window_rings promises, one std::deque per key: the calls in (t - W, t], a call stamped
/// before its key's newest counted at that newest time, a key forgotten once its newest call
/// has left the window at a release.
class ring_model {
 public:
  ring_model(std::size_t keys, std::int64_t w) : keys_(keys), w_(w) {}

  std::uint32_t add(std::uint32_t k, std::int64_t t, std::uint32_t admitted,
                    std::array<std::uint32_t, ring_policies>& max_admitted) {
    key& s = keys_[k];
    if (!s.calls.empty() && t < s.newest) t = s.newest;
    while (!s.calls.empty() && s.calls.front().first <= t - w_) {
      const std::uint32_t m = s.calls.front().second;
      for (std::size_t p = 0; p < ring_policies; ++p) s.count[p] -= (m >> p) & 1u;
      s.calls.pop_front();
    }
    s.calls.emplace_back(t, admitted);
    s.newest = t;
    for (std::size_t p = 0; p < ring_policies; ++p) {
      s.count[p] += (admitted >> p) & 1u;
      max_admitted[p] = std::max(max_admitted[p], s.count[p]);
    }
    return static_cast<std::uint32_t>(s.calls.size());
  }
  void release_stale(std::int64_t now) {
    for (key& s : keys_) {
      if (s.calls.empty() || s.newest <= now - w_) {
        s.calls.clear();
        s.count = {};
      }
    }
  }

 private:
  struct key {
    std::deque<std::pair<std::int64_t, std::uint32_t>> calls;
    std::int64_t newest = 0;
    std::array<std::uint32_t, ring_policies> count{};
  };
  std::vector<key> keys_;
  std::int64_t w_;
};

/// Drives window_rings and the model with the same calls and checks every answer.
struct rings_vs_model {
  rings_vs_model(std::size_t keys, std::int64_t w) : info(keys), model(keys, w), w(w) {}

  void add(std::uint32_t k, std::int64_t t, std::uint32_t admitted) {
    std::uint32_t got_max[ring_policies] = {};
    std::copy(got.begin(), got.end(), got_max);
    const std::uint32_t got_n = rings.add(info[k].ring, k, t, admitted, w, got_max);
    std::copy(std::begin(got_max), std::end(got_max), got.begin());
    const std::uint32_t want_n = model.add(k, t, admitted, want);
    ASSERT_EQ(got_n, want_n) << "key " << k << " at " << t << " after " << calls << " calls";
    ASSERT_EQ(got, want) << "key " << k << " at " << t << " after " << calls << " calls";
    ++calls;
  }
  void release(std::int64_t now) {
    rings.release_stale(info, now, w);
    model.release_stale(now);
  }

  std::vector<key_info> info;
  window_rings rings;
  ring_model model;
  std::int64_t w;
  std::array<std::uint32_t, ring_policies> got{}, want{};
  std::uint64_t calls = 0;
};

// One key far past a 64 KiB block (2^17 calls in one window: rings of 4 .. 2^17 entries),
// then keys that take the buffers it gave back, size by size, and overflow them in turn.
TEST(WindowRings, OneKeyPastABlockThenReusedBuffersMatchTheModel) {
  constexpr std::int64_t w = 1'000'000;
  rings_vs_model r(64, w);
  std::mt19937_64 rng(1);
  std::int64_t t = 0;
  for (std::uint32_t i = 0; i < (1u << 17) + 3; ++i) {
    r.add(0, t, static_cast<std::uint32_t>(rng()) & 31u);
    if (HasFatalFailure()) return;
    t += (i % 64 == 0) ? 1 : 0;  // all inside one window
  }
  // Keys 1.. grow to 4, 8, ... 2^k entries, each one step further: every spare size is taken.
  for (std::uint32_t k = 1; k < 20; ++k) {
    for (std::uint32_t i = 0; i < (2u << (k % 14)) + 1; ++i) {
      r.add(k, t, static_cast<std::uint32_t>(rng()) & 31u);
      if (HasFatalFailure()) return;
    }
    r.add(0, t, 1);  // the big ring still counts right beside them
    if (HasFatalFailure()) return;
  }
  // Let every ring go stale, and reuse the freed rings (with their buffers) for new bursts.
  t += 2 * w;
  r.release(t);
  for (std::uint32_t k = 20; k < 64; ++k) {
    for (std::uint32_t i = 0; i < 300 * (k - 19); ++i) {
      r.add(k, t + i / 7, static_cast<std::uint32_t>(rng()) & 31u);
      if (HasFatalFailure()) return;
    }
  }
}

// Random bursts on random keys, out-of-order stamps, evictions at the window's edge and
// releases: rings grow, shrink to nothing, are freed and reused with buffers of every size.
TEST(WindowRings, RandomBurstsAndReleasesMatchTheModel) {
  constexpr std::int64_t w = 10'000;
  constexpr std::size_t keys = 200;
  rings_vs_model r(keys, w);
  std::mt19937_64 rng(7);
  std::int64_t now = 0;
  const int bursts = rltest::scaled(3'000);
  for (int burst = 0; burst < bursts; ++burst) {
    const auto k = static_cast<std::uint32_t>(rng() % keys);
    const std::uint64_t len = std::uint64_t{1} << (rng() % 13);  // 1 .. 4096 calls
    const std::uint64_t n = len + rng() % len;
    for (std::uint64_t i = 0; i < n; ++i) {
      now += static_cast<std::int64_t>(rng() % 3);
      // Now and then a stamp before the key's newest call, or exactly W after it.
      std::int64_t t = now;
      if (rng() % 16 == 0) t -= static_cast<std::int64_t>(rng() % (2 * w));
      r.add(k, t, static_cast<std::uint32_t>(rng()) & 31u);
      if (HasFatalFailure()) return;
    }
    if (rng() % 4 == 0) now += w;  // every key may go stale
    if (burst % 5 == 0) r.release(now);
  }
}

// A ring that grows past a block does not leave its outgrown buffers behind: once one key's
// burst is over, the pool holds that ring's buffer and a few blocks, not twice the ring (the
// buffers of 8,192 .. 2^17 entries it outgrew). With 2^17 + 1 calls the ring holds 2^18
// entries (4 MiB); the outgrown large buffers would add another 4 MiB.
TEST(WindowRings, OutgrownBuffersPastABlockAreFreed) {
  constexpr std::int64_t w = 1'000'000;
  std::vector<key_info> info(2);
  window_rings rings;
  std::uint32_t max_admitted[ring_policies] = {};
  for (std::uint32_t i = 0; i < (1u << 17) + 1; ++i) {
    (void)rings.add(info[0].ring, 0, 5, 1, w, max_admitted);
  }
  EXPECT_EQ(max_admitted[0], (1u << 17) + 1);
  // Headers, free list and entries accounted, plus the small buffers the ring outgrew
  // (4 .. 4,096 entries, in at most two 64 KiB blocks).
  const std::size_t slack = 2 * 65'536;
  EXPECT_LE(rings.pool_bytes(), rings.memory_bytes() + slack);
  EXPECT_GE(rings.pool_bytes(), (std::size_t{1} << 18) * 16);
  // A second burst on another key reuses nothing it cannot: same bound.
  for (std::uint32_t i = 0; i < (1u << 14) + 1; ++i) {
    (void)rings.add(info[1].ring, 1, 6, 3, w, max_admitted);
  }
  EXPECT_LE(rings.pool_bytes(), rings.memory_bytes() + slack);
}

}  // namespace
