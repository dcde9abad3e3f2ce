// SPDX-License-Identifier: Apache-2.0
// SipHash (Aumasson and Bernstein), the keyed hash the memory store uses for its keys. Not API.
//
// SipHash-c-d: c compression rounds per 8-byte word, d finalisation rounds.
// The store uses SipHash-1-3 (as Rust's HashMap and CPython's str hash do):
// under a secret 128-bit key nobody who does not know the key can find keys
// that share a hash faster than by trying them, which is what keeps a flood
// of crafted keys from piling into one bucket. SipHash-2-4 is the variant the
// paper's reference test vectors are published for; the tests check it with
// the same code, the round counts being template parameters.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ratelimit::detail {

/// A 128-bit SipHash key, as two little-endian 64-bit words.
struct siphash_key {
  std::uint64_t k0 = 0;
  std::uint64_t k1 = 0;
};

namespace sip {

[[nodiscard]] constexpr std::uint64_t rotl(std::uint64_t x, int b) noexcept {
  return (x << b) | (x >> (64 - b));
}

/// Reads 8 bytes as a little-endian word, whatever the host's byte order.
[[nodiscard]] inline std::uint64_t load_le64(const unsigned char* p) noexcept {
  std::uint64_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof v);
  } else {
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  }
  return v;
}

struct state {
  std::uint64_t v0, v1, v2, v3;

  constexpr void round() noexcept {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
};

}  // namespace sip

/// SipHash-C-D of `data` under `key`, 64-bit output.
/// Thread safety: a pure function.
template <int C, int D>
[[nodiscard]] inline std::uint64_t siphash(const siphash_key& key, std::string_view data) noexcept {
  // "somepseudorandomlygeneratedbytes", the constants of the specification.
  sip::state s{key.k0 ^ 0x736f6d6570736575ULL, key.k1 ^ 0x646f72616e646f6dULL,
               key.k0 ^ 0x6c7967656e657261ULL, key.k1 ^ 0x7465646279746573ULL};
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t n = data.size();
  const std::size_t whole = n & ~std::size_t{7};
  for (std::size_t i = 0; i < whole; i += 8) {
    const std::uint64_t m = sip::load_le64(p + i);
    s.v3 ^= m;
    for (int r = 0; r < C; ++r) s.round();
    s.v0 ^= m;
  }
  // The last word: the remaining 0..7 bytes, and the length mod 256 in the top byte.
  std::uint64_t last = static_cast<std::uint64_t>(n & 0xff) << 56;
  for (std::size_t i = 0; i < (n & 7); ++i) {
    last |= static_cast<std::uint64_t>(p[whole + i]) << (8 * i);
  }
  s.v3 ^= last;
  for (int r = 0; r < C; ++r) s.round();
  s.v0 ^= last;
  s.v2 ^= 0xff;
  for (int r = 0; r < D; ++r) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

/// SipHash-1-3, the variant the memory store hashes keys with.
[[nodiscard]] inline std::uint64_t siphash13(const siphash_key& key,
                                             std::string_view data) noexcept {
  return siphash<1, 3>(key, data);
}

}  // namespace ratelimit::detail
