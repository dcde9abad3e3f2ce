// SPDX-License-Identifier: Apache-2.0
// One check on the wire: the EVALSHA/EVAL command of a policy's script and
// the decision read back from its reply (only a reply one of our scripts
// could give decides a check).
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// Appends EVALSHA (or EVAL) of P's script for one check. `time` is empty for
/// server time; `ttl_floor_ms` is "0" for server time.
template <class P>
void append_eval(std::string& out, bool with_text, const std::vector<std::string>& keys,
                 std::string_view time, std::string_view cost, access a,
                 const std::vector<std::string>& policy_args, std::string_view ttl_floor_ms) {
  const std::string nkeys = std::to_string(keys.size());
  std::vector<std::string_view> args;
  args.reserve(8 + keys.size() + policy_args.size());
  args.push_back(with_text ? "EVAL" : "EVALSHA");
  args.push_back(with_text ? script_for<P>::text : std::string_view(script_sha<P>()));
  args.push_back(nkeys);
  for (const std::string& k : keys) args.push_back(k);
  args.push_back(time);
  args.push_back(cost);
  args.push_back(access_arg(a));
  args.push_back(ttl_floor_ms);
  for (const std::string& p : policy_args) args.push_back(p);
  append_command(out, args.data(), args.size());
}

[[nodiscard]] inline bool is_noscript(const redisReply& r) noexcept {
  return r.type == REDIS_REPLY_ERROR && r.len >= 8 && std::string_view(r.str, 8) == "NOSCRIPT";
}

/// The decision in a script's reply.
/// @throws script_error for an error reply or a malformed one
template <class Config>
[[nodiscard]] decision parse_reply(const Config& cfg, const redisReply& r) {
  if (r.type == REDIS_REPLY_ERROR) {
    throw script_error("ratelimit: redis: script failed: " + std::string(r.str, r.len));
  }
  // Five integers, or six when the script reports the decision's limit
  // (compound), or seven when it also reports a repeat (leases).
  if (r.type != REDIS_REPLY_ARRAY || r.elements < 5 || r.elements > 7) {
    throw script_error("ratelimit: redis: unexpected script reply");
  }
  long long v[7] = {};
  for (std::size_t i = 0; i < r.elements; ++i) {
    if (r.element[i]->type != REDIS_REPLY_INTEGER) {
      throw script_error("ratelimit: redis: unexpected script reply element");
    }
    v[i] = r.element[i]->integer;
  }
  // Only a reply a script of this library could give decides a check.
  const long long limit = r.elements >= 6 ? v[5] : cfg.limit();
  const long long far = std::int64_t{1} << 53;
  // A repeat is admitted and records nothing; any other admission records.
  const bool repeat = v[6] == 1;
  const bool ok = (v[0] == 0 || v[0] == 1) && (v[1] == 0 || v[1] == 1) &&
                  (v[6] == 0 || (repeat && v[0] == 1 && v[1] == 0)) &&
                  (v[0] == 0 || v[1] == 1 || repeat) && limit >= 1 && limit <= max_units &&
                  v[2] >= 0 && v[2] <= limit && v[3] >= -1 && v[3] <= far &&
                  // An admission waits 0; a rejection at least 1 us, or never.
                  (v[0] == 1 ? v[3] == 0 : v[3] != 0) && v[4] >= 0 && v[4] <= far;
  if (!ok) {
    std::string got;
    for (std::size_t i = 0; i < r.elements; ++i) {
      got += i == 0 ? "{" : ", ";
      got += std::to_string(v[i]);
    }
    throw script_error("ratelimit: redis: script reply out of range: " + got + "}");
  }
  decision d;
  d.allowed = v[0] != 0;
  d.counted = v[1] != 0;
  d.limit = static_cast<units>(limit);
  d.remaining = static_cast<units>(v[2]);
  d.retry_after = v[3] < 0 ? never : std::chrono::microseconds{v[3]};
  d.reset_after = std::chrono::microseconds{v[4]};
  d.repeat = repeat;
  return d;
}

/// The decision in a reply of a wrapped (request id) script: the policy's
/// reply and a last element, 1 when it is a repeat.
/// @throws script_error for an error reply or a malformed one
template <class Config>
[[nodiscard]] decision parse_reply_once(const Config& cfg, const redisReply& r) {
  if (r.type == REDIS_REPLY_ARRAY && (r.elements == 6 || r.elements == 7)) {
    const redisReply& flag = *r.element[r.elements - 1];
    if (flag.type != REDIS_REPLY_INTEGER || (flag.integer != 0 && flag.integer != 1)) {
      throw script_error("ratelimit: redis: unexpected repeat flag in script reply");
    }
    redisReply policy_part = r;  // a shallow view without the flag; never freed
    policy_part.elements -= 1;
    decision d = parse_reply(cfg, policy_part);
    d.repeat = flag.integer == 1;
    return d;
  }
  if (r.type == REDIS_REPLY_ERROR) return parse_reply(cfg, r);
  throw script_error("ratelimit: redis: unexpected script reply");
}

}  // namespace detail

}  // namespace ratelimit::redis
