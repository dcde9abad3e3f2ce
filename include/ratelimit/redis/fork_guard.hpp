// SPDX-License-Identifier: Apache-2.0
// A Redis store belongs to the process that made it: the guards that keep a
// forked child from using or destroying its parent's connections, locks and
// threads.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <stdexcept>

namespace ratelimit::redis {

namespace detail {

/// Throws when called in a process other than `owner`, the one that made a
/// store: a child forked after the store was made shares the parent's pooled
/// sockets (its commands would interleave with the parent's replies), and any
/// of the store's mutexes may have been held by a parent thread at the fork,
/// never to be released in the child.
/// @throws std::logic_error naming the rule: make a new store after fork()
inline void check_same_process(pid_t owner) {
  if (owner != ::getpid()) {
    throw std::logic_error(
        "ratelimit: redis: a store made before fork() was used in the child; make a new store "
        "in the child after fork()");
  }
}

/// Deleter of a store's shared state: deletes it in the process that made it
/// (T::owner_pid) and leaks it in a child forked after, where destroying it
/// could join a thread that does not exist there, lock a mutex a parent thread
/// held at the fork or destroy a condition variable a parent thread waited on
/// (each of which can block forever). Leaking closes none of the parent's
/// sockets either.
template <class T>
struct delete_unless_forked {
  void operator()(T* p) const noexcept {
    if (p->owner_pid == ::getpid()) delete p;
  }
};

}  // namespace detail

}  // namespace ratelimit::redis
