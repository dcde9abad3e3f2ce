// SPDX-License-Identifier: Apache-2.0
// Lua script of the fixed-window policy (policy/fixed_window.hpp, bit for bit).
//
// State: one string "<window index>:<count>;<W>,<limit>,<count_rejected>",
// the state and the fingerprint of the config that wrote it. Its expiry is
// set only when a window's first units are recorded (SET ... PX
// end-of-window), and kept with KEEPTTL afterwards, so calling again never
// extends a window. State written under another config is ignored (a count
// means nothing under another limit or window length): the key starts fresh,
// as a new limiter with this config would.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// The policy as a Lua function `fixed_window(key, t, cost, W, limit,
/// count_rejected)`: reads the key and decides, writing nothing; the result's
/// `commit()` writes the new state with its TTL. Besides the script reply it
/// gives `again` (when the same request is admitted on the state it leaves,
/// absolute time; set when that state does not admit it) and `idle_at` (when
/// the state read becomes empty), for the compound script.
inline constexpr std::string_view fixed_window_lua = R"lua(
local function fixed_window(key, t, cost, W, limit, count_rejected)
  local fp = int(W) .. ',' .. int(limit) .. ',' .. (count_rejected and '1' or '0')
  local sw, sn = 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local f, written_under = split_state(key, raw, 2)
    local w, c = whole(key, f[1], 0, CEILING), whole(key, f[2], 0, CEILING)
    if written_under == fp then sw, sn = w, c end
  end
  local idle_at = 0
  if sn > 0 then idle_at = (sw + 1) * W end
  if sn > 0 and t < sw * W then t = sw * W end
  local k = fdiv(t, W)
  local stop = (k + 1) * W
  local same = sn > 0 and sw == k
  local n = 0
  if same then n = sn end
  local allowed = n + cost <= limit
  local counted = 0
  if allowed or force or count_rejected then
    n = n + cost
    if n > CEILING then n = CEILING end
    counted = 1
  end
  local function commit()
    if counted == 0 then return end
    local v = int(k) .. ':' .. int(n) .. ';' .. fp
    if same then
      redis.call('SET', key, v, 'KEEPTTL')
    else
      redis.call('SET', key, v, 'PX', ttl(stop - t))
    end
  end
  local remaining = limit - n
  if remaining < 0 then remaining = 0 end
  local again = 0
  if remaining < cost then
    if cost > limit then again = -1 else again = stop end
  end
  local retry = 0
  if not allowed then
    if again < 0 then retry = -1 else retry = again - t end
  end
  local reset = 0
  if n > 0 then reset = stop - t end
  return {allowed = allowed, counted = counted, remaining = remaining, retry = retry,
          reset = reset, again = again, idle_at = idle_at, commit = commit,
          convert = function() end}
end
)lua";

/// The script of the policy alone: KEYS[1] and ARGV as documented in script_for.
inline constexpr std::string_view fixed_window_main_lua = R"lua(
local r = fixed_window(KEYS[1], t, cost, tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1')
if not peek then r.commit() end
return {r.allowed and 1 or 0, r.counted, r.remaining, r.retry, r.reset}
)lua";

}  // namespace detail

template <>
struct script_for<fixed_window>
    : detail::window_script<fixed_window, detail::fixed_window_lua, detail::fixed_window_main_lua> {
};

}  // namespace ratelimit::redis
