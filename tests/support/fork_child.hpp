// SPDX-License-Identifier: Apache-2.0
// Runs a function in a forked child and reports how it ended, killing it when it hangs.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>

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

}  // namespace rltest
