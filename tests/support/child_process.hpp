// SPDX-License-Identifier: Apache-2.0
// A built executable run as a user runs it, for the example tools' tests: its
// output read line by line, signals, its exit code.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rltest {

/// The executable `exe` started with `args`, its stdout and stderr on one
/// pipe; killed (SIGKILL) and reaped when this object goes, and when the test
/// process dies (PR_SET_PDEATHSIG).
class child_process {
 public:
  child_process(const std::string& exe, std::vector<std::string> args) {
    args.insert(args.begin(), exe);
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
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() {
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
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
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

}  // namespace rltest
