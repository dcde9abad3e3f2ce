// SPDX-License-Identifier: Apache-2.0
// Test helper: a throwaway redis-server child process on a free 127.0.0.1 port.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ratelimit/redis.hpp"

namespace rltest {

/// True for a regular file this process may execute (a directory passes
/// access(X_OK) but cannot be run; execvp skips it the same way).
[[nodiscard]] inline bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

/// Where redis-server was looked for, and what was found.
struct redis_server_lookup {
  std::optional<std::string> path;  ///< the executable; unset = none found
  std::string looked;               ///< where it looked, for a message when none was found
};

/// Finds redis-server: $RATELIMIT_REDIS_SERVER when set (and an executable
/// file), else the first executable file of that name in a directory of
/// $PATH (/usr/bin:/usr/local/bin when PATH is unset).
[[nodiscard]] inline redis_server_lookup find_redis_server() {
  if (const char* p = std::getenv("RATELIMIT_REDIS_SERVER"); p != nullptr && *p != '\0') {
    if (executable_file(p)) return {std::string(p), {}};
    return {std::nullopt,
            "RATELIMIT_REDIS_SERVER=" + std::string(p) + " is not an executable file"};
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/bin:/usr/local/bin";
  const std::string looked = "RATELIMIT_REDIS_SERVER is unset or empty and no directory of " +
                             (path != nullptr ? "PATH=" + std::string(dirs)
                                              : std::string("/usr/bin:/usr/local/bin")) +
                             " has one";
  while (!dirs.empty()) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? "." : dir) + "/redis-server";
    if (executable_file(candidate)) return {candidate, {}};
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return {std::nullopt, looked};
}

/// Path of redis-server (find_redis_server).
/// @throws std::runtime_error saying how to install it
inline std::string redis_server_path() {
  redis_server_lookup found = find_redis_server();
  if (found.path) return std::move(*found.path);
  throw std::runtime_error(
      "redis-server not found (" + found.looked +
      "): the Redis tests run against a real server. Install it with "
      "`apt-get install redis-server` (or set RATELIMIT_TEST_REDIS_URL=redis://host:port to use a "
      "running server for the tests that do not stop it)");
}

/// A port that was free a moment ago.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free TCP port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Runs one command on a fresh connection (tests only).
inline ratelimit::redis::reply_ptr command(const ratelimit::redis::options& o,
                                           std::initializer_list<std::string_view> args) {
  ratelimit::redis::connection c(o);
  const std::vector<std::string_view> v(args);
  return c.command(v.data(), v.size(),
                   ratelimit::redis::deadline_clock::now() + std::chrono::seconds(5));
}

/// `redis-server --port <free> --bind 127.0.0.1 --save '' --appendonly no`,
/// killed by PID when destroyed (or when this process dies). With `tls_port`
/// it also listens for TLS on a second free port (`extra` then names the
/// certificate files: see tls_certs.hpp).
class redis_server {
 public:
  explicit redis_server(std::vector<std::string> extra = {}, bool tls_port = false)
      : extra_(std::move(extra)), tls_(tls_port) {
    const std::string exe = redis_server_path();
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port();
      if (tls_) tls_port_ = free_port();
      if (launch(exe)) return;
    }
    throw std::runtime_error("redis-server did not start (tried 5 ports)");
  }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;
  ~redis_server() { stop(); }

  /// Kills the server (SIGKILL) and waits for it. The signals go to its
  /// process group (its own, see launch), so a wrapper script that runs
  /// redis-server as a child of its own (RATELIMIT_REDIS_SERVER) leaves no
  /// server behind either.
  void stop() noexcept {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGCONT);
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  /// Starts it again on the same port (empty, as after a crash without persistence).
  void restart() {
    stop();
    const std::string exe = redis_server_path();
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (launch(exe)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("redis-server did not restart on port " + std::to_string(port_));
  }
  void pause() noexcept { ::kill(-pid_, SIGSTOP); }
  void resume() noexcept { ::kill(-pid_, SIGCONT); }

  [[nodiscard]] int port() const noexcept { return port_; }
  /// The TLS port (0 without one).
  [[nodiscard]] int tls_port() const noexcept { return tls_port_; }
  [[nodiscard]] ratelimit::redis::options options() const {
    ratelimit::redis::options o;
    o.host = "127.0.0.1";
    o.port = port_;
    o.connect_timeout = std::chrono::milliseconds(1000);
    o.command_timeout = std::chrono::milliseconds(2000);
    return o;
  }

 private:
  bool launch(const std::string& exe) {
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {
        exe,  "--port",      port, "--bind",    "127.0.0.1", "--save", "", "--appendonly",
        "no", "--daemonize", "no", "--logfile", ""};
    if (tls_) {
      args.insert(args.end(), {"--tls-port", std::to_string(tls_port_)});
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setpgid(0, 0);  // a group of its own: stop() kills what it started too
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // as the child does, in case stop() comes first
    pid_ = pid;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: port taken?
        pid_ = -1;
        return false;
      }
      try {
        auto r = command(options(), {"PING"});
        if (r->type == REDIS_REPLY_STATUS) return true;
      } catch (const ratelimit::store_error&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop();
    return false;
  }

  std::vector<std::string> extra_;
  bool tls_ = false;
  int port_ = 0;
  int tls_port_ = 0;
  pid_t pid_ = -1;
};

/// Options for tests that do not stop the server: $RATELIMIT_TEST_REDIS_URL
/// if set, else a server started once for this test process.
inline ratelimit::redis::options shared_redis() {
  if (const char* url = std::getenv("RATELIMIT_TEST_REDIS_URL"); url != nullptr && *url != '\0') {
    ratelimit::redis::options o = ratelimit::redis::parse_url(url);
    o.connect_timeout = std::chrono::milliseconds(1000);
    o.command_timeout = std::chrono::milliseconds(2000);
    return o;
  }
  static const std::unique_ptr<redis_server> server = std::make_unique<redis_server>();
  return server->options();
}

/// A prefix unique to this process and call, so tests sharing a server never collide.
inline std::string unique_prefix(std::string_view what) {
  static int n = 0;
  return "rltest:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
         std::string(what) + ":";
}

}  // namespace rltest
