// SPDX-License-Identifier: Apache-2.0
// The connection's own socket path against fake servers that misbehave on
// purpose: replies split into single bytes, a reply that never ends, a peer
// that never answers or closes mid-reply, bytes nobody asked for, unix
// sockets and IPv6, and no file descriptor left behind by any failure.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/redis.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

/// Open file descriptors of this process.
int open_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n - 1;  // the directory's own descriptor
}

/// Reads from `fd` until `n` bytes came or the peer went away.
std::string read_some(int fd, std::size_t n) {
  std::string got;
  char buf[4096];
  while (got.size() < n) {
    const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - got.size()), 0);
    if (r <= 0) break;
    got.append(buf, static_cast<std::size_t>(r));
  }
  return got;
}

/// Sends all of `s` (false when the peer went away).
bool send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t r = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (r <= 0) return false;
    s.remove_prefix(static_cast<std::size_t>(r));
  }
  return true;
}

/// A listening socket (TCP on 127.0.0.1 or ::1, or a unix socket) whose
/// accepted connections are served by `serve` on a thread, one at a time.
class fake_server {
 public:
  enum class kind { v4, v6, unix_socket };

  explicit fake_server(std::function<void(int)> serve, kind k = kind::v4)
      : serve_(std::move(serve)) {
    if (k == kind::unix_socket) {
      path_ = "/tmp/rltest-fake-" + std::to_string(::getpid()) + "-" +
              std::to_string(counter_.fetch_add(1)) + ".sock";
      ::unlink(path_.c_str());
      fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::memcpy(a.sun_path, path_.c_str(), path_.size());
      ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    } else if (k == kind::v6) {
      fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_loopback;
      socklen_t len = sizeof a;
      ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0;
      port_ = ntohs(a.sin6_port);
    } else {
      fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof a;
      ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0;
      port_ = ntohs(a.sin_port);
    }
    ok_ = ok_ && ::listen(fd_, 16) == 0 && ::pipe(stop_) == 0;
    if (ok_) thread_ = std::thread([this] { run(); });
  }
  fake_server(const fake_server&) = delete;
  fake_server& operator=(const fake_server&) = delete;
  ~fake_server() {
    if (thread_.joinable()) {
      (void)!::write(stop_[1], "x", 1);
      thread_.join();
    }
    ::close(fd_);
    for (const int p : stop_) {
      if (p >= 0) ::close(p);
    }
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  [[nodiscard]] bool ok() const noexcept { return ok_; }

  /// Options to connect here (store defaults otherwise).
  [[nodiscard]] redis::options options(kind k = kind::v4) const {
    redis::options o;
    if (k == kind::unix_socket) {
      o.unix_socket = path_;
    } else {
      o.host = k == kind::v6 ? "::1" : "127.0.0.1";
      o.port = port_;
    }
    o.connect_timeout = 500ms;
    return o;
  }

 private:
  void run() {
    for (;;) {
      pollfd p[2] = {{stop_[0], POLLIN, 0}, {fd_, POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) continue;
      if (p[0].revents != 0) return;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      serve_(c);
      ::close(c);
    }
  }

  static inline std::atomic<int> counter_{0};
  std::function<void(int)> serve_;
  int fd_ = -1;
  int port_ = 0;
  int stop_[2] = {-1, -1};
  bool ok_ = false;
  std::string path_;
  std::thread thread_;
};

/// The bytes of one PING command as the connection sends it.
constexpr std::string_view ping_bytes = "*1\r\n$4\r\nPING\r\n";

redis::reply_ptr ping(redis::connection& c, clk::duration timeout) {
  const std::string_view args[] = {"PING"};
  return c.command(args, 1, clk::now() + timeout);
}

// Verifies a reply that arrives one byte per segment (each a separate read)
// is assembled, and that a command read one byte at a time by the server is
// sent whole.
TEST(Transport, ReplySplitIntoSingleBytes) {
  fake_server server([](int fd) {
    for (int i = 0; i < 2; ++i) {
      if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
      for (const char ch : std::string_view("$5\r\nhello\r\n")) {
        if (!send_all(fd, std::string_view(&ch, 1))) return;
        std::this_thread::sleep_for(1ms);
      }
    }
    (void)read_some(fd, 1);
  });
  ASSERT_TRUE(server.ok());
  redis::connection c(server.options());
  for (int i = 0; i < 2; ++i) {
    const redis::reply_ptr r = ping(c, 5s);
    ASSERT_EQ(r->type, REDIS_REPLY_STRING);
    EXPECT_EQ(std::string(r->str, r->len), "hello");
  }
  EXPECT_FALSE(c.broken());
}

// Verifies a reply that never ends (a bulk string announced as 2 GB, then an
// endless stream) is refused once more than 64 MiB of it came, with a
// connection_error saying so: the client neither buffers what the peer
// announces nor reads until the deadline.
TEST(Transport, EndlessReplyIsRefused) {
  std::atomic<bool> stop{false};
  fake_server server([&](int fd) {
    if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
    if (!send_all(fd, "$2000000000\r\n")) return;
    const std::string chunk(1 << 16, 'x');
    for (std::size_t sent = 0; sent < (std::size_t{80} << 20) && !stop; sent += chunk.size()) {
      if (!send_all(fd, chunk)) return;
    }
    (void)read_some(fd, 1);  // until the client goes away
  });
  ASSERT_TRUE(server.ok());
  redis::connection c(server.options());
  std::string what;
  try {
    (void)ping(c, 20s);
  } catch (const redis::timeout_error& e) {
    what = std::string("timeout: ") + e.what();
  } catch (const redis::connection_error& e) {
    what = e.what();
  }
  stop = true;
  EXPECT_NE(what.find("larger than 64 MiB"), std::string::npos) << what;
  EXPECT_TRUE(c.broken());
}

/// Reads a PING, then answers with an array announcing 2^28 elements and
/// sends up to 75 MiB of tiny ones (until `stop`).
void answer_ping_with_millions_of_elements(int fd, const std::atomic<bool>& stop) {
  if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
  if (!send_all(fd, "*268435456\r\n")) return;
  std::string chunk;
  for (int i = 0; i < 16384; ++i) chunk += ":1\r\n";
  for (int i = 0; i < 300 && !stop; ++i) {
    if (!send_all(fd, chunk)) return;
  }
  (void)read_some(fd, 1);
}

// Verifies a reply announcing an array of 2^28 elements and then sending
// millions of tiny ones is refused after 2^20 elements (the reader would
// otherwise allocate a 2 GiB array and a reply object per 4 bytes received).
TEST(Transport, ReplyWithMillionsOfElementsIsRefused) {
  std::atomic<bool> stop{false};
  fake_server server([&](int fd) { answer_ping_with_millions_of_elements(fd, stop); });
  ASSERT_TRUE(server.ok());
  redis::connection c(server.options());
  std::string what;
  try {
    (void)ping(c, 20s);
  } catch (const redis::timeout_error& e) {
    what = std::string("timeout: ") + e.what();
  } catch (const redis::connection_error& e) {
    what = e.what();
  }
  stop = true;
  EXPECT_NE(what.find("more than 1048576 elements"), std::string::npos) << what;
  EXPECT_TRUE(c.broken());
}

// Verifies the same bound on a multiplexed connection: a reply announcing
// 2^28 elements fails the check written on it with a connection_error that
// says why, instead of letting the reader grow without bound.
TEST(Transport, MultiplexedReplyWithMillionsOfElementsIsRefused) {
  std::atomic<bool> stop{false};
  fake_server server([&](int fd) { answer_ping_with_millions_of_elements(fd, stop); });
  ASSERT_TRUE(server.ok());
  struct job final : redis::mux_job {
    std::promise<std::string>* out = nullptr;
    void complete(std::unique_ptr<redis::mux_job>, redis::reply_ptr r,
                  std::exception_ptr error) noexcept override {
      try {
        if (error) std::rethrow_exception(error);
        out->set_value(r ? "a reply" : "nothing");
      } catch (const std::exception& e) {
        out->set_value(e.what());
      }
    }
  };
  std::promise<std::string> result;
  redis::multiplexer mux(server.options(), 1);
  auto j = std::make_unique<job>();
  j->out = &result;
  j->bytes = std::string(ping_bytes);
  j->until = redis::deadline_clock::now() + 20s;
  std::unique_ptr<redis::mux_job> base = std::move(j);
  ASSERT_TRUE(mux.submit(base));
  const std::string what = result.get_future().get();
  stop = true;
  EXPECT_NE(what.find("more than 1048576 elements"), std::string::npos) << what;
  EXPECT_EQ(mux.connections_dropped(), 1u);
}

// Verifies a peer that accepts, reads the command and never answers makes
// the command fail with timeout_error at its deadline: not before, and not
// much after (no hang).
TEST(Transport, SilentPeerTimesOutAtTheDeadline) {
  fake_server server([](int fd) { (void)read_some(fd, 1 << 20); });
  ASSERT_TRUE(server.ok());
  redis::connection c(server.options());
  const auto start = clk::now();
  EXPECT_THROW((void)ping(c, 150ms), redis::timeout_error);
  const auto took = clk::now() - start;
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 2s);
  EXPECT_TRUE(c.broken());
}

// Verifies a server that closes in the middle of a reply gives a
// connection_error (and a broken connection), and one that sends bytes no
// command asked for makes the idle connection count as closed.
TEST(Transport, CloseMidReplyAndUnaskedBytes) {
  int served = 0;
  fake_server server([&served](int fd) {
    if (served++ == 0) {
      if (read_some(fd, ping_bytes.size()) == ping_bytes) {
        (void)send_all(fd, "$10\r\nhal");  // then the connection ends
      }
    } else {
      (void)send_all(fd, "+surprise\r\n");
      (void)read_some(fd, 1);
    }
  });
  ASSERT_TRUE(server.ok());
  {
    redis::connection c(server.options());
    EXPECT_THROW((void)ping(c, 5s), redis::connection_error);
    EXPECT_TRUE(c.broken());
  }
  {
    redis::connection c(server.options());
    const auto until = clk::now() + 5s;
    while (!c.peer_closed() && clk::now() < until) std::this_thread::sleep_for(5ms);
    EXPECT_TRUE(c.broken());
  }
}

// Verifies writes to a server that went away fail with connection_error and
// raise no SIGPIPE (which would end this process), also for a command larger
// than the socket buffers.
TEST(Transport, WriteToAClosedPeerRaisesNoSigpipe) {
  fake_server server([](int) {});  // closes at once
  ASSERT_TRUE(server.ok());
  redis::connection c(server.options());
  std::this_thread::sleep_for(50ms);
  const std::string big(8 << 20, 'v');
  const std::string_view args[] = {"SET", "k", big};
  bool failed = false;
  for (int i = 0; i < 3 && !failed; ++i) {
    try {
      (void)c.command(args, 3, clk::now() + 5s);
    } catch (const redis::connection_error&) {
      failed = true;
    }
  }
  EXPECT_TRUE(failed);
}

// Verifies the connection works over a unix socket and over IPv6 (when the
// machine has ::1).
TEST(Transport, UnixSocketAndIpv6) {
  const auto pong = [](int fd) {
    while (read_some(fd, ping_bytes.size()) == ping_bytes) {
      if (!send_all(fd, "+PONG\r\n")) return;
    }
  };
  {
    fake_server server(pong, fake_server::kind::unix_socket);
    ASSERT_TRUE(server.ok());
    redis::connection c(server.options(fake_server::kind::unix_socket));
    EXPECT_EQ(ping(c, 5s)->type, REDIS_REPLY_STATUS);
  }
  fake_server server(pong, fake_server::kind::v6);
  if (!server.ok()) GTEST_SKIP() << "no IPv6 loopback here";
  redis::connection c(server.options(fake_server::kind::v6));
  EXPECT_EQ(c.where(), "[::1]:" + std::to_string(server.options(fake_server::kind::v6).port));
  EXPECT_EQ(ping(c, 5s)->type, REDIS_REPLY_STATUS);
}

// Verifies signals interrupting every wait (a handler without SA_RESTART,
// so poll and recv fail with EINTR) change nothing: a reply that comes after
// 200 ms is read whole, and a silent peer still times out at the deadline.
TEST(Transport, SignalsDuringWaitsChangeNothing) {
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  struct sigaction old {};
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  int served = 0;
  fake_server server([&served](int fd) {
    if (served++ == 0) {
      if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
      std::this_thread::sleep_for(200ms);
      (void)send_all(fd, "+PONG\r\n");
    }
    (void)read_some(fd, 1 << 20);
  });
  ASSERT_TRUE(server.ok());
  const pthread_t self = ::pthread_self();
  std::atomic<bool> stop{false};
  std::thread signaller([&] {
    while (!stop) {
      ::pthread_kill(self, SIGUSR1);
      std::this_thread::sleep_for(1ms);
    }
  });
  {
    redis::connection c(server.options());
    const auto r = ping(c, 5s);
    EXPECT_EQ(r->type, REDIS_REPLY_STATUS);
  }
  redis::connection c(server.options());
  const auto start = clk::now();
  EXPECT_THROW((void)ping(c, 150ms), redis::timeout_error);
  const auto took = clk::now() - start;
  stop = true;
  signaller.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 2s);
}

// Verifies a host, unix socket path or TLS server name holding a NUL byte
// fails the connect with connection_error instead of connecting to the text
// before the NUL (a socket path "\0..." would name an abstract socket).
TEST(Transport, NulBytesInAddressesFailTheConnect) {
  const std::string abstract_name = std::string(1, '\0') + "rltest-abstract-" +
                                    std::to_string(::getpid());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, abstract_name.data(), abstract_name.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  const auto error = [](const redis::options& o) -> std::string {
    try {
      redis::connection c(o);
    } catch (const redis::connection_error& e) {
      return e.what();
    }
    return "";
  };
  redis::options o;
  o.unix_socket = abstract_name;
  EXPECT_NE(error(o).find("NUL byte"), std::string::npos) << error(o);
  ::close(fd);
  o = {};
  o.host = std::string("127.0.0.1\0.evil", 15);
  EXPECT_NE(error(o).find("NUL byte"), std::string::npos) << error(o);
  fake_server server([](int f) { (void)read_some(f, 1); });
  ASSERT_TRUE(server.ok());
  o = server.options();
  o.tls.enabled = true;
  o.tls.server_name = std::string("localhost\0.evil", 15);
  EXPECT_NE(error(o).find("NUL byte"), std::string::npos) << error(o);
}

// Verifies that a host, unix socket path, TLS server name or TLS file set in
// code (options fields: parse_url refuses a control byte in them, code may
// set one) is quoted escaped by the connect and TLS errors, each byte
// outside printable ASCII as \xNN (detail::escaped_name): "cannot connect
// to /t/s\r\nX-Forged: 1: ..." put a raw CR LF into the message, and so into
// a log line.
TEST(Transport, ControlBytesInHostsAndPathsAreEscaped) {
  // No ':' (the host would read as IPv6), nor '=', ';' or '&' (a socket
  // path is quoted up to the first, detail::quoted_part).
  const std::string forged = "\r\nX-Forged-1";
  const std::string shown = "\\x0d\\x0aX-Forged-1";
  const auto error = [](const redis::options& o) -> std::string {
    try {
      redis::connection c(o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  const auto check = [&](const std::string& what, const std::string& said) {
    SCOPED_TRACE(redis::detail::escaped_name(what));
    EXPECT_NE(what.find(said), std::string::npos);
    EXPECT_NE(what.find(shown), std::string::npos);
    EXPECT_FALSE(std::any_of(what.begin(), what.end(), [](char ch) {
      const auto c = static_cast<unsigned char>(ch);
      return c < 0x20 || c == 0x7f;
    }));
  };
  redis::options o;
  o.unix_socket = "/nonexistent/rltest" + forged;
  check(error(o), "cannot connect to /nonexistent/rltest" + shown + ": ");
  o.unix_socket = "/nonexistent/" + forged + std::string(120, 'a');
  check(error(o), "the path is too long");
  o.tls.enabled = true;
  check(error(o), "cannot connect to /nonexistent/" + shown);
  try {
    redis::connection_pool pool(o);
    ADD_FAILURE() << "TLS over a unix socket was taken";
  } catch (const std::invalid_argument& e) {
    check(e.what(), "unix socket \"/nonexistent/" + shown);
  }

  // A host name: the resolver's failures, then a refused connect.
  o = {};
  o.host = "redis" + forged;
  o.connect_timeout = 500ms;
  o.resolver = [](const std::string&) { return std::vector<std::string>{}; };
  check(error(o), "\"redis" + shown + "\" resolved to no address");
  o.resolver = [](const std::string&) -> std::vector<std::string> {
    throw std::runtime_error("no such host");
  };
  check(error(o), "cannot resolve \"redis" + shown + "\": no such host");
  o.resolver = [forged](const std::string&) { return std::vector<std::string>{"a" + forged}; };
  check(error(o), "resolved to \"a" + shown + "\", which is no numeric address");
  const int closed = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // bound, not listening
  ASSERT_GE(closed, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(closed, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::getsockname(closed, reinterpret_cast<sockaddr*>(&a), &len), 0);
  o.resolver = [](const std::string&) { return std::vector<std::string>{"127.0.0.1"}; };
  o.port = ntohs(a.sin_port);
  check(error(o), "cannot connect to redis" + shown + ":" + std::to_string(o.port) + ": ");
  ::close(closed);

  // TLS: the peer in the handshake's messages, the server name, the files.
  fake_server server([](int f) { (void)read_some(f, 1); });  // no TLS: closes
  ASSERT_TRUE(server.ok());
  o.port = server.options().port;
  o.tls.enabled = true;
  o.tls.verify = redis::tls_verify::none;
  check(error(o), "TLS handshake with redis" + shown + ":" + std::to_string(o.port));
  o.tls.verify = redis::tls_verify::full;
  o.tls.server_name = std::string(300, 'n') + forged;  // too long for SNI
  check(error(o), "bad server name \"nnn");
  o.tls.server_name.clear();
  o.tls.ca_file = "/nonexistent/ca" + forged;
  try {
    redis::connection_pool pool(o);
    ADD_FAILURE() << "a missing CA file was taken";
  } catch (const std::invalid_argument& e) {
    check(e.what(), "TLS CA file (ca) \"/nonexistent/ca" + shown + "\": ");
  }
}

// Verifies no failure leaves a file descriptor open: refused connects,
// connect and handshake timeouts, TLS to a peer that speaks no TLS, a
// resolver that fails, a reply cut off, a command timeout, a missing unix
// socket.
TEST(Transport, FailuresLeaveNoDescriptorOpen) {
  fake_server silent([](int fd) { (void)read_some(fd, 1 << 20); });
  fake_server garbage([](int fd) {
    (void)read_some(fd, 1);
    (void)send_all(fd, "-ERR no TLS here\r\n");
  });
  ASSERT_TRUE(silent.ok());
  ASSERT_TRUE(garbage.ok());
  int refused_port = 0;
  {
    fake_server gone([](int) {});
    refused_port = gone.options().port;
  }
  const auto fail = [](const redis::options& o) {
    try {
      redis::connection c(o);
      (void)ping(c, 100ms);
    } catch (const store_error&) {
    } catch (const std::invalid_argument&) {
    }
  };
  const int before = open_fds();
  for (int i = 0; i < 3; ++i) {
    redis::options o = silent.options();
    o.port = refused_port;
    fail(o);                 // refused
    fail(silent.options());  // command timeout
    o = silent.options();
    o.tls.enabled = true;
    o.tls.verify = redis::tls_verify::none;
    o.connect_timeout = 100ms;
    fail(o);  // handshake timeout
    o = garbage.options();
    o.tls.enabled = true;
    o.tls.verify = redis::tls_verify::none;
    fail(o);  // no TLS there
    o = silent.options();
    o.host = "name.invalid";
    o.resolver = [](const std::string&) -> std::vector<std::string> {
      throw std::runtime_error("no such name");
    };
    fail(o);
    o.resolver = [](const std::string&) -> std::vector<std::string> { return {"not-numeric"}; };
    fail(o);
    o = silent.options();
    o.unix_socket = "/nonexistent/rltest.sock";
    fail(o);
  }
  std::this_thread::sleep_for(50ms);  // resolver threads finish
  EXPECT_EQ(open_fds(), before);
}

/// The bytes of a script's usual reply, and its values.
constexpr std::string_view gcra_reply = "*5\r\n:1\r\n:1\r\n:9\r\n:0\r\n:-90000000\r\n";
constexpr long long gcra_values[5] = {1, 1, 9, 0, -90000000};

/// Sends PING and reads the answer as a script's reply, within `timeout`.
void script_call(redis::connection& c, clk::duration timeout, redis::script_reply& out) {
  const auto until = clk::now() + timeout;
  c.send(ping_bytes, until);
  c.receive_script(until, out);
}

// Verifies receive_script (the pooled single check's read): a reply of
// integers that arrives whole is read without hiredis, one that arrives a
// byte at a time goes through hiredis with the same values, an error reply
// (NOSCRIPT) comes back whole, and a node failure (READONLY) throws
// connection_error as receive() does; over TCP and a unix socket.
TEST(Transport, ScriptRepliesWholeSplitAndErrors) {
  const auto serve = [](int fd) {
    int n = 0;
    while (read_some(fd, ping_bytes.size()) == ping_bytes) {
      switch (n++) {
        case 0: (void)send_all(fd, gcra_reply); break;
        case 1:
          for (const char ch : gcra_reply) {
            if (!send_all(fd, std::string_view(&ch, 1))) return;
            std::this_thread::sleep_for(1ms);
          }
          break;
        case 2: (void)send_all(fd, "-NOSCRIPT No matching script. Please use EVAL.\r\n"); break;
        default: (void)send_all(fd, "-READONLY You can't write against a read only replica.\r\n");
      }
    }
  };
  for (const auto kind : {fake_server::kind::v4, fake_server::kind::unix_socket}) {
    fake_server server(serve, kind);
    ASSERT_TRUE(server.ok());
    redis::connection c(server.options(kind));
    redis::script_reply r;
    script_call(c, 5s, r);
    ASSERT_EQ(r.count, 5u);
    EXPECT_EQ(r.other, nullptr);
    for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(r.values[i], gcra_values[i]);
    script_call(c, 5s, r);
    ASSERT_EQ(r.count, 0u);
    ASSERT_NE(r.other, nullptr);
    ASSERT_EQ(r.other->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(r.other->elements, 5u);
    for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(r.other->element[i]->integer, gcra_values[i]);
    script_call(c, 5s, r);
    ASSERT_EQ(r.count, 0u);
    ASSERT_NE(r.other, nullptr);
    EXPECT_TRUE(redis::detail::is_noscript(*r.other));
    EXPECT_FALSE(c.broken());
    EXPECT_THROW(script_call(c, 5s, r), redis::connection_error);
    EXPECT_TRUE(c.broken());
  }
}

// Verifies the deadline of receive_script's blocking read: a reply that
// comes after the read's own limit (3/4 of the time left less 10 ms, 1,492
// ms of 2 s, which the kernel may stretch to 1,689 ms) but before the
// deadline is read; a silent peer times out at the deadline, not before and
// not much after; a peer that closes gives connection_error.
TEST(Transport, ScriptReplyDeadlineIsExact) {
  int served = 0;
  fake_server server([&served](int fd) {
    const int n = served++;
    if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
    if (n == 0) {
      std::this_thread::sleep_for(1800ms);  // past the read's limit, before the deadline (2 s)
      (void)send_all(fd, gcra_reply);
      (void)read_some(fd, 1 << 20);
    } else if (n == 1) {
      (void)read_some(fd, 1 << 20);  // silent
    }                                // else: closes
  });
  ASSERT_TRUE(server.ok());
  {
    redis::connection c(server.options());
    redis::script_reply r;
    const auto start = clk::now();
    script_call(c, 2s, r);
    EXPECT_GE(clk::now() - start, 1800ms);
    ASSERT_EQ(r.count, 5u);
    EXPECT_EQ(r.values[4], gcra_values[4]);
  }
  {
    redis::connection c(server.options());
    redis::script_reply r;
    const auto start = clk::now();
    EXPECT_THROW(script_call(c, 300ms, r), redis::timeout_error);
    const auto took = clk::now() - start;
    EXPECT_GE(took, 300ms);
    EXPECT_LT(took, 2s);
    EXPECT_TRUE(c.broken());
  }
  redis::connection c(server.options());
  redis::script_reply r;
  EXPECT_THROW(script_call(c, 5s, r), redis::connection_error);
  EXPECT_TRUE(c.broken());
}

// Verifies signals interrupting receive_script's waits (no SA_RESTART: the
// blocking recv and poll fail with EINTR) change nothing: a reply after
// 200 ms is read, a silent peer times out at the deadline.
TEST(Transport, SignalsDuringScriptReplyWaitsChangeNothing) {
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  struct sigaction old {};
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  int served = 0;
  fake_server server([&served](int fd) {
    if (served++ == 0) {
      if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
      std::this_thread::sleep_for(200ms);
      (void)send_all(fd, gcra_reply);
    }
    (void)read_some(fd, 1 << 20);
  });
  ASSERT_TRUE(server.ok());
  const pthread_t self = ::pthread_self();
  std::atomic<bool> stop{false};
  std::thread signaller([&] {
    while (!stop) {
      ::pthread_kill(self, SIGUSR1);
      std::this_thread::sleep_for(1ms);
    }
  });
  redis::script_reply r;
  {
    redis::connection c(server.options());
    script_call(c, 5s, r);
  }
  redis::connection c(server.options());
  const auto start = clk::now();
  redis::script_reply silent;
  EXPECT_THROW(script_call(c, 150ms, silent), redis::timeout_error);
  const auto took = clk::now() - start;
  stop = true;
  signaller.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(r.count, 5u);
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 2s);
}

// Verifies that a server's error replies reach exception messages escaped
// (detail::reply_text, as detail::printable writes bytes): a hostile server,
// or a man in the middle of a plain connection, answering AUTH, SELECT, a
// command or a script with "-ERR a\nb\x1b[31m" put a raw LF and an escape
// sequence into the message, and so into a log line.
TEST(Transport, ServerErrorRepliesAreQuotedEscaped) {
  const std::string hostile = "-ERR a\nb\x1b[31mc\"d\r\n";
  const std::string shown = "ERR a\\x0ab\\x1b[31mc\\x22d";
  // Answers each command (one read each) with the next of `replies`.
  const auto answer_each = [](std::vector<std::string> replies) {
    return [replies](int fd) {
      char buf[4096];
      for (const std::string& r : replies) {
        if (::recv(fd, buf, sizeof buf, 0) <= 0 || !send_all(fd, r)) return;
      }
      (void)read_some(fd, 1 << 20);
    };
  };
  const auto connect_error = [](const redis::options& o) -> std::string {
    try {
      redis::connection c(o);
    } catch (const redis::connection_error& e) {
      return e.what();
    }
    return "connected";
  };
  const auto raw = [](const std::string& why) {
    return why.find_first_of("\n\r\x1b") != std::string::npos;
  };
  {
    fake_server server(answer_each({hostile}));
    ASSERT_TRUE(server.ok());
    redis::options o = server.options();
    o.user = "u";
    o.password = "pw";
    const std::string why = connect_error(o);
    EXPECT_NE(why.find("AUTH as user \"u\" at 127.0.0.1:"), std::string::npos) << why;
    EXPECT_NE(why.find(" failed: " + shown), std::string::npos) << why;
    EXPECT_FALSE(raw(why)) << why;
  }
  {
    fake_server server(answer_each({hostile}));
    ASSERT_TRUE(server.ok());
    redis::options o = server.options();
    o.database = 2;
    const std::string why = connect_error(o);
    EXPECT_NE(why.find("SELECT 2 at 127.0.0.1:"), std::string::npos) << why;
    EXPECT_NE(why.find(" failed: " + shown), std::string::npos) << why;
    EXPECT_FALSE(raw(why)) << why;
  }
  // A node failure (receive) and a script's error reply (parse_reply).
  {
    fake_server server(answer_each({"-LOADING a\nb\x1b[2J\r\n"}));
    ASSERT_TRUE(server.ok());
    redis::connection c(server.options());
    try {
      (void)ping(c, 5s);
      ADD_FAILURE() << "no error";
    } catch (const redis::connection_error& e) {
      const std::string why = e.what();
      EXPECT_NE(why.find("cannot serve checks now: LOADING a\\x0ab\\x1b[2J"), std::string::npos)
          << why;
      EXPECT_FALSE(raw(why)) << why;
    }
  }
  fake_server server(answer_each({hostile}));
  ASSERT_TRUE(server.ok());
  redis::connection c(server.options());
  const auto r = ping(c, 5s);
  ASSERT_EQ(r->type, REDIS_REPLY_ERROR);
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  try {
    (void)redis::detail::parse_reply(cfg, *r);
    ADD_FAILURE() << "no error";
  } catch (const redis::script_error& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("script failed: " + shown), std::string::npos) << why;
    EXPECT_FALSE(raw(why)) << why;
  }
}

}  // namespace

// Verifies a pooled connection whose last reply came with unasked bytes in
// the same read (here an extra ":7\r\n" after the script's reply: a hostile
// or broken server or proxy) is not lent again: those bytes sit in the reply
// reader, where poll() on the socket cannot see them, and the next check on
// it would read them as its own reply and every later check the reply of the
// check before (a permanent shift of answers between keys). The pool drops
// it and the next check gets its own reply on a new connection.
TEST(Transport, UnaskedBytesAfterAReplyRetireThePooledConnection) {
  const std::string config_get = "*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$16\r\nmaxmemory-policy\r\n";
  constexpr std::string_view other_reply = "*5\r\n:0\r\n:0\r\n:0\r\n:5\r\n:100\r\n";
  std::atomic<int> connections{0};
  fake_server server([&](int fd) {
    if (connections.fetch_add(1) == 0) {
      if (read_some(fd, config_get.size()) != config_get) return;
      if (!send_all(fd, "-ERR not here\r\n")) return;
      if (read_some(fd, ping_bytes.size()) != ping_bytes) return;
      if (!send_all(fd, std::string(gcra_reply) + ":7\r\n")) return;  // one segment
    }
    while (read_some(fd, ping_bytes.size()) == ping_bytes) {
      if (!send_all(fd, other_reply)) return;
    }
  });
  ASSERT_TRUE(server.ok());
  redis::options o = server.options();
  o.pool_size = 1;
  redis::connection_pool pool(o);
  redis::script_reply r;
  {
    redis::connection_pool::lease l = pool.acquire(clk::now() + 2s);
    script_call(*l, 2s, r);
    ASSERT_NE(r.other, nullptr);  // more than one reply in the read: hiredis's path
    ASSERT_EQ(r.other->type, REDIS_REPLY_ARRAY);
    ASSERT_EQ(r.other->elements, 5u);
    EXPECT_EQ(r.other->element[4]->integer, gcra_values[4]);
  }
  redis::connection_pool::lease l = pool.acquire(clk::now() + 2s);
  script_call(*l, 2s, r);
  ASSERT_EQ(r.count, 5u) << (r.other != nullptr ? r.other->type : -1);
  EXPECT_EQ(r.values[3], 5);
  EXPECT_EQ(r.values[4], 100);
  EXPECT_EQ(connections.load(), 2);
}
