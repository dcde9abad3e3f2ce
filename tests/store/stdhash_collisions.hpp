// SPDX-License-Identifier: Apache-2.0
// Builds keys that all share one libstdc++ std::hash<std::string_view> value (a hash-flooding attack).
//
// libstdc++'s std::hash on strings is _Hash_bytes (a MurmurHash64A variant)
// with a fixed seed. For a key whose length is a multiple of 8 it computes
//   h = seed ^ (len * m);  for each 8-byte word w: h = (h ^ mix(w)) * m;
// then a final mix of h, where m = 0xc6a4a7935bd1e995 and
//   mix(w) = shift_mix(w * m) * m,  shift_mix(v) = v ^ (v >> 47).
// mix is a bijection (m is odd; shift_mix by 47 >= 32 is its own inverse), so
// for any word a there is a word a' with mix(a') = mix(a) ^ 2^63. Flipping the
// top bit of (h ^ mix(a)) adds 2^63, and multiplying by the odd m keeps that:
// the product also differs in the top bit only, which the next word cancels
// if it is likewise b' with mix(b') = mix(b) ^ 2^63. So the 16-byte blocks
// (a, b) and (a', b') leave h the same whatever came before: n such blocks
// give 2^n keys of 16n bytes with one hash, for any seed. Used by the tests
// (which check the collision really happens) and the benchmarks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ratelimit::test {

namespace stdhash {

inline constexpr std::uint64_t m = 0xc6a4a7935bd1e995ULL;

[[nodiscard]] constexpr std::uint64_t inverse(std::uint64_t a) noexcept {
  std::uint64_t x = a;  // correct to 3 bits for odd a; each step doubles them
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}

[[nodiscard]] constexpr std::uint64_t shift_mix(std::uint64_t v) noexcept {
  return v ^ (v >> 47);
}
[[nodiscard]] constexpr std::uint64_t mix(std::uint64_t w) noexcept {
  return shift_mix(w * m) * m;
}
[[nodiscard]] constexpr std::uint64_t unmix(std::uint64_t d) noexcept {
  return shift_mix(d * inverse(m)) * inverse(m);
}
/// The word whose mix differs from w's in the top bit only.
[[nodiscard]] constexpr std::uint64_t twin(std::uint64_t w) noexcept {
  return unmix(mix(w) ^ (std::uint64_t{1} << 63));
}

static_assert(inverse(m) * m == 1);
static_assert(unmix(mix(0x0123456789abcdefULL)) == 0x0123456789abcdefULL);

}  // namespace stdhash

/// 2^blocks distinct keys of 16 * blocks bytes that libstdc++'s std::hash
/// maps to one value (on a 64-bit target). Key i takes, in block j, the twin
/// words exactly when bit j of i is set.
inline std::vector<std::string> stdhash_colliding_keys(unsigned blocks) {
  std::vector<std::uint64_t> a(blocks);
  std::vector<std::uint64_t> b(blocks);
  for (unsigned j = 0; j < blocks; ++j) {
    a[j] = 0x9e3779b97f4a7c15ULL * (2 * j + 1);
    b[j] = 0xbf58476d1ce4e5b9ULL * (2 * j + 2);
  }
  const std::size_t count = std::size_t{1} << blocks;
  std::vector<std::string> keys;
  keys.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::string key(16 * std::size_t{blocks}, '\0');
    for (unsigned j = 0; j < blocks; ++j) {
      const bool flip = ((i >> j) & 1) != 0;
      const std::uint64_t w0 = flip ? stdhash::twin(a[j]) : a[j];
      const std::uint64_t w1 = flip ? stdhash::twin(b[j]) : b[j];
      // _Hash_bytes loads words in the host's byte order; so do we.
      std::memcpy(key.data() + 16 * j, &w0, 8);
      std::memcpy(key.data() + 16 * j + 8, &w1, 8);
    }
    keys.push_back(std::move(key));
  }
  return keys;
}

}  // namespace ratelimit::test
