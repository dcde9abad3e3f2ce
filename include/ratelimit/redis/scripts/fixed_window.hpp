// SPDX-License-Identifier: Apache-2.0
// Lua script of the fixed-window policy (policy/fixed_window.hpp, bit for bit).
//
// State: one string "<window index>:<count>". Its expiry is set only when a
// window's first units are recorded (SET ... PX end-of-window), and kept with
// KEEPTTL afterwards, so calling again never extends a window.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

template <>
struct script_for<fixed_window> {
  static constexpr std::string_view name = fixed_window::name;
  // ARGV[5] = period us, ARGV[6] = limit, ARGV[7] = count_rejected (0/1).
  static constexpr std::string_view text = RATELIMIT_REDIS_LUA_PRELUDE R"lua(
local W = tonumber(ARGV[5])
local limit = tonumber(ARGV[6])
local count_rejected = ARGV[7] == '1'
local sw, sn = 0, 0
local raw = redis.call('GET', key)
if raw then
  local p = string.find(raw, ':', 1, true)
  sw = tonumber(string.sub(raw, 1, p - 1))
  sn = tonumber(string.sub(raw, p + 1))
end
if sn > 0 and t < sw * W then t = sw * W end
local k = fdiv(t, W)
local stop = (k + 1) * W
local same = sn > 0 and sw == k
local n = 0
if same then n = sn end
local allowed = n + cost <= limit
local counted = 0
if allowed or count_rejected then
  n = n + cost
  if n > CEILING then n = CEILING end
  counted = 1
  if not peek then
    local v = int(k) .. ':' .. int(n)
    if same then
      redis.call('SET', key, v, 'KEEPTTL')
    else
      redis.call('SET', key, v, 'PX', ttl(stop - t))
    end
  end
end
local remaining = limit - n
if remaining < 0 then remaining = 0 end
local retry = 0
if not allowed then
  if cost > limit then retry = -1 else retry = stop - t end
end
local reset = 0
if n > 0 then reset = stop - t end
return {allowed and 1 or 0, counted, remaining, retry, reset}
)lua";

  static void append_args(const fixed_window::config& cfg, std::vector<std::string>& out) {
    out.push_back(std::to_string(cfg.period_us()));
    out.push_back(std::to_string(cfg.limit()));
    out.push_back(cfg.count_rejected() ? "1" : "0");
  }

  static fixed_window::config scaled(const fixed_window::config& cfg, units divisor) {
    return fixed_window::config(
        rate(detail::scaled_limit(cfg.limit(), divisor), cfg.get_rate().period()),
        window_options{cfg.count_rejected()});
  }
};

}  // namespace ratelimit::redis
