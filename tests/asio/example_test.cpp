// SPDX-License-Identifier: Apache-2.0
// The Asio example server (examples/asio) as a user runs it: the line
// protocol over TCP, in process and on a real redis-server shared by two
// servers, bad requests, bad options, SIGTERM.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "support/child_process.hpp"

#ifdef RATELIMIT_ASIO_HAVE_REDIS
#include "redis_server.hpp"
#endif

namespace {

using namespace std::chrono_literals;

/// The example started with `args`.
class process : public rltest::child_process {
 public:
  explicit process(std::vector<std::string> args)
      : rltest::child_process(RATELIMIT_ASIO_EXE, std::move(args)) {}
};

/// The port from the server's first line "listening on PORT".
unsigned short port_of(rltest::child_process& p) {
  const std::string l = p.line();
  const std::string prefix = "listening on ";
  if (l.rfind(prefix, 0) != 0) throw std::runtime_error("unexpected first line: " + l);
  return static_cast<unsigned short>(std::stoul(l.substr(prefix.size())));
}

/// A client connection speaking the line protocol.
class client {
 public:
  explicit client(unsigned short port) : socket_(io_) {
    socket_.connect({::asio::ip::make_address("127.0.0.1"), port});
  }
  /// Sends `line` and returns the reply line without its newline.
  std::string ask(const std::string& line) {
    ::asio::write(socket_, ::asio::buffer(line + "\n"));
    const std::size_t n = ::asio::read_until(socket_, ::asio::dynamic_buffer(buf_), '\n');
    std::string r = buf_.substr(0, n - 1);
    buf_.erase(0, n);
    return r;
  }

 private:
  ::asio::io_context io_;
  ::asio::ip::tcp::socket socket_;
  std::string buf_;
};

/// The wait of a "DENY us" reply, or -1 for any other reply.
long long denied_for(const std::string& reply) {
  if (reply.rfind("DENY ", 0) != 0) return -1;
  return std::stoll(reply.substr(5));
}

// Verifies the protocol in process: 2 per hour admits two per key, then
// denies with GCRA's wait (at most 30 min); keys are independent, requests on
// two connections share the limiter; bad lines get ERR and the connection
// stays usable; a line above 1 KiB closes its connection; SIGTERM exits 0.
TEST(AsioExample, LineProtocolInProcess) {
  process p({"--port", "0", "--rate", "2/1h"});
  const unsigned short port = port_of(p);
  client a(port), b(port);
  EXPECT_EQ(a.ask("CHECK k"), "ALLOW 1");
  EXPECT_EQ(b.ask("CHECK k"), "ALLOW 0");
  const long long wait = denied_for(a.ask("CHECK k"));
  EXPECT_GT(wait, 1'790'000'000);
  EXPECT_LE(wait, 1'800'000'000);
  EXPECT_EQ(b.ask("CHECK other\r"), "ALLOW 1");
  EXPECT_EQ(a.ask("HELLO"), "ERR expected: CHECK <key>");
  EXPECT_EQ(a.ask("CHECK "), "ERR bad key");
  client c(port);  // a line above 1 KiB closes that connection only
  EXPECT_THROW(c.ask("CHECK " + std::string(5000, 'x')), std::system_error);
  EXPECT_EQ(a.ask("CHECK other"), "ALLOW 0");
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(), 0);
}

// Verifies that bad options exit 2 with a usage message.
TEST(AsioExample, BadOptions) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--port", "70000"},
                                             {"--store", "nosuch://x"},
                                             {"--frobnicate", "1"},
                                             {"--port"},
                                             {"--idle-timeout-ms", "0"},
                                             {"--idle-timeout-ms", "x"},
                                             {"--port", "80x"},
                                             {"--port", "-1"},
                                             {"--port", " 80"},
                                             {"--idle-timeout-ms", "300ms"}}) {
    process p(args);
    const std::string out = p.rest();
    EXPECT_EQ(p.wait(), 2) << args[0] << " " << (args.size() > 1 ? args[1] : "");
    EXPECT_NE(out.find("usage:"), std::string::npos) << out;
  }
}

/// A TCP connection to 127.0.0.1:`port` (a raw descriptor), or -1.
int connect_raw(unsigned short port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Sends `line` on a new connection and returns the reply line, or "" when
/// none came within `limit` (a server that does not accept never answers).
std::string ask_within(unsigned short port, const std::string& line,
                       std::chrono::milliseconds limit) {
  const int fd = connect_raw(port);
  if (fd < 0) return "";
  const std::string out = line + "\n";
  std::string got;
  if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size())) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (got.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[256];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const std::size_t nl = got.find('\n');
  return nl == std::string::npos ? std::string() : got.substr(0, nl);
}

// Verifies that running out of file descriptors does not stop the server
// for good (many connections are hostile input too): with `ulimit -n 24`,
// 60 clients connect (the kernel queues those the server cannot accept),
// then all close, and a new client is served. The accept loop ended at the
// first EMFILE: the server ran on but never accepted again.
TEST(AsioExample, OutOfDescriptorsDoesNotStopAccepting) {
  rltest::child_process p("/bin/sh",
                          {"-c", "ulimit -n 24 && exec \"$0\" --rate 1000/1h", RATELIMIT_ASIO_EXE});
  const unsigned short port = port_of(p);
  EXPECT_EQ(ask_within(port, "CHECK k", 5s), "ALLOW 999");
  std::vector<int> many;
  for (int i = 0; i < 60; ++i) {
    const int fd = connect_raw(port);
    ASSERT_GE(fd, 0) << i;
    many.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);  // the server reaches its limit
  for (const int fd : many) ::close(fd);
  EXPECT_EQ(ask_within(port, "CHECK k", 5s), "ALLOW 998");  // 0.4 s refill 0.1 unit
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(), 0) << p.rest();
}

/// Milliseconds until the server closes `fd` (recv sees EOF or a reset),
/// or -1 when it is still open after `limit`.
long long closed_after(int fd, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto left = limit - std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - start);
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return -1;
    char buf[256];
    if (::recv(fd, buf, sizeof buf, 0) <= 0) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - start)
          .count();
    }
  }
}

// Verifies that slow clients are bounded in time (with a timeout of 300 ms):
// a silent connection and one whose line never ends are closed after about
// 300 ms, while a client asking every 100 ms for 900 ms keeps its connection.
// Without it, idle connections held their descriptors for ever (with the
// limit on descriptors, they shut everyone else out).
TEST(AsioExample, IdleConnectionsAreClosed) {
  process p({"--rate", "100/1s", "--idle-timeout-ms", "300"});
  const unsigned short port = port_of(p);
  const int silent = connect_raw(port);
  const int partial = connect_raw(port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(partial, 0);
  ASSERT_EQ(::send(partial, "CHECK k", 7, MSG_NOSIGNAL), 7);
  client active(port);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(active.ask("CHECK a").rfind("ALLOW ", 0), 0U) << i;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(active.ask("CHECK a").rfind("ALLOW ", 0), 0U);
  // Both idle ones were closed at about 300 ms, during the active client's 900 ms.
  EXPECT_GE(closed_after(silent, 100ms), 0);
  EXPECT_GE(closed_after(partial, 100ms), 0);
  ::close(silent);
  ::close(partial);
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(), 0);
}

#ifdef RATELIMIT_ASIO_HAVE_REDIS
// Verifies shutdown with checks in flight: Redis stopped (SIGSTOP), 8
// clients each waiting for a CHECK, then SIGTERM: the server exits 0 at
// once (sanitizer builds: no use after free while the limiter completes the
// checks into the stopped io_context and the io_context destroys them).
TEST(AsioExample, SigtermWithChecksInFlight) {
  rltest::redis_server server;
  const std::string url = "redis://127.0.0.1:" + std::to_string(server.port());
  process p({"--rate", "100/1s", "--store", url});
  const unsigned short port = port_of(p);
  EXPECT_EQ(ask_within(port, "CHECK k", 5s).rfind("ALLOW ", 0), 0U);  // connected
  server.pause();
  std::vector<int> waiting;
  for (int i = 0; i < 8; ++i) {
    const int fd = connect_raw(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, "CHECK k\n", 8, MSG_NOSIGNAL), 8);
    waiting.push_back(fd);
  }
  std::this_thread::sleep_for(50ms);  // every check written, none answered
  p.signal(SIGTERM);
  const auto start = std::chrono::steady_clock::now();
  const int code = p.wait();
  const std::string out = p.rest();
  EXPECT_EQ(code, 0) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  for (const int fd : waiting) ::close(fd);
  server.resume();
}

// Verifies two servers on one redis-server share the limit exactly, and that
// with Redis gone a request is answered ERR (the failure policy throws) and
// the server keeps running.
TEST(AsioExample, TwoServersShareRedis) {
  rltest::redis_server server;
  const std::string url = "redis://127.0.0.1:" + std::to_string(server.port());
  process p1({"--rate", "3/1h", "--store", url});
  process p2({"--rate", "3/1h", "--store", url});
  client a(port_of(p1)), b(port_of(p2));
  EXPECT_EQ(a.ask("CHECK k"), "ALLOW 2");
  EXPECT_EQ(b.ask("CHECK k"), "ALLOW 1");
  EXPECT_EQ(a.ask("CHECK k"), "ALLOW 0");
  EXPECT_GT(denied_for(b.ask("CHECK k")), 0);
  server.stop();
  EXPECT_EQ(a.ask("CHECK k"), "ERR store unavailable");
  EXPECT_EQ(a.ask("HELLO"), "ERR expected: CHECK <key>");
  p1.signal(SIGTERM);
  p2.signal(SIGTERM);
  const std::string out1 = p1.rest(), out2 = p2.rest();
  EXPECT_EQ(p1.wait(), 0) << out1;
  EXPECT_EQ(p2.wait(), 0) << out2;
}
#endif

}  // namespace
