// SPDX-License-Identifier: Apache-2.0
// Redis key naming: which Redis keys one check of one limiter touches, and
// why no two (user key, policy, limiter name) ever share one. Also the
// validation of what a check sends.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/redis/cluster/hash_slot.hpp"
#include "ratelimit/redis/scripts/request_id.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

namespace detail {

/// Validates a check's key and cost.
/// @throws std::invalid_argument
inline void check_input(std::string_view key, units cost) {
  ratelimit::detail::check_key(key);
  ratelimit::detail::check_cost(cost);
}

/// Validates a caller-supplied time for the scripts (see max_script_time).
/// @throws std::invalid_argument
inline void check_script_time(timestamp now) {
  if (now.count() < 0 || now > max_script_time) {
    throw std::invalid_argument("ratelimit: redis: time " + std::to_string(now.count()) +
                                "us is outside 0.." + std::to_string(max_script_time.count()) +
                                "us (Lua numbers are exact only below 2^53)");
  }
}

/// True when Redis would find an empty hash tag in `k` (its first `{` is
/// directly followed by `}`) and so hash the whole key instead.
[[nodiscard]] inline bool has_empty_hash_tag(std::string_view k) noexcept {
  const std::size_t open = k.find('{');
  return open != std::string_view::npos && open + 1 < k.size() && k[open + 1] == '}';
}

/// Refuses a key prefix in which Redis would find an empty hash tag (its
/// first `{` directly followed by `}`): the keys of one user key could then
/// land in different cluster slots. Reads the prefix only; builds no key.
/// @throws std::invalid_argument naming the prefix
inline void check_prefix(std::string_view prefix) {
  if (has_empty_hash_tag(prefix)) {
    throw std::invalid_argument("ratelimit: redis key prefix \"" + std::string(prefix) +
                                "\" holds an empty hash tag {}: keys of one user key could "
                                "not share a cluster slot");
  }
}

/// The Redis key of `key` for policy P and limiter `name`:
/// `<prefix>{<key>}:<policy>:<name>`, so that every key of one user key
/// shares its hash tag (one cluster slot).
///
/// A user key starting with `}` would leave that tag empty: Redis would hash
/// each whole key, and the keys of one compound check would land in different
/// slots. Such user keys get a tag of their own,
/// `<prefix>{~<slot of key>}{<key>}:<policy>:<name>!`.
///
/// Why two (key, policy, name) under one prefix never share a key (two
/// prefixes may: "p" with key "{x" and "p{" with key "x"), compound sub-keys
/// (`<this>:<i>:<sub-policy>`, scripts/compound.hpp) included: names are
/// [A-Za-z0-9_.-]+ and policy names [a-z_]+, so neither holds ':', '{', '}'
/// or '!'. Read a key (after the store's fixed prefix) from its end: when the
/// second-to-last ':'-segment is digits it is a compound sub-key (no policy
/// name is digits) and the segments before are `<name>[!]` and `compound`;
/// otherwise the last two segments are `<policy>` and `<name>[!]`. A trailing
/// `!` on the name marks the second form (no name ends in `!`). The user key
/// is then everything between the first `{` (usual form) or the second `{`
/// (second form, whose `~<slot>` is a function of the key) and the `}` just
/// before `:<policy>`; user keys may hold any byte, but the parse never
/// searches inside them. So each component is recovered from the key.
/// @throws std::invalid_argument for a prefix whose first `{` is followed by `}` (check_prefix)
template <class P>
[[nodiscard]] std::string redis_key(std::string_view prefix, std::string_view key,
                                    std::string_view limiter_name) {
  check_prefix(prefix);
  std::string k;
  const std::string_view name = script_for<P>::name;
  k.reserve(prefix.size() + key.size() + name.size() + limiter_name.size() + 14);
  k.append(prefix);
  k += '{';
  k.append(key);
  k += "}:";
  k.append(name);
  k += ':';
  k.append(limiter_name);
  if (!has_empty_hash_tag(k)) return k;
  k.clear();
  k.append(prefix);
  k += "{~";
  k += std::to_string(key_slot(key));
  k += "}{";
  k.append(key);
  k += "}:";
  k.append(name);
  k += ':';
  k.append(limiter_name);
  k += '!';
  return k;
}

/// Refuses an unnamed config: Redis state outlives processes and deploys, and
/// two unnamed limiters of one policy would read and write one key.
/// @throws std::invalid_argument when `cfg.name()` is empty
template <class Config>
void check_named(const Config& cfg) {
  if (cfg.name().empty()) {
    throw std::invalid_argument(
        "ratelimit: redis: a limiter needs a name to keep its state in Redis (it is part of "
        "the key, so that two limiters never share state); give it one, e.g. "
        "fixed_window::config{\"10/s\", window_options{.name = \"calls\"}}, "
        "gcra::config{\"10/s\", bucket_options{.name = \"calls\"}} or, for a compound, "
        "compound_options{.name = \"calls\"}");
  }
}

/// The Redis keys of one check: `redis_key<P>` alone, or, when script_for<P>
/// declares `append_keys(cfg, base, out)` (compound), the keys it derives from it.
template <class Config>
[[nodiscard]] std::vector<std::string> redis_keys(std::string_view prefix, const Config& cfg,
                                                  std::string_view key) {
  using P = typename Config::policy_type;
  check_named(cfg);
  std::string base = redis_key<P>(prefix, key, cfg.name());
  std::vector<std::string> out;
  if constexpr (requires { script_for<P>::append_keys(cfg, base, out); }) {
    script_for<P>::append_keys(cfg, base, out);
  } else {
    out.push_back(std::move(base));
  }
  return out;
}

/// The policy name and its script arguments, without the limiter's name:
/// what the state's meaning depends on. The scripts store the arguments part
/// (joined by ',') with the state as its fingerprint.
template <class Config>
[[nodiscard]] std::string config_id(const Config& cfg) {
  using P = typename Config::policy_type;
  std::vector<std::string> args;
  script_for<P>::append_args(cfg, args);
  std::string id(script_for<P>::name);
  for (const std::string& a : args) {
    id += ':';
    id += a;
  }
  return id;
}

/// The base of the id key of `key` (the policy key, for a compound its base).
template <class Config>
[[nodiscard]] std::string once_key(std::string_view prefix, const Config& cfg, std::string_view key,
                                   std::string_view id) {
  return request_id_key(redis_key<typename Config::policy_type>(prefix, key, cfg.name()), id);
}

}  // namespace detail

}  // namespace ratelimit::redis
