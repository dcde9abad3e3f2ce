// SPDX-License-Identifier: Apache-2.0
// The Asio example server (examples/asio) as a user runs it: the line
// protocol over TCP, in process and on a real redis-server shared by two
// servers, bad requests, bad options, SIGTERM.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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
#ifdef RATELIMIT_ASIO_HAVE_REDIS
#include "redis_server.hpp"
#endif

namespace {

using namespace std::chrono_literals;

/// The example started with `args`, its stdout and stderr on one pipe.
class process {
 public:
  explicit process(std::vector<std::string> args) {
    args.insert(args.begin(), RATELIMIT_ASIO_EXE);
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  process(const process&) = delete;
  process& operator=(const process&) = delete;
  ~process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
  }

  /// Output up to and including the next newline (waits up to 30 s), or all of it at EOF.
  std::string line() {
    while (true) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string l = buf_.substr(0, nl + 1);
        buf_.erase(0, nl + 1);
        return l;
      }
      if (!fill()) return std::exchange(buf_, {});
    }
  }
  /// All output up to EOF.
  std::string rest() {
    while (fill()) {
    }
    return std::exchange(buf_, {});
  }

  void signal(int sig) const { ::kill(pid_, sig); }

  /// The exit code (waits up to 30 s), or -1 if it did not exit normally.
  int wait() {
    int status = 0;
    for (int i = 0; i < 3000; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  bool fill() {
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, 30'000) <= 0) return false;
    char b[4096];
    const ssize_t n = ::read(out_, b, sizeof b);
    if (n <= 0) return false;
    buf_.append(b, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

/// The port from the server's first line "listening on PORT".
unsigned short port_of(process& p) {
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
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--port", "70000"}, {"--store", "nosuch://x"}, {"--frobnicate", "1"}, {"--port"}}) {
    process p(args);
    const std::string out = p.rest();
    EXPECT_EQ(p.wait(), 2) << args[0];
    EXPECT_NE(out.find("usage:"), std::string::npos) << out;
  }
}

#ifdef RATELIMIT_ASIO_HAVE_REDIS
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
