// SPDX-License-Identifier: Apache-2.0
// Idempotent checks on Redis: the memory an id costs (MEMORY USAGE of an id
// key, and INFO used_memory over 10,000 keys with and without an id each),
// and sequential round trips of an idempotent check against a plain one,
// alternated in one run, as a ratio.
//
// The server comes from $RATELIMIT_BENCH_REDIS_URL (default
// redis://127.0.0.1:6379); benchmarks/redis/run_request_id.sh starts a
// throwaway one. Usage: ratelimit_request_id_redis_bench [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"

namespace {

using namespace ratelimit;
using clk = std::chrono::steady_clock;

redis::options bench_options(std::string_view prefix) {
  const char* url = std::getenv("RATELIMIT_BENCH_REDIS_URL");
  redis::options o = redis::parse_url(url != nullptr ? url : "redis://127.0.0.1:6379");
  o.pool_size = 1;
  o.command_timeout = std::chrono::milliseconds(2000);
  o.prefix = std::string(prefix);
  return o;
}

long long integer_of(redis::connection& c, std::initializer_list<std::string_view> args) {
  const std::vector<std::string_view> v(args);
  auto r = c.command(v.data(), v.size(), redis::deadline_clock::now() + std::chrono::seconds(5));
  return r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
}

long long used_memory(redis::connection& c) {
  const std::string_view args[] = {"INFO", "memory"};
  auto r = c.command(args, 2, redis::deadline_clock::now() + std::chrono::seconds(5));
  const std::string text(r->str, r->len);
  const auto at = text.find("used_memory:");
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + 12);
}

std::string phone(int i) {
  const std::string digits = std::to_string(1'000'000 + i);
  return "+1555" + std::string(11 - digits.size(), '0') + digits;  // 16 bytes
}

/// A SIP Call-ID and CSeq: 45 bytes.
std::string call_id(int i) {
  return "a84c1f0e-" + std::to_string(100'000 + i) + "@pbx-17.example.net;1 INVITE";
}

template <class Config>
void memory_of(const Config& cfg, const char* label) {
  const redis::options o = bench_options(std::string("rid-mem-") + label + ":");
  redis::redis_store store(o);
  redis::connection c(o);
  const int n = 10'000;
  const auto t = store_time;
  // One id key alone.
  (void)store.apply_once(cfg, phone(0), request_id{call_id(0)}, std::chrono::minutes{15}, t, 1);
  const std::string id_key = redis::detail::request_id_key(
      redis::detail::redis_key<typename Config::policy_type>(o.prefix, phone(0), cfg.name()),
      call_id(0));
  const long long one_id = integer_of(c, {"MEMORY", "USAGE", id_key, "SAMPLES", "0"});
  const long long one_state = integer_of(
      c, {"MEMORY", "USAGE", store.key_for(cfg, phone(0)), "SAMPLES", "0"});
  // 10,000 keys with plain checks, then 10,000 more keys with an id each.
  const long long m0 = used_memory(c);
  for (int i = 1; i <= n; ++i) (void)store.apply(cfg, phone(i), t, 1);
  const long long m1 = used_memory(c);
  for (int i = n + 1; i <= 2 * n; ++i) {
    (void)store.apply_once(cfg, phone(i), request_id{call_id(i)}, std::chrono::minutes{15}, t, 1);
  }
  const long long m2 = used_memory(c);
  std::printf(
      "%-14s MEMORY USAGE: state key %lld B, id key %lld B (16-byte key, 45-byte id); "
      "used_memory per key: plain %.1f B, with one id %.1f B\n",
      label, one_state, one_id, static_cast<double>(m1 - m0) / n, static_cast<double>(m2 - m1) / n);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 11;
  if (argc == 3 && std::string_view(argv[1]) == "--rounds") rounds = std::atoi(argv[2]);
  if (rounds < 1) return 2;
  try {
    memory_of(gcra::config{"10/15min", bucket_options{.name = "bench"}}, "gcra");
    memory_of(fixed_window::config{"10/15min", window_options{.name = "bench"}}, "fixed_window");
    memory_of(sliding_window_log::config{"10/15min", window_options{.name = "bench"}},
              "sliding_log");

    // Sequential round trips, one connection: plain vs idempotent (new ids),
    // 2,000 checks each per round, alternating which goes first.
    const gcra::config cfg{"1000000/h", bucket_options{.name = "bench"}};
    redis::redis_store store(bench_options("rid-rt:"));
    std::vector<double> ratios;
    std::vector<double> plain_us;
    std::vector<double> once_us;
    int next_id = 0;
    for (int r = 0; r < rounds; ++r) {
      const auto plain = [&] {
        const auto start = clk::now();
        for (int i = 0; i < 2000; ++i) (void)store.apply(cfg, phone(i % 100), store_time, 1);
        return std::chrono::duration<double, std::micro>(clk::now() - start).count() / 2000;
      };
      const auto once = [&] {
        const auto start = clk::now();
        for (int i = 0; i < 2000; ++i) {
          (void)store.apply_once(cfg, phone(i % 100), request_id{call_id(next_id++)},
                                 std::chrono::minutes{1}, store_time, 1);
        }
        return std::chrono::duration<double, std::micro>(clk::now() - start).count() / 2000;
      };
      double p = 0;
      double q = 0;
      if (r % 2 == 0) {
        p = plain();
        q = once();
      } else {
        q = once();
        p = plain();
      }
      plain_us.push_back(p);
      once_us.push_back(q);
      ratios.push_back(q / p);
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf(
        "sequential round trips (gcra, 100 keys, %d rounds, medians): plain %.1f us, "
        "idempotent %.1f us, ratio %.2fx\n",
        rounds, median(plain_us), median(once_us), median(ratios));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ratelimit_request_id_redis_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
