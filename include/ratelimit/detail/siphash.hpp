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

/// Reads 4 bytes as a little-endian word.
[[nodiscard]] inline std::uint64_t load_le32(const unsigned char* p) noexcept {
  std::uint32_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof v);
  } else {
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  }
  return v;
}

/// The `r` (0..7) bytes at `p`, the last `r` of a message of `n` bytes, as
/// a little-endian word. Reads only bytes of the message, but in at most
/// three loads and no loop: the store hashes every key of every check, and
/// a byte loop for the tail of a 12-byte key costs as much as a round.
[[nodiscard]] inline std::uint64_t load_tail(const unsigned char* p, std::size_t r,
                                             std::size_t n) noexcept {
  if (n >= 8) {
    // The 8 bytes that end the message overlap the whole words before them;
    // shift those out. r == 0 would shift by 64, so it is handled apart.
    return r == 0 ? 0 : load_le64(p + r - 8) >> (64 - 8 * r);
  }
  if (r >= 4) {
    // Two 4-byte loads that overlap; the shared bytes land on the same bits.
    return load_le32(p) | (load_le32(p + r - 4) << (8 * (r - 4)));
  }
  if (r == 0) return 0;
  // 1..3 bytes: the first, the middle and the last (some the same byte).
  return static_cast<std::uint64_t>(p[0]) |
         (static_cast<std::uint64_t>(p[r / 2]) << (8 * (r / 2))) |
         (static_cast<std::uint64_t>(p[r - 1]) << (8 * (r - 1)));
}

struct state {
  std::uint64_t v0, v1, v2, v3;

  [[gnu::always_inline]] constexpr void round() noexcept {
    v0 += v1;
    v1 = std::rotl(v1, 13);
    v1 ^= v0;
    v0 = std::rotl(v0, 32);
    v2 += v3;
    v3 = std::rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = std::rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = std::rotl(v1, 17);
    v1 ^= v2;
    v2 = std::rotl(v2, 32);
  }

  template <int C>
  [[gnu::always_inline]] constexpr void compress(std::uint64_t m) noexcept {
    v3 ^= m;
    for (int r = 0; r < C; ++r) round();
    v0 ^= m;
  }
};

}  // namespace sip

/// A key with the specification's constants already folded in: the state
/// every message starts from. A store hashes every check's key with the same
/// secret key, so it keeps this form and saves the four 64-bit constants and
/// four XORs per hash.
struct siphash_prepared {
  sip::state start;

  constexpr explicit siphash_prepared(const siphash_key& key) noexcept
      // "somepseudorandomlygeneratedbytes", the constants of the specification.
      : start{key.k0 ^ 0x736f6d6570736575ULL, key.k1 ^ 0x646f72616e646f6dULL,
              key.k0 ^ 0x6c7967656e657261ULL, key.k1 ^ 0x7465646279746573ULL} {}
};

/// SipHash-C-D of `data` under a prepared key, 64-bit output.
///
/// Always inlined: it sits on every check's path, and as an out-of-line call
/// (which GCC chose) it cost the call, spills and a generic tail loop.
/// Thread safety: a pure function.
template <int C, int D>
[[nodiscard]] [[gnu::always_inline]] inline std::uint64_t siphash(const siphash_prepared& key,
                                                                  std::string_view data) noexcept {
  sip::state s = key.start;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t n = data.size();
  const unsigned char* const end = p + (n & ~std::size_t{7});
  for (; p != end; p += 8) s.compress<C>(sip::load_le64(p));
  // The last word: the remaining 0..7 bytes, and the length mod 256 in the top byte.
  s.compress<C>(sip::load_tail(p, n & 7, n) | (static_cast<std::uint64_t>(n & 0xff) << 56));
  s.v2 ^= 0xff;
  for (int r = 0; r < D; ++r) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

/// SipHash-C-D of `data` under `key`, 64-bit output.
/// Thread safety: a pure function.
template <int C, int D>
[[nodiscard]] [[gnu::always_inline]] inline std::uint64_t siphash(const siphash_key& key,
                                                                  std::string_view data) noexcept {
  return siphash<C, D>(siphash_prepared{key}, data);
}

/// SipHash-1-3, the variant the memory store hashes keys with.
[[nodiscard]] [[gnu::always_inline]] inline std::uint64_t siphash13(
    const siphash_key& key, std::string_view data) noexcept {
  return siphash<1, 3>(key, data);
}
[[nodiscard]] [[gnu::always_inline]] inline std::uint64_t siphash13(
    const siphash_prepared& key, std::string_view data) noexcept {
  return siphash<1, 3>(key, data);
}

}  // namespace ratelimit::detail
