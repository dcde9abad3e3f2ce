// SPDX-License-Identifier: Apache-2.0
// Lua script of the compound policies (policy/compound.hpp, field for field): all sub-limits in one script.
//
// Keys: one per sub-limit, `<prefix>{<user key>}:compound:<name>:<i>:<sub-policy>`
// (i from 0 in configuration order), all in KEYS and all sharing the user
// key's hash tag, so the script is legal in Redis Cluster. Each key holds the
// sub-limit's state exactly as the policy's own script keeps it, with the
// fingerprint of that sub-limit's config, and gets its TTL from the same code:
// a sub-limit whose config changed (or that moved to another index when the
// sub-limits were reordered) finds another fingerprint and converts or starts
// fresh as the policy alone would. A sub-limit that the compound does not
// commit still writes its converted state (convert(), log and GCRA).
//
// One script text serves every compound type: it contains the five policy functions (scripts/<policy>.hpp) and dispatches on
// the sub-policy names in ARGV, so EVALSHA caching works and user keys never
// appear in the text.
//
// The script decides every sub-limit without writing, then commits all of
// them when all admit, or only the sub-limits that count rejected attempts
// when one rejects (every sub-limit when the check is forced, ARGV[3] = "2"):
// the rule of detail::settle in policy/compound.hpp. Its
// reply has a sixth element, the binding sub-limit's limit.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "ratelimit/policy/compound.hpp"
#include "ratelimit/redis/scripts/fixed_window.hpp"
#include "ratelimit/redis/scripts/gcra.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/redis/scripts/sliding_window_counter.hpp"
#include "ratelimit/redis/scripts/sliding_window_log.hpp"
#include "ratelimit/redis/scripts/token_bucket.hpp"

namespace ratelimit::redis {

namespace detail {

/// The compound driver. ARGV[5] lists the sub-limits in order, separated by
/// ';', each `<policy name>,<that policy's ARGV[5..]>` joined by ','. KEYS[i]
/// is sub-limit i's key. Durations follow detail::settle and detail::combine:
/// a rejecting sub-limit gives its own retry (from its clamped time); a
/// count_rejected sub-limit that admitted and recorded the attempt gives the
/// wait, from the request's time, until its recorded state admits the request
/// again (`again`); a sub-limit left untouched gives retry 0, the time until
/// its state is idle (`idle_at`) and is never the binding one.
inline constexpr std::string_view compound_main_lua = R"lua(
local subs = {}
for spec in string.gmatch(ARGV[5], '[^;]+') do
  local f = {}
  for x in string.gmatch(spec, '[^,]+') do f[#f + 1] = x end
  subs[#subs + 1] = f
end
local n = #subs
if n == 0 or #KEYS ~= n then
  return redis.error_reply('ratelimit: the compound script needs one key per sub-limit')
end
-- Decides sub-limit i; returns its result, its limit and whether it counts
-- rejected attempts.
local function decide(i)
  local f, key = subs[i], KEYS[i]
  local a, b, c = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
  if f[1] == 'fixed_window' then
    return fixed_window(key, t, cost, a, b, f[4] == '1'), b, f[4] == '1'
  elseif f[1] == 'sliding_log' then
    return sliding_window_log(key, t, cost, a, b, f[4] == '1'), b, f[4] == '1'
  elseif f[1] == 'sliding_counter' then
    return sliding_window_counter(key, t, cost, a, b, f[4] == '1'), b, f[4] == '1'
  elseif f[1] == 'token_bucket' then
    return token_bucket(key, t, cost, a, b, c), c, false
  elseif f[1] == 'gcra' then
    return gcra(key, t, cost, a, b), b, false
  end
  error('ratelimit: unknown sub-policy ' .. tostring(f[1]))
end
local FAR = 1125899906842624
local function later(x, y)
  if x < 0 or y < 0 then return -1 end
  if x > y then return x end
  return y
end
local function from_now(at)
  local d = at - t
  if d > FAR then return -1 end
  return d
end
local rs, limits, counts = {}, {}, {}
local all = true
for i = 1, n do
  rs[i], limits[i], counts[i] = decide(i)
  -- Forced, every sub-limit records the request, as one counting rejected
  -- attempts does (detail::settle's `forced`).
  counts[i] = counts[i] or force
  all = all and rs[i].allowed
end
local counted, retry, reset = 0, 0, 0
local limit, remaining = nil, nil
for i = 1, n do
  local d = rs[i]
  local wait, until_reset, binding = 0, d.reset, true
  if all or d.counted == 1 and (not d.allowed or counts[i]) then
    if not peek then d.commit() end
    counted = 1
    if not all then
      if not d.allowed then
        wait = d.retry
      elseif d.remaining < cost then
        wait = from_now(d.again)
      end
    end
  elseif not d.allowed then
    if not peek then d.convert() end
    wait = d.retry
  else
    if not peek then d.convert() end
    binding = false
    if d.idle_at <= t then until_reset = 0 else until_reset = from_now(d.idle_at) end
  end
  retry = later(retry, wait)
  reset = later(reset, until_reset)
  if binding and (remaining == nil or d.remaining < remaining) then
    limit = limits[i]
    remaining = d.remaining
  end
end
if all then retry = 0 end
return {all and 1 or 0, counted, remaining, retry, reset, limit}
)lua";

/// The one script of every compound policy.
inline constexpr std::string_view compound_script =
    lua_join<lua_prelude, fixed_window_lua, sliding_window_log_lua, sliding_window_counter_lua,
             token_bucket_lua, gcra_lua, compound_main_lua>::value;

/// Appends sub-limit `cfg`'s entry to the packed ARGV[5] of the compound script.
template <class Config>
void append_compound_part(const Config& cfg, std::string& packed) {
  using P = typename Config::policy_type;
  std::vector<std::string> args;
  script_for<P>::append_args(cfg, args);
  if (!packed.empty()) packed += ';';
  packed.append(script_for<P>::name);
  for (const std::string& a : args) {
    packed += ',';
    packed += a;
  }
}

/// Appends sub-limit i's Redis key, `<base>:<i>:<policy name>`.
template <class P>
void append_compound_key(std::string_view base, std::size_t i, std::vector<std::string>& out) {
  std::string k(base);
  k += ':';
  k += std::to_string(i);
  k += ':';
  k.append(script_for<P>::name);
  out.push_back(std::move(k));
}

}  // namespace detail

/// Compound of sub-policies fixed at compile time. Beyond the usual members
/// (script_for.hpp) it declares its keys: `append_keys(cfg, base, out)`
/// appends one Redis key per sub-limit, each `base` (the store's
/// `<prefix>{<user key>}:compound:<name>`) followed by `:<i>:<sub-policy>`; the
/// reply's sixth element is the binding sub-limit's limit.
template <policy... Ps>
struct script_for<compound<Ps...>> {
  using config = typename compound<Ps...>::config;
  static constexpr std::string_view name = compound<Ps...>::name;
  // ARGV[5] = the sub-limits, packed (see detail::compound_main_lua).
  static constexpr std::string_view text = detail::compound_script;

  static void append_args(const config& cfg, std::vector<std::string>& out) {
    std::string packed;
    std::apply([&](const auto&... part) { (detail::append_compound_part(part, packed), ...); },
               cfg.parts());
    out.push_back(std::move(packed));
  }

  static void append_keys(const config&, std::string_view base, std::vector<std::string>& out) {
    append_keys_each(base, out, std::index_sequence_for<Ps...>{});
  }

  /// The fallback limiter: every sub-limit scaled as it would be alone.
  static config scaled(const config& cfg, units divisor) {
    return std::apply(
        [&](const auto&... part) {
          return config(compound_options{cfg.name()}, script_for<Ps>::scaled(part, divisor)...);
        },
        cfg.parts());
  }

 private:
  template <std::size_t... I>
  static void append_keys_each(std::string_view base, std::vector<std::string>& out,
                               std::index_sequence<I...>) {
    (detail::append_compound_key<Ps>(base, I, out), ...);
  }
};

/// Compound of any number of sub-limits of one policy, chosen at run time.
/// Same members and keys as script_for<compound<Ps...>>.
template <policy P>
struct script_for<compound_of<P>> {
  using config = typename compound_of<P>::config;
  static constexpr std::string_view name = compound_of<P>::name;
  // ARGV[5] = the sub-limits, packed (see detail::compound_main_lua).
  static constexpr std::string_view text = detail::compound_script;

  static void append_args(const config& cfg, std::vector<std::string>& out) {
    std::string packed;
    for (const auto& part : cfg.parts()) detail::append_compound_part(part, packed);
    out.push_back(std::move(packed));
  }

  static void append_keys(const config& cfg, std::string_view base, std::vector<std::string>& out) {
    for (std::size_t i = 0; i < cfg.size(); ++i) detail::append_compound_key<P>(base, i, out);
  }

  static config scaled(const config& cfg, units divisor) {
    std::vector<typename P::config> parts;
    parts.reserve(cfg.size());
    for (const auto& part : cfg.parts()) parts.push_back(script_for<P>::scaled(part, divisor));
    return config(std::move(parts), compound_options{cfg.name()});
  }
};

}  // namespace ratelimit::redis
