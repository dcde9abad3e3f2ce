// SPDX-License-Identifier: Apache-2.0
// Lua script of the lease limiter (concurrency.hpp, field for field): one script per operation.
//
// Keys: KEYS[1] = `<prefix>{<user key>}:leases:<name>`, a sorted set of
// lease id -> expiry (microseconds; live while expiry > t), its TTL the
// latest expiry; with a rate R, KEYS[2] = that followed by `:0:<policy>`,
// R's state exactly as R's own script keeps it (fingerprint included). Both
// share the user key's hash tag, so the script is legal in Redis Cluster.
//
// A lease is an absolute expiry, whatever the config that granted it, so the
// sorted set needs no fingerprint: under another config the leases stay
// until they expire and count against the new N.
//
// Stored values are checked before anything is written: KEYS[1] must be a
// sorted set (or absent) whose lowest and highest expiries, earliest live
// expiry and the lease id's own are integers in 0..2^53 and whose members
// read are 1..256 bytes; the rate's state is read before the expired leases
// are dropped. Anything else is a script error naming the key, and the keys
// are left as they were.
//
// ARGV[5] = N, ARGV[6] = max duration us, ARGV[7] = operation (acquire,
// release, renew), ARGV[8] = lease id (binary safe), ARGV[9] = the rate as
// `<policy>,<its ARGV[5..]>` or "". The reply has seven elements: the usual
// five, the decision's limit, and 1 when an acquire found the lease already
// live (`repeat`).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/concurrency.hpp"
#include "ratelimit/redis/scripts/compound.hpp"
#include "ratelimit/redis/scripts/fixed_window.hpp"
#include "ratelimit/redis/scripts/gcra.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/redis/scripts/sliding_window_counter.hpp"
#include "ratelimit/redis/scripts/sliding_window_log.hpp"
#include "ratelimit/redis/scripts/token_bucket.hpp"

namespace ratelimit::redis {

namespace detail {

/// The lease driver; the rate part follows detail::settle and
/// detail::combine as the compound driver does (no count_rejected).
inline constexpr std::string_view leases_main_lua = R"lua(
local key = KEYS[1]
local N, D, op, id = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8]
local kind = redis.call('TYPE', key).ok
if kind ~= 'none' and kind ~= 'zset' then bad(key, 'not a lease set: a', kind) end
local function expiry(member, score)
  if #member < 1 or #member > 256 then bad(key, 'not a lease id:', member) end
  return whole(key, score, 0, 2 * CEILING)
end
local function at(rank)
  local e = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return expiry(e[1], e[2])
end
-- Everything read is checked before the first write: the lowest and highest
-- expiries, the earliest live one (the lowest once the expired are dropped)
-- and this id's; the expired are dropped only once the rate (if any) has
-- read its state too (prune).
local live = 0
local mine = nil
if kind == 'zset' then
  at(0)
  at(-1)
  local e = redis.call('ZRANGEBYSCORE', key, '(' .. int(t), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #e > 0 then expiry(e[1], e[2]) end
  live = redis.call('ZCOUNT', key, '(' .. int(t), '+inf')
  mine = redis.call('ZSCORE', key, id)
  if mine then
    mine = expiry(id, mine)
    if mine <= t then mine = nil end
  end
end
local function prune()
  if kind == 'zset' then redis.call('ZREMRANGEBYSCORE', key, '-inf', int(t)) end
end
-- The earliest and latest live expiries (t, t when none is live).
local function bounds()
  if live == 0 then return t, t end
  return at(0), at(-1)
end
local function left()
  if live >= N then return 0 end
  return N - live
end
local function keep(latest)
  if live > 0 then redis.call('PEXPIRE', key, ttl(latest - t)) end
end
if op == 'release' or op == 'renew' then
  prune()
  if mine then
    if op == 'release' then
      redis.call('ZREM', key, id)
      live = live - 1
    elseif t + D > mine then
      redis.call('ZADD', key, int(t + D), id)
    end
  end
  local _, latest = bounds()
  if mine then keep(latest) end
  if mine then return {1, 1, left(), 0, latest - t, N, 0} end
  return {0, 0, left(), -1, latest - t, N, 0}
end
if op ~= 'acquire' then
  return redis.error_reply('ratelimit: unknown lease operation ' .. tostring(op))
end
if mine then
  prune()
  local _, latest = bounds()
  return {1, 0, left(), 0, latest - t, N, 1}
end
local free = live < N
local r, rlimit = nil, nil
if ARGV[9] ~= '' then
  local f = {}
  for x in string.gmatch(ARGV[9], '[^,]+') do f[#f + 1] = x end
  local rk = KEYS[2]
  local a, b, c = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
  if f[1] == 'fixed_window' then
    r, rlimit = fixed_window(rk, t, 1, a, b, false), b
  elseif f[1] == 'sliding_log' then
    r, rlimit = sliding_window_log(rk, t, 1, a, b, false), b
  elseif f[1] == 'sliding_counter' then
    r, rlimit = sliding_window_counter(rk, t, 1, a, b, false), b
  elseif f[1] == 'token_bucket' then
    r, rlimit = token_bucket(rk, t, 1, a, b, c), c
  elseif f[1] == 'gcra' then
    r, rlimit = gcra(rk, t, 1, a, b), b
  else
    return redis.error_reply('ratelimit: unknown rate policy ' .. tostring(f[1]))
  end
end
local all = free and (r == nil or r.allowed)
prune()
local earliest, latest = bounds()
if all then
  redis.call('ZADD', key, int(t + D), id)
  if live == 0 then earliest = t + D end
  live = live + 1
  if t + D > latest then latest = t + D end
  keep(latest)
  if r then r.commit() end
elseif r then
  r.convert()
end
-- Parts in order (leases first): limit, remaining, retry, reset, binding.
local FAR = 1125899906842624
local function later(x, y)
  if x < 0 or y < 0 then return -1 end
  if x > y then return x end
  return y
end
local retry, reset = 0, latest - t
if not free then retry = earliest - t end
local limit, remaining = nil, nil
if all or not free then limit, remaining = N, left() end
if r then
  local wait, until_reset, binding = 0, r.reset, true
  if not all then
    if not r.allowed then
      wait = r.retry
    else
      binding = false
      if r.idle_at <= t then
        until_reset = 0
      elseif r.idle_at - t > FAR then
        until_reset = -1
      else
        until_reset = r.idle_at - t
      end
    end
  end
  retry = later(retry, wait)
  reset = later(reset, until_reset)
  if binding and (remaining == nil or r.remaining < remaining) then
    limit, remaining = rlimit, r.remaining
  end
end
if all then return {1, 1, remaining, 0, reset, limit, 0} end
return {0, 0, remaining, retry, reset, limit, 0}
)lua";

/// The one script of every lease limiter.
inline constexpr std::string_view leases_script =
    lua_join<lua_prelude, fixed_window_lua, sliding_window_log_lua, sliding_window_counter_lua,
             token_bucket_lua, gcra_lua, leases_main_lua>::value;

[[nodiscard]] inline std::string_view lease_op_name(lease_op op) noexcept {
  switch (op) {
    case lease_op::acquire: return "acquire";
    case lease_op::release: return "release";
    case lease_op::renew: return "renew";
    case lease_op::none: break;
  }
  return "none";
}

}  // namespace detail

/// The lease limiter's script. Beyond the usual members (script_for.hpp):
/// `append_keys` (the rate's key after the lease set's), and the two hooks
/// of the failure policy's fallback limiter: `fallback_id` (the limiter's
/// identity without the operation and lease id) and `rebind` (the fallback's
/// settings with this call's operation and lease id).
template <class R>
struct script_for<leases<R>> {
  using config = typename leases<R>::config;
  static constexpr std::string_view name = leases<R>::name;
  static constexpr std::string_view text = detail::leases_script;

  static void append_args(const config& cfg, std::vector<std::string>& out) {
    const auto& c = cfg.get_settings().concurrency();
    out.push_back(std::to_string(c.limit()));
    out.push_back(std::to_string(c.max_duration().count()));
    out.emplace_back(detail::lease_op_name(cfg.op()));
    out.emplace_back(cfg.lease_id());
    out.push_back(rate_arg(cfg));
  }

  static void append_keys(const config&, std::string_view base, std::vector<std::string>& out) {
    out.emplace_back(base);
    if constexpr (leases<R>::rated) detail::append_compound_key<R>(base, 0, out);
  }

  /// The fallback limiter: N and the rate scaled by `divisor`, same duration.
  static config scaled(const config& cfg, units divisor) {
    const auto& s = cfg.get_settings();
    const concurrency_config& c = s.concurrency();
    concurrency_config small(detail::scaled_limit(c.limit(), divisor), c.max_duration(),
                             concurrency_options{c.name()});
    if constexpr (leases<R>::rated) {
      return config::owning(
          typename leases<R>::settings(std::move(small), script_for<R>::scaled(s.rate(), divisor)));
    } else {
      return config::owning(typename leases<R>::settings(std::move(small)));
    }
  }

  static std::string fallback_id(const config& cfg) {
    const auto& c = cfg.get_settings().concurrency();
    return std::string(name) + ':' + std::to_string(c.limit()) + ':' +
           std::to_string(c.max_duration().count()) + ':' + rate_arg(cfg);
  }

  static config rebind(const config& fallback, const config& call) {
    return fallback.with(call.op(), call.lease_id());
  }

 private:
  /// ARGV[9]: the rate as `<policy>,<its ARGV[5..]>`, or "".
  static std::string rate_arg(const config& cfg) {
    std::string rate;
    if constexpr (leases<R>::rated) detail::append_compound_part(cfg.get_settings().rate(), rate);
    return rate;
  }
};

}  // namespace ratelimit::redis
