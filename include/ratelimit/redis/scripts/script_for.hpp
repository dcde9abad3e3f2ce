// SPDX-License-Identifier: Apache-2.0
// The trait that maps a policy to its Lua script, and what the scripts share.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit::redis {

/// Specialised once per policy in `ratelimit/redis/scripts/<policy>.hpp`:
/// - `name`: the policy's name in Redis keys (`P::name`);
/// - `text`: the Lua script (KEYS[1] = the key; ARGV as below);
/// - `append_args(cfg, out)`: appends the policy's ARGV (from ARGV[5] on);
/// - `scaled(cfg, divisor)`: the config of the in-process fallback limiter.
///
/// Every script takes ARGV[1] = the caller's time in microseconds, or "" to
/// read the server's TIME; ARGV[2] = cost; ARGV[3] = the access: "0" to
/// consume, "1" to peek (decide, write nothing), "2" to force (record the
/// request as admitted even when rejected; the reply is the policy's own
/// decision, as P::force returns it); ARGV[4] = TTL floor in milliseconds. It returns
/// {allowed, counted, remaining, retry_after_us (-1 = never), reset_after_us}.
template <class P>
struct script_for;

/// ARGV[3] of every script: "0" consume, "1" peek, "2" force.
[[nodiscard]] constexpr std::string_view access_arg(access a) noexcept {
  return a == access::peek ? "1" : (a == access::force ? "2" : "0");
}

/// Largest caller-supplied time the scripts accept: 2^52 us (year 2112 since
/// the Unix epoch), so that every intermediate stays an exact integer in a Lua
/// double (2^53) even two periods past it.
inline constexpr timestamp max_script_time{std::int64_t{1} << 52};

/// Lua shared by every script: exact integer helpers on doubles, the decision
/// time, the TTL rule, and the strict readers of stored state. All integers
/// stay below 2^53, where doubles are exact. Numbers are written with
/// string.format('%d') because Lua's tostring keeps only 14 significant digits.
///
/// Stored state is read strictly: `whole` accepts only an integer string
/// (`-?[0-9]+`, at most 17 bytes) within the field's range, and
/// `split_state` a string value `<field>:<field>...;<fingerprint>` with the
/// policy's number of fields. Anything else (a foreign value, a value of
/// another version, a corrupt one) raises a script error naming the key and
/// the value, so the store's failure policy decides the check and the key is
/// left as it was; a key of the wrong type fails in Redis itself (WRONGTYPE).
/// The fingerprint is the config's script arguments (ARGV[5..]) joined by
/// ',': state whose fingerprint differs was written under another config
/// (a deploy that changed the rate, or a rolling one) and is converted or
/// ignored by each policy's script.
#define RATELIMIT_REDIS_LUA_PRELUDE                                               \
  "local CEILING = 4503599627370496\n"                                            \
  "local function int(n) return string.format('%d', n) end\n"                     \
  "local function bad(key, why, v)\n"                                             \
  "  error({err = 'ratelimit: foreign or corrupt state in ' ..\n"                 \
  "    key .. ': ' .. why .. ' ' .. string.sub(tostring(v), 1, 80)})\n"           \
  "end\n"                                                                         \
  "local function whole(key, s, lo, hi)\n"                                        \
  "  if #s > 17 or not string.find(s, '^%-?%d+$') then\n"                         \
  "    bad(key, 'not an integer:', s)\n"                                          \
  "  end\n"                                                                       \
  "  local n = tonumber(s)\n"                                                     \
  "  if n < lo or n > hi then bad(key, 'out of range:', s) end\n"                 \
  "  return n\n"                                                                  \
  "end\n"                                                                         \
  "local function split_state(key, raw, n)\n"                                     \
  "  local sep = string.find(raw, ';', 1, true)\n"                                \
  "  if sep == nil then bad(key, 'no config fingerprint:', raw) end\n"            \
  "  local fp = string.sub(raw, sep + 1)\n"                                       \
  "  if not (string.find(fp, '^%d+,%d+$') or\n"                                   \
  "          string.find(fp, '^%d+,%d+,%d+$')) then\n"                            \
  "    bad(key, 'bad config fingerprint:', raw)\n"                                \
  "  end\n"                                                                       \
  "  local out = {}\n"                                                            \
  "  for x in string.gmatch(string.sub(raw, 1, sep - 1) .. ':', '([^:]*):') do\n" \
  "    out[#out + 1] = x\n"                                                       \
  "  end\n"                                                                       \
  "  if #out ~= n then bad(key, 'wrong number of fields:', raw) end\n"            \
  "  return out, fp\n"                                                            \
  "end\n"                                                                         \
  "local function fdiv(a, b)\n"                                                   \
  "  local q = math.floor(a / b)\n"                                               \
  "  local r = a - q * b\n"                                                       \
  "  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end\n"                  \
  "  return q\n"                                                                  \
  "end\n"                                                                         \
  "local function cdiv(a, b)\n"                                                   \
  "  local q = fdiv(a, b)\n"                                                      \
  "  if q * b < a then q = q + 1 end\n"                                           \
  "  return q\n"                                                                  \
  "end\n"                                                                         \
  "local t\n"                                                                     \
  "if ARGV[1] == '' then\n"                                                       \
  "  local tm = redis.call('TIME')\n"                                             \
  "  t = tonumber(tm[1]) * 1000000 + tonumber(tm[2])\n"                           \
  "else\n"                                                                        \
  "  t = tonumber(ARGV[1])\n"                                                     \
  "end\n"                                                                         \
  "local cost = tonumber(ARGV[2])\n"                                              \
  "local peek = ARGV[3] == '1'\n"                                                 \
  "local force = ARGV[3] == '2'\n"                                                \
  "local floor_ms = tonumber(ARGV[4])\n"                                          \
  "local function ttl(need_us)\n"                                                 \
  "  local ms = cdiv(need_us, 1000)\n"                                            \
  "  if ms < floor_ms then ms = floor_ms end\n"                                   \
  "  if ms < 1 then ms = 1 end\n"                                                 \
  "  return int(ms)\n"                                                            \
  "end\n"

namespace detail {

/// The prelude as a string_view, for lua_join.
inline constexpr std::string_view lua_prelude = RATELIMIT_REDIS_LUA_PRELUDE;

/// Several Lua fragments joined at compile time into one constant script
/// (`value`), so that a script assembled from shared functions is still one
/// constant text per type, and EVALSHA caching works as for any script.
template <const std::string_view&... Parts>
struct lua_join {
  static constexpr std::size_t size = (Parts.size() + ... + 0);
  static constexpr std::array<char, size + 1> chars = [] {
    std::array<char, size + 1> out{};
    std::size_t i = 0;
    for (const std::string_view part : {Parts...}) {
      for (const char c : part) out[i++] = c;
    }
    return out;
  }();
  static constexpr std::string_view value{chars.data(), size};
};

/// SHA-1 of a script, as the 40 lower-case hex digits EVALSHA expects.
[[nodiscard]] inline std::string sha1_hex(std::string_view data) {
  std::uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  const auto rol = [](std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); };
  std::string msg(data);
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8u;
  msg += static_cast<char>(0x80);
  while (msg.size() % 64 != 56) msg += '\0';
  for (int i = 7; i >= 0; --i) msg += static_cast<char>((bits >> (i * 8)) & 0xFFu);
  for (std::size_t off = 0; off < msg.size(); off += 64) {
    std::uint32_t w[80];
    for (std::size_t i = 0; i < 16; ++i) {
      w[i] = 0;
      for (std::size_t j = 0; j < 4; ++j) {
        w[i] = (w[i] << 8) | static_cast<unsigned char>(msg[off + i * 4 + j]);
      }
    }
    for (std::size_t i = 16; i < 80; ++i)
      w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (std::size_t i = 0; i < 80; ++i) {
      std::uint32_t f = 0;
      std::uint32_t k = 0;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5A827999u;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ED9EBA1u;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8F1BBCDCu;
      } else {
        f = b ^ c ^ d;
        k = 0xCA62C1D6u;
      }
      const std::uint32_t tmp = rol(a, 5) + f + e + k + w[i];
      e = d;
      d = c;
      c = rol(b, 30);
      b = a;
      a = tmp;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(40);
  for (const std::uint32_t v : h) {
    for (int s = 28; s >= 0; s -= 4) out += hex[(v >> s) & 0xFu];
  }
  return out;
}

/// The SHA-1 of script_for<P>::text, computed once.
template <class P>
[[nodiscard]] const std::string& script_sha() {
  static const std::string sha = sha1_hex(script_for<P>::text);
  return sha;
}

[[nodiscard]] inline units scaled_limit(units limit, units divisor) noexcept {
  if (divisor < 1) divisor = 1;
  const units l = limit / divisor;
  return l < 1 ? 1 : l;
}

/// script_for<P> of the three window policies: they share their arguments
/// (ARGV[5] = period us, ARGV[6] = limit, ARGV[7] = count_rejected 0/1) and
/// differ only in their Lua.
template <class P, const std::string_view& PolicyLua, const std::string_view& MainLua>
struct window_script {
  static constexpr std::string_view name = P::name;
  static constexpr std::string_view text = lua_join<lua_prelude, PolicyLua, MainLua>::value;

  static void append_args(const typename P::config& cfg, std::vector<std::string>& out) {
    out.push_back(std::to_string(cfg.period_us()));
    out.push_back(std::to_string(cfg.limit()));
    out.push_back(cfg.count_rejected() ? "1" : "0");
  }

  static typename P::config scaled(const typename P::config& cfg, units divisor) {
    return typename P::config(rate(scaled_limit(cfg.limit(), divisor), cfg.get_rate().period()),
                              window_options{cfg.count_rejected(), cfg.name()});
  }
};

}  // namespace detail
}  // namespace ratelimit::redis
