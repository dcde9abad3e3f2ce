// SPDX-License-Identifier: Apache-2.0
// Lua script of the GCRA policy (policy/gcra.hpp, bit for bit).
//
// State: one string "<TAT us>;<T>,<burst>", the theoretical arrival time and
// the fingerprint of the config that wrote it, written with an expiry of
// TAT - t (the time until the key is at rest). A TAT is an absolute time, so
// state written under another config is converted, not dropped: TAT is
// clamped to at most t + burst' x T' (the most debt the new config can hold),
// and the converted state is written back (by any check that is not a peek),
// so that it is converted once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// The policy as a Lua function `gcra(key, t, cost, T, burst)`: reads the
/// key and decides, writing nothing; the result's `commit()` writes the new
/// TAT with its TTL. `idle_at` as in detail::fixed_window_lua (GCRA
/// records only admissions, so it needs no `again`).
inline constexpr std::string_view gcra_lua = R"lua(
local function gcra(key, t, cost, tv, burst)
  local tol = burst * tv
  local fp = int(tv) .. ',' .. int(burst)
  local tat = 0
  local converted = false
  local raw = redis.call('GET', key)
  if raw then
    local f, written_under = split_state(key, raw, 1)
    tat = whole(key, f[1], 0, 2 * CEILING)
    if written_under ~= fp then
      converted = true
      if tat > t + tol then tat = t + tol end
    end
  end
  local tat0 = tat
  local function convert()
    if not converted then return end
    if tat0 > t then
      redis.call('SET', key, int(tat0) .. ';' .. fp, 'PX', ttl(tat0 - t))
    else
      redis.call('DEL', key)
    end
  end
  local idle_at = tat
  local base = tat
  if t > base then base = t end
  local allowed = cost <= burst and (base - t) + cost * tv <= tol
  local counted = 0
  if allowed then
    tat = base + cost * tv
    counted = 1
  elseif force then
    -- base + cost * tv, saturating at t + 2^52 (never below base).
    local ceiling = t + CEILING
    if base >= ceiling then
      tat = base
    elseif cost > fdiv(ceiling - base, tv) then
      tat = ceiling
    else
      tat = base + cost * tv
    end
    counted = 1
  end
  local function commit()
    if counted == 0 then return convert() end
    redis.call('SET', key, int(tat) .. ';' .. fp, 'PX', ttl(tat - t))
  end
  local debt = tat - t
  if debt < 0 then debt = 0 end
  local remaining = 0
  if tol - debt > 0 then remaining = fdiv(tol - debt, tv) end
  -- `again`: when the same request is admitted on the recorded state (for
  -- a forced compound whose other sub-limit rejected).
  local again = 0
  if remaining < cost then
    if cost > burst then again = -1 else again = tat + (cost * tv - tol) end
  end
  local retry = 0
  if not allowed then
    if cost > burst then retry = -1 else retry = (tat - t) + (cost * tv - tol) end
  end
  return {allowed = allowed, counted = counted, remaining = remaining, retry = retry,
          reset = debt, again = again, idle_at = idle_at, commit = commit, convert = convert}
end
)lua";

/// The script of the policy alone: KEYS[1] and ARGV as documented in script_for.
inline constexpr std::string_view gcra_main_lua = R"lua(
local r = gcra(KEYS[1], t, cost, tonumber(ARGV[5]), tonumber(ARGV[6]))
if not peek then r.commit() end
return {r.allowed and 1 or 0, r.counted, r.remaining, r.retry, r.reset}
)lua";

}  // namespace detail

template <>
struct script_for<gcra> {
  static constexpr std::string_view name = gcra::name;
  // ARGV[5] = emission interval T us, ARGV[6] = burst.
  static constexpr std::string_view text =
      detail::lua_join<detail::lua_prelude, detail::gcra_lua, detail::gcra_main_lua>::value;

  static void append_args(const gcra::config& cfg, std::vector<std::string>& out) {
    out.push_back(std::to_string(cfg.interval_us()));
    out.push_back(std::to_string(cfg.burst()));
  }

  static gcra::config scaled(const gcra::config& cfg, units divisor) {
    return gcra::config(
        rate(detail::scaled_limit(cfg.get_rate().limit(), divisor), cfg.get_rate().period()),
        bucket_options{detail::scaled_limit(cfg.burst(), divisor), cfg.name()});
  }
};

}  // namespace ratelimit::redis
