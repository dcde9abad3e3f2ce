// SPDX-License-Identifier: Apache-2.0
// Runs functions in forked children: one and how it ended, killing it when it
// hangs (in_child), or several at once and what each counted (sum_in_children).
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace rltest {

/// How a child run by in_child() ended.
struct child_end {
  bool hung = false;  ///< still running at the deadline: killed with SIGKILL
  int status = -1;    ///< exit status; -1 when hung or killed by a signal
};

/// Forks; the child runs `body` (returning its exit status; an escaping
/// exception exits with 100) and leaves with _exit, so no destructor or
/// atexit handler of the parent's objects (test servers) runs there. The
/// parent polls for the child until `limit` (generous: it only bounds a hang),
/// then kills it.
template <class Body>
child_end in_child(Body&& body, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int code = 100;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return child_end{false, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
    if (r < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    if (std::chrono::steady_clock::now() >= until) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return child_end{true, -1};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// Forks `processes` children at once; child p runs `body(p)`, which returns
/// a count (of admissions, say), and leaves with _exit. Returns the sum of
/// the counts, or -1 when any child threw, died without answering, or was
/// still running at `limit` (then it is killed). Every child is reaped.
template <class Body>
long sum_in_children(int processes, Body&& body,
                     std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  std::vector<std::pair<pid_t, int>> children;
  bool failed = false;
  for (int p = 0; p < processes; ++p) {
    int fds[2];
    if (::pipe(fds) != 0) {
      failed = true;
      break;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      failed = true;
      break;
    }
    if (pid == 0) {
      ::close(fds[0]);
      long n = -1;
      try {
        n = body(p);
      } catch (...) {
      }
      (void)!::write(fds[1], &n, sizeof n);
      ::_exit(0);
    }
    ::close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  const auto until = std::chrono::steady_clock::now() + limit;
  long total = 0;
  for (auto [pid, fd] : children) {
    long n = -1;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(std::max<long long>(0, left.count()))) == 1 &&
        ::read(fd, &n, sizeof n) == static_cast<ssize_t>(sizeof n) && n >= 0) {
      total += n;
    } else {
      failed = true;
      ::kill(pid, SIGKILL);
    }
    ::close(fd);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  return failed ? -1 : total;
}

}  // namespace rltest
