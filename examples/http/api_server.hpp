// SPDX-License-Identifier: Apache-2.0
// The HTTP API example's server: API token -> tier -> limiter, 429s and RateLimit headers, Idempotency-Key.
//
// Design. The library's `tiered_limiter` maps key -> tier -> config, but it
// has no idempotent check (`try_acquire(key, request_id)` is `limiter`'s),
// and this server needs both. Its tiers are fixed at start-up, so what
// `tiered_limiter` adds (tiers changed at run time, a key's state carried
// over when its tier changes) is not needed here. So the server keeps one
// `ratelimit::limiter` per tier, each with the tier's name as its limiter
// name, all over one store (one memory_store each, or copies of one Redis
// handle, which share its connection pool): a token's tier picks the
// limiter, and the limiter's own idempotent check handles Idempotency-Key
// (an in-process id table, or the id inside the one Redis script).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "bounded_pool.hpp"
#include "ratelimit/http_headers.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/request_id.hpp"

namespace http_example {

using ratelimit::decision;
using ratelimit::timestamp;

/// Longest API token accepted, in bytes.
inline constexpr std::size_t max_token_bytes = 128;

/// Longest request body accepted, in bytes (the API reads none; a longer one
/// gets 413 from httplib, whose default would read any length into memory).
inline constexpr std::size_t max_body_bytes = 64 * 1024;

/// One tier: its name (also the limiter's name and the policy name in the
/// RateLimit headers) and its rate, a fixed window.
struct tier_spec {
  std::string name;
  ratelimit::rate rate;
};

/// What the server limits, and how.
struct server_config {
  /// The tiers; the built-in ones unless the command line names others.
  std::vector<tier_spec> tiers = {{"free", ratelimit::rate::parse("5/1min")},
                                  {"pro", ratelimit::rate::parse("100/1min")}};
  /// API token -> tier name.
  std::map<std::string, std::string, std::less<>> tokens = {{"demo-free", "free"},
                                                            {"demo-pro", "pro"}};
  /// The tier of a token not in `tokens`; empty: such a token gets 401.
  std::string default_tier;
  /// No limiter at all (the benchmark's baseline): every valid request gets
  /// 200 and no RateLimit headers.
  bool limiter_off = false;
};

/// Why a request was refused before the limiter saw it: 400 or 401, and a
/// message naming the problem.
struct refusal {
  int status = 400;
  std::string message;
};

/// "byte 0x01 at offset 3" for the first byte of `s` outside `ok`, or empty.
template <class Ok>
[[nodiscard]] std::string first_bad_byte(std::string_view s, Ok ok) {
  static constexpr char hex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (!ok(b)) {
      return std::string("byte 0x") + hex[b >> 4] + hex[b & 0xF] + " at offset " +
             std::to_string(i);
    }
  }
  return {};
}

/// The API token of an `Authorization` header value: `Bearer <token>`
/// (scheme case-insensitive, then one or more spaces), the token 1..128
/// bytes of the RFC 6750 token characters A-Z a-z 0-9 - . _ ~ + / =.
/// @return the token, or the refusal naming what is wrong
[[nodiscard]] inline std::variant<std::string_view, refusal> bearer_token(
    std::string_view authorization) {
  constexpr std::string_view scheme = "bearer ";
  bool is_bearer = authorization.size() > scheme.size();
  for (std::size_t i = 0; is_bearer && i < scheme.size(); ++i) {
    const char c = authorization[i];
    is_bearer = (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) == scheme[i];
  }
  if (!is_bearer) {
    return refusal{400, "Authorization header must be \"Bearer <token>\""};
  }
  std::string_view token = authorization.substr(scheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.empty()) return refusal{400, "API token is empty"};
  if (token.size() > max_token_bytes) {
    return refusal{400, "API token of " + std::to_string(token.size()) +
                            " bytes exceeds the maximum of " + std::to_string(max_token_bytes)};
  }
  const std::string bad = first_bad_byte(token, [](unsigned char b) {
    return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '-' ||
           b == '.' || b == '_' || b == '~' || b == '+' || b == '/' || b == '=';
  });
  if (!bad.empty()) return refusal{400, "API token holds a bad " + bad};
  return token;
}

/// Checks an `Idempotency-Key` value: 1..256 bytes (the library's request id
/// limit) of visible ASCII (0x21..0x7E), taken as it is.
/// @return empty when good, else the message naming what is wrong
[[nodiscard]] inline std::string idempotency_key_problem(std::string_view key) {
  if (key.empty()) return "Idempotency-Key is empty";
  if (key.size() > ratelimit::max_request_id_bytes) {
    return "Idempotency-Key of " + std::to_string(key.size()) + " bytes exceeds the maximum of " +
           std::to_string(ratelimit::max_request_id_bytes);
  }
  const std::string bad = first_bad_byte(key, [](unsigned char b) { return b > 0x20 && b < 0x7F; });
  return bad.empty() ? std::string() : "Idempotency-Key holds a bad " + bad;
}

/// The per-tier limiters, whatever their store.
class tier_limits {
 public:
  virtual ~tier_limits() = default;
  /// Decides one request of `token` in tier number `tier` at `now`; with an
  /// Idempotency-Key, a retry gets the first decision again.
  virtual decision check(std::size_t tier, std::string_view token,
                         std::optional<std::string_view> idempotency_key, timestamp now) = 0;
};

/// One `limiter<fixed_window, Store>` per tier; `make_store()` gives each its store.
template <class Store>
class tier_limits_on final : public tier_limits {
 public:
  using limiter_type = ratelimit::limiter<ratelimit::fixed_window, Store>;

  /// @throws std::invalid_argument for a bad tier name (the limiter name rules)
  template <class MakeStore>
  tier_limits_on(const std::vector<tier_spec>& tiers, MakeStore make_store) {
    for (const tier_spec& t : tiers) {
      limiters_.push_back(std::make_unique<limiter_type>(
          typename limiter_type::config_type(t.rate, ratelimit::window_options{.name = t.name}),
          make_store()));
    }
  }

  decision check(std::size_t tier, std::string_view token,
                 std::optional<std::string_view> idempotency_key, timestamp now) override {
    limiter_type& l = *limiters_.at(tier);
    if (idempotency_key) return l.try_acquire(token, ratelimit::request_id{*idempotency_key}, now);
    return l.try_acquire(token, now);
  }

 private:
  std::vector<std::unique_ptr<limiter_type>> limiters_;
};

/// The server: routes, request checks, counters. Serve with `http().listen...`.
///
/// Routes: `GET|POST /v1/<anything>` is the limited API (200 with a small JSON
/// body, or 429); `GET /healthz` is not limited.
class api_server {
 public:
  /// The time of a check, microseconds since the Unix epoch (tests pass their own).
  using time_source = std::function<timestamp()>;

  /// @param limits null only when `cfg.limiter_off`
  /// @throws std::invalid_argument for a token naming no tier, or an unknown default tier
  api_server(server_config cfg, std::unique_ptr<tier_limits> limits, time_source now)
      : cfg_(std::move(cfg)), limits_(std::move(limits)), now_(std::move(now)) {
    for (const tier_spec& t : cfg_.tiers) {
      if (tier_index(t.name, "tier") != policies_.size()) {
        throw std::invalid_argument("tier \"" + t.name + "\" is defined twice");
      }
      policies_.push_back(ratelimit::http::policy_info{t.name, t.rate.limit(), t.rate.period()});
    }
    for (const auto& [token, tier] : cfg_.tokens) {
      token_tier_.emplace(token, tier_index(tier, "token \"" + token + "\""));
    }
    if (!cfg_.default_tier.empty()) default_tier_ = tier_index(cfg_.default_tier, "default tier");
    if (!cfg_.limiter_off && !limits_) throw std::invalid_argument("no limiter given");

    const auto api = [this](const httplib::Request& req, httplib::Response& res) {
      handle(req, res);
    };
    // Up to 100 requests per kept-alive connection (httplib's default is 5).
    http_.set_keep_alive_max_count(100);
    http_.set_payload_max_length(max_body_bytes);
    http_.Get("/v1/.*", api);
    http_.Post("/v1/.*", api);
    http_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
  }

  [[nodiscard]] httplib::Server& http() noexcept { return http_; }

  /// Serves with `threads` workers and at most `max_waiting` accepted
  /// connections waiting for one (see bounded_pool). Call before listening.
  void set_workers(std::size_t threads, std::size_t max_waiting) {
    http_.new_task_queue = [this, threads, max_waiting] {
      closing_.store(false, std::memory_order_release);
      return new bounded_pool(threads, max_waiting, closing_);
    };
  }

  /// Stops serving: http().stop(), and an accept loop waiting for room in
  /// the pool waits no more.
  void stop() {
    closing_.store(true, std::memory_order_release);
    http_.stop();
  }

  /// Requests admitted, rejected with 429, refused with 400/401 (and 503: store down or full).
  [[nodiscard]] std::uint64_t admitted() const noexcept { return admitted_.load(); }
  [[nodiscard]] std::uint64_t limited() const noexcept { return limited_.load(); }
  [[nodiscard]] std::uint64_t refused() const noexcept { return refused_.load(); }

  /// Answers one API request (the handler of the /v1/ routes).
  void handle(const httplib::Request& req, httplib::Response& res) {
    // 1. The token and its tier.
    const auto [auth_begin, auth_end] = req.headers.equal_range("Authorization");
    if (auth_begin == auth_end || std::next(auth_begin) != auth_end) {
      return refuse(res, {400, auth_begin != auth_end
                                   ? "Authorization header sent more than once"
                                   : "missing API token: send \"Authorization: Bearer <token>\""});
    }
    // The field's value from the header map itself: get_header_value returns
    // it through a C string, which would cut it at a NUL byte.
    const std::string& authorization = auth_begin->second;
    const auto token_or = bearer_token(authorization);
    if (const auto* r = std::get_if<refusal>(&token_or)) return refuse(res, *r);
    const std::string_view token = std::get<std::string_view>(token_or);
    std::size_t tier = default_tier_;
    if (const auto it = token_tier_.find(token); it != token_tier_.end()) tier = it->second;
    if (tier == no_tier) return refuse(res, {401, "unknown API token"});

    // 2. The Idempotency-Key, if any.
    std::optional<std::string> idempotency_key;
    const auto [key_begin, key_end] = req.headers.equal_range("Idempotency-Key");
    if (key_begin != key_end && std::next(key_begin) != key_end) {
      return refuse(res, {400, "Idempotency-Key header sent more than once"});
    } else if (key_begin != key_end) {
      idempotency_key = key_begin->second;  // all its bytes, as above
      if (std::string why = idempotency_key_problem(*idempotency_key); !why.empty()) {
        return refuse(res, {400, std::move(why)});
      }
    }

    if (cfg_.limiter_off) {
      admitted_.fetch_add(1, std::memory_order_relaxed);
      return reply(res, 200, R"({"ok":true,"tier":")" + cfg_.tiers[tier].name + "\"}\n");
    }

    // 3. The limiter's decision, as status and headers.
    decision d;
    try {
      d = limits_->check(tier, token, idempotency_key, now_());
    } catch (const std::invalid_argument& e) {  // the library's input checks (already made above)
      return refuse(res, {400, e.what()});
    } catch (const std::exception& e) {  // the store failed (Redis down, timeout)
      refused_.fetch_add(1, std::memory_order_relaxed);
      return reply(res, 503,
                   R"({"error":"rate limit store unavailable"})"
                   "\n");
    }
    // A store full of keys (the memory store's cap, fail_closed): not the
    // token's limit, so no 429 (its Retry-After would be 0) but a 503.
    if (d.source == ratelimit::decision_source::fail_closed) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return reply(res, 503,
                   R"({"error":"rate limit store full"})"
                   "\n");
    }
    // The IETF fields and Retry-After (not the older X-RateLimit-* trio).
    for (ratelimit::http::header& h :
         ratelimit::http::headers(d, policies_[tier], {.x_ratelimit = false})) {
      res.set_header(h.name, h.value);
    }
    const std::string repeat = d.repeat ? "true" : "false";
    if (!d.allowed) {
      limited_.fetch_add(1, std::memory_order_relaxed);
      return reply(res, 429, R"({"error":"rate limited","repeat":)" + repeat + "}\n");
    }
    admitted_.fetch_add(1, std::memory_order_relaxed);
    reply(res, 200,
          R"({"ok":true,"tier":")" + cfg_.tiers[tier].name + R"(","repeat":)" + repeat + "}\n");
  }

 private:
  static constexpr std::size_t no_tier = static_cast<std::size_t>(-1);

  std::atomic<bool> closing_{false};  ///< see stop()

  [[nodiscard]] std::size_t tier_index(std::string_view name, const std::string& who) const {
    for (std::size_t i = 0; i < cfg_.tiers.size(); ++i) {
      if (cfg_.tiers[i].name == name) return i;
    }
    throw std::invalid_argument(who + " names tier \"" + std::string(name) +
                                "\", which is not defined");
  }

  static void reply(httplib::Response& res, int status, std::string body) {
    res.status = status;
    res.set_content(std::move(body), "application/json");
  }

  void refuse(httplib::Response& res, const refusal& r) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    // The message holds no byte of the request that is not printable
    // (bad bytes are named by value), so it is safe to echo in JSON.
    std::string quoted;
    for (const char c : r.message) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    reply(res, r.status, R"({"error":")" + quoted + "\"}\n");
  }

  server_config cfg_;
  std::unique_ptr<tier_limits> limits_;
  time_source now_;
  std::vector<ratelimit::http::policy_info> policies_;
  std::map<std::string, std::size_t, std::less<>> token_tier_;
  std::size_t default_tier_ = no_tier;
  httplib::Server http_;
  std::atomic<std::uint64_t> admitted_{0};
  std::atomic<std::uint64_t> limited_{0};
  std::atomic<std::uint64_t> refused_{0};
};

}  // namespace http_example
