// SPDX-License-Identifier: Apache-2.0
// What one sequential Redis check costs the client outside the round trip,
// piece by piece (no server needed): formatting the EVALSHA command and the
// key, reading the reply, the fork guard, the clock, the breaker and the
// counters, and the system calls a check makes. Each row is one piece, once.
// See docs/redis.md ("Where a sequential check's time goes").
//
// `--wait-probe HOST PORT [CHECKS_PER_ROUND] [ROUNDS] [MODES] [TURN]` runs
// instead the wait probe against a server (see wait_probe below and
// run_wait.sh).
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "phone_keys.hpp"
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

// Where a sequential check's wall time goes besides the client's CPU: the
// same GCRA EVALSHA bytes the pooled store sends, sent on one raw TCP
// connection and waited for in different ways, in alternating rounds with
// the store itself. A wait mode that is faster than the store's own
// (`block`) on the same machine in the same run would point at the wait; the
// store slower than `block` at the library or the harness; `rbstyle` waits
// as `redis-benchmark -c 1 -P 1` does (an event loop that arms write
// interest, waits, writes, re-arms read interest, waits, reads);
// `blockinf` blocks without SO_RCVTIMEO (no timer armed per wait);
// `blocklate` makes four cheap system calls before it blocks; `spin`
// polls the socket without sleeping (measurement only: it burns a core),
// which takes the client's own wake-up out of the round trip. A bounded
// busy-poll before the blocking read: `spinN` polls for up to N us (a pause
// instruction between polls), `yieldN` the same with sched_yield() between
// polls, `adaptN` as `spinN` but backs off after a miss (no reply within
// the spin, or the thread preempted while it spun: 1, 2, 4 ... 256 checks
// without spinning); `busypoll` blocks with SO_BUSY_POLL 50 us (root only).
//
// Usage: ratelimit_redis_client_cost_bench --wait-probe HOST PORT
//          [CHECKS_PER_ROUND] [ROUNDS] [MODES] [TURN]
//   MODES: comma-separated of store, block, blockinf, blocklate, poll, epoll, rbstyle, spin,
//   spinN, yieldN, adaptN (N in us), busypoll, storeN (the store with
//   options::read_spin of N us) (default the first seven);
//   TURN: where the first round starts in MODES (run_wait.sh passes its round)
// Prints per round checks/s of each mode, the client thread's CPU time per
// check and the median time of a send() (raw modes; it includes waking
// Redis, much longer when that crosses to the other vCPU), the share of
// replies a spinN, yieldN or adaptN round found within its spin, then each mode's
// median and its median ratio to `block` (run_wait.sh adds redis-benchmark
// to the rounds).
namespace wait_probe {

using namespace ratelimit;
using bench_clock = std::chrono::steady_clock;

const gcra::config& cfg() {
  static const gcra::config c("10/15min", bucket_options{.name = "bench"});
  return c;
}

using ratelimit_bench::phones;

/// One raw TCP connection (TCP_NODELAY, as the store's).
int connect_to(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd < 0 || ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    std::fprintf(stderr, "cannot connect to %s:%d\n", host.c_str(), port);
    std::exit(1);
  }
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/// Replies that a spinN or yieldN round found within its spin.
int spin_hits = 0;

/// A spin-wait hint to the CPU (x86 pause; a no-op elsewhere).
inline void pause_cpu() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// `n` checks on a raw connection waiting for each reply as `mode` says;
/// checks per second, and in `send_us` the median time of one send().
double raw_round(const std::string& host, int port, const std::string& mode, int n, std::size_t& at,
                 double& send_us) {
  const int fd = connect_to(host, port);
  const bool yield = mode.rfind("yield", 0) == 0;
  const int spin_us = mode.rfind("spin", 0) == 0 && mode.size() > 4 ? std::atoi(mode.c_str() + 4)
                      : yield                                       ? std::atoi(mode.c_str() + 5)
                                                                    : 0;
  const bool adapt = mode.rfind("adapt", 0) == 0;
  const int adapt_us = adapt ? std::atoi(mode.c_str() + 5) : 0;
  int skip = 0;     // adaptN: checks left that block without spinning
  int backoff = 0;  // adaptN: the next skip after a miss (doubles, up to 256)
  spin_hits = 0;
  if (mode == "busypoll") {
    // SO_BUSY_POLL: the kernel polls the device queue in recv() for up to
    // 50 us (needs CAP_NET_ADMIN to raise it; loopback has no NAPI queue).
    const int us = 50;
    if (::setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &us, sizeof us) != 0) {
      std::perror("setsockopt(SO_BUSY_POLL)");
      std::exit(1);
    }
  }
  if (mode == "block" || mode == "blocklate" || mode == "busypoll" || spin_us > 0 || adapt) {
    timeval tv{1, 0};  // as the store: a blocking recv bounded by SO_RCVTIMEO
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.data.fd = fd;
  if (mode == "epoll") {
    ev.events = EPOLLIN;
    (void)::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  std::string out;
  std::vector<std::string> args;
  char buf[4096];
  std::vector<double> send_time;
  send_time.reserve(static_cast<std::size_t>(n));
  const auto t0 = bench_clock::now();
  for (int i = 0; i < n; ++i) {
    out.clear();
    redis::detail::append_single_eval(out, args, false, "bench:", cfg(),
                                      phones()[at++ % phones().size()], std::nullopt, 1,
                                      access::consume, "0");
    epoll_event got{};
    if (mode == "rbstyle") {
      ev.events = EPOLLOUT;
      (void)::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
      (void)::epoll_wait(ep, &got, 1, 1000);
    }
    const auto sent = bench_clock::now();
    if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
      std::fprintf(stderr, "send failed\n");
      std::exit(1);
    }
    send_time.push_back(
        std::chrono::duration<double, std::micro>(bench_clock::now() - sent).count());
    ssize_t r = -1;
    if (mode == "block" || mode == "blockinf" || mode == "busypoll") {
      r = ::recv(fd, buf, sizeof buf, 0);
    } else if (mode == "blocklate") {
      // As `block`, after four cheap system calls, as many as redis-benchmark
      // makes between its write and its wait (epoll_ctl): the core idles later.
      for (int k = 0; k < 4; ++k) (void)::getppid();
      r = ::recv(fd, buf, sizeof buf, 0);
    } else if (spin_us > 0) {
      // spinN, yieldN: the reply polled for without sleeping for up to N us
      // (a pause instruction, or sched_yield(), between polls), then a
      // blocking read as `block`: what a bounded busy-poll in the store
      // would do.
      const auto give_up = bench_clock::now() + std::chrono::microseconds(spin_us);
      for (;;) {
        r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r >= 0 || errno != EAGAIN || bench_clock::now() >= give_up) break;
        if (yield) {
          (void)::sched_yield();
        } else {
          pause_cpu();
        }
      }
      if (r < 0) {
        r = ::recv(fd, buf, sizeof buf, 0);  // nothing within the spin
      } else {
        ++spin_hits;
      }
    } else if (adapt) {
      // adaptN: as spinN, but a spin that missed (no reply within N us, or
      // the thread was preempted while it spun: the server may have needed
      // this CPU) turns spinning off for the next 1, 2, 4 ... 256 checks.
      bool hit = false;
      if (skip > 0) {
        --skip;
      } else {
        rusage ru{};
        (void)::getrusage(RUSAGE_THREAD, &ru);
        const long preempted = ru.ru_nivcsw;
        const auto give_up = bench_clock::now() + std::chrono::microseconds(adapt_us);
        for (;;) {
          r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
          if (r >= 0 || errno != EAGAIN || bench_clock::now() >= give_up) break;
          pause_cpu();
        }
        (void)::getrusage(RUSAGE_THREAD, &ru);
        hit = r > 0 && ru.ru_nivcsw == preempted;
        if (hit) {
          ++spin_hits;
          backoff = 0;
        } else {
          backoff = std::min(256, std::max(1, backoff * 2));
          skip = backoff;
        }
      }
      if (r < 0) r = ::recv(fd, buf, sizeof buf, 0);  // not spun, or nothing within the spin
    } else if (mode == "spin") {
      // Measurement only: the client never sleeps (up to 1 ms), so its core
      // never idles; what this saves is the client's own wake-up.
      const auto give_up = bench_clock::now() + std::chrono::milliseconds(1);
      do {
        r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      } while (r < 0 && errno == EAGAIN && bench_clock::now() < give_up);
      if (r < 0 && errno == EAGAIN) r = ::recv(fd, buf, sizeof buf, 0);
    } else if (mode == "poll") {
      pollfd p{fd, POLLIN, 0};
      (void)::poll(&p, 1, 1000);
      r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    } else if (mode == "epoll") {
      (void)::epoll_wait(ep, &got, 1, 1000);
      r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    } else {  // rbstyle
      (void)::epoll_ctl(ep, EPOLL_CTL_DEL, fd, &ev);
      ev.events = EPOLLIN;
      (void)::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
      (void)::epoll_wait(ep, &got, 1, 1000);
      r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      (void)::epoll_ctl(ep, EPOLL_CTL_DEL, fd, &ev);
    }
    if (r <= 0 || buf[0] != '*') {
      std::fprintf(stderr, "%s: unexpected reply (is the script loaded?)\n", mode.c_str());
      std::exit(1);
    }
  }
  const double s = std::chrono::duration<double>(bench_clock::now() - t0).count();
  std::sort(send_time.begin(), send_time.end());
  send_us = send_time[send_time.size() / 2];
  ::close(ep);
  ::close(fd);
  return n / s;
}

/// `n` checks through the pooled store (one connection); checks per second.
/// A check that fails (a timeout on a starved machine) is reported on
/// stderr, and the round goes on.
double store_round(redis::redis_store& store, int n, std::size_t& at) {
  const auto t0 = bench_clock::now();
  for (int i = 0; i < n; ++i) {
    try {
      (void)store.apply(cfg(), phones()[at++ % phones().size()], store_time, 1, access::consume);
    } catch (const store_error& e) {
      std::fprintf(stderr, "store check failed: %s\n", e.what());
    }
  }
  return n / std::chrono::duration<double>(bench_clock::now() - t0).count();
}

/// CPU time this thread has used, in microseconds.
double thread_cpu_us() {
  timespec ts{};
  (void)::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The probe: `argv` as after `--wait-probe`.
int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: ratelimit_redis_client_cost_bench %s HOST PORT [CHECKS_PER_ROUND] "
                 "[ROUNDS] [store,block,blockinf,blocklate,poll,epoll,rbstyle,spin,spinN,yieldN,"
                 "adaptN,busypoll] [TURN]\n",
                 argv[0]);
    return 2;
  }
  const std::string host = argv[1];
  const int port = std::atoi(argv[2]);
  const int n = argc > 3 ? std::atoi(argv[3]) : 10'000;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  std::vector<std::string> modes;
  std::stringstream list(argc > 5 ? argv[5] : "store,block,blockinf,blocklate,poll,epoll,rbstyle");
  for (std::string m; std::getline(list, m, ',');) modes.push_back(m);
  const int turn = argc > 6 ? std::atoi(argv[6]) : 0;

  redis::options o;
  o.host = host;
  o.port = port;
  o.pool_size = 1;
  o.command_timeout = std::chrono::milliseconds(2000);
  o.prefix = "bench:";
  redis::redis_store store(o);
  std::size_t at = 0;
  (void)store_round(store, 10, at);  // loads the script (EVALSHA, EVAL after NOSCRIPT)
  // storeN: the pooled store with options::read_spin of N us.
  std::map<std::string, std::unique_ptr<redis::redis_store>> spinning;
  for (const std::string& m : modes) {
    if (m.rfind("store", 0) != 0 || m.size() == 5 || spinning.count(m) != 0) continue;
    redis::options so = o;
    so.read_spin = std::chrono::microseconds(std::atoi(m.c_str() + 5));
    spinning[m] = std::make_unique<redis::redis_store>(so);
    (void)store_round(*spinning[m], 10, at);
  }

  std::map<std::string, std::vector<double>> rate;
  for (int r = 0; r < rounds; ++r) {
    std::string cpu = "cpu us per check:";
    std::string sends = "send() us p50:";
    std::string hits = "spin hits:";
    std::printf("round %d:", r + 1);
    for (std::size_t k = 0; k < modes.size(); ++k) {
      // The order turns every round, so that no mode always follows another.
      const std::string& m = modes[(k + static_cast<std::size_t>(r + turn)) % modes.size()];
      const double cpu0 = thread_cpu_us();
      double send_us = 0;
      const double v = m == "store"             ? store_round(store, n, at)
                       : spinning.count(m) != 0 ? store_round(*spinning[m], n, at)
                                                : raw_round(host, port, m, n, at, send_us);
      char note[64];
      std::snprintf(note, sizeof note, " %s %.2f", m.c_str(), (thread_cpu_us() - cpu0) / n);
      cpu += note;
      if (m.rfind("store", 0) != 0) {
        std::snprintf(note, sizeof note, " %s %.1f", m.c_str(), send_us);
        sends += note;
      }
      if ((m.rfind("spin", 0) == 0 && m.size() > 4) || m.rfind("yield", 0) == 0 ||
          m.rfind("adapt", 0) == 0) {
        std::snprintf(note, sizeof note, " %s %.2f", m.c_str(), static_cast<double>(spin_hits) / n);
        hits += note;
      }
      rate[m].push_back(v);
      std::printf(" %s %.0f", m.c_str(), v);
      std::fflush(stdout);
    }
    std::printf("\n%s\n%s\n%s\n", cpu.c_str(), sends.c_str(), hits.c_str());
  }
  const bool have_block = rate.count("block") != 0;
  for (const std::string& m : modes) {
    std::printf("%-8s median %.0f checks/s", m.c_str(), median(rate[m]));
    if (have_block) {
      std::vector<double> ratio;
      for (std::size_t i = 0; i < rate[m].size(); ++i)
        ratio.push_back(rate[m][i] / rate["block"][i]);
      std::printf("  vs block (same round) median %.2fx", median(ratio));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace wait_probe

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--wait-probe") {
    return wait_probe::run(argc - 1, argv + 1);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
