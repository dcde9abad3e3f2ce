// SPDX-License-Identifier: Apache-2.0
// A consumer of ratelimit::asio: a callback on an io_context and a use_future check.
#include <asio/bind_executor.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <ratelimit/asio.hpp>
#include <ratelimit/ratelimit.hpp>

int main() {
  namespace rl = ratelimit;
  rl::limiter<rl::gcra> lim{rl::gcra::config{"2/s", rl::bucket_options{.name = "calls"}}};
  asio::io_context io;
  rl::asio::async_try_acquire(lim, "caller", std::chrono::microseconds{0}, 2,
                              asio::bind_executor(io, [](std::exception_ptr e, rl::decision d) {
                                std::printf("callback allowed=%d remaining=%lld error=%d\n",
                                            d.allowed ? 1 : 0, static_cast<long long>(d.remaining),
                                            e ? 1 : 0);
                              }));
  io.run();
  const rl::decision d = rl::asio::async_try_acquire(lim, "caller", std::chrono::microseconds{0}, 1,
                                                     asio::use_future)
                             .get();
  std::printf("future allowed=%d retry_after_us=%lld\n", d.allowed ? 1 : 0,
              static_cast<long long>(d.retry_after.count()));
  return 0;
}
