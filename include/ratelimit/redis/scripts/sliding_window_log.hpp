// SPDX-License-Identifier: Apache-2.0
// Lua script of the sliding-window log (policy/sliding_window_log.hpp, bit for bit).
//
// State: a LIST, oldest first, of entries "<ts us>:<cost>:<running total>".
// Two requests in the same microsecond are two entries. Like the C++ ring
// buffer it holds at most `limit` entries (the same trim rule under
// count_rejected), and its expiry is newest entry + W. Entries are read lazily
// with LINDEX (a bisection finds the expired ones), and only a recorded
// attempt writes: a rejection leaves the list as it was.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// The policy as a Lua function `sliding_window_log(key, t, cost, W, limit,
/// count_rejected)`: reads the key and decides, writing nothing; the result's
/// `commit()` writes the new log with its TTL. `again` and `idle_at` as in
/// detail::fixed_window_lua.
inline constexpr std::string_view sliding_window_log_lua = R"lua(
local function sliding_window_log(key, t, cost, W, limit, count_rejected)
  local len = redis.call('LLEN', key)
  -- The log is the stored entries [head, len) followed by at most one pushed
  -- entry; `offset` rebases running totals (always < 2^53).
  local head, size, offset = 0, len, 0
  local cache = {}
  local pushed = nil
  local function at(i)
    local j = head + i
    if j == len then return pushed end
    local e = cache[j]
    if e == nil then
      local s = redis.call('LINDEX', key, j)
      local a = string.find(s, ':', 1, true)
      local b = string.find(s, ':', a + 1, true)
      e = {tonumber(string.sub(s, 1, a - 1)), tonumber(string.sub(s, a + 1, b - 1)),
           tonumber(string.sub(s, b + 1))}
      cache[j] = e
    end
    return {e[1], e[2], e[3] - offset}
  end
  local function pop()
    head = head + 1
    size = size - 1
  end
  local function total()
    if size == 0 then return 0 end
    local f = at(0)
    return at(size - 1)[3] - (f[3] - f[2])
  end
  local idle_at = 0
  if size > 0 then idle_at = at(size - 1)[1] + W end
  if size > 0 and t < at(size - 1)[1] then t = at(size - 1)[1] end
  -- Entries at or before t - W have left the window; they are dropped only
  -- when this attempt is recorded (a rejection writes nothing).
  local first, hi = 0, size
  while first < hi do
    local mid = first + math.floor((hi - first) / 2)
    if at(mid)[1] <= t - W then first = mid + 1 else hi = mid end
  end
  local in_window = total()
  if first > 0 then in_window = at(size - 1)[3] - at(first - 1)[3] end
  local allowed = in_window + cost <= limit
  local counted = 0
  local rebased = false
  if allowed or count_rejected then
    for _ = 1, first do pop() end
    if size >= limit then pop() end
    local last = 0
    if size > 0 then last = at(size - 1)[3] end
    if last + cost > CEILING then
      local f = at(0)
      local base = f[3] - f[2]
      offset = offset + base
      last = last - base
      rebased = true
    end
    pushed = {t, cost, last + cost}
    size = size + 1
    while size > 1 and at(size - 1)[3] - at(0)[3] >= limit do pop() end
    in_window = total()
    counted = 1
  end
  local remaining = limit - in_window
  if remaining < 0 then remaining = 0 end
  local again = 0
  if remaining < cost then
    if cost > limit then
      again = -1
    else
      local need = at(size - 1)[3] + cost - limit
      local lo, hi = 0, size - 1
      while lo < hi do
        local mid = lo + math.floor((hi - lo) / 2)
        if at(mid)[3] >= need then hi = mid else lo = mid + 1 end
      end
      again = at(lo)[1] + W
    end
  end
  local retry = 0
  if not allowed then
    if again < 0 then retry = -1 else retry = again - t end
  end
  local reset = 0
  if in_window > 0 or counted == 1 then reset = at(size - 1)[1] + W - t end
  local function commit()
    local function entry(e) return int(e[1]) .. ':' .. int(e[2]) .. ':' .. int(e[3]) end
    if rebased then
      redis.call('DEL', key)
      for i = 0, size - 1 do redis.call('RPUSH', key, entry(at(i))) end
      redis.call('PEXPIRE', key, ttl(reset))
    elseif counted == 1 then
      if head > 0 then redis.call('LTRIM', key, head, -1) end
      redis.call('RPUSH', key, entry(pushed))
      redis.call('PEXPIRE', key, ttl(reset))
    end
  end
  return {allowed = allowed, counted = counted, remaining = remaining, retry = retry,
          reset = reset, again = again, idle_at = idle_at, commit = commit}
end
)lua";

/// The script of the policy alone: KEYS[1] and ARGV as documented in script_for.
inline constexpr std::string_view sliding_window_log_main_lua = R"lua(
local r = sliding_window_log(KEYS[1], t, cost, tonumber(ARGV[5]), tonumber(ARGV[6]),
                             ARGV[7] == '1')
if not peek then r.commit() end
return {r.allowed and 1 or 0, r.counted, r.remaining, r.retry, r.reset}
)lua";

}  // namespace detail

template <>
struct script_for<sliding_window_log>
    : detail::window_script<sliding_window_log, detail::sliding_window_log_lua,
                            detail::sliding_window_log_main_lua> {};

}  // namespace ratelimit::redis
