// SPDX-License-Identifier: Apache-2.0
// Idempotent checks in Redis: every policy's script wrapped with a request id
// prelude and epilogue, so that the id and the check are one script.
//
// The wrapped script takes the policy script's KEYS with one more key last,
// the id key, and its ARGV with two more arguments last: the config's limit
// (recorded with the decision, so that a repeat carries the limit it was
// decided under even after a config change) and the retention in
// microseconds. It reads the id key first: a record whose retention has not
// ended at the check's time is the reply (the first decision, marked as a
// repeat) and nothing else runs. Otherwise the policy's script runs unchanged
// (as a Lua function of its own KEYS and ARGV, at the time read once by the
// wrapper), and a consuming check writes the record with PX = the retention.
//
// Id key: `<the policy key>:id:<id bytes>:<id length>#` (detail::redis_key;
// for a compound, its base key), so it shares the user key's hash tag (one
// cluster slot) and no two (key, policy, name, id) share one: a policy key
// never ends in '#', and the length read from the end delimits the id.
//
// Record: `rid1:<until us>:<allowed>:<counted>:<remaining>:<retry us>:<reset us>:<limit>`
// (the decision's limit), read strictly: anything else is a script error
// naming the key, and the check is left undone.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/request_id.hpp"

namespace ratelimit::redis::detail {

/// Before the policy: the id key and retention taken off KEYS and ARGV, the
/// record looked up and validated. `t` is the prelude's (one TIME at most).
inline constexpr std::string_view request_id_head_lua = R"lua(
local nkeys, nargs = #KEYS, #ARGV
local id_key = KEYS[nkeys]
local id_retention = whole(id_key, ARGV[nargs], 1, 2 * CEILING)
local id_limit = whole(id_key, ARGV[nargs - 1], 1, CEILING)
local id_raw = redis.call('GET', id_key)
if id_raw then
  if #id_raw > 120 or
      not string.find(id_raw, '^rid1:%d+:%d:%d:%d+:%-?%d+:%d+:%d+$') then
    bad(id_key, 'not a request id record:', id_raw)
  end
  local f = {}
  for x in string.gmatch(string.sub(id_raw, 6), '[^:]+') do f[#f + 1] = x end
  local id_until = whole(id_key, f[1], 0, 2 * CEILING)
  local rec = {whole(id_key, f[2], 0, 1), whole(id_key, f[3], 0, 1),
               whole(id_key, f[4], 0, CEILING), whole(id_key, f[5], -1, 2 * CEILING),
               whole(id_key, f[6], 0, 2 * CEILING)}
  rec[6] = whole(id_key, f[7], 1, CEILING)
  if t < id_until then
    rec[7] = 1
    return rec
  end
end
local inner_keys, inner_args = {}, {}
for i = 1, nkeys - 1 do inner_keys[i] = KEYS[i] end
for i = 1, nargs - 2 do inner_args[i] = ARGV[i] end
inner_args[1] = int(t)
local function rl_policy(KEYS, ARGV)
)lua";

/// After the policy: the record written by a consuming check, the repeat flag appended.
inline constexpr std::string_view request_id_tail_lua = R"lua(
end
local r = rl_policy(inner_keys, inner_args)
if type(r) ~= 'table' or r.err ~= nil then return r end
if not peek then
  local id_until = t + id_retention
  if id_until > 2 * CEILING then id_until = 2 * CEILING end
  redis.call('SET', id_key, 'rid1:' .. int(id_until) .. ':' .. int(r[1]) .. ':' ..
             int(r[2]) .. ':' .. int(r[3]) .. ':' .. int(r[4]) .. ':' .. int(r[5]) .. ':' ..
             int(r[6] or id_limit), 'PX', ttl(id_retention))
end
r[#r + 1] = 0
return r
)lua";

/// The wrapped script of policy P, made once.
template <class P>
[[nodiscard]] const std::string& once_script_text() {
  static const std::string text = [] {
    std::string s(lua_prelude);
    s += request_id_head_lua;
    s += script_for<P>::text;
    s += request_id_tail_lua;
    return s;
  }();
  return text;
}

/// The SHA-1 of once_script_text<P>(), computed once.
template <class P>
[[nodiscard]] const std::string& once_script_sha() {
  static const std::string sha = sha1_hex(once_script_text<P>());
  return sha;
}

/// The id key of `id` beside the policy key `base` (see the file comment).
[[nodiscard]] inline std::string request_id_key(std::string_view base, std::string_view id) {
  std::string k;
  k.reserve(base.size() + id.size() + 10);
  k.append(base);
  k += ":id:";
  k.append(id);
  k += ':';
  k += std::to_string(id.size());
  k += '#';
  return k;
}

/// Appends EVALSHA (or EVAL) of P's wrapped script: `keys` ends with the id
/// key; the config's limit and `retention_us` go last in ARGV.
template <class P>
void append_eval_once(std::string& out, bool with_text, const std::vector<std::string>& keys,
                      std::string_view time, std::string_view cost, access a,
                      const std::vector<std::string>& policy_args, std::string_view ttl_floor_ms,
                      std::string_view limit, std::string_view retention_us) {
  const std::string nkeys = std::to_string(keys.size());
  std::vector<std::string_view> args;
  args.reserve(9 + keys.size() + policy_args.size());
  args.push_back(with_text ? "EVAL" : "EVALSHA");
  args.push_back(with_text ? std::string_view(once_script_text<P>())
                           : std::string_view(once_script_sha<P>()));
  args.push_back(nkeys);
  for (const std::string& k : keys) args.push_back(k);
  args.push_back(time);
  args.push_back(cost);
  args.push_back(access_arg(a));
  args.push_back(ttl_floor_ms);
  for (const std::string& p : policy_args) args.push_back(p);
  args.push_back(limit);
  args.push_back(retention_us);
  append_command(out, args.data(), args.size());
}

/// What an idempotent check adds to a store's round trip.
struct once_request {
  std::string_view id;
  std::string limit;
  std::string retention_us;
};

/// Validates a retention for the scripts (exact integers in Lua).
/// @throws std::invalid_argument
inline void check_script_retention(std::chrono::microseconds r) {
  if (r.count() < 1 || r > max_script_time) {
    throw std::invalid_argument("ratelimit: redis: request id retention " +
                                std::to_string(r.count()) + "us is outside 1.." +
                                std::to_string(max_script_time.count()) + "us");
  }
}

}  // namespace ratelimit::redis::detail
