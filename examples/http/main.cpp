// SPDX-License-Identifier: Apache-2.0
// ratelimit-http-example: an HTTP API server (cpp-httplib) limiting requests per API token and tier.
//
//   ratelimit-http-example --port 8080
//   curl -i -H 'Authorization: Bearer demo-free' http://127.0.0.1:8080/v1/hello
//
// See README.md, "HTTP API example", and `--help`.
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "api_server.hpp"
#include "ratelimit/store/memory_store.hpp"

#ifdef RATELIMIT_HTTP_HAVE_REDIS
#include "ratelimit/redis.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#endif

namespace {

constexpr std::string_view usage = R"(usage: ratelimit-http-example [options]

Serves GET/POST /v1/<anything>, limited per API token ("Authorization: Bearer <token>")
with a fixed window per tier; GET /healthz is not limited.

  --port N              TCP port (default 8080; 0 = any free port, printed at start)
  --bind ADDR           address to listen on (default 127.0.0.1)
  --store URL           memory (default), redis://[USER:PASSWORD@]HOST[:PORT][/DB] or
                        redis-cluster://HOST:PORT[,HOST:PORT...]
  --tier NAME=RATE      a tier, e.g. free=5/1min (repeatable; the first replaces the built-in
                        tiers free=5/1min and pro=100/1min)
  --token TOKEN=TIER    an API token and its tier (repeatable; the first replaces the built-in
                        demo-free=free and demo-pro=pro, which --tier drops too)
  --default-tier NAME   tier of tokens not given with --token (default: such tokens get 401)
  --threads N           worker threads (default 8); each serves one connection at a time
  --max-waiting N       accepted connections waiting for a worker, 1..65536 (default 64);
                        past it the server accepts no more until a worker is free, so slow
                        clients cannot make it hold more than threads + N + 1 sockets
  --max-keys N          memory store: most tokens held per tier (default 1000000; 0 = no cap);
                        a new token past the cap gets 503 until idle ones are reclaimed
  --redis-timeout MS    Redis connect and command timeout in ms, 1..60000 (default: the
                        library's, 200 ms to connect and 100 ms per command); past it 503
  --limiter-off         no limiter and no RateLimit headers (the benchmark's baseline)
)";

struct cli {
  int port = 8080;
  std::string bind = "127.0.0.1";
  std::string store = "memory";
  std::size_t threads = 8;
  /// Accepted connections waiting for a worker, at most (see bounded_pool).
  std::size_t max_waiting = 64;
  std::size_t max_keys = 1'000'000;
  /// Redis connect and command timeout; 0 = the library's defaults.
  std::chrono::milliseconds redis_timeout{0};
  http_example::server_config cfg;
};

/// "NAME=VALUE" split at the first '=', or at the last with `at_last` (for
/// TOKEN=TIER: a token may end in '=' padding, a tier name holds no '=').
std::pair<std::string, std::string> split_pair(std::string_view flag, std::string_view arg,
                                               bool at_last = false) {
  const auto eq = at_last ? arg.rfind('=') : arg.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == arg.size()) {
    throw std::invalid_argument(std::string(flag) + " expects NAME=VALUE, got \"" +
                                std::string(arg) + "\"");
  }
  return {std::string(arg.substr(0, eq)), std::string(arg.substr(eq + 1))};
}

long parse_number(std::string_view flag, const std::string& s, long lo, long hi) {
  // Digits only: std::stol alone would take " 80" and "+80".
  std::size_t used = 0;
  long v = 0;
  try {
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos)
      v = std::stol(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v < lo || v > hi) {
    throw std::invalid_argument(std::string(flag) + " expects a number in " + std::to_string(lo) +
                                ".." + std::to_string(hi) + ", got \"" + s + "\"");
  }
  return v;
}

cli parse_cli(int argc, char** argv) {
  cli c;
  bool own_tiers = false;
  bool own_tokens = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (a == "--limiter-off") {
      c.cfg.limiter_off = true;
      continue;
    }
    if (i + 1 >= argc)
      throw std::invalid_argument("unknown option or missing value: " + std::string(a));
    const std::string v = argv[++i];
    if (a == "--port") {
      c.port = static_cast<int>(parse_number(a, v, 0, 65535));
    } else if (a == "--bind") {
      c.bind = v;
    } else if (a == "--store") {
      c.store = v;
    } else if (a == "--threads") {
      c.threads = static_cast<std::size_t>(parse_number(a, v, 1, 1024));
    } else if (a == "--max-waiting") {
      c.max_waiting = static_cast<std::size_t>(parse_number(a, v, 1, 65536));
    } else if (a == "--max-keys") {
      c.max_keys = static_cast<std::size_t>(parse_number(a, v, 0, 1'000'000'000));
    } else if (a == "--redis-timeout") {
      c.redis_timeout = std::chrono::milliseconds{parse_number(a, v, 1, 60'000)};
    } else if (a == "--tier") {
      if (!own_tiers) c.cfg.tiers.clear();
      own_tiers = true;
      auto [name, rate] = split_pair(a, v);
      c.cfg.tiers.push_back({std::move(name), ratelimit::rate::parse(rate)});
    } else if (a == "--token") {
      if (!own_tokens) c.cfg.tokens.clear();
      own_tokens = true;
      auto [token, tier] = split_pair(a, v, /*at_last=*/true);
      if (const auto t = http_example::bearer_token("Bearer " + token);
          std::holds_alternative<http_example::refusal>(t)) {
        throw std::invalid_argument("--token \"" + token +
                                    "\": " + std::get<http_example::refusal>(t).message);
      }
      if (!c.cfg.tokens.emplace(std::move(token), std::move(tier)).second) {
        throw std::invalid_argument("--token given twice for one token");
      }
    } else if (a == "--default-tier") {
      c.cfg.default_tier = v;
    } else {
      throw std::invalid_argument("unknown option " + std::string(a));
    }
  }
  // The built-in demo tokens name the built-in tiers only.
  if (own_tiers && !own_tokens) c.cfg.tokens.clear();
  return c;
}

/// The per-tier limiters over the store `url` names (the library parses Redis URLs).
std::unique_ptr<http_example::tier_limits> open_limits(const cli& c) {
  using namespace http_example;
  if (c.store == "memory") {
    // Capped: with --default-tier every new token is a new key, and a client
    // sending made-up tokens must not grow the server without bound. Past
    // the cap a new token is refused (fail_closed; the server answers 503).
    const ratelimit::memory_store_options o{.max_keys = c.max_keys,
                                            .on_full = ratelimit::when_full::fail_closed};
    return std::make_unique<tier_limits_on<ratelimit::memory_store<ratelimit::fixed_window>>>(
        c.cfg.tiers, [o] { return ratelimit::memory_store<ratelimit::fixed_window>{o}; });
  }
#ifdef RATELIMIT_HTTP_HAVE_REDIS
  // Caller time (Unix microseconds from this host's clock); Redis failures
  // throw (failure_policy::throw_error, the default) and the server answers
  // 503. One connection per worker thread.
  if (c.store.starts_with("redis-cluster://")) {
    ratelimit::redis::cluster_options o = ratelimit::redis::parse_cluster_url(c.store);
    o.node.prefix = "rl:http:";
    o.node.pool_size = c.threads;
    if (c.redis_timeout.count() > 0)
      o.node.connect_timeout = o.node.command_timeout = c.redis_timeout;
    ratelimit::redis::cluster_store store(std::move(o));
    return std::make_unique<tier_limits_on<ratelimit::redis::cluster_store>>(c.cfg.tiers,
                                                                             [&] { return store; });
  }
  if (c.store.starts_with("redis://") || c.store.starts_with("unix://")) {
    ratelimit::redis::options o = ratelimit::redis::parse_url(c.store);
    o.prefix = "rl:http:";
    o.pool_size = c.threads;
    if (c.redis_timeout.count() > 0) o.connect_timeout = o.command_timeout = c.redis_timeout;
    ratelimit::redis::redis_store store(std::move(o));
    return std::make_unique<tier_limits_on<ratelimit::redis::redis_store>>(c.cfg.tiers,
                                                                           [&] { return store; });
  }
#else
  if (c.store.starts_with("redis")) {
    throw std::invalid_argument(  // no URL in the message: it may hold a password
        "--store: built without Redis support (configure with -DRATELIMIT_REDIS=ON)");
  }
#endif
  // Named by its scheme only: the rest may hold a password (rediss://u:p@h).
  const auto scheme_end = c.store.find("://");
  const std::string named = scheme_end == std::string::npos
                                ? "\"" + c.store.substr(0, c.store.find('@')) + "\""
                                : "scheme \"" + c.store.substr(0, scheme_end) + "\"";
  throw std::invalid_argument("--store " + named +
                              ": use memory, redis://HOST:PORT[/DB] or "
                              "redis-cluster://HOST:PORT[,HOST:PORT...]");
}

ratelimit::timestamp unix_now() {
  return std::chrono::duration_cast<ratelimit::timestamp>(
      std::chrono::system_clock::now().time_since_epoch());
}

}  // namespace

int main(int argc, char** argv) {
  cli c;
  std::unique_ptr<http_example::api_server> server;
  try {
    c = parse_cli(argc, argv);
    auto limits = c.cfg.limiter_off ? nullptr : open_limits(c);
    server = std::make_unique<http_example::api_server>(c.cfg, std::move(limits), unix_now);
  } catch (const std::exception& e) {
    std::cerr << "ratelimit-http-example: " << e.what() << "\n(--help for usage)\n";
    return 2;
  }

  // SIGINT/SIGTERM: blocked in every thread (set before any is started) and
  // taken by one thread with sigwait, which stops the server: no work in a
  // signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  httplib::Server& http = server->http();
  const std::size_t threads = c.threads;
  server->set_workers(threads, c.max_waiting);
  // Small responses go out at once (no Nagle wait for the client's delayed ACK).
  http.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second
  // server bind a port already in use and silently share its connections
  // (each with its own in-process counts). A busy port must fail here.
  http.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int port = c.port == 0 ? http.bind_to_any_port(c.bind)
                               : (http.bind_to_port(c.bind, c.port) ? c.port : -1);
  if (port < 0) {
    std::cerr << "ratelimit-http-example: cannot listen on " << c.bind << ":" << c.port
              << " (address in use or not local)\n";
    return 1;
  }
  std::string store = c.cfg.limiter_off ? "none, limiter off" : c.store;
#ifdef RATELIMIT_HTTP_HAVE_REDIS
  // No password in logs; "memory" is a word, not a URL (redacted_url would
  // hide a bare word whole, as it may be a password given as the URL).
  if (!c.cfg.limiter_off && store != "memory")
    store = ratelimit::redis::detail::redacted_url(store);
#endif
  std::cout << "ratelimit-http-example: listening on http://" << c.bind << ":" << port << " (store "
            << store << ")" << std::endl;

  // stop() does nothing before listening has begun: repeat it until served.
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    while (!done.load()) {
      server->stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const bool served = http.listen_after_bind();
  done.store(true);
  // listen ended by itself (an error): wake the stopper with a signal it waits for.
  if (!served) ::kill(::getpid(), SIGTERM);
  stopper.join();
  std::cout << "ratelimit-http-example: stopped; admitted " << server->admitted() << ", limited "
            << server->limited() << ", refused " << server->refused() << std::endl;
  return served ? 0 : 1;
}
