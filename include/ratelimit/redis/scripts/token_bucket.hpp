// SPDX-License-Identifier: Apache-2.0
// Lua script of the token-bucket policy (policy/token_bucket.hpp, bit for bit).
//
// State: one string "<deficit ticks>:<time of last admission us>;<L>,<P>,
// <burst>" (the state, then the fingerprint of the config that wrote it),
// written with an expiry of the time until the bucket is full again. State
// written under another config is ignored (a deficit is counted in that
// config's ticks): the bucket starts full, as a new limiter's would.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// The policy as a Lua function `token_bucket(key, t, cost, L, P, burst)`:
/// reads the key and decides, writing nothing; the result's `commit()` writes
/// the new state with its TTL. `idle_at` as in detail::fixed_window_lua
/// (a bucket records only admissions, so it needs no `again`).
inline constexpr std::string_view token_bucket_lua = R"lua(
local function token_bucket(key, t, cost, L, P, burst)
  local cap = burst * P
  local fp = int(L) .. ',' .. int(P) .. ',' .. int(burst)
  local sd, sl = 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local f, written_under = split_state(key, raw, 2)
    local d0, l0 = whole(key, f[1], 0, CEILING), whole(key, f[2], 0, CEILING)
    -- A deficit above the capacity is a debt left by forced checks; the
    -- reader's range [0, 2^52] is what any check can write.
    if written_under == fp then sd, sl = d0, l0 end
  end
  local idle_at = 0
  if sd > 0 then idle_at = sl + cdiv(sd, L) end
  if sd > 0 and t < sl then t = sl end
  local deficit = 0
  if sd > 0 then
    local elapsed = t - sl
    if elapsed < cdiv(sd, L) then deficit = sd - elapsed * L end
  end
  local allowed = cost <= burst and deficit + cost * P <= cap
  local counted = 0
  if allowed or force then
    -- Forced past the capacity, the deficit saturates at 2^52 ticks.
    if cost > fdiv(CEILING - deficit, P) then
      deficit = CEILING
    else
      deficit = deficit + cost * P
    end
    counted = 1
  end
  local function commit()
    if counted == 0 then return end
    redis.call('SET', key, int(deficit) .. ':' .. int(t) .. ';' .. fp, 'PX', ttl(cdiv(deficit, L)))
  end
  local remaining = 0
  if deficit < cap then remaining = fdiv(cap - deficit, P) end
  -- `again`: when the same request is admitted on the recorded state (for
  -- a forced compound whose other sub-limit rejected).
  local again = 0
  if remaining < cost then
    if cost > burst then again = -1 else again = t + cdiv(deficit + (cost * P - cap), L) end
  end
  local retry = 0
  if not allowed then
    if cost > burst then retry = -1 else retry = cdiv(deficit + (cost * P - cap), L) end
  end
  return {allowed = allowed, counted = counted, remaining = remaining, retry = retry,
          reset = cdiv(deficit, L), again = again, idle_at = idle_at, commit = commit,
          convert = function() end}
end
)lua";

/// The script of the policy alone: KEYS[1] and ARGV as documented in script_for.
inline constexpr std::string_view token_bucket_main_lua = R"lua(
local r = token_bucket(KEYS[1], t, cost, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
if not peek then r.commit() end
return {r.allowed and 1 or 0, r.counted, r.remaining, r.retry, r.reset}
)lua";

}  // namespace detail

template <>
struct script_for<token_bucket> {
  static constexpr std::string_view name = token_bucket::name;
  // ARGV[5] = ticks per us (L), ARGV[6] = ticks per token (P), ARGV[7] = burst.
  static constexpr std::string_view text = detail::lua_join<
      detail::lua_prelude, detail::token_bucket_lua, detail::token_bucket_main_lua>::value;

  static void append_args(const token_bucket::config& cfg, std::vector<std::string>& out) {
    out.push_back(std::to_string(cfg.ticks_per_us()));
    out.push_back(std::to_string(cfg.ticks_per_token()));
    out.push_back(std::to_string(cfg.burst()));
  }

  static token_bucket::config scaled(const token_bucket::config& cfg, units divisor) {
    return token_bucket::config(
        rate(detail::scaled_limit(cfg.get_rate().limit(), divisor), cfg.get_rate().period()),
        bucket_options{detail::scaled_limit(cfg.burst(), divisor), cfg.name()});
  }
};

}  // namespace ratelimit::redis
