// SPDX-License-Identifier: Apache-2.0
// One check on the wire: the EVALSHA/EVAL command of a policy's script and
// the decision read back from its reply (only a reply one of our scripts
// could give decides a check).
#pragma once

#include <hiredis/hiredis.h>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/keys.hpp"
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

/// Appends one RESP bulk string (`$<length>\r\n<bytes>\r\n`) to `out`.
inline void append_bulk(std::string& out, std::string_view arg) {
  char len[24];
  const auto end = std::to_chars(len, len + sizeof len, arg.size()).ptr;
  out += '$';
  out.append(len, end);
  out += "\r\n";
  out.append(arg);
  out += "\r\n";
}

/// Appends `v` as a RESP bulk string in decimal, as std::to_string writes it.
inline void append_bulk(std::string& out, long long v) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, v).ptr;
  append_bulk(out, std::string_view(digits, static_cast<std::size_t>(end - digits)));
}

/// Appends the Redis key of `key` (redis_key<P>) as a RESP bulk string,
/// written straight into `out` for the usual form; the other form (a user
/// key starting with `}`) and a refused prefix go through redis_key<P>.
/// @throws std::invalid_argument as redis_key<P>
template <class P>
void append_key_bulk(std::string& out, std::string_view prefix, std::string_view key,
                     std::string_view limiter_name) {
  const std::string_view name = script_for<P>::name;
  if (!has_empty_hash_tag(prefix)) {
    const std::size_t mark = out.size();
    char len[24];
    const auto end = std::to_chars(
                         len, len + sizeof len,
                         prefix.size() + key.size() + name.size() + limiter_name.size() + 4)
                         .ptr;
    out += '$';
    out.append(len, end);
    out += "\r\n";
    const std::size_t at = out.size();
    out.append(prefix);
    out += '{';
    out.append(key);
    out += "}:";
    out.append(name);
    out += ':';
    out.append(limiter_name);
    if (!has_empty_hash_tag(std::string_view(out).substr(at))) {
      out += "\r\n";
      return;
    }
    out.resize(mark);
  }
  append_bulk(out, redis_key<P>(prefix, key, limiter_name));
}

/// Appends EVALSHA (or EVAL) of P's script for one check of `key`, as
/// append_eval with redis_keys(prefix, cfg, key) writes it, byte for byte,
/// without allocating once `out` and `args` have grown to a check's size:
/// the key is written in place (see append_key_bulk) and `args` (cleared
/// first) is reused for the policy's arguments. `time` is nullopt for
/// server time.
/// @throws std::invalid_argument as redis_keys
template <class Config>
void append_single_eval(std::string& out, std::vector<std::string>& args, bool with_text,
                        std::string_view prefix, const Config& cfg, std::string_view key,
                        std::optional<timestamp> time, units cost, access a,
                        std::string_view ttl_floor_ms) {
  using P = typename Config::policy_type;
  args.clear();
  script_for<P>::append_args(cfg, args);
  if constexpr (requires(std::vector<std::string>& v) {
                  script_for<P>::append_keys(cfg, std::string_view(), v);
                }) {
    const std::vector<std::string> keys = redis_keys(prefix, cfg, key);
    append_eval<P>(out, with_text, keys, time ? std::to_string(time->count()) : std::string(),
                   std::to_string(cost), a, args, ttl_floor_ms);
  } else {
    char head[24];
    const auto end = std::to_chars(head, head + sizeof head, 8 + args.size()).ptr;
    out += '*';
    out.append(head, end);
    out += "\r\n";
    append_bulk(out, with_text ? std::string_view("EVAL") : std::string_view("EVALSHA"));
    append_bulk(out, with_text ? script_for<P>::text : std::string_view(script_sha<P>()));
    append_bulk(out, "1");
    append_key_bulk<P>(out, prefix, key, cfg.name());
    if (time) {
      append_bulk(out, static_cast<long long>(time->count()));
    } else {
      append_bulk(out, std::string_view());
    }
    append_bulk(out, static_cast<long long>(cost));
    append_bulk(out, access_arg(a));
    append_bulk(out, ttl_floor_ms);
    for (const std::string& p : args) append_bulk(out, p);
  }
}

[[nodiscard]] inline bool is_noscript(const redisReply& r) noexcept {
  return r.type == REDIS_REPLY_ERROR && r.len >= 8 && std::string_view(r.str, 8) == "NOSCRIPT";
}

template <class Config>
[[nodiscard]] decision decision_of(const Config& cfg, const long long* values, std::size_t n);

/// The decision in a script's reply.
/// @throws script_error for an error reply or a malformed one
template <class Config>
[[nodiscard]] decision parse_reply(const Config& cfg, const redisReply& r) {
  if (r.type == REDIS_REPLY_ERROR) {
    throw script_error("ratelimit: redis: script failed: " + detail::reply_text(r));
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
  return decision_of(cfg, v, r.elements);
}

/// The decision in a script's reply of `n` integers `v` (5 to 7, as
/// parse_reply reads them from an array reply).
/// @throws script_error for values no script of this library gives, or a
///   count outside 5..7
template <class Config>
[[nodiscard]] decision decision_of(const Config& cfg, const long long* values, std::size_t n) {
  if (n < 5 || n > 7) throw script_error("ratelimit: redis: unexpected script reply");
  long long v[7] = {};
  for (std::size_t i = 0; i < n; ++i) v[i] = values[i];
  const std::size_t elements = n;
  // Only a reply a script of this library could give decides a check.
  const long long limit = elements >= 6 ? v[5] : cfg.limit();
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
    for (std::size_t i = 0; i < elements; ++i) {
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
