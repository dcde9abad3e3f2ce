// SPDX-License-Identifier: Apache-2.0
// Lua script of the sliding-window counter (policy/sliding_window_counter.hpp, bit for bit).
//
// State: one string "<window index>:<current count>:<previous count>;<W>,
// <limit>,<count_rejected>" (the state, then the fingerprint of the config that
// wrote it), written with an expiry at the end of the window after the
// current one. State written under another config is ignored (its counts are
// in another window's units): the key starts fresh. The weighted
// test runs in IEEE double in the same order as the C++ (Lua executes each
// operation separately, so nothing is fused).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// The policy as a Lua function `sliding_window_counter(key, t, cost, W,
/// limit, count_rejected)`: reads the key and decides, writing nothing; the
/// result's `commit()` writes the new state with its TTL. `again` and
/// `idle_at` as in detail::fixed_window_lua.
inline constexpr std::string_view sliding_window_counter_lua = R"lua(
local function sliding_window_counter(key, t, cost, W, limit, count_rejected)
  local fp = int(W) .. ',' .. int(limit) .. ',' .. (count_rejected and '1' or '0')
  local sk, scur, sprev = 0, 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local f, written_under = split_state(key, raw, 3)
    local k0 = whole(key, f[1], 0, CEILING)
    local c0, p0 = whole(key, f[2], 0, CEILING), whole(key, f[3], 0, CEILING)
    if written_under == fp then sk, scur, sprev = k0, c0, p0 end
  end
  local seen = scur > 0 or sprev > 0
  local idle_at = 0
  if scur > 0 then idle_at = (sk + 2) * W elseif sprev > 0 then idle_at = (sk + 1) * W end
  if seen and t < sk * W then t = sk * W end
  local k = fdiv(t, W)
  local e = t - k * W
  local cur, prev = 0, 0
  if seen and k == sk then
    cur = scur
    prev = sprev
  elseif seen and k == sk + 1 then
    prev = scur
  end
  local function estimate(p, c, off, m)
    local weight = (W - off) / W
    local weighted = p * weight
    local with_current = weighted + c
    return with_current + m
  end
  local function passes(p, c, off, m)
    return estimate(p, c, off, m) <= limit
  end
  local function first_passing(p, c, lo)
    local hi = W - 1
    if lo > hi or not passes(p, c, hi, cost) then return -1 end
    while lo < hi do
      local mid = lo + math.floor((hi - lo) / 2)
      if passes(p, c, mid, cost) then hi = mid else lo = mid + 1 end
    end
    return lo
  end
  local allowed = passes(prev, cur, e, cost)
  local counted = 0
  if allowed or force or count_rejected then
    cur = cur + cost
    if cur > CEILING then cur = CEILING end
    counted = 1
  end
  local function commit()
    if counted == 0 then return end
    redis.call('SET', key, int(k) .. ':' .. int(cur) .. ':' .. int(prev) .. ';' .. fp, 'PX',
               ttl((k + 2) * W - t))
  end
  local room = limit - estimate(prev, cur, e, 0)
  local remaining = 0
  if room >= 1.0 then remaining = math.floor(room) end
  while remaining > 0 and not passes(prev, cur, e, remaining) do remaining = remaining - 1 end
  while passes(prev, cur, e, remaining + 1) do remaining = remaining + 1 end
  local again = 0
  if not passes(prev, cur, e, cost) then
    if cost > limit then
      again = -1
    else
      local in_k = first_passing(prev, cur, e + 1)
      if in_k >= 0 then
        again = k * W + in_k
      else
        local in_next = first_passing(cur, 0, 0)
        if in_next >= 0 then
          again = (k + 1) * W + in_next
        else
          again = (k + 2) * W
        end
      end
    end
  end
  local retry = 0
  if not allowed then
    if again < 0 then retry = -1 else retry = again - t end
  end
  local reset = 0
  if cur > 0 then
    reset = (k + 2) * W - t
  elseif prev > 0 then
    reset = (k + 1) * W - t
  end
  return {allowed = allowed, counted = counted, remaining = remaining, retry = retry,
          reset = reset, again = again, idle_at = idle_at, commit = commit,
          convert = function() end}
end
)lua";

/// The script of the policy alone: KEYS[1] and ARGV as documented in script_for.
inline constexpr std::string_view sliding_window_counter_main_lua = R"lua(
local r = sliding_window_counter(KEYS[1], t, cost, tonumber(ARGV[5]), tonumber(ARGV[6]),
                                 ARGV[7] == '1')
if not peek then r.commit() end
return {r.allowed and 1 or 0, r.counted, r.remaining, r.retry, r.reset}
)lua";

}  // namespace detail

template <>
struct script_for<sliding_window_counter>
    : detail::window_script<sliding_window_counter, detail::sliding_window_counter_lua,
                            detail::sliding_window_counter_main_lua> {};

}  // namespace ratelimit::redis
