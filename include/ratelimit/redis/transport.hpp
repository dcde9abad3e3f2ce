// SPDX-License-Identifier: Apache-2.0
// The byte stream under a Redis connection: a non-blocking TCP or unix socket,
// optionally wrapped in TLS (OpenSSL), every wait bounded by a deadline.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/options.hpp"

namespace ratelimit::redis {

/// Monotonic deadlines of connects and round trips.
using deadline_clock = std::chrono::steady_clock;
using deadline = deadline_clock::time_point;

/// The TLS handshake failed: the certificate was not trusted (unknown CA,
/// expired, name mismatch; the message quotes OpenSSL's verify reason), the
/// server wanted a client certificate, or the peer speaks no TLS.
class tls_error : public connection_error {
 public:
  using connection_error::connection_error;
};

namespace detail {

/// OpenSSL's first queued error as text (and clears the queue); `fallback` when none.
[[nodiscard]] inline std::string ssl_error_text(const char* fallback) {
  const unsigned long e = ::ERR_get_error();
  ::ERR_clear_error();
  if (e == 0) return fallback;
  char buf[256];
  ::ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

/// Tells the CPU that this thread is spinning (x86 `pause`, AArch64
/// `yield`; nothing elsewhere), so that it spends less power and yields to
/// its hyperthread sibling while it polls.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/// True for an errno that means "try again later".
[[nodiscard]] inline bool would_block(int e) noexcept {
  return e == EAGAIN || e == EWOULDBLOCK || e == EINTR;
}

/// A BIO over a socket that writes with MSG_NOSIGNAL, so a closed peer
/// gives EPIPE and never SIGPIPE (OpenSSL's socket BIO uses write()), and
/// never blocks (MSG_DONTWAIT). The socket is in the BIO's data; the BIO
/// never closes it.
[[nodiscard]] inline BIO_METHOD* socket_bio_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = ::BIO_meth_new(::BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                                   "ratelimit nosignal socket");
    if (m == nullptr) return m;
    ::BIO_meth_set_write(m, [](BIO* b, const char* data, int len) -> int {
      ::BIO_clear_retry_flags(b);
      const ssize_t n = ::send(static_cast<int>(reinterpret_cast<std::intptr_t>(::BIO_get_data(b))),
                               data, static_cast<std::size_t>(len), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && would_block(errno)) BIO_set_retry_write(b);
      return static_cast<int>(n);
    });
    ::BIO_meth_set_read(m, [](BIO* b, char* data, int len) -> int {
      ::BIO_clear_retry_flags(b);
      const ssize_t n = ::recv(static_cast<int>(reinterpret_cast<std::intptr_t>(::BIO_get_data(b))),
                               data, static_cast<std::size_t>(len), MSG_DONTWAIT);
      if (n < 0 && would_block(errno)) BIO_set_retry_read(b);
      return static_cast<int>(n);
    });
    ::BIO_meth_set_ctrl(
        m, [](BIO*, int cmd, long, void*) -> long { return cmd == BIO_CTRL_FLUSH ? 1 : 0; });
    ::BIO_meth_set_create(m, [](BIO* b) -> int {
      ::BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

/// Modification time and size of `path`, to notice a replaced file.
[[nodiscard]] inline std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return "-";
  return std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "/" +
         std::to_string(st.st_size);
}

/// A readable regular file (or, for `dir`, directory) at `path`.
/// @throws std::invalid_argument naming the option and the path
inline void require_readable(const std::string& path, const char* what, bool dir = false) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw std::invalid_argument("ratelimit: redis: TLS " + std::string(what) + " \"" +
                                escaped_name(path) + "\": " + std::strerror(errno));
  }
  if (dir ? !S_ISDIR(st.st_mode) : S_ISDIR(st.st_mode)) {
    throw std::invalid_argument("ratelimit: redis: TLS " + std::string(what) + " \"" +
                                escaped_name(path) +
                                (dir ? "\" is no directory" : "\" is a directory"));
  }
  if (::access(path.c_str(), R_OK) != 0) {
    throw std::invalid_argument("ratelimit: redis: TLS " + std::string(what) + " \"" +
                                escaped_name(path) + "\" is not readable: " + std::strerror(errno));
  }
}

/// A client SSL_CTX for `t`: trusted CAs, client certificate and key,
/// verification mode, TLS 1.2 or later.
/// @throws std::invalid_argument naming the file that is missing, unreadable
///   or not understood, or a certificate without its key
[[nodiscard]] inline std::shared_ptr<SSL_CTX> make_tls_context(const tls_options& t) {
  if (t.cert_file.empty() != t.key_file.empty()) {
    throw std::invalid_argument(
        "ratelimit: redis: TLS client certificate and key go together (cert and key): "
        "only one is given");
  }
  ::ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(::SSL_CTX_new(::TLS_client_method()), ::SSL_CTX_free);
  if (ctx == nullptr) {
    throw std::runtime_error("ratelimit: redis: TLS: " + ssl_error_text("SSL_CTX_new failed"));
  }
  ::SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  ::SSL_CTX_set_mode(ctx.get(),
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  ::SSL_CTX_set_verify(ctx.get(), t.verify == tls_verify::none ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                       nullptr);
  // Called only when the server asks for a client certificate and none is
  // set: notes it (see transport::client_cert_missing) and sends none.
  ::SSL_CTX_set_client_cert_cb(ctx.get(), [](SSL* ssl, X509**, EVP_PKEY**) -> int {
    if (void* flag = SSL_get_app_data(ssl); flag != nullptr) *static_cast<bool*>(flag) = true;
    return 0;
  });
  // An encrypted key is refused: without this, OpenSSL would ask for its
  // pass phrase on the process's terminal and wait for an answer.
  ::SSL_CTX_set_default_passwd_cb(ctx.get(), [](char*, int, int, void*) -> int { return 0; });
  if (!t.ca_file.empty()) require_readable(t.ca_file, "CA file (ca)");
  if (!t.ca_dir.empty()) require_readable(t.ca_dir, "CA directory (ca_dir)", true);
  if (t.ca_file.empty() && t.ca_dir.empty()) {
    if (::SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      throw std::invalid_argument("ratelimit: redis: TLS: cannot load the system's CAs: " +
                                  ssl_error_text("unknown error"));
    }
  } else if (::SSL_CTX_load_verify_locations(ctx.get(),
                                             t.ca_file.empty() ? nullptr : t.ca_file.c_str(),
                                             t.ca_dir.empty() ? nullptr : t.ca_dir.c_str()) != 1) {
    throw std::invalid_argument(
        "ratelimit: redis: TLS CA file (ca) \"" + escaped_name(t.ca_file) +
        "\" holds no usable certificate: " + ssl_error_text("unknown error"));
  }
  if (!t.cert_file.empty()) {
    require_readable(t.cert_file, "client certificate (cert)");
    require_readable(t.key_file, "client key (key)");
    if (::SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert_file.c_str()) != 1) {
      throw std::invalid_argument("ratelimit: redis: TLS client certificate (cert) \"" +
                                  escaped_name(t.cert_file) +
                                  "\" is unusable: " + ssl_error_text("unknown error"));
    }
    if (::SSL_CTX_use_PrivateKey_file(ctx.get(), t.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      throw std::invalid_argument(
          "ratelimit: redis: TLS client key (key) \"" + escaped_name(t.key_file) +
          "\" is unusable (an unencrypted PEM key is needed): " + ssl_error_text("unknown error"));
    }
    if (::SSL_CTX_check_private_key(ctx.get()) != 1) {
      throw std::invalid_argument(
          "ratelimit: redis: TLS client key (key) \"" + escaped_name(t.key_file) +
          "\" does not belong to the certificate \"" + escaped_name(t.cert_file) + "\"");
    }
  }
  return ctx;
}

/// The SSL_CTX cache of one process: its own lock and map. A child forked
/// while a thread of the parent held the parent's lock would wait on it
/// forever, so a process other than the one that made the cache makes a
/// cache of its own, and leaves the parent's untouched (leaked: its lock may
/// be held and its map half-changed).
struct tls_context_cache {
  struct entry {
    std::string stamp;
    std::shared_ptr<SSL_CTX> ctx;
  };
  const pid_t pid = ::getpid();
  std::mutex mutex;
  std::map<std::string, entry> map;

  /// This process's cache (made on first use, never destroyed).
  [[nodiscard]] static tls_context_cache& mine() {
    static std::atomic<tls_context_cache*> current{nullptr};
    const pid_t self = ::getpid();
    tls_context_cache* c = current.load(std::memory_order_acquire);
    while (c == nullptr || c->pid != self) {
      auto* fresh = new tls_context_cache;
      if (current.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) return *fresh;
      delete fresh;  // another thread of this process won; `c` is its cache
    }
    return *c;
  }
};

/// The SSL_CTX for `t`, shared by every connection with the same settings
/// and files: made on first use and made again when a file named in `t` was
/// replaced (a renewed certificate is used by the next new connection). One
/// cache per process (see tls_context_cache: a forked child never locks the
/// parent's).
/// @throws std::invalid_argument as make_tls_context
[[nodiscard]] inline std::shared_ptr<SSL_CTX> tls_context_for(const tls_options& t) {
  tls_context_cache& cache = tls_context_cache::mine();
  // Each field as <length>:<bytes>: no path (a file name may hold any byte
  // but NUL and '/') can make two different option sets one key.
  std::string key;
  for (const std::string* field : {&t.ca_file, &t.ca_dir, &t.cert_file, &t.key_file}) {
    key += std::to_string(field->size());
    key += ':';
    key += *field;
  }
  key += static_cast<char>('0' + static_cast<int>(t.verify));
  std::string stamp = file_stamp(t.ca_file) + ' ' + file_stamp(t.cert_file) + ' ' +
                      file_stamp(t.key_file) + ' ' + file_stamp(t.ca_dir);
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (const auto it = cache.map.find(key); it != cache.map.end() && it->second.stamp == stamp) {
      return it->second.ctx;
    }
  }
  std::shared_ptr<SSL_CTX> ctx = make_tls_context(t);  // outside the lock: reads files
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.map[std::move(key)] = tls_context_cache::entry{std::move(stamp), ctx};
  return ctx;
}

/// Why the certificate check failed, in words a reader can act on, with
/// OpenSSL's own reason.
[[nodiscard]] inline std::string verify_failure(long code, const std::string& name) {
  const std::string reason = ::X509_verify_cert_error_string(code);
  switch (code) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      return "certificate signed by an unknown CA (" + reason +
             "): give the CA that signed it with ca= (tls_options::ca_file)";
    case X509_V_ERR_CERT_HAS_EXPIRED: return "certificate expired (" + reason + ")";
    case X509_V_ERR_CERT_NOT_YET_VALID: return "certificate not yet valid (" + reason + ")";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return "hostname mismatch: the certificate is not valid for \"" + escaped_name(name) +
             "\" (" + reason + ")";
    default: return "certificate verify failed: " + reason;
  }
}

}  // namespace detail

/// A connected, non-blocking stream socket, over TLS when asked: the bytes
/// under one Redis connection. Closing it sends nothing when the process is
/// a fork() child of the one that connected it, so a child never ends the
/// parent's TLS session (it sends no close_notify).
///
/// Thread safety: one thread at a time.
class transport {
 public:
  /// What a read or write did.
  enum class io : unsigned char {
    ok,          ///< `n` bytes moved (at least one)
    want_read,   ///< wait until the socket is readable, then call again
    want_write,  ///< wait until the socket is writable, then call again
    closed,      ///< the peer closed the stream (reads only)
    failed,      ///< an error; error() says which
  };

  transport() = default;
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  ~transport() { close(); }

  /// Connects to the numeric address `address` (IPv4 or IPv6) and `port`,
  /// giving up at `until`. `where` names the peer in messages as is: the
  /// caller escapes it (connection::where()).
  /// @throws connection_error saying why (timeout_error when `until` passes)
  void open_tcp(const std::string& address, int port, const std::string& where, deadline until) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const std::string service = std::to_string(port);
    if (const int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &list); rc != 0) {
      throw connection_error("ratelimit: redis: cannot connect to " + where + ": " +
                             ::gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(list, ::freeaddrinfo);
    open_socket(list->ai_family, list->ai_addr, list->ai_addrlen, where, until);
    const int one = 1;
    (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  /// Connects to the unix domain socket at `path`, giving up at `until`.
  /// @throws connection_error (timeout_error when `until` passes)
  void open_unix(const std::string& path, deadline until) {
    if (path.find('\0') != std::string::npos) {  // "\0..." would name an abstract socket
      throw connection_error(
          "ratelimit: redis: cannot connect to unix socket: its path holds a "
          "NUL byte");
    }
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    // Set in code, the path may hold CR, LF or other control bytes: every
    // message quotes it escaped, as URL parts are, and cut after its first
    // '&', ';', '=', ',', '?' or space (detail::quoted_part), as redacted_url shows it: a
    // path may hold them, but `unix:///tmp/s;password=S3CRET` (';' typed
    // for '?') is a path holding a secret.
    const std::string shown = detail::quoted_part(path);
    if (path.size() >= sizeof a.sun_path) {
      throw connection_error("ratelimit: redis: cannot connect to " + shown +
                             ": the path is too long for a unix socket");
    }
    std::memcpy(a.sun_path, path.data(), path.size());
    open_socket(AF_UNIX, reinterpret_cast<const sockaddr*>(&a), sizeof a, shown, until);
  }

  /// Runs the TLS handshake on the connected socket with `ctx`, sending
  /// `name` as SNI (unless it is an IP address) and checking the server's
  /// certificate as `verify` says, until `until` at most. Messages quote
  /// `name` escaped (detail::escaped_name) and `where` as is (the caller
  /// escapes it, as connection::where() is).
  /// @throws tls_error naming what failed (unknown CA, expired certificate,
  ///   hostname mismatch, OpenSSL's reason); timeout_error when `until` passes
  void start_tls(SSL_CTX* ctx, const std::string& name, tls_verify verify, const std::string& where,
                 deadline until) {
    if (name.find('\0') != std::string::npos) {  // OpenSSL would check the text before it
      throw tls_error("ratelimit: redis: TLS to " + where + ": the server name holds a NUL byte");
    }
    ::ERR_clear_error();
    fatal_ = true;  // until the handshake succeeds: no close_notify
    ssl_ = ::SSL_new(ctx);
    BIO* bio = ssl_ == nullptr ? nullptr : ::BIO_new(detail::socket_bio_method());
    if (bio == nullptr) {
      throw connection_error("ratelimit: redis: TLS to " + where + ": " +
                             detail::ssl_error_text("out of memory"));
    }
    ::BIO_set_data(bio, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd_)));
    ::SSL_set_bio(ssl_, bio, bio);
    SSL_set_app_data(ssl_, &cert_asked_);
    in6_addr ip{};
    // An IPv6 address with a zone id (fe80::1%eth0) is checked as the
    // address alone: the zone names a local interface, no certificate holds it.
    std::string checked = name;
    if (const auto pct = name.find('%'); pct != std::string::npos) {
      const std::string address = name.substr(0, pct);
      if (::inet_pton(AF_INET6, address.c_str(), &ip) == 1) checked = address;
    }
    const bool numeric = ::inet_pton(AF_INET, checked.c_str(), &ip) == 1 ||
                         ::inet_pton(AF_INET6, checked.c_str(), &ip) == 1;
    if (!numeric && ::SSL_set_tlsext_host_name(ssl_, checked.c_str()) != 1) {
      throw tls_error("ratelimit: redis: TLS to " + where + ": bad server name \"" +
                      detail::escaped_name(name) + "\"");
    }
    if (verify == tls_verify::full) {
      const int ok = numeric
                         ? ::X509_VERIFY_PARAM_set1_ip_asc(::SSL_get0_param(ssl_), checked.c_str())
                         : ::SSL_set1_host(ssl_, checked.c_str());
      if (ok != 1) {
        throw tls_error("ratelimit: redis: TLS to " + where + ": bad server name \"" +
                        detail::escaped_name(name) + "\"");
      }
      // Names come from subjectAltName only: the subject's CN is no host name.
      ::SSL_set_hostflags(
          ssl_, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
    }
    for (;;) {
      ::ERR_clear_error();
      const int rc = ::SSL_connect(ssl_);
      if (rc == 1) {
        fatal_ = false;
        return;
      }
      const int e = ::SSL_get_error(ssl_, rc);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        if (!wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, until)) {
          throw timeout_error("ratelimit: redis: TLS handshake with " + where + " timed out");
        }
        continue;
      }
      const long verified = ::SSL_get_verify_result(ssl_);
      if (verify != tls_verify::none && verified != X509_V_OK) {
        ::ERR_clear_error();
        throw tls_error("ratelimit: redis: TLS handshake with " + where +
                        " failed: " + detail::verify_failure(verified, name));
      }
      const int sys = errno;
      std::string why = detail::ssl_error_text("");
      if (why.empty()) {
        why = e == SSL_ERROR_SYSCALL && sys != 0
                  ? std::string(std::strerror(sys))
                  : std::string("the server closed the connection (does it speak TLS there?)");
      }
      throw tls_error("ratelimit: redis: TLS handshake with " + where + " failed: " + why);
    }
  }

  /// True when the TLS server asked for a client certificate and none is
  /// configured (a server requiring one then ends the session after the handshake).
  [[nodiscard]] bool client_cert_missing() const noexcept { return cert_asked_; }

  /// True when the stream runs over TLS.
  [[nodiscard]] bool tls() const noexcept { return ssl_ != nullptr; }
  /// The socket (-1 when closed).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// errno of the last failed read or write (0 for a TLS protocol error).
  [[nodiscard]] int error() const noexcept { return errno_; }
  /// Text of the last failed read or write.
  [[nodiscard]] const std::string& error_text() const noexcept { return error_text_; }

  /// Writes some of `data` without blocking; `n` is set to the bytes taken.
  [[nodiscard]] io write_some(std::string_view data, std::size_t& n) noexcept {
    n = 0;
    if (ssl_ == nullptr) {
      const ssize_t r = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        n = static_cast<std::size_t>(r);
        return io::ok;
      }
      if (r < 0 && detail::would_block(errno)) return io::want_write;
      return fail_sys(r < 0 ? errno : EPIPE);
    }
    ::ERR_clear_error();
    const int len = static_cast<int>(std::min<std::size_t>(data.size(), 1 << 30));
    const int r = ::SSL_write(ssl_, data.data(), len);
    if (r > 0) {
      n = static_cast<std::size_t>(r);
      return io::ok;
    }
    return ssl_failure(r);
  }

  /// Reads up to `cap` bytes into `buf` without blocking; `n` is set to the
  /// bytes read.
  [[nodiscard]] io read_some(char* buf, std::size_t cap, std::size_t& n) noexcept {
    n = 0;
    if (ssl_ == nullptr) {
      const ssize_t r = ::recv(fd_, buf, cap, MSG_DONTWAIT);
      if (r > 0) {
        n = static_cast<std::size_t>(r);
        return io::ok;
      }
      if (r == 0) return io::closed;
      if (detail::would_block(errno)) return io::want_read;
      return fail_sys(errno);
    }
    ::ERR_clear_error();
    const int r = ::SSL_read(ssl_, buf, static_cast<int>(std::min<std::size_t>(cap, 1 << 30)));
    if (r > 0) {
      n = static_cast<std::size_t>(r);
      return io::ok;
    }
    return ssl_failure(r);
  }

  /// Lets read_blocking() block for at most `limit` (SO_RCVTIMEO; the
  /// socket's own O_NONBLOCK is cleared: every other read and write passes
  /// MSG_DONTWAIT). Plain sockets only. False when the socket refused (it
  /// is then left as it was, or broken for the next call to report).
  [[nodiscard]] bool allow_blocking_reads(std::chrono::microseconds limit) noexcept {
    if (ssl_ != nullptr || fd_ < 0 || limit.count() <= 0) return false;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(limit.count() / 1'000'000);
    tv.tv_usec = static_cast<suseconds_t>(limit.count() % 1'000'000);
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) return false;
    const int flags = ::fcntl(fd_, F_GETFL);
    return flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) == 0;
  }

  /// Reads up to `cap` bytes into `buf`, blocking until some arrive, the
  /// peer closes, or allow_blocking_reads()'s limit passes (or a signal
  /// comes): those two give want_read. Only after allow_blocking_reads()
  /// returned true.
  [[nodiscard]] io read_blocking(char* buf, std::size_t cap, std::size_t& n) noexcept {
    n = 0;
    const ssize_t r = ::recv(fd_, buf, cap, 0);
    if (r > 0) {
      n = static_cast<std::size_t>(r);
      return io::ok;
    }
    if (r == 0) return io::closed;
    if (detail::would_block(errno)) return io::want_read;
    return fail_sys(errno);
  }

  /// Waits until the socket is ready for `events` (POLLIN, POLLOUT) or
  /// reports an error; false when `until` passed first.
  /// @throws connection_error when poll() fails
  [[nodiscard]] bool wait(short events, deadline until) const {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - deadline_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
      if (r > 0) return true;  // ready, or an error the next call reports
      if (r < 0 && errno != EINTR) {
        throw connection_error(std::string("ratelimit: redis: poll failed: ") +
                               std::strerror(errno));
      }
    }
  }

  /// True when the peer closed this idle stream or sent something unasked
  /// for; checked without sending or blocking. Over TLS, session tickets the
  /// server sends after the handshake are consumed and do not count.
  [[nodiscard]] bool peer_closed() noexcept {
    if (ssl_ != nullptr && ::SSL_pending(ssl_) > 0) return true;
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 0);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    if (r < 0) return true;
    if (ssl_ == nullptr) {
      char byte = 0;
      const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      return !(n < 0 && detail::would_block(errno));
    }
    char byte = 0;
    std::size_t n = 0;
    const io got = read_some(&byte, 1, n);
    return got != io::want_read && got != io::want_write;  // data, end, or an error
  }

  /// Closes the socket. Over TLS, in the process that connected it and when
  /// no error came first, a close_notify is offered without waiting.
  void close() noexcept {
    if (ssl_ != nullptr) {
      if (!fatal_ && owner_ == ::getpid()) {
        ::ERR_clear_error();
        (void)::SSL_shutdown(ssl_);  // non-blocking: one try, no wait for the answer
      }
      ::SSL_free(ssl_);  // frees the BIO, which leaves the socket open
      ::ERR_clear_error();
      ssl_ = nullptr;
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  void open_socket(int family, const sockaddr* addr, socklen_t len, const std::string& where,
                   deadline until) {
    close();
    fd_ = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      throw connection_error("ratelimit: redis: cannot connect to " + where +
                             ": socket: " + std::strerror(errno));
    }
    if (::connect(fd_, addr, len) == 0) return;
    if (errno != EINPROGRESS && errno != EAGAIN && errno != EINTR) {
      const int e = errno;
      close();
      throw connection_error("ratelimit: redis: cannot connect to " + where + ": " +
                             std::strerror(e));
    }
    if (!wait(POLLOUT, until)) {
      close();
      throw timeout_error("ratelimit: redis: cannot connect to " + where + ": timed out");
    }
    int e = 0;
    socklen_t elen = sizeof e;
    if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &e, &elen) != 0) e = errno;
    if (e != 0) {
      close();
      throw connection_error("ratelimit: redis: cannot connect to " + where + ": " +
                             std::strerror(e));
    }
  }

  io fail_sys(int e) noexcept {
    errno_ = e;
    try {
      error_text_ = std::strerror(e);
    } catch (...) {
    }
    return io::failed;
  }

  io ssl_failure(int r) noexcept {
    const int sys = errno;
    const int e = ::SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) return io::want_read;
    if (e == SSL_ERROR_WANT_WRITE) return io::want_write;
    fatal_ = true;
    if (e == SSL_ERROR_ZERO_RETURN) return io::closed;
    if (e == SSL_ERROR_SYSCALL && sys != 0 && ::ERR_peek_error() == 0) {
      return r == 0 ? io::closed : fail_sys(sys);
    }
    errno_ = 0;
    try {
      error_text_ = "TLS: " + detail::ssl_error_text("the connection ended");
    } catch (...) {
    }
    ::ERR_clear_error();
    return io::failed;
  }

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  bool fatal_ = false;       ///< a TLS error came: no close_notify may follow
  bool cert_asked_ = false;  ///< see client_cert_missing
  pid_t owner_ = ::getpid();
  int errno_ = 0;
  std::string error_text_;
};

}  // namespace ratelimit::redis
