// SPDX-License-Identifier: Apache-2.0
// What redis_store and cluster_store share about one check, so that the two
// stores cannot drift apart: a batch split into the columns their batch
// paths take, the command of one multiplexed check, a decision handed to an
// async check's handler, and a check without an answer decided by the
// failure policy and handed on.
#pragma once

#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/redis/degrader.hpp"
#include "ratelimit/redis/script_call.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/redis/stats.hpp"

namespace ratelimit::redis::detail {

/// The keys, costs and times of a batch's items, in their order.
struct batch_columns {
  std::vector<std::string_view> keys;
  std::vector<units> costs;
  std::vector<timestamp> times;  ///< empty when the batch runs on server time
};

/// Splits `items` (each with `key`, `cost` and `now`) into columns; the
/// keys view the items' keys.
/// @param server_time leave `times` empty (the items' `now` is ignored)
/// @throws std::bad_alloc
template <class Item>
[[nodiscard]] batch_columns split_batch(std::span<const Item> items, bool server_time) {
  batch_columns c;
  c.keys.reserve(items.size());
  c.costs.reserve(items.size());
  if (!server_time) c.times.reserve(items.size());
  for (const Item& it : items) {
    c.keys.push_back(it.key);
    c.costs.push_back(it.cost);
    if (!server_time) c.times.push_back(it.now);
  }
  return c;
}

/// Writes into `bytes` (cleared first) the EVALSHA of one check of `keys`,
/// or with `with_text` the EVAL carrying the script's text: `now` (nullopt
/// for server time, which also takes a TTL floor of 0 instead of
/// `floor_ms`), `cost` and `a`, with the policy's arguments from `cfg`.
/// @throws std::bad_alloc
template <class Config>
void write_check_command(std::string& bytes, bool with_text, const Config& cfg,
                         const std::vector<std::string>& keys, std::optional<timestamp> now,
                         units cost, access a, std::string_view floor_ms) {
  using P = typename Config::policy_type;
  std::vector<std::string> policy_args;
  script_for<P>::append_args(cfg, policy_args);
  const std::string time_arg = now ? std::to_string(now->count()) : std::string();
  const std::string cost_arg = std::to_string(cost);
  const std::string_view floor = now ? floor_ms : std::string_view("0");
  bytes.clear();
  bytes.reserve(with_text ? script_for<P>::text.size() + 256 : 256);
  append_eval<P>(bytes, with_text, keys, time_arg, cost_arg, a, policy_args, floor);
}

/// Calls `handler(d, e)`; what it throws is dropped (it runs on an I/O
/// thread, or inline where the caller expects no exception).
template <class Handler>
void call_handler(Handler& handler, const decision& d, std::exception_ptr e) noexcept {
  try {
    handler(d, std::move(e));
  } catch (...) {
  }
}

/// Has the failure policy decide a check that got no answer (`error`, not
/// counted here) and hands the outcome to `deliver(decision, exception_ptr)`:
/// the policy's decision with no error, or decision{} with what the policy
/// threw (throw_error's error, std::bad_alloc).
template <class Config, class Deliver>
void degrade_and_deliver(degrader& dg, counters& stats, const Config& cfg, std::string_view key,
                         std::optional<timestamp> now, units cost, access a,
                         const std::exception_ptr& error, Deliver&& deliver) noexcept {
  decision d;
  try {
    d = dg.degrade(stats, cfg, key, now, cost, a, error);
  } catch (...) {
    deliver(decision{}, std::current_exception());
    return;
  }
  deliver(d, nullptr);
}

}  // namespace ratelimit::redis::detail
