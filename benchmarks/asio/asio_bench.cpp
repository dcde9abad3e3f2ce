// SPDX-License-Identifier: Apache-2.0
// The cost of ratelimit::asio on the in-process store: a blocking check, the
// limiter's inline async check, and the Asio operation with a callback on an
// io_context and co_await'ed in a coroutine (each completion posted and run).
#include <benchmark/benchmark.h>

#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <exception>
#include <string>
#include <vector>

#include "ratelimit/asio.hpp"
#include "ratelimit/ratelimit.hpp"

namespace {

using namespace ratelimit;

const gcra::config cfg("1000000/1s", bucket_options{.name = "bench"});

std::vector<std::string> make_keys() {
  std::vector<std::string> k;
  for (int i = 0; i < 1024; ++i) k.push_back("user:" + std::to_string(i));
  return k;
}
const std::vector<std::string> keys = make_keys();

void BM_Blocking(benchmark::State& state) {
  limiter<gcra> l(cfg);
  std::size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(l.try_acquire(keys[i++ & 1023]));
}
BENCHMARK(BM_Blocking);

void BM_LimiterAsyncInline(benchmark::State& state) {
  limiter<gcra> l(cfg);
  std::size_t i = 0;
  for (auto _ : state) {
    l.async_try_acquire(keys[i++ & 1023], units{1},
                        [](decision d, std::exception_ptr) { benchmark::DoNotOptimize(d); });
  }
}
BENCHMARK(BM_LimiterAsyncInline);

void BM_AsioCallback(benchmark::State& state) {
  limiter<gcra> l(cfg);
  ::asio::io_context io(1);
  // Without work of its own the io_context stops once the first completion
  // ran, and poll_one() then runs nothing: the other completions only queued.
  auto work = ::asio::make_work_guard(io);
  std::size_t i = 0;
  std::size_t ran = 0;
  for (auto _ : state) {
    ratelimit::asio::async_try_acquire(
        l, keys[i++ & 1023], ::asio::bind_executor(io, [&ran](std::exception_ptr, decision d) {
          benchmark::DoNotOptimize(d);
          ++ran;
        }));
    io.poll_one();
  }
  if (ran != i) state.SkipWithError("not every completion ran");
}
BENCHMARK(BM_AsioCallback);

::asio::awaitable<void> checks(limiter<gcra>& l, benchmark::State& state) {
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        co_await ratelimit::asio::async_try_acquire(l, keys[i++ & 1023], ::asio::use_awaitable));
  }
}

void BM_AsioCoAwait(benchmark::State& state) {
  limiter<gcra> l(cfg);
  ::asio::io_context io(1);
  ::asio::co_spawn(io, checks(l, state), ::asio::detached);
  io.run();
}
BENCHMARK(BM_AsioCoAwait);

}  // namespace

BENCHMARK_MAIN();
