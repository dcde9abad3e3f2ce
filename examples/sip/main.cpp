// SPDX-License-Identifier: Apache-2.0
// sip-front-door: a UDP SIP responder that limits INVITEs per calling number
// (rate and calls in progress) with ratelimit's concurrency_limiter.
// Plain POSIX sockets, one thread; the SIP logic is in front_door.hpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "front_door.hpp"
#ifdef SIPFD_HAVE_REDIS
#include "ratelimit/redis.hpp"
#endif

namespace {

constexpr std::string_view usage_text =
    R"(sip-front-door: answers SIP INVITEs over UDP, limited per calling number.

Usage: sip-front-door [options]
  --listen HOST:PORT         address to bind (default 127.0.0.1:5060; port 0 = any free)
  --rate RATE                calls per number per window (default "10/15min")
  --max-calls N              calls in progress per number (default 2)
  --max-call-seconds S       a call's lease expires S seconds after INVITE if no
                             BYE comes (default 3600)
  --max-numbers N            calling numbers held at once in memory (default
                             1000000, 0 = no cap); at the cap an INVITE from a
                             new number is refused 503
  --store URL                memory (default), redis://HOST:PORT[/DB] or
                             redis-cluster://HOST:PORT[,HOST:PORT...]
  --redis-timeout MS         Redis connect and command timeout in ms, 1..60000
                             (default: the library's, 200 ms and 100 ms); a
                             check past it is answered 500
  --dialog-secret-file PATH  a file holding 32 hex digits, then only whitespace
                             (4096 bytes at most): the key of the To tags
                             of our answers, which a BYE must carry; front doors
                             sharing a store and an address need the same one
                             (default: a random key per process)
  --limiter-off              admit every INVITE (baseline for benchmarks)

Prints "listening on HOST:PORT" once bound, the counters as one JSON line on
SIGUSR1, and a final JSON line (counters and CPU time) on SIGTERM or SIGINT.
)";

volatile std::sig_atomic_t stop_requested = 0;
volatile std::sig_atomic_t stats_requested = 0;

extern "C" void on_stop(int) {
  stop_requested = 1;
}
extern "C" void on_stats(int) {
  stats_requested = 1;
}

struct options {
  std::string host = "127.0.0.1";
  int port = 5060;
  sipfd::policy policy;
  std::string store = "memory";
  std::chrono::milliseconds redis_timeout{0};  // 0: the library's defaults
  bool limiter_off = false;
  std::string dialog_secret_file;  // empty: a random secret
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "sip-front-door: %s\n\n%s", why.c_str(), usage_text.data());
  std::exit(2);
}

long long parse_int(const std::string& flag, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || n < lo || n > hi) {
    usage_error(flag + " takes a whole number in " + std::to_string(lo) + ".." +
                std::to_string(hi) + ", got \"" + v + "\"");
  }
  return n;
}

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--listen") {
      const std::string v = value();
      const std::size_t colon = v.rfind(':');
      if (colon == std::string::npos) usage_error("--listen takes HOST:PORT, got \"" + v + "\"");
      o.host = v.substr(0, colon);
      o.port = static_cast<int>(parse_int(a, v.substr(colon + 1), 0, 65535));
    } else if (a == "--rate") {
      o.policy.rate = value();
    } else if (a == "--max-calls") {
      o.policy.max_calls = parse_int(a, value(), 1, ratelimit::max_leases);
    } else if (a == "--max-call-seconds") {
      o.policy.max_call = std::chrono::seconds{parse_int(a, value(), 1, 30LL * 86400)};
    } else if (a == "--max-numbers") {
      o.policy.max_numbers = static_cast<std::size_t>(parse_int(a, value(), 0, 1LL << 40));
    } else if (a == "--store") {
      o.store = value();
    } else if (a == "--redis-timeout") {
      o.redis_timeout = std::chrono::milliseconds{parse_int(a, value(), 1, 60'000)};
    } else if (a == "--dialog-secret-file") {
      o.dialog_secret_file = value();
    } else if (a == "--limiter-off") {
      o.limiter_off = true;
    } else if (a == "-h" || a == "--help") {
      std::fputs(usage_text.data(), stdout);
      std::exit(0);
    } else {
      usage_error("unknown option \"" + a + "\"");
    }
  }
  return o;
}

/// The To tags' key: read from the file `path` (32 hex digits, then only
/// whitespace, at most 4096 bytes; see front_door::read_secret_file), or
/// random when `path` is empty.
ratelimit::detail::siphash_key dialog_secret(const std::string& path) {
  if (path.empty()) return sipfd::front_door::random_secret();
  try {
    return sipfd::front_door::read_secret_file(path);
  } catch (const std::invalid_argument& e) {
    usage_error(std::string("--dialog-secret-file: ") + e.what());  // names the file
  }
}

#ifdef SIPFD_HAVE_REDIS
/// `o` with its connect and command timeouts set to `t` (unchanged when 0).
ratelimit::redis::options with_timeout(ratelimit::redis::options o, std::chrono::milliseconds t) {
  if (t.count() > 0) o.connect_timeout = o.command_timeout = t;
  return o;
}
ratelimit::redis::cluster_options with_timeout(ratelimit::redis::cluster_options o,
                                               std::chrono::milliseconds t) {
  o.node = with_timeout(std::move(o.node), t);
  return o;
}
#endif

/// The admission the options ask for.
/// @throws std::invalid_argument for a bad rate or store URL
std::unique_ptr<sipfd::admission> open_admission(const options& o) {
  using namespace sipfd;
  if (o.limiter_off) return std::make_unique<no_admission>();
  if (o.store == "memory") return in_process_admission(o.policy);
#ifdef SIPFD_HAVE_REDIS
  // The Redis server's clock, so that several front doors share one time line.
  if (o.store.starts_with("redis://")) {
    return std::make_unique<
        lease_admission<ratelimit::redis::redis_store, ratelimit::redis::server_clock>>(
        o.policy, ratelimit::redis::redis_store(
                      with_timeout(ratelimit::redis::parse_url(o.store), o.redis_timeout)));
  }
  if (o.store.starts_with("redis-cluster://")) {
    return std::make_unique<
        lease_admission<ratelimit::redis::cluster_store, ratelimit::redis::server_clock>>(
        o.policy, ratelimit::redis::cluster_store(
                      with_timeout(ratelimit::redis::parse_cluster_url(o.store), o.redis_timeout)));
  }
#endif
  // Named by its scheme only: the rest may hold a password (rediss://u:p@h).
  const std::size_t scheme_end = o.store.find("://");
  const std::string named = scheme_end == std::string::npos
                                ? "\"" + o.store.substr(0, o.store.find('@')) + "\""
                                : "scheme \"" + o.store.substr(0, scheme_end) + "\"";
  throw std::invalid_argument("unsupported --store " + named +
                              " (memory, redis://..., redis-cluster://...; Redis needs a "
                              "build with RATELIMIT_REDIS=ON)");
}

std::string final_json(const sipfd::counters& c) {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const auto us = [](const timeval& t) {
    return static_cast<long long>(t.tv_sec) * 1'000'000 + t.tv_usec;
  };
  std::string s = sipfd::to_json(c);
  s.pop_back();
  s += ",\"cpu_user_us\":" + std::to_string(us(ru.ru_utime)) +
       ",\"cpu_sys_us\":" + std::to_string(us(ru.ru_stime)) + "}";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_args(argc, argv);
  ratelimit::detail::siphash_key secret{};
  try {
    secret = dialog_secret(o.dialog_secret_file);
  } catch (const std::exception& e) {  // no random source
    std::fprintf(stderr, "sip-front-door: no dialog secret: %s\n", e.what());
    return 1;
  }
  std::unique_ptr<sipfd::admission> admission;
  try {
    admission = open_admission(o);
  } catch (const std::exception& e) {
    usage_error(e.what());
  }

  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) {
    std::perror("sip-front-door: socket");
    return 1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(o.port));
  if (::inet_pton(AF_INET, o.host.c_str(), &addr.sin_addr) != 1) {
    usage_error("--listen needs an IPv4 address, got \"" + o.host + "\"");
  }
  const int buf = 4 << 20;  // room for bursts while we are descheduled
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("sip-front-door: bind");
    return 1;
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);

  struct sigaction sa {};
  sa.sa_handler = on_stop;  // no SA_RESTART: poll returns EINTR
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = on_stats;
  ::sigaction(SIGUSR1, &sa, nullptr);

  sipfd::front_door door(std::move(admission),
                         "sip:front-door@" + o.host + ":" + std::to_string(port), 100'000,
                         std::size_t{64} << 20, secret);
  std::printf("listening on %s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);

  std::vector<char> in(sipfd::max_datagram + 1);
  std::string out;
  auto last_upkeep = sipfd::clock_type::now();
  while (stop_requested == 0) {
    if (stats_requested != 0) {
      stats_requested = 0;
      std::printf("%s\n", sipfd::to_json(door.stats()).c_str());
      std::fflush(stdout);
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 500);
    const auto now = sipfd::clock_type::now();
    if (now - last_upkeep >= std::chrono::seconds{1}) {
      door.housekeeping(now);
      last_upkeep = now;
    }
    if (ready <= 0) continue;  // timeout or a signal
    for (int burst = 0; burst < 256; ++burst) {
      sockaddr_in from{};
      socklen_t from_len = sizeof from;
      // MSG_TRUNC: the real length of an oversized datagram, so it is refused.
      const ssize_t n = ::recvfrom(fd, in.data(), in.size(), MSG_DONTWAIT | MSG_TRUNC,
                                   reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n < 0) break;  // EAGAIN (drained), EINTR, ...
      const std::size_t size = std::min(static_cast<std::size_t>(n), in.size());
      if (door.handle(std::string_view(in.data(), size), sipfd::clock_type::now(), out)) {
        (void)::sendto(fd, out.data(), out.size(), 0, reinterpret_cast<const sockaddr*>(&from),
                       from_len);
      }
    }
  }
  ::close(fd);
  std::printf("%s\n", final_json(door.stats()).c_str());
  std::fflush(stdout);
  return 0;
}
