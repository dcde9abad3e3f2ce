// SPDX-License-Identifier: Apache-2.0
// Sequential GCRA checks over TLS against plain TCP on the same server:
// checks per second and p50/p99 latency of each, and their ratios. The two
// run in alternating rounds so that noise on a shared machine hits both.
//
// Usage: ratelimit_tls_bench PLAIN_URL TLS_URL [CHECKS_PER_ROUND] [ROUNDS]
// (benchmarks/redis/run_tls.sh makes certificates, starts a server and runs it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"

namespace {

using namespace ratelimit;
using bench_clock = std::chrono::steady_clock;

struct result {
  std::vector<double> latency_us;  ///< every check
  double seconds = 0;
};

/// `n` sequential checks on distinct keys, timed one by one.
void round(redis::redis_store& store, int n, result& out) {
  const gcra::config cfg("10/15min", bucket_options{.name = "bench"});
  char key[32];
  const auto start = bench_clock::now();
  for (int i = 0; i < n; ++i) {
    std::snprintf(key, sizeof key, "+1555%011d", i % 10'000);
    const auto t = bench_clock::now();
    (void)store.apply(cfg, key, store_time, 1, access::consume);
    out.latency_us.push_back(
        std::chrono::duration<double, std::micro>(bench_clock::now() - t).count());
  }
  out.seconds += std::chrono::duration<double>(bench_clock::now() - start).count();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PLAIN_URL TLS_URL [CHECKS_PER_ROUND] [ROUNDS]\n", argv[0]);
    return 2;
  }
  const int n = argc > 3 ? std::atoi(argv[3]) : 20'000;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  redis::options plain_o = redis::parse_url(argv[1]);
  redis::options tls_o = redis::parse_url(argv[2]);
  for (redis::options* o : {&plain_o, &tls_o}) {
    o->pool_size = 1;
    o->command_timeout = std::chrono::milliseconds(2000);
    o->connect_timeout = std::chrono::milliseconds(2000);
    o->prefix = "bench:";
  }
  redis::redis_store plain(plain_o);
  redis::redis_store tls(tls_o);
  result p;
  result t;
  round(plain, 1000, p);  // warm up: connections, script load
  round(tls, 1000, t);
  p = {};
  t = {};
  for (int r = 0; r < rounds; ++r) {
    round(plain, n, p);
    round(tls, n, t);
  }
  const auto line = [](const char* name, const result& x) {
    std::printf("%-6s %9.0f checks/s  p50 %6.1f us  p99 %6.1f us\n", name,
                static_cast<double>(x.latency_us.size()) / x.seconds, percentile(x.latency_us, 0.5),
                percentile(x.latency_us, 0.99));
  };
  line("plain", p);
  line("tls", t);
  std::printf(
      "tls/plain: throughput %.2fx, p50 latency %.2fx, p99 latency %.2fx (%d x %d checks each)\n",
      (static_cast<double>(t.latency_us.size()) / t.seconds) /
          (static_cast<double>(p.latency_us.size()) / p.seconds),
      percentile(t.latency_us, 0.5) / percentile(p.latency_us, 0.5),
      percentile(t.latency_us, 0.99) / percentile(p.latency_us, 0.99), rounds, n);
  return 0;
}
