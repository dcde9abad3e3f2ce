// SPDX-License-Identifier: Apache-2.0
// Connections to Redis with hard deadlines, and a thread-safe pool of them.
#pragma once

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/transport.hpp"

namespace ratelimit::redis {

/// Frees a hiredis reply.
struct reply_deleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
/// A hiredis reply, freed on scope exit.
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

/// Appends one command in the Redis protocol (RESP) to `out`. Every argument
/// carries its length, so arguments are binary safe (NUL, braces, spaces).
inline void append_command(std::string& out, const std::string_view* args, std::size_t n) {
  out += '*';
  out += std::to_string(n);
  out += "\r\n";
  for (std::size_t i = 0; i < n; ++i) {
    out += '$';
    out += std::to_string(args[i].size());
    out += "\r\n";
    out.append(args[i]);
    out += "\r\n";
  }
}

namespace detail {

/// The text of the error (or status) reply `r` as a message quotes it,
/// escaped as escaped_name does: a hostile or broken server, or a
/// man in the middle of a plain connection, could otherwise put CR, LF, ESC
/// or other control bytes into a log line through an exception message
/// (`-ERR a\nb\x1b[31m` reads `ERR a\x0ab\x1b[31m`).
[[nodiscard]] inline std::string reply_text(const redisReply& r) {
  return r.str == nullptr ? std::string() : escaped_name(std::string_view(r.str, r.len));
}

/// True for an error reply by which the server says it cannot serve checks
/// at all now, whatever the command: it became a replica (READONLY), is
/// loading its dataset, lost its master, is stuck in a script (BUSY), refuses
/// writes (MISCONF, NOREPLICAS) or wants authentication. These are failures
/// of the node, not of the script. Cluster answers (MOVED, ASK, TRYAGAIN,
/// CLUSTERDOWN) are not among them: the cluster store handles those.
/// Redis before 7 wraps the error of a write inside a script, as in
/// `ERR Error running script (...): @user_script:1: -READONLY You can't...`;
/// such a write error counts too.
[[nodiscard]] inline bool is_node_failure(const redisReply& r) noexcept {
  if (r.type != REDIS_REPLY_ERROR || r.str == nullptr) return false;
  const std::string_view s(r.str, r.len);
  constexpr std::string_view codes[] = {"READONLY", "LOADING",    "MASTERDOWN", "BUSY",
                                        "MISCONF",  "NOREPLICAS", "NOAUTH",     "WRONGPASS"};
  const auto word_at = [&](std::size_t at, std::string_view code) {
    return s.substr(at).starts_with(code) &&
           (s.size() == at + code.size() || s[at + code.size()] == ' ');
  };
  if (std::any_of(std::begin(codes), std::end(codes),
                  [&](std::string_view code) { return word_at(0, code); })) {
    return true;
  }
  // Only the position right after the wrapper's `(call to f_<sha>): ` and its
  // `@user_script:<line>: ` markers holds the failed call's error code: text
  // further on may quote a user key or a stored value (a script's own
  // "foreign or corrupt state" error does), and is no error code.
  constexpr std::string_view head = "ERR Error running script (call to ";
  if (!s.starts_with(head)) return false;
  std::size_t at = s.find("): ", head.size());
  if (at == std::string_view::npos) return false;
  at += 3;
  for (;;) {
    std::size_t p = at;
    if (s.substr(p).starts_with('@')) ++p;
    if (!s.substr(p).starts_with("user_script:")) break;
    p += 12;
    if (s.substr(p).starts_with(' ')) ++p;
    const std::size_t digits = p;
    while (p < s.size() && s[p] >= '0' && s[p] <= '9') ++p;
    if (p == digits || !s.substr(p).starts_with(": ")) break;
    at = p + 2;
  }
  if (!s.substr(at).starts_with('-')) return false;
  constexpr std::string_view in_script[] = {"READONLY", "MISCONF", "NOREPLICAS"};
  return std::any_of(std::begin(in_script), std::end(in_script),
                     [&](std::string_view code) { return word_at(at + 1, code); });
}

/// What one reply may still hold: reader objects (strings, integers, nils,
/// arrays and each array's announced elements); see bounded_reply_functions.
struct reply_budget {
  std::size_t left = 0;
  bool exceeded = false;
};

/// Objects in one reply before it is refused: none of ours comes near.
inline constexpr std::size_t max_reply_objects = std::size_t{1} << 20;

/// Bytes one reply may take before it is refused: none of ours comes near.
inline constexpr std::size_t max_reply_bytes = std::size_t{64} << 20;

/// hiredis's own reply functions (taken from a default reader).
[[nodiscard]] inline const redisReplyObjectFunctions& hiredis_reply_functions() {
  static const redisReplyObjectFunctions functions = [] {
    redisReplyObjectFunctions f{};
    if (redisReader* r = redisReaderCreate(); r != nullptr) {
      if (r->fn != nullptr) f = *r->fn;
      redisReaderFree(r);
    }
    return f;
  }();
  return functions;
}

/// Takes `n` objects from the reply_budget in the task's privdata; false
/// (and the budget marked exceeded) when fewer are left.
[[nodiscard]] inline bool take_reply_objects(const redisReadTask* t, std::size_t n) noexcept {
  auto* b = static_cast<reply_budget*>(t->privdata);
  if (b == nullptr) return true;
  if (b->left < n) {
    b->exceeded = true;
    return false;
  }
  b->left -= n;
  return true;
}

/// hiredis's reply functions, each refusing (as hiredis's out of memory)
/// once a reply exceeds its reply_budget: a peer announcing an array of
/// millions of elements, or sending millions of tiny ones, would otherwise
/// make the reader allocate far more than it sent. nullptr when hiredis's
/// own functions cannot be found.
[[nodiscard]] inline redisReplyObjectFunctions* bounded_reply_functions() {
  static redisReplyObjectFunctions functions = [] {
    const redisReplyObjectFunctions& h = hiredis_reply_functions();
    redisReplyObjectFunctions f{};
    if (h.createString == nullptr || h.createArray == nullptr || h.createInteger == nullptr ||
        h.createNil == nullptr || h.freeObject == nullptr) {
      return f;
    }
    f.createString = [](const redisReadTask* t, char* s, std::size_t n) -> void* {
      return take_reply_objects(t, 1) ? hiredis_reply_functions().createString(t, s, n) : nullptr;
    };
    f.createArray = [](const redisReadTask* t, int n) -> void* {
      return n >= 0 && take_reply_objects(t, 1 + static_cast<std::size_t>(n))
                 ? hiredis_reply_functions().createArray(t, n)
                 : nullptr;
    };
    f.createInteger = [](const redisReadTask* t, long long v) -> void* {
      return take_reply_objects(t, 1) ? hiredis_reply_functions().createInteger(t, v) : nullptr;
    };
    f.createNil = [](const redisReadTask* t) -> void* {
      return take_reply_objects(t, 1) ? hiredis_reply_functions().createNil(t) : nullptr;
    };
    f.freeObject = h.freeObject;
    return f;
  }();
  return functions.createArray == nullptr ? nullptr : &functions;
}

/// True when `host` is an IPv4 or IPv6 address, the latter with an optional
/// zone id (`fe80::1%eth0`, which getaddrinfo takes as a numeric host): no
/// resolution needed.
[[nodiscard]] inline bool is_numeric_host(const std::string& host) noexcept {
  in6_addr buf{};
  if (::inet_pton(AF_INET, host.c_str(), &buf) == 1) return true;
  const auto pct = host.find('%');
  if (pct == std::string::npos) return ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
  if (pct + 1 == host.size() || pct >= INET6_ADDRSTRLEN) return false;
  char addr[INET6_ADDRSTRLEN] = {};
  host.copy(addr, pct);
  return ::inet_pton(AF_INET6, addr, &buf) == 1;
}

/// The numeric addresses of `host` from getaddrinfo (IPv4 and IPv6, as the
/// system orders them).
/// @throws connection_error when it cannot be resolved
[[nodiscard]] inline std::vector<std::string> system_resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0) {
    throw connection_error("ratelimit: redis: cannot resolve \"" + detail::escaped_name(host) +
                           "\": " + ::gai_strerror(rc));
  }
  std::vector<std::string> out;
  try {
    for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
      char buf[NI_MAXHOST];
      if (::getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) ==
              0 &&
          std::find(out.begin(), out.end(), buf) == out.end()) {
        out.emplace_back(buf);
      }
    }
  } catch (...) {
    ::freeaddrinfo(list);
    throw;
  }
  ::freeaddrinfo(list);
  return out;
}

/// The addresses to connect to for `o.host`, resolved by `o.resolver` (or
/// getaddrinfo) on a helper thread, waited for until `until` at most. The
/// thread owns everything it uses, so a resolver that outlives the wait only
/// finishes late, harmlessly.
/// @throws timeout_error when `until` passes first; connection_error when
///   resolution fails or yields nothing
[[nodiscard]] inline std::vector<std::string> resolve(const options& o, deadline until) {
  if (o.host.find('\0') != std::string::npos) {  // the resolver would see the text before it
    throw connection_error("ratelimit: redis: cannot resolve a host name holding a NUL byte");
  }
  if (!o.resolver && is_numeric_host(o.host)) return {o.host};
  struct state {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::vector<std::string> addresses;
    std::exception_ptr error;
  };
  auto st = std::make_shared<state>();
  try {
    std::thread([st, fn = o.resolver, host = o.host]() noexcept {
      std::vector<std::string> got;
      std::exception_ptr error;
      try {
        got = fn ? fn(host) : system_resolve(host);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(st->mutex);
      st->addresses = std::move(got);
      st->error = error;
      st->done = true;
      st->done_cv.notify_all();
    }).detach();
  } catch (const std::exception& e) {
    throw connection_error(std::string("ratelimit: redis: cannot start a resolver thread: ") +
                           e.what());
  }
  std::unique_lock<std::mutex> lock(st->mutex);
  if (!st->done_cv.wait_until(lock, until, [&] { return st->done; })) {
    throw timeout_error("ratelimit: redis: resolving \"" + escaped_name(o.host) +
                        "\" took longer than connect_timeout");
  }
  if (st->error) {
    try {
      std::rethrow_exception(st->error);
    } catch (const store_error&) {
      throw;
    } catch (const std::exception& e) {
      throw connection_error("ratelimit: redis: cannot resolve \"" + escaped_name(o.host) +
                             "\": " + e.what());
    } catch (...) {
      throw connection_error("ratelimit: redis: cannot resolve \"" + escaped_name(o.host) + "\"");
    }
  }
  if (st->addresses.empty()) {
    throw connection_error("ratelimit: redis: \"" + escaped_name(o.host) +
                           "\" resolved to no address");
  }
  // hiredis would resolve a name itself, with no deadline.
  for (const std::string& a : st->addresses) {
    if (!is_numeric_host(a)) {
      throw connection_error("ratelimit: redis: \"" + escaped_name(o.host) + "\" resolved to \"" +
                             escaped_name(a) + "\", which is no numeric address");
    }
  }
  return std::move(st->addresses);
}

}  // namespace detail

/// The reply to one script call (see connection::receive_script): the
/// integers of an array reply of 5 to 7 integers, the usual answer of the
/// scripts, read without allocating; or any other reply, whole, in `other`.
struct script_reply {
  long long values[7] = {};
  std::size_t count = 0;  ///< integers in `values`; 0 when `other` holds the reply
  reply_ptr other;
};

namespace detail {

/// Reads `bytes` as exactly one RESP array of 5 to 7 integers, each written
/// as Redis writes them (`:` then `0`, or an optional `-` and up to 18
/// digits without a leading zero, then CRLF), into `out`; false for
/// anything else (another reply, more or fewer bytes, another spelling),
/// which the caller then hands to hiredis's reader.
[[nodiscard]] inline bool parse_integer_array(std::string_view bytes, script_reply& out) noexcept {
  if (bytes.size() < 4 || bytes[0] != '*' || bytes[1] < '5' || bytes[1] > '7' || bytes[2] != '\r' ||
      bytes[3] != '\n') {
    return false;
  }
  const std::size_t n = static_cast<std::size_t>(bytes[1] - '0');
  std::size_t at = 4;
  for (std::size_t i = 0; i < n; ++i) {
    if (at >= bytes.size() || bytes[at] != ':') return false;
    ++at;
    const bool negative = at < bytes.size() && bytes[at] == '-';
    if (negative) ++at;
    const std::size_t first = at;
    long long v = 0;
    while (at < bytes.size() && bytes[at] >= '0' && bytes[at] <= '9' && at - first < 18) {
      v = v * 10 + (bytes[at] - '0');
      ++at;
    }
    const std::size_t digits = at - first;
    if (digits == 0 || (digits > 1 && bytes[first] == '0') || (negative && v == 0)) return false;
    if (at + 2 > bytes.size() || bytes[at] != '\r' || bytes[at + 1] != '\n') return false;
    at += 2;
    out.values[i] = negative ? -v : v;
  }
  if (at != bytes.size()) return false;
  out.count = n;
  return true;
}

}  // namespace detail

/// One connection to Redis. Every operation takes a deadline and throws
/// timeout_error when it passes; any error leaves the connection broken
/// (`broken()`), and the pool then discards it, because a late reply could
/// otherwise be read as the answer to the next command.
///
/// Thread safety: one thread at a time (the pool hands it out exclusively).
class connection {
 public:
  /// Connects (over TLS when `o.tls.enabled`), authenticates and selects the
  /// database, all within connect_timeout.
  /// @throws connection_error (timeout_error when connect_timeout passes;
  ///   tls_error when the TLS handshake fails, naming why)
  explicit connection(const options& o)
      : where_(describe(o)),
        read_spin_(o.read_spin > detail::max_read_spin ? detail::max_read_spin : o.read_spin) {
    const auto timeout = o.connect_timeout.count() > 0 ? o.connect_timeout
                                                       : std::chrono::milliseconds{200};
    const deadline until = deadline_clock::now() + timeout;
    if (redisReplyObjectFunctions* fn = detail::bounded_reply_functions(); fn != nullptr) {
      reader_.reset(redisReaderCreateWithFunctions(fn));
      if (reader_ != nullptr) {
        budget_.left = detail::max_reply_objects;
        reader_->privdata = &budget_;
      }
    } else {
      reader_.reset(redisReaderCreate());
    }
    if (reader_ == nullptr) {
      throw connection_error("ratelimit: redis: cannot allocate a connection");
    }
    // Every wait below is a poll() with the remaining time, so no call can
    // outlive its deadline.
    if (o.unix_socket.empty()) {
      connect_tcp(o, until);
    } else {
      stream_.open_unix(o.unix_socket, until);
    }
    if (o.tls.enabled) start_tls(o, until);
    try {
      login(o, until);
    } catch (const connection_error& e) {
      // A server that answered accepted the session: the failure is not the
      // certificate (tls-auth-clients optional asks for one without needing it).
      if (!stream_.client_cert_missing() || answered_) throw;
      throw tls_error("ratelimit: redis: TLS: " + where_ +
                      " asked for a client certificate and none is configured (tls_options "
                      "cert_file and key_file; cert= and key= in the URL): " +
                      e.what());
    }
  }

  /// `host:port` (`[host]:port` for IPv6) or the socket path, for messages.
  [[nodiscard]] const std::string& where() const noexcept { return where_; }

  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() = default;

  /// True after any I/O error or timeout: the connection must be dropped.
  [[nodiscard]] bool broken() const noexcept { return broken_; }

  /// Marks the connection broken, so the pool drops it: for a caller that
  /// leaves replies unread (an exception between a pipelined send and its reads).
  void mark_broken() noexcept { broken_ = true; }

  /// True after send() failed because the server had closed or reset the
  /// connection before any byte of it was accepted: nothing of that send
  /// reached the server, so what it carried cannot have run.
  [[nodiscard]] bool closed_before_send() const noexcept { return closed_before_send_; }

  /// The socket, for tests and diagnostics (reading or writing it would
  /// desynchronise the connection).
  [[nodiscard]] int native_handle() const noexcept { return stream_.fd(); }

  /// True when bytes already read from the socket wait in the reply reader
  /// (a second reply that arrived in the same read as the first): receive()
  /// returns it although poll() on native_handle() sees nothing.
  [[nodiscard]] bool has_buffered_input() const noexcept {
    return reader_ != nullptr && reader_->pos < reader_->len;
  }

  /// True when the connection runs over TLS.
  [[nodiscard]] bool tls() const noexcept { return stream_.tls(); }

  /// The socket (or TLS session) itself, for the multiplexer, which drives it
  /// without blocking from its own I/O thread after the connect and login.
  [[nodiscard]] transport& stream() noexcept { return stream_; }

  /// True when the server has closed this idle connection (for example after
  /// its `timeout`, or CLIENT KILL) or sent something unasked for: on the
  /// socket, or already read with the last reply and left in the reply
  /// reader (the next command would take those bytes as its reply, and each
  /// later one the reply of the one before); checked without sending, in a
  /// few microseconds. Such a connection must be dropped.
  [[nodiscard]] bool peer_closed() noexcept {
    if (!has_buffered_input() && !stream_.peer_closed()) return false;
    broken_ = true;  // end of stream, an error, or bytes no command asked for
    return true;
  }

  /// Writes all of `bytes` (one or more commands, see append_command).
  void send(std::string_view bytes, deadline until) {
    closed_before_send_ = false;
    bool accepted = false;
    while (!bytes.empty()) {
      std::size_t n = 0;
      const transport::io r = stream_.write_some(bytes, n);
      if (r == transport::io::ok) {
        accepted = true;
        bytes.remove_prefix(n);
        if (!bytes.empty() && deadline_clock::now() >= until) {
          fail<timeout_error>("ratelimit: redis: command timed out");
        }
        continue;
      }
      if (r == transport::io::failed || r == transport::io::closed) {
        const int e = stream_.error();
        closed_before_send_ = !accepted && (e == EPIPE || e == ECONNRESET || e == ENOTCONN);
        fail<connection_error>(
            "ratelimit: redis: write failed: " +
            (r == transport::io::closed ? std::string("connection closed") : stream_.error_text()));
      }
      wait_for(r == transport::io::want_read ? POLLIN : POLLOUT, until);
    }
  }

  /// Reads the next reply. An error reply is a reply, not an exception,
  /// except one saying that the server cannot serve checks now (READONLY,
  /// LOADING, MASTERDOWN, BUSY, NOAUTH...; see detail::is_node_failure):
  /// that throws connection_error and leaves the connection broken, so the
  /// pool drops it and the next connection resolves the host again.
  [[nodiscard]] reply_ptr receive(deadline until) {
    reply_ptr r = read_reply(until);
    if (detail::is_node_failure(*r)) {
      fail<connection_error>("ratelimit: redis: " + where_ +
                             " cannot serve checks now: " + detail::reply_text(*r));
    }
    return r;
  }

  /// Reads the reply to one script call, as receive() does, into `out`: an
  /// array of 5 to 7 integers that arrives whole in one read is taken
  /// straight from the bytes read (no reply objects); any other reply, or
  /// one split over reads, goes through hiredis's reader as in receive().
  ///
  /// Over plain TCP or a unix socket, with nothing left over from an earlier
  /// read, the first read blocks in recv() itself (one system call where
  /// reading, failing with EAGAIN, polling and reading again took three: a
  /// reply never comes back within the send), bounded by SO_RCVTIMEO set
  /// once per connection to a limit that ends well before `until` (see
  /// blocking_read_fits); when the limit passes first, or a signal comes,
  /// poll() waits out the rest exactly as before. Over TLS it reads first
  /// and polls (OpenSSL may hold bytes already). The deadline is the same:
  /// a reply not read before `until` is a timeout. With options::read_spin,
  /// plain TCP and unix sockets first poll without sleeping (see spin_read).
  /// @throws as receive()
  void receive_script(deadline until, script_reply& out) {
    out.count = 0;
    out.other.reset();
    if (stream_.tls() || has_buffered_input()) {
      out.other = receive(until);
      return;
    }
    char buf[16 * 1024];
    std::size_t n = 0;
    transport::io got = spin_due() ? spin_read(buf, sizeof buf, n, until)
                                   : transport::io::want_read;
    // After any spin: it took some of the time left.
    bool blocking = got == transport::io::want_read && blocking_read_fits(until);
    for (;;) {
      if (got == transport::io::want_read) {
        if (!blocking) wait_for(POLLIN, until);
        got = blocking ? stream_.read_blocking(buf, sizeof buf, n)
                       : stream_.read_some(buf, sizeof buf, n);
        blocking = false;
      }
      if (got == transport::io::ok) {
        if (detail::parse_integer_array(std::string_view(buf, n), out)) {
          if (deadline_clock::now() >= until) {
            fail<timeout_error>("ratelimit: redis: command timed out");
          }
          answered_ = true;
          return;
        }
        fed_ += n;
        if (redisReaderFeed(reader_.get(), buf, n) != REDIS_OK) {
          fail<connection_error>("ratelimit: redis: protocol error in reply");
        }
        if (deadline_clock::now() >= until) {
          fail<timeout_error>("ratelimit: redis: command timed out");
        }
        out.other = receive(until);
        return;
      }
      if (got == transport::io::closed) {
        fail<connection_error>("ratelimit: redis: server closed the connection");
      }
      if (got == transport::io::failed) {
        fail<connection_error>("ratelimit: redis: read failed: " + stream_.error_text());
      }
      // want_read: the blocking read's limit passed or a signal came, or
      // poll() woke without data; poll() waits for what is left.
      got = transport::io::want_read;
    }
  }

  /// A command buffer and an argument list kept with the connection, so
  /// that formatting a check's command allocates nothing once they have
  /// grown to a check's size. Valid while the connection lives.
  [[nodiscard]] std::string& command_buffer() noexcept { return scratch_; }
  [[nodiscard]] std::vector<std::string>& argument_buffer() noexcept { return scratch_args_; }

  /// One command, one reply (see receive).
  [[nodiscard]] reply_ptr command(const std::string_view* args, std::size_t n, deadline until) {
    out_.clear();
    append_command(out_, args, n);
    send(out_, until);
    return receive(until);
  }

 private:
  struct reader_deleter {
    void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
  };

  /// True when a blocking read may wait for the reply to a command whose
  /// deadline is `until`: its SO_RCVTIMEO limit, set on first use to 3/4 of
  /// what is then left less 10 ms, ends before `until` even when the kernel
  /// rounds it up (to a whole tick, at most 10 ms, and by its timer wheel's
  /// granularity, at most 8/63 of it, under 1/7). Otherwise poll() waits, as it
  /// always did.
  [[nodiscard]] bool blocking_read_fits(deadline until) noexcept {
    using std::chrono::microseconds;
    const auto left = std::chrono::duration_cast<microseconds>(until - deadline_clock::now());
    if (read_limit_.count() == 0) {  // first use: choose the limit once
      read_limit_ = (left - microseconds{10'000}) * 3 / 4;
      if (read_limit_ < microseconds{1'000} || !stream_.allow_blocking_reads(read_limit_)) {
        read_limit_ = microseconds{-1};  // never: poll() waits
      }
    }
    return read_limit_.count() > 0 && left >= read_limit_ + read_limit_ / 7 + microseconds{11'000};
  }

  /// True when this check's reply is to be polled for first
  /// (options::read_spin set and not backing off after a miss).
  [[nodiscard]] bool spin_due() noexcept {
    if (read_spin_.count() <= 0) return false;
    if (spin_skip_ > 0) {
      --spin_skip_;
      return false;
    }
    return true;
  }

  /// Polls the socket for the reply without sleeping (a non-blocking read,
  /// then a pause instruction) until some bytes, the end of the stream or
  /// an error come, or read_spin_ passes, never past `until`. A spin that
  /// ends without bytes, or during which the thread was preempted (its
  /// involuntary context switches grew: the server may have been waiting
  /// for this CPU), is a miss: the next 1, 2, 4 ... 256 checks (doubling
  /// with each miss in a row) block at once; a spin that read its bytes
  /// unpreempted ends the back-off. Bytes (or an end) found by the first
  /// read, before any spinning, leave the back-off as it was: the blocking
  /// read would have found them as soon (with client and server on one CPU
  /// the server often runs within the send). Returns as transport::read_some.
  [[nodiscard]] transport::io spin_read(char* buf, std::size_t cap, std::size_t& n,
                                        deadline until) noexcept {
    rusage ru{};
    const bool counted = ::getrusage(RUSAGE_THREAD, &ru) == 0;
    const long preempted = ru.ru_nivcsw;
    const deadline stop = std::min(until, deadline_clock::now() + read_spin_);
    transport::io got = stream_.read_some(buf, cap, n);
    if (got != transport::io::want_read) return got;  // no spin: says nothing either way
    for (;;) {
      detail::cpu_relax();
      got = stream_.read_some(buf, cap, n);
      if (got != transport::io::want_read || deadline_clock::now() >= stop) break;
    }
    const bool hit = got == transport::io::ok &&
                     !(counted && ::getrusage(RUSAGE_THREAD, &ru) == 0 &&
                       ru.ru_nivcsw != preempted);
    if (hit) {
      spin_backoff_ = 0;
    } else {
      spin_backoff_ = std::min<std::uint32_t>(max_spin_backoff,
                                              std::max<std::uint32_t>(1, spin_backoff_ * 2));
      spin_skip_ = spin_backoff_;
    }
    return got;
  }

  /// Most checks that block at once after a missed spin (see spin_read).
  static constexpr std::uint32_t max_spin_backoff = 256;

  /// The least time one address of several gets for its TCP connect.
  static constexpr std::chrono::milliseconds min_address_share{50};

  /// Resolves the host within `until` (getaddrinfo has no deadline of its
  /// own), then connects to its addresses in turn: each but the last gets
  /// an equal share of what is left (what is left / addresses left, at
  /// least min_address_share, never past `until`), the last all that is
  /// left, so a first address that never answers cannot eat the whole
  /// connect_timeout. The last failure is reported.
  void connect_tcp(const options& o, deadline until) {
    const std::vector<std::string> addresses = detail::resolve(o, until);
    for (std::size_t i = 0;; ++i) {
      try {
        const deadline now = deadline_clock::now();
        const auto share = std::max<deadline_clock::duration>(
            (until - now) / static_cast<long>(addresses.size() - i), min_address_share);
        stream_.open_tcp(addresses[i], o.port, where_,
                         i + 1 == addresses.size() || until - now <= share ? until : now + share);
        return;
      } catch (const connection_error&) {
        if (i + 1 == addresses.size() || deadline_clock::now() >= until) throw;
      }
    }
  }

  /// The TLS handshake, within what is left of the connect's time.
  void start_tls(const options& o, deadline until) {
    std::shared_ptr<SSL_CTX> ctx;
    try {
      ctx = detail::tls_context_for(o.tls);
    } catch (const std::invalid_argument& e) {  // a file changed since the pool checked it
      throw connection_error(e.what());
    }
    stream_.start_tls(ctx.get(), o.tls.server_name.empty() ? o.host : o.tls.server_name,
                      o.tls.verify, where_, until);
  }

  /// AUTH and SELECT, as the options ask; over TLS at least a PING, so that
  /// a server refusing the session after the handshake (TLS 1.3 checks the
  /// client's certificate then) fails the connect, not the first check.
  void login(const options& o, deadline until) {
    if (stream_.tls() && o.password.empty() && o.database == 0) {
      const std::string_view args[] = {"PING"};
      (void)command(args, 1, until);  // an error reply (PING denied by ACL) will do
    }
    if (!o.password.empty()) {
      reply_ptr r;
      if (o.user.empty()) {
        const std::string_view args[] = {"AUTH", o.password};
        r = exchange(args, 2, until);
      } else {
        const std::string_view args[] = {"AUTH", o.user, o.password};
        r = exchange(args, 3, until);
      }
      if (r->type == REDIS_REPLY_ERROR) {
        throw connection_error("ratelimit: redis: AUTH " +
                               (o.user.empty()
                                    ? std::string("with password")
                                    : "as user \"" + detail::escaped_name(o.user) + "\"") +
                               " at " + where_ + " failed: " + detail::reply_text(*r));
      }
    }
    if (o.database != 0) {
      const std::string db = std::to_string(o.database);
      const std::string_view args[] = {"SELECT", db};
      reply_ptr r = exchange(args, 2, until);
      if (r->type == REDIS_REPLY_ERROR) {
        throw connection_error("ratelimit: redis: SELECT " + db + " at " + where_ +
                               " failed: " + detail::reply_text(*r));
      }
    }
  }

  /// One command, one reply, error replies included (AUTH, SELECT).
  [[nodiscard]] reply_ptr exchange(const std::string_view* args, std::size_t n, deadline until) {
    out_.clear();
    append_command(out_, args, n);
    send(out_, until);
    return read_reply(until);
  }

  /// Reads the next reply, whatever it is. A reply still incomplete after
  /// max_reply_bytes fails the connection (no reply of ours comes near), and
  /// `until` is checked after every read, so a peer that never stops sending
  /// can neither fill the memory nor hold the caller past its deadline.
  [[nodiscard]] reply_ptr read_reply(deadline until) {
    for (;;) {
      void* r = nullptr;
      if (redisReaderGetReply(reader_.get(), &r) != REDIS_OK) {
        fail<connection_error>(budget_.exceeded
                                   ? "ratelimit: redis: protocol error in reply: " + where_ +
                                         " sent a reply of more than " +
                                         std::to_string(detail::max_reply_objects) + " elements"
                                   : std::string("ratelimit: redis: protocol error in reply"));
      }
      if (r != nullptr) {
        fed_ = 0;
        budget_.left = detail::max_reply_objects;
        answered_ = true;
        return reply_ptr(static_cast<redisReply*>(r));
      }
      if (fed_ > max_reply_bytes) {
        fail<connection_error>("ratelimit: redis: protocol error in reply: " + where_ +
                               " sent a reply larger than " +
                               std::to_string(max_reply_bytes >> 20) + " MiB");
      }
      char buf[16 * 1024];
      std::size_t n = 0;
      const transport::io got = stream_.read_some(buf, sizeof buf, n);
      if (got == transport::io::ok) {
        fed_ += n;
        if (redisReaderFeed(reader_.get(), buf, n) != REDIS_OK) {
          fail<connection_error>("ratelimit: redis: protocol error in reply");
        }
        if (deadline_clock::now() >= until)
          fail<timeout_error>("ratelimit: redis: command timed out");
        continue;
      }
      if (got == transport::io::closed) {
        fail<connection_error>("ratelimit: redis: server closed the connection");
      }
      if (got == transport::io::failed) {
        fail<connection_error>("ratelimit: redis: read failed: " + stream_.error_text());
      }
      wait_for(got == transport::io::want_write ? POLLOUT : POLLIN, until);
    }
  }

  /// where(): the host or socket path escaped as detail::escaped_name does
  /// (set in code, they may hold CR, LF or other control bytes that would
  /// forge a log line through a connect or TLS error); the socket path cut
  /// after its first '&', ';', '=', ',', '?' or space (detail::quoted_part), which parse_url
  /// takes in a path: `unix:///tmp/s;password=S3CRET` reads "/tmp/s;...".
  static std::string describe(const options& o) {
    if (!o.unix_socket.empty()) return detail::quoted_part(o.unix_socket);
    const std::string host = detail::escaped_name(o.host);
    const bool v6 = o.host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(o.port);
  }

  template <class Error>
  [[noreturn]] void fail(const std::string& what) {
    broken_ = true;
    throw Error(what);
  }

  void wait_for(short events, deadline until) {
    bool ready = false;
    try {
      ready = stream_.wait(events, until);
    } catch (const connection_error& e) {
      fail<connection_error>(e.what());
    }
    if (!ready) fail<timeout_error>("ratelimit: redis: command timed out");
  }

  /// Bytes of one reply read before it is refused (see read_reply).
  static constexpr std::size_t max_reply_bytes = detail::max_reply_bytes;

  std::string where_;  ///< host:port or socket path, for messages
  transport stream_;
  std::size_t fed_ = 0;          ///< bytes fed to the reader since the last whole reply
  detail::reply_budget budget_;  ///< objects the reply being read may still hold
  std::unique_ptr<redisReader, reader_deleter> reader_;
  std::string out_;
  std::string scratch_;                    ///< see command_buffer
  std::vector<std::string> scratch_args_;  ///< see argument_buffer
  /// SO_RCVTIMEO of blocking reads: 0 until first needed, negative when
  /// they are not used (see blocking_read_fits).
  std::chrono::microseconds read_limit_{0};
  /// options::read_spin (at most detail::max_read_spin), and its back-off:
  /// checks left that block at once, and how many the next miss skips.
  std::chrono::microseconds read_spin_{0};
  std::uint32_t spin_skip_ = 0;
  std::uint32_t spin_backoff_ = 0;
  bool broken_ = false;
  bool closed_before_send_ = false;
  bool answered_ = false;  ///< a whole reply was read (the server accepted the session)
};

/// At most `pool_size` connections, each lent to one thread at a time.
/// Connections are made lazily and remade after any failure, so a restarted
/// server is picked up without user code.
///
/// Thread safety: all member functions may be called from any number of threads.
class connection_pool {
 public:
  /// Opens each new connection in place of `connection(options)`, for
  /// example to the master that Sentinel names (see sentinel.hpp). Called
  /// without the pool's lock, from the thread that needs the connection.
  using opener = std::function<std::unique_ptr<connection>(const options&)>;

  /// @throws std::invalid_argument for TLS settings that cannot be used (a
  ///   file missing, unreadable or not understood; TLS over a unix socket),
  ///   or an options::read_spin outside 0..1000 us (naming it)
  explicit connection_pool(options o, opener open = {})
      : options_(std::move(o)),
        opener_(std::move(open)),
        size_(options_.pool_size == 0 ? 4 : options_.pool_size) {
    detail::check_read_spin(options_.read_spin);
    if (options_.tls.enabled) {
      if (!options_.unix_socket.empty()) {
        throw std::invalid_argument("ratelimit: redis: TLS is for TCP; unix socket \"" +
                                    detail::quoted_part(options_.unix_socket) + "\" takes none");
      }
      (void)detail::tls_context_for(options_.tls);  // files are read now, and named if bad
    }
  }

  connection_pool(const connection_pool&) = delete;
  connection_pool& operator=(const connection_pool&) = delete;

  /// Exclusive use of one connection; returns it to the pool on destruction,
  /// or drops it when it broke.
  class lease {
   public:
    lease(connection_pool* pool, std::unique_ptr<connection> c,
          deadline_clock::duration connect_time = {}, std::uint64_t generation = 0) noexcept
        : pool_(pool), conn_(std::move(c)), connect_time_(connect_time), generation_(generation) {}
    lease(lease&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)),
          conn_(std::move(o.conn_)),
          connect_time_(o.connect_time_),
          generation_(o.generation_) {}
    lease& operator=(lease&&) = delete;
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      if (pool_ != nullptr) pool_->give_back(std::move(conn_), generation_);
    }
    [[nodiscard]] connection& operator*() const noexcept { return *conn_; }
    [[nodiscard]] connection* operator->() const noexcept { return conn_.get(); }
    /// Time spent making this connection (zero for a pooled one).
    [[nodiscard]] deadline_clock::duration connect_time() const noexcept { return connect_time_; }

    /// Writes `bytes` as connection::send does, except when the connection
    /// turns out to have been closed by the server before any byte was
    /// accepted (it dropped the idle connection just after acquire() looked
    /// at it): nothing reached the server, so the bytes are written once more
    /// on a new connection, and `until` moves on by the time spent
    /// connecting. Once a byte may have been sent, nothing is ever resent.
    /// @throws connection_error, timeout_error
    void send(std::string_view bytes, deadline& until) {
      try {
        conn_->send(bytes, until);
        return;
      } catch (const connection_error&) {
        if (pool_ == nullptr || !conn_->closed_before_send()) throw;
      }
      const deadline start = deadline_clock::now();
      auto fresh = pool_->open_connection();  // same pool slot
      const auto took = deadline_clock::now() - start;
      until += took;
      connect_time_ += took;
      // `bytes` may be the old connection's command_buffer(): copied first.
      const std::string kept(bytes);
      conn_ = std::move(fresh);
      conn_->send(kept, until);
    }

   private:
    connection_pool* pool_;
    std::unique_ptr<connection> conn_;
    deadline_clock::duration connect_time_;
    std::uint64_t generation_;  ///< the pool's generation when it was lent (see renew)
  };

  /// Waits until `until` for a free connection, connecting a new one when
  /// fewer than pool_size exist. An idle connection that the server closed
  /// meanwhile (its `timeout`, CLIENT KILL, a restart, a NAT forgetting the
  /// flow) is found without sending anything, dropped and replaced: it is
  /// neither an error nor a failure for the circuit breaker. The first
  /// connection the pool makes also reads the server's maxmemory-policy (see
  /// options::on_warning).
  /// @throws timeout_error when every connection stays busy until `until`;
  ///   connection_error when connecting fails
  [[nodiscard]] lease acquire(deadline until) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (!ready_.wait_until(lock, until, [&] { return !idle_.empty() || open_ < size_; })) {
        throw timeout_error("ratelimit: redis: no pooled connection became free in time");
      }
      if (idle_.empty()) break;
      std::unique_ptr<connection> c = std::move(idle_.back());
      idle_.pop_back();
      const std::uint64_t generation = generation_;
      lock.unlock();
      if (!c->peer_closed()) return lease(this, std::move(c), {}, generation);
      c.reset();  // closes the socket outside the lock
      lock.lock();
      --open_;  // its slot is ours now: take another idle one or connect
    }
    ++open_;
    const std::uint64_t generation = generation_;
    lock.unlock();
    try {
      const deadline start = deadline_clock::now();
      auto c = open_connection();
      if (!config_checked_.load(std::memory_order_acquire)) check_config(*c, start);
      return lease(this, std::move(c), deadline_clock::now() - start, generation);
    } catch (...) {
      lock.lock();
      --open_;
      lock.unlock();
      ready_.notify_one();
      throw;
    }
  }

  /// Reads the server's maxmemory-policy on `c`, a connection made outside
  /// the pool (by the multiplexer), unless some connection did already; as
  /// acquire() does for the pool's own (see options::on_warning).
  /// @throws connection_error when `c` broke meanwhile
  void check_new_connection(connection& c, deadline start) {
    if (!config_checked_.load(std::memory_order_acquire)) check_config(c, start);
  }

  /// Drops every idle connection (the next check reconnects).
  void clear() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ -= idle_.size();
    idle_.clear();
  }

  /// Drops every idle connection now, and every lent one (or one being
  /// made) when it comes back: no connection made before this call serves
  /// another check (Sentinel: the master moved).
  void renew() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    open_ -= idle_.size();
    idle_.clear();
  }

  [[nodiscard]] const options& get_options() const noexcept { return options_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  [[nodiscard]] std::unique_ptr<connection> open_connection() {
    return opener_ ? opener_(options_) : std::make_unique<connection>(options_);
  }

  /// Warns (once per pool) when the server may evict keys of any TTL: an
  /// evicted limiter key forgets what it counted, admitting too much. Runs
  /// within what is left of the connect's connect_timeout (skipped when
  /// nothing is left: a later connection asks). Error replies (CONFIG
  /// renamed, disabled or denied by ACL) are ignored; a connection that
  /// breaks meanwhile fails the connect.
  void check_config(connection& c, deadline start) {
    const auto budget = options_.connect_timeout.count() > 0 ? options_.connect_timeout
                                                             : std::chrono::milliseconds{200};
    if (deadline_clock::now() >= start + budget) return;
    const std::string_view args[] = {"CONFIG", "GET", "maxmemory-policy"};
    reply_ptr r;
    try {
      r = c.command(args, 3, start + budget);
    } catch (const store_error&) {
      if (c.broken()) throw;
      return;
    }
    if (config_checked_.exchange(true, std::memory_order_acq_rel)) return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[1]->type != REDIS_REPLY_STRING) {
      return;
    }
    const std::string policy(r->element[1]->str, r->element[1]->len);
    // allkeys-* may evict any key; volatile-ttl evicts the keys nearest to
    // expiry first, and a limiter's keys carry the shortest TTLs there are.
    if (!policy.starts_with("allkeys-") && policy != "volatile-ttl") return;
    const std::string line = "ratelimit: redis: " + c.where() + " has maxmemory-policy " +
                             detail::escaped_name(policy) +
                             ": under memory pressure Redis may evict rate-limit keys, which "
                             "resets their counts; use noeviction (see docs/redis.md)";
    if (options_.on_warning) {
      try {
        options_.on_warning(line);
      } catch (...) {
      }
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  void give_back(std::unique_ptr<connection> c, std::uint64_t generation) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (c == nullptr || c->broken() || generation != generation_) {
        --open_;
      } else {
        try {
          idle_.push_back(std::move(c));
        } catch (...) {
          --open_;
        }
      }
    }
    ready_.notify_one();
  }

  options options_;
  opener opener_;
  std::size_t size_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<std::unique_ptr<connection>> idle_;
  std::size_t open_ = 0;          ///< connections in existence (idle or lent) or being made
  std::uint64_t generation_ = 0;  ///< renew() calls; a connection lent before one is dropped
  std::atomic<bool> config_checked_{false};  ///< maxmemory-policy was read (see check_config)
};

}  // namespace ratelimit::redis
