// SPDX-License-Identifier: Apache-2.0
// Lua script of the sliding-window log (policy/sliding_window_log.hpp, bit for bit).
//
// State: a LIST whose first element is a header "#<W>,<limit>,<count_rejected>",
// the fingerprint of the config that wrote it, followed by the entries,
// oldest first, "<ts us>:<cost>:<running total>". Two requests in the same
// microsecond are two entries. Like the C++ ring buffer it holds at most
// `limit` entries (the same trim rule under count_rejected), and its expiry
// is newest entry + W. Entries are read lazily with LINDEX (a bisection finds
// the expired ones), each checked against the first, the last and its read
// neighbours for order, and only a recorded attempt writes: a rejection
// leaves the list as it was.
//
// Entries are absolute times, so a log written under another config is
// converted, not dropped: the entries the new window no longer holds (at or
// before t - W') are dropped, the rest trimmed as the new limit's log would
// be (`trim`), and the converted log is written back under the new header by
// any check that is not a peek, so that it is converted once. A log idle
// under the window that wrote it (newest entry at or before t - W) is empty,
// as if its key had expired: what it holds then no longer depends on when
// Redis (or the in-process store's reclaim) drops it.
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
  local header = '#' .. int(W) .. ',' .. int(limit) .. ',' .. (count_rejected and '1' or '0')
  local stored = redis.call('LLEN', key)
  -- `len` entries follow the header, at list indices 1..len.
  local len, converted, old_W = 0, false, 0
  if stored > 0 then
    local h = redis.call('LINDEX', key, 0)
    if stored < 2 or not string.find(h, '^#%d+,%d+,[01]$') then
      bad(key, 'not a log header:', h)
    end
    len = stored - 1
    converted = h ~= header
    if converted then old_W = whole(key, string.match(h, '^#(%d+),'), 1, CEILING) end
  end
  -- The log is the stored entries [head, len) followed by at most one pushed
  -- entry; `offset` rebases running totals (always < 2^53).
  local head, size, offset = 0, len, 0
  local cache = {}
  local pushed = nil
  -- Stored entries i < j must be in order: times never decrease, and each
  -- running total is the one before plus its entry's cost (at least 1).
  -- Every entry read is checked against the first and last entries and its
  -- neighbours read so far, so a log whose entries were reordered or edited
  -- is refused rather than decided on (a total going down made the window
  -- hold less than nothing).
  local function ordered(i, ei, j, ej, s)
    local before = ej[3] - ej[2]
    if ei[1] > ej[1] or before < ei[3] or ej[3] - ei[3] < j - i or
       (j == i + 1 and before ~= ei[3]) then
      bad(key, 'log entries out of order:', s)
    end
  end
  local function load(j)
    local e = cache[j]
    if e ~= nil then return e end
    local s = redis.call('LINDEX', key, j + 1)
    local a, b, c = string.match(s, '^([^:]*):([^:]*):([^:]*)$')
    if a == nil then bad(key, 'not a log entry:', s) end
    e = {whole(key, a, 0, CEILING), whole(key, b, 1, CEILING), whole(key, c, 1, CEILING)}
    if e[2] > e[3] then bad(key, 'log entry cost above its running total:', s) end
    cache[j] = e
    if j > 0 then ordered(0, load(0), j, e, s) end
    if j < len - 1 then ordered(j, e, len - 1, load(len - 1), s) end
    if cache[j - 1] ~= nil then ordered(j - 1, cache[j - 1], j, e, s) end
    if cache[j + 1] ~= nil then ordered(j, e, j + 1, cache[j + 1], s) end
    return e
  end
  local function at(i)
    local j = head + i
    if j == len then return pushed end
    local e = load(j)
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
  -- Drops the oldest entries while those after the oldest reach `limit`
  -- (policy trim). That sum only shrinks as entries go, so a bisection finds
  -- how many go: reading each one as it went would make one check read a
  -- whole long log (a change to a much smaller limit).
  local function trim()
    if size < 2 then return end
    local last = at(size - 1)[3]
    if last - at(0)[3] < limit then return end
    local lo, hi = 1, size - 1
    while lo < hi do
      local mid = lo + math.floor((hi - lo) / 2)
      if last - at(mid)[3] < limit then hi = mid else lo = mid + 1 end
    end
    for _ = 1, lo do pop() end
  end
  -- Index of the oldest entry newer than `horizon` (entry times never decrease).
  local function first_after(horizon)
    local lo, hi = 0, size
    while lo < hi do
      local mid = lo + math.floor((hi - lo) / 2)
      if at(mid)[1] <= horizon then lo = mid + 1 else hi = mid end
    end
    return lo
  end
  if size > 0 and t < at(size - 1)[1] then t = at(size - 1)[1] end
  if converted then
    if at(size - 1)[1] <= t - old_W then
      -- Idle under the config that wrote it: empty, as if it had expired.
      head, size = head + size, 0
    else
      for _ = 1, first_after(t - W) do pop() end
      trim()
    end
  end
  -- The log as read (and converted), for convert().
  local head0, size0, offset0 = head, size, offset
  local idle_at = 0
  if size > 0 then idle_at = at(size - 1)[1] + W end
  -- Entries at or before t - W have left the window; they are dropped only
  -- when this attempt is recorded (a rejection writes nothing).
  local first = first_after(t - W)
  local in_window = total()
  if first > 0 then in_window = at(size - 1)[3] - at(first - 1)[3] end
  local allowed = in_window + cost <= limit
  local counted = 0
  local rebased = false
  if allowed or force or count_rejected then
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
    trim()
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
  local function entry(e) return int(e[1]) .. ':' .. int(e[2]) .. ':' .. int(e[3]) end
  -- Writes the log [head, head + size) under this config's header. Every
  -- entry is read before the DEL: `at` reads the list lazily.
  local function rewrite()
    local es = {}
    for i = 0, size - 1 do es[i + 1] = entry(at(i)) end
    local expire = 0
    if size > 0 then expire = at(size - 1)[1] + W - t end
    redis.call('DEL', key)
    if size == 0 then return end
    redis.call('RPUSH', key, header)
    for i = 1, size do redis.call('RPUSH', key, es[i]) end
    redis.call('PEXPIRE', key, ttl(expire))
  end
  -- Writes the converted log as read, without this attempt.
  local function convert()
    if not converted then return end
    head, size, offset, pushed = head0, size0, offset0, nil
    rewrite()
  end
  local function commit()
    if counted == 0 then return convert() end
    if rebased or converted then return rewrite() end
    if len == 0 then
      redis.call('RPUSH', key, header)
    elseif head > 0 then
      -- Drops list indices 1..head: the header moves onto the last of them.
      redis.call('LSET', key, head, header)
      redis.call('LTRIM', key, head, -1)
    end
    redis.call('RPUSH', key, entry(pushed))
    redis.call('PEXPIRE', key, ttl(reset))
  end
  return {allowed = allowed, counted = counted, remaining = remaining, retry = retry,
          reset = reset, again = again, idle_at = idle_at, commit = commit, convert = convert}
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
