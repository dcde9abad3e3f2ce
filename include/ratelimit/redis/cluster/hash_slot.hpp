// SPDX-License-Identifier: Apache-2.0
// Redis Cluster hash slots: CRC16 (XMODEM) of a key's hash tag, mod 16384.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ratelimit::redis {

/// Number of hash slots in a Redis Cluster.
inline constexpr std::uint16_t cluster_slots = 16384;

namespace detail {

[[nodiscard]] constexpr std::array<std::uint16_t, 256> crc16_table() noexcept {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    unsigned crc = i << 8;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000u) != 0 ? (crc << 1) ^ 0x1021u : crc << 1;
    t[i] = static_cast<std::uint16_t>(crc & 0xFFFFu);
  }
  return t;
}

inline constexpr std::array<std::uint16_t, 256> crc16_lookup = crc16_table();

}  // namespace detail

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection, no final
/// XOR): the checksum Redis Cluster hashes keys with. crc16("123456789") == 0x31C3.
[[nodiscard]] constexpr std::uint16_t crc16(std::string_view bytes) noexcept {
  unsigned crc = 0;
  for (const char c : bytes) {
    const unsigned byte = static_cast<unsigned char>(c);
    crc = ((crc << 8) ^ detail::crc16_lookup[((crc >> 8) ^ byte) & 0xFFu]) & 0xFFFFu;
  }
  return static_cast<std::uint16_t>(crc);
}

/// The hash slot Redis Cluster assigns to the full key `key` (what CLUSTER
/// KEYSLOT answers): when the key has a `{`, and a `}` after it with at least
/// one byte between them, only the bytes between the first `{` and the first
/// `}` after it are hashed; otherwise the whole key is.
///
/// The store's keys are `<prefix>{<user key>}:<policy>`, so a user key
/// containing `}` hashes on its part before that `}` (and a prefix containing
/// `{` moves the tag into the prefix). Either way this function, applied to the
/// final key, gives the slot Redis uses.
[[nodiscard]] constexpr std::uint16_t key_slot(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<std::uint16_t>(crc16(key) & (cluster_slots - 1u));
}

static_assert(crc16("123456789") == 0x31C3);

}  // namespace ratelimit::redis
