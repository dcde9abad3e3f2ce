// SPDX-License-Identifier: Apache-2.0
// ratelimit-asio-server: an Asio TCP server with a line protocol, each request
// checked with a co_await'ed ratelimit::asio::async_try_acquire.
//
//   CHECK <key>   ->  ALLOW <remaining>   |  DENY <retry_after_us>
//   anything else ->  ERR <reason>
//
// Usage: ratelimit-asio-server [--port N] [--rate R] [--store memory|redis://...]
//                              [--idle-timeout-ms N]
// --port 0 (the default) picks a free port; the first line on stdout is
// "listening on PORT". A connection that leaves a read or a write unfinished
// for --idle-timeout-ms (default 30000) is closed. SIGINT/SIGTERM stop it (exit 0).
#include <asio/buffer.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/redirect_error.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "ratelimit/asio.hpp"
#include "ratelimit/ratelimit.hpp"
#ifdef RATELIMIT_ASIO_EXAMPLE_REDIS
#include "ratelimit/redis/redis_store.hpp"
#endif

namespace {

using ::asio::ip::tcp;

/// Longest request line; a longer one closes the connection.
constexpr std::size_t max_line = 1024;

/// The answer to one request line.
template <class Limiter>
::asio::awaitable<std::string> answer(Limiter& limiter, std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  constexpr std::string_view verb = "CHECK ";
  if (!line.starts_with(verb)) co_return "ERR expected: CHECK <key>\n";
  const std::string_view key = line.substr(verb.size());
  try {
    const ratelimit::decision d = co_await ratelimit::asio::async_try_acquire(
        limiter, key, ::asio::use_awaitable);
    if (d.allowed) co_return "ALLOW " + std::to_string(d.remaining) + "\n";
    co_return "DENY " + std::to_string(d.retry_after.count()) + "\n";
  } catch (const std::invalid_argument&) {
    co_return "ERR bad key\n";
  } catch (const std::exception&) {
    co_return "ERR store unavailable\n";
  }
}

using idle_clock = std::chrono::steady_clock;

/// Request lines answered in order until the client closes. `deadline` is
/// moved on before each read and each write (see expire).
template <class Limiter>
::asio::awaitable<void> lines(Limiter& limiter, tcp::socket& socket,
                              idle_clock::time_point& deadline, std::chrono::milliseconds idle) {
  std::string buffer;
  try {
    for (;;) {
      deadline = idle_clock::now() + idle;
      const std::size_t n = co_await ::asio::async_read_until(
          socket, ::asio::dynamic_buffer(buffer, max_line), '\n', ::asio::use_awaitable);
      const std::string reply = co_await answer(limiter, std::string_view(buffer).substr(0, n - 1));
      buffer.erase(0, n);
      deadline = idle_clock::now() + idle;
      co_await ::asio::async_write(socket, ::asio::buffer(reply), ::asio::use_awaitable);
    }
  } catch (const std::exception&) {
    // closed by the client, a line above max_line, or cancelled by expire
  }
}

/// Returns once `deadline` has passed (it may move on meanwhile).
::asio::awaitable<void> expire(const idle_clock::time_point& deadline) {
  ::asio::steady_timer timer(co_await ::asio::this_coro::executor);
  while (deadline > idle_clock::now()) {
    timer.expires_at(deadline);
    std::error_code ec;
    co_await timer.async_wait(::asio::redirect_error(::asio::use_awaitable, ec));
    if (ec == ::asio::error::operation_aborted) co_return;
  }
}

/// One client until it closes, or until it leaves a read or a write
/// unfinished for `idle` (a silent client, a line that never ends, replies
/// never read): descriptors and memory are not held for ever.
template <class Limiter>
::asio::awaitable<void> serve(Limiter& limiter, tcp::socket socket,
                              std::chrono::milliseconds idle) {
  using namespace ::asio::experimental::awaitable_operators;
  idle_clock::time_point deadline = idle_clock::now() + idle;
  // Whichever ends first cancels the other (a check in flight then completes
  // with operation_aborted; it may still consume).
  co_await (lines(limiter, socket, deadline, idle) || expire(deadline));
}

/// Accepts until the acceptor is closed. A failed accept (out of file
/// descriptors or memory: too many connections) pauses accepting briefly
/// instead of ending it: connections that close free what the next needs.
template <class Limiter>
::asio::awaitable<void> accept(Limiter& limiter, tcp::acceptor& acceptor,
                               std::chrono::milliseconds idle) {
  ::asio::steady_timer pause(acceptor.get_executor());
  for (;;) {
    std::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(
        ::asio::redirect_error(::asio::use_awaitable, ec));
    if (!ec) {
      ::asio::co_spawn(acceptor.get_executor(), serve(limiter, std::move(socket), idle),
                       ::asio::detached);
      continue;
    }
    if (ec == ::asio::error::operation_aborted || !acceptor.is_open()) co_return;
    pause.expires_after(std::chrono::milliseconds(50));
    co_await pause.async_wait(::asio::use_awaitable);
  }
}

template <class Limiter>
int run(::asio::io_context& io, Limiter& limiter, unsigned short port,
        std::chrono::milliseconds idle) {
  tcp::acceptor acceptor(io, tcp::endpoint(::asio::ip::make_address("127.0.0.1"), port));
  std::cout << "listening on " << acceptor.local_endpoint().port() << std::endl;
  ::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](std::error_code, int) { io.stop(); });
  ::asio::co_spawn(io, accept(limiter, acceptor, idle), ::asio::detached);
  io.run();
  return 0;
}

/// `v` as a decimal number in lo..hi: digits only (no sign, space or suffix).
std::optional<unsigned long> number(std::string_view v, unsigned long lo, unsigned long hi) {
  unsigned long n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi) {
    return std::nullopt;
  }
  return n;
}

int usage(const char* why) {
  std::cerr << "ratelimit-asio-server: " << why
            << "\nusage: ratelimit-asio-server [--port N] [--rate R] [--store memory|redis://...]\n"
               "       [--idle-timeout-ms N]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned short port = 0;
  std::string rate = "10/1s";
  std::string store = "memory";
  std::chrono::milliseconds idle{30'000};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) return usage("missing value after an option");
    const std::string v = argv[++i];
    if (a == "--port") {
      const auto p = number(v, 0, 65535);
      if (!p) return usage("--port must be 0..65535");
      port = static_cast<unsigned short>(*p);
    } else if (a == "--idle-timeout-ms") {
      const auto ms = number(v, 1, 86'400'000);
      if (!ms) return usage("--idle-timeout-ms must be 1..86400000");
      idle = std::chrono::milliseconds(*ms);
    } else if (a == "--rate") {
      rate = v;
    } else if (a == "--store") {
      store = v;
    } else {
      return usage("unknown option");
    }
  }
  // Made before the limiter, so destroyed after it: a Redis store's I/O
  // thread may still post a completion into `io` until the store is gone.
  ::asio::io_context io;
  try {
    const ratelimit::gcra::config cfg(rate, ratelimit::bucket_options{.name = "asio-server"});
    if (store == "memory") {
      ratelimit::limiter<ratelimit::gcra> limiter(cfg);
      return run(io, limiter, port, idle);
    }
#ifdef RATELIMIT_ASIO_EXAMPLE_REDIS
    if (store.starts_with("redis://") || store.starts_with("rediss://")) {
      ratelimit::limiter<ratelimit::gcra, ratelimit::redis::redis_store,
                         ratelimit::redis::server_clock>
          limiter(cfg, ratelimit::redis::redis_store(ratelimit::redis::parse_url(store)));
      return run(io, limiter, port, idle);
    }
#endif
    return usage("--store must be memory or redis://HOST:PORT (when built with Redis)");
  } catch (const std::exception& e) {
    std::cerr << "ratelimit-asio-server: " << e.what() << "\n";
    return 1;
  }
}
