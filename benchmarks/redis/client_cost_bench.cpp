// SPDX-License-Identifier: Apache-2.0
// What one sequential Redis check costs the client outside the round trip,
// piece by piece (no server needed): formatting the EVALSHA command and the
// key, reading the reply, the fork guard, the clock, the breaker and the
// counters, and the system calls a check makes. Each row is one piece, once.
// See docs/redis.md ("Where a sequential check's time goes").
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"

namespace {

using namespace ratelimit;

const gcra::config& cfg() {
  static const gcra::config c("10/15min", bucket_options{.name = "bench"});
  return c;
}
constexpr std::string_view key = "+15550000001234";
constexpr std::string_view prefix = "bench:";
/// The usual reply of the GCRA script.
constexpr std::string_view reply = "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:90000000\r\n";

// The command as the batch path formats it (run_batch_impl for one key):
// keys and arguments in new vectors and strings, then append_eval.
void BM_Format_BatchPath(benchmark::State& state) {
  for (auto _ : state) {
    const std::vector<std::string> keys = redis::detail::redis_keys(prefix, cfg(), key);
    std::vector<std::string> args;
    redis::script_for<gcra>::append_args(cfg(), args);
    std::string out;
    redis::detail::append_eval<gcra>(out, false, keys, std::string(), std::to_string(1),
                                     access::consume, args, "0");
    benchmark::DoNotOptimize(out.data());
  }
}

// The same bytes written in place into the connection's reused buffers.
void BM_Format_InPlace(benchmark::State& state) {
  std::string out;
  std::vector<std::string> args;
  for (auto _ : state) {
    out.clear();
    redis::detail::append_single_eval(out, args, false, prefix, cfg(), key, std::nullopt, 1,
                                      access::consume, "0");
    benchmark::DoNotOptimize(out.data());
  }
}

// The reply through hiredis's reader (one array and five integer objects,
// allocated and freed) and parse_reply.
void BM_Reply_Hiredis(benchmark::State& state) {
  redisReader* r = redisReaderCreate();
  for (auto _ : state) {
    void* got = nullptr;
    (void)redisReaderFeed(r, reply.data(), reply.size());
    (void)redisReaderGetReply(r, &got);
    benchmark::DoNotOptimize(redis::detail::parse_reply(cfg(), *static_cast<redisReply*>(got)));
    freeReplyObject(got);
  }
  redisReaderFree(r);
}

// The reply's integers read from the bytes, then decision_of.
void BM_Reply_InPlace(benchmark::State& state) {
  for (auto _ : state) {
    redis::script_reply out;
    benchmark::DoNotOptimize(redis::detail::parse_integer_array(reply, out));
    benchmark::DoNotOptimize(redis::detail::decision_of(cfg(), out.values, out.count));
  }
}

// The fork guard: getpid() is a system call.
void BM_ForkGuard(benchmark::State& state) {
  const pid_t me = ::getpid();
  for (auto _ : state) redis::detail::check_same_process(me);
}

void BM_SteadyClock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(redis::deadline_clock::now());
}

// The breaker's enter() and success() and the store counter of one check.
void BM_BreakerAndCounters(benchmark::State& state) {
  const redis::options o;
  redis::detail::breaker b(o);
  std::atomic<std::uint64_t> stored{0};
  for (auto _ : state) {
    benchmark::DoNotOptimize(b.enter());
    b.success();
    stored.fetch_add(1, std::memory_order_relaxed);
  }
}

// The system calls of a check's connection that do not move its bytes, on
// an idle socket pair: the pool's look for a closed peer (poll, 0 timeout)
// and a read that finds nothing (the EAGAIN the old read path paid).
void BM_Syscall_PollIdle(benchmark::State& state) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    state.SkipWithError("socketpair");
    return;
  }
  for (auto _ : state) {
    pollfd p{sv[0], POLLIN, 0};
    benchmark::DoNotOptimize(::poll(&p, 1, 0));
  }
  ::close(sv[0]);
  ::close(sv[1]);
}

void BM_Syscall_RecvEagain(benchmark::State& state) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    state.SkipWithError("socketpair");
    return;
  }
  char buf[64];
  for (auto _ : state) benchmark::DoNotOptimize(::recv(sv[0], buf, sizeof buf, MSG_DONTWAIT));
  ::close(sv[0]);
  ::close(sv[1]);
}

BENCHMARK(BM_Format_BatchPath);
BENCHMARK(BM_Format_InPlace);
BENCHMARK(BM_Reply_Hiredis);
BENCHMARK(BM_Reply_InPlace);
BENCHMARK(BM_ForkGuard);
BENCHMARK(BM_SteadyClock);
BENCHMARK(BM_BreakerAndCounters);
BENCHMARK(BM_Syscall_PollIdle);
BENCHMARK(BM_Syscall_RecvEagain);

}  // namespace

BENCHMARK_MAIN();
