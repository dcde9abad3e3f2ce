// SPDX-License-Identifier: Apache-2.0
// The SIP front door's logic, free of sockets: one datagram in, at most one
// response out, and the counters. main.cpp puts it on a UDP socket.
//
// Per calling number (the From user) an INVITE takes a lease named by its
// dialog (Call-ID ';' From tag) from a concurrency_limiter whose rate is
// applied in the same step, all or nothing: "at most N calls in progress and
// R calls per window". Admitted: 200 OK. Refused: 503 with Retry-After. A BYE
// releases the lease; a lease whose BYE never comes expires after the longest
// call. Final responses are kept per transaction (method, From number, Call-ID, From tag,
// To tag, CSeq) for `transaction_life`, so a retransmitted request gets the same bytes
// again and is never counted as a new call; should an INVITE outlive its
// cached answer, the lease's own idempotent acquire still knows it (`repeat`).
//
// The To tag of our final answers is a keyed hash (SipHash-1-3 under a
// 128-bit secret) of the dialog, so a BYE must carry it: one who knows a
// call's Call-ID, From tag and number but never saw our answer cannot end
// the call. Front doors sharing one store (Redis) and one address must share
// the secret (`--dialog-secret-file`), so that any of them accepts the BYE of a
// call another one admitted and answers a retransmitted INVITE with the same
// tag.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "ratelimit/concurrency.hpp"
#include "ratelimit/detail/printable.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "sip_message.hpp"

namespace sipfd {

using clock_type = std::chrono::steady_clock;

/// What happened to the datagrams so far. Written by the one thread that
/// runs the front door.
struct counters {
  std::uint64_t received = 0;                ///< datagrams read
  std::uint64_t malformed = 0;               ///< dropped by the parser
  std::uint64_t ignored = 0;                 ///< SIP responses (a UAS gets none it needs)
  std::uint64_t invites = 0;                 ///< new INVITE transactions
  std::uint64_t admitted = 0;                ///< ... answered 200 OK
  std::uint64_t rejected = 0;                ///< ... answered 503 (over a limit)
  std::uint64_t errors = 0;                  ///< ... answered 500 (the store failed)
  std::uint64_t invite_retransmissions = 0;  ///< INVITEs of a transaction already answered
  std::uint64_t acks = 0;
  std::uint64_t byes = 0;          ///< new BYE transactions
  std::uint64_t released = 0;      ///< ... that freed a live lease (200 OK)
  std::uint64_t unknown_byes = 0;  ///< ... for no live lease (481)
  std::uint64_t bye_retransmissions = 0;
  std::uint64_t other = 0;       ///< other methods (OPTIONS 200, rest 501/481)
  std::uint64_t limiter_ns = 0;  ///< wall time inside the limiter's acquire and release
};

/// The counters as one JSON object on one line.
[[nodiscard]] inline std::string to_json(const counters& c) {
  std::string s = "{";
  const auto add = [&s](const char* name, std::uint64_t v) {
    if (s.size() > 1) s += ',';
    s += '"';
    s += name;
    s += "\":";
    s += std::to_string(v);
  };
  add("received", c.received);
  add("malformed", c.malformed);
  add("ignored", c.ignored);
  add("invites", c.invites);
  add("admitted", c.admitted);
  add("rejected", c.rejected);
  add("errors", c.errors);
  add("invite_retransmissions", c.invite_retransmissions);
  add("acks", c.acks);
  add("byes", c.byes);
  add("released", c.released);
  add("unknown_byes", c.unknown_byes);
  add("bye_retransmissions", c.bye_retransmissions);
  add("other", c.other);
  add("limiter_us", c.limiter_ns / 1000);
  s += '}';
  return s;
}

/// The front door's question to the library, behind one interface so that
/// the store (memory, Redis, cluster) or no limiter at all is a run-time choice.
class admission {
 public:
  struct answer {
    bool admitted = false;
    bool repeat = false;                       ///< the lease was already live (same dialog)
    std::chrono::microseconds retry_after{0};  ///< when refused
  };
  virtual ~admission() = default;
  /// Takes a lease for dialog `lease_id` of calling number `number`.
  /// @throws whatever the store throws (the caller answers 500)
  virtual answer acquire(std::string_view number, std::string_view lease_id) = 0;
  /// Frees it; false when it was not live (never acquired, or expired).
  virtual bool release(std::string_view number, std::string_view lease_id) = 0;
  /// Periodic upkeep (the in-process store drops idle numbers).
  virtual void housekeeping() {}
};

/// The limits of one front door.
struct policy {
  std::string rate = "10/15min";                              ///< calls per window per number
  ratelimit::units max_calls = 2;                             ///< calls in progress per number
  std::chrono::microseconds max_call{std::chrono::hours{1}};  ///< a lease's life (lost BYE)
  /// Calling numbers held at once in process (0 = no cap). Every number is
  /// the caller's word (From), and an admitted call whose BYE never comes
  /// keeps its number for max_call: without a cap a flood of made-up numbers
  /// grows memory for that long. At the cap, an INVITE from a new number is
  /// refused (503) until idle numbers can be reclaimed; known numbers are
  /// decided as always.
  std::size_t max_numbers = 1'000'000;
};

/// The rate policy: an exact sliding log, "no more than R calls in any window".
using rate_policy = ratelimit::sliding_window_log;

/// `admission` on a concurrency_limiter with its rate, in any store.
template <class Store, class Clock = ratelimit::steady_clock>
class lease_admission final : public admission {
 public:
  lease_admission(const policy& p, Store store, Clock clock = Clock{})
      : limiter_(ratelimit::concurrency_config(p.max_calls, p.max_call, {.name = "sip_front_door"}),
                 rate_policy::config(p.rate), std::move(store), std::move(clock)) {}

  answer acquire(std::string_view number, std::string_view lease_id) override {
    const ratelimit::decision d = limiter_.acquire(number, lease_id);
    return {d.allowed, d.repeat, d.retry_after};
  }
  bool release(std::string_view number, std::string_view lease_id) override {
    return limiter_.release(number, lease_id).allowed;
  }
  void housekeeping() override {
    if constexpr (requires { limiter_.sweep(limiter_.now()); }) {
      (void)limiter_.sweep(limiter_.now());
    }
  }

 private:
  ratelimit::concurrency_limiter<rate_policy, Store, Clock> limiter_;
};

/// The in-process store of `lease_admission`.
using memory_lease_store = ratelimit::memory_store<ratelimit::leases<rate_policy>>;

/// `admission` in process, holding at most `p.max_numbers` numbers.
template <class Clock = ratelimit::steady_clock>
[[nodiscard]] std::unique_ptr<admission> in_process_admission(const policy& p,
                                                              Clock clock = Clock{}) {
  ratelimit::memory_store_options o;
  o.max_keys = p.max_numbers;
  o.on_full = ratelimit::when_full::fail_closed;
  return std::make_unique<lease_admission<memory_lease_store, Clock>>(p, memory_lease_store(o),
                                                                      std::move(clock));
}

/// No limiter: every INVITE is admitted (the benchmark's baseline).
class no_admission final : public admission {
 public:
  answer acquire(std::string_view, std::string_view) override { return {true, false, {}}; }
  bool release(std::string_view, std::string_view) override { return true; }
};

/// Final responses by transaction, forgotten `life` after they were made and
/// at most `max_entries` and `max_bytes` at once (the oldest go first). A
/// response echoes its request's headers, so an entry is up to about a whole
/// datagram (8 KiB), not the 0.5 KiB of a typical call: the byte bound is
/// what keeps a flood of large INVITEs from holding gigabytes.
class transaction_cache {
 public:
  /// Bytes an entry is charged beyond its key (held twice) and response:
  /// the map node, the order entry and two string headers, roughly.
  static constexpr std::size_t entry_overhead = 160;

  transaction_cache(clock_type::duration life, std::size_t max_entries,
                    std::size_t max_bytes = std::size_t{64} << 20)
      : life_(life), max_(max_entries), max_bytes_(max_bytes) {}

  [[nodiscard]] const std::string* find(const std::string& key) const {
    const auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  void put(std::string key, std::string response, clock_type::time_point now) {
    expire(now);
    const std::size_t cost = charge(key, response);
    while ((map_.size() >= max_ || bytes_ + cost > max_bytes_) && !order_.empty()) drop_oldest();
    if (map_.size() >= max_ || bytes_ + cost > max_bytes_) return;  // larger than the whole budget
    if (map_.emplace(key, std::move(response)).second) {
      bytes_ += cost;
      order_.emplace_back(now + life_, std::move(key));
    }
  }
  void expire(clock_type::time_point now) {
    while (!order_.empty() && order_.front().first <= now) drop_oldest();
  }
  [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }
  /// Bytes charged for the entries held (see entry_overhead).
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  [[nodiscard]] static std::size_t charge(const std::string& key, const std::string& response) {
    return 2 * key.size() + response.size() + entry_overhead;
  }
  void drop_oldest() {
    const auto it = map_.find(order_.front().second);
    if (it != map_.end()) {
      bytes_ -= charge(it->first, it->second);
      map_.erase(it);
    }
    order_.pop_front();
  }

  clock_type::duration life_;
  std::size_t max_;
  std::size_t max_bytes_;
  std::size_t bytes_ = 0;
  std::unordered_map<std::string, std::string> map_;
  std::deque<std::pair<clock_type::time_point, std::string>> order_;
};

/// One front door: feed it datagrams, send what it returns.
class front_door {
 public:
  /// How long a final response is kept for retransmissions: 64 * T1, the
  /// longest a UAC keeps retransmitting over UDP (RFC 3261, Timer B/F).
  static constexpr clock_type::duration transaction_life = std::chrono::seconds{32};

  /// @param contact          the Contact URI put into 200 OK to INVITE
  /// @param max_transactions answers kept at once (about 0.5 KiB each for a
  ///                         typical call; a flood of new calls pushes out
  ///                         the oldest)
  /// @param max_transaction_bytes bytes those answers may take at once (an
  ///                         answer echoes its request: up to about 8 KiB)
  /// @param dialog_secret    the key of our To tags (see file comment);
  ///                         by default a random one per front door
  front_door(std::unique_ptr<admission> a, std::string contact,
             std::size_t max_transactions = 100'000,
             std::size_t max_transaction_bytes = std::size_t{64} << 20,
             ratelimit::detail::siphash_key dialog_secret = random_secret())
      : admission_(std::move(a)),
        contact_(std::move(contact)),
        cache_(transaction_life, max_transactions, max_transaction_bytes),
        secret_(dialog_secret) {}

  /// A fresh secret for To tags, from std::random_device.
  /// @throws std::runtime_error when there is no random source
  [[nodiscard]] static ratelimit::detail::siphash_key random_secret() {
    std::random_device rd;
    const auto word = [&rd] {
      return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
    };
    return {word(), word()};
  }

  /// Parses a dialog secret: exactly 32 hex digits (128 bits).
  /// @throws std::invalid_argument naming the value's length or bad digit
  [[nodiscard]] static ratelimit::detail::siphash_key parse_secret(std::string_view hex) {
    if (hex.size() != 32) {
      throw std::invalid_argument("the dialog secret needs 32 hex digits (128 bits), got " +
                                  std::to_string(hex.size()) + " characters");
    }
    std::uint64_t k[2] = {0, 0};
    for (std::size_t i = 0; i < 32; ++i) {
      const char c = hex[i];
      int v = -1;
      if (c >= '0' && c <= '9') v = c - '0';
      if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
      if (v < 0) {
        throw std::invalid_argument(
            "the dialog secret holds a character that is not a hex digit "
            "at position " +
            std::to_string(i + 1));
      }
      k[i / 16] = (k[i / 16] << 4) | static_cast<std::uint64_t>(v);
    }
    return {k[0], k[1]};
  }

  /// Most bytes a dialog secret file may hold (32 hex digits and whitespace).
  static constexpr std::size_t max_secret_file = 4096;

  /// Reads the dialog secret from the file `path`, which must hold exactly
  /// 32 hex digits (either case), then nothing but spaces, tabs, CR and LF,
  /// and at most max_secret_file bytes in all: a trailing newline is fine,
  /// whitespace before the digits is not. It reads until the end of the file
  /// or max_secret_file + 1 bytes, whichever comes first: a longer file (or
  /// an endless one such as /dev/zero) is refused, never cut. After trailing
  /// whitespace is dropped, what is left goes to parse_secret: an empty file
  /// or any other length is refused by its length, 32 characters holding a
  /// byte that is not a hex digit (a binary file) by that byte's position.
  /// A FIFO with no writer reads as empty instead of blocking the open.
  /// @throws std::invalid_argument starting `dialog secret file "PATH": `
  ///   (PATH as ratelimit::detail::printable shows it, at most 256 bytes),
  ///   then what is wrong: cannot open it (with the
  ///   system's reason), cannot read it (a directory), more than
  ///   max_secret_file bytes, or parse_secret's message; never the file's bytes
  [[nodiscard]] static ratelimit::detail::siphash_key read_secret_file(const std::string& path) {
    const auto fail = [&path](const std::string& why) {
      return std::invalid_argument("dialog secret file \"" +
                                   ratelimit::detail::printable(path, 256) + "\": " + why);
    };
    // Opened without blocking, then read blocking: a FIFO that no process
    // writes to would block the open forever; this way it reads as empty
    // (refused), while a pipe with a writer (a shell's <(...)) still works.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw fail(std::string("cannot open it: ") + std::strerror(errno));
    const int flags = ::fcntl(fd, F_GETFL);
    std::FILE* f = flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ? nullptr
                                                                              : ::fdopen(fd, "rb");
    if (f == nullptr) {
      const int err = errno;
      ::close(fd);
      throw fail(std::string("cannot open it: ") + std::strerror(err));
    }
    std::string text;
    char buf[1024];
    while (text.size() <= max_secret_file) {
      const std::size_t want = std::min(sizeof buf, max_secret_file + 1 - text.size());
      const std::size_t n = std::fread(buf, 1, want, f);
      text.append(buf, n);
      if (n < want) break;  // end of file or an error
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) throw fail("cannot read it");
    if (text.size() > max_secret_file) {
      throw fail("it holds more than " + std::to_string(max_secret_file) +
                 " bytes (a dialog secret file holds 32 hex digits)");
    }
    std::string_view hex(text);
    while (!hex.empty() &&
           (hex.back() == '\n' || hex.back() == '\r' || hex.back() == ' ' || hex.back() == '\t')) {
      hex.remove_suffix(1);
    }
    try {
      return parse_secret(hex);
    } catch (const std::invalid_argument& e) {
      throw fail(e.what());
    }
  }

  /// Our To tag for the dialog (Call-ID, From tag) of the number `from_user`:
  /// "fd" and 16 hex digits of a keyed hash of the three. The number is in
  /// it because leases are held per number: a BYE carrying a dialog's tag
  /// under another From number is not of that dialog (481, not cached), so it
  /// cannot put an answer in the cache under the real BYE's transaction key.
  [[nodiscard]] std::string dialog_tag(std::string_view call_id, std::string_view from_tag,
                                       std::string_view from_user) const {
    std::string d = std::to_string(call_id.size());
    d += ':';
    d += call_id;
    d += std::to_string(from_tag.size());
    d += ':';
    d += from_tag;
    d += from_user;
    std::string tag = "fd";
    tag += to_hex16(ratelimit::detail::siphash13(secret_, d));
    return tag;
  }

  /// Handles one datagram at `now`; returns true with `out` set to the
  /// response to send back to the sender, false when there is none.
  bool handle(std::string_view datagram, clock_type::time_point now, std::string& out) {
    ++c_.received;
    sip_message m;
    switch (parse(datagram, m)) {
      case parse_result::malformed: ++c_.malformed; return false;
      case parse_result::response: ++c_.ignored; return false;
      case parse_result::request: break;
    }
    if (m.method == "ACK") {
      ++c_.acks;  // ends the INVITE transaction; nothing to send
      return false;
    }
    if (m.method == "INVITE" && !m.to_has_tag) return invite(m, now, out);
    if (m.method == "BYE") return bye(m, now, out);
    ++c_.other;
    if (m.method == "OPTIONS") {
      out = response(m, 200, "OK", false);
    } else if (m.method == "CANCEL" || m.method == "INVITE") {
      // INVITEs are answered at once (nothing left to cancel); re-INVITEs
      // are out of this example's scope.
      out = response(m, 481, "Call/Transaction Does Not Exist", false);
    } else {
      out = response(m, 501, "Not Implemented", false);
    }
    return true;
  }

  /// Drops old transactions and idle numbers; call about once a second.
  void housekeeping(clock_type::time_point now) {
    cache_.expire(now);
    admission_->housekeeping();
  }

  [[nodiscard]] const counters& stats() const noexcept { return c_; }
  [[nodiscard]] std::size_t transactions_held() const noexcept { return cache_.size(); }
  /// Bytes charged for the answers held (bounded by max_transaction_bytes).
  [[nodiscard]] std::size_t transaction_bytes() const noexcept { return cache_.bytes(); }

 private:
  bool invite(const sip_message& m, clock_type::time_point now, std::string& out) {
    const std::string key = transaction_key(m);
    if (const std::string* cached = cache_.find(key)) {
      ++c_.invite_retransmissions;
      out = *cached;
      return true;
    }
    const std::string lease = lease_id(m);
    admission::answer a;
    try {
      const timer t(c_.limiter_ns);
      a = admission_->acquire(m.from_user, lease);
    } catch (const std::exception&) {
      ++c_.errors;  // not cached: a retransmission asks the store again
      out = response(m, 500, "Server Internal Error", false);
      return true;
    }
    if (a.repeat) {
      ++c_.invite_retransmissions;  // its cached answer had been dropped
    } else {
      ++c_.invites;
      ++(a.admitted ? c_.admitted : c_.rejected);
    }
    if (a.admitted) {
      out = response(m, 200, "OK", true);
    } else {
      const std::int64_t us = a.retry_after.count();
      const std::int64_t secs = us <= 0 ? 1 : (us + 999'999) / 1'000'000;  // rounded up
      out = response(m, 503, "Service Unavailable", true,
                     "Retry-After: " + std::to_string(secs) + "\r\n");
    }
    cache_.put(key, out, now);
    return true;
  }

  bool bye(const sip_message& m, clock_type::time_point now, std::string& out) {
    const std::string key = transaction_key(m);
    if (const std::string* cached = cache_.find(key)) {
      ++c_.bye_retransmissions;
      out = *cached;
      return true;
    }
    if (!m.to_has_tag || m.to_tag != dialog_tag(m.call_id, m.from_tag, m.from_user)) {
      // Not a dialog of ours: the store is not asked, and nothing is cached
      // (the key holds the To tag, but a flood of such BYEs should not push
      // real answers out of the cache).
      ++c_.byes;
      ++c_.unknown_byes;
      out = response(m, 481, "Call/Transaction Does Not Exist", false);
      return true;
    }
    bool freed = false;
    try {
      const timer t(c_.limiter_ns);
      freed = admission_->release(m.from_user, lease_id(m));
    } catch (const std::exception&) {
      ++c_.errors;
      out = response(m, 500, "Server Internal Error", false);
      return true;
    }
    ++c_.byes;
    if (freed) {
      ++c_.released;
      out = response(m, 200, "OK", false);
    } else {
      ++c_.unknown_byes;
      out = response(m, 481, "Call/Transaction Does Not Exist", false);
    }
    cache_.put(key, out, now);
    return true;
  }

  /// Adds the wall time of its scope to a counter (the limiter's share of
  /// the work, for the benchmark: two clock reads per call).
  class timer {
   public:
    explicit timer(std::uint64_t& total) noexcept : total_(total), start_(clock_type::now()) {}
    timer(const timer&) = delete;
    timer& operator=(const timer&) = delete;
    ~timer() {
      total_ += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - start_).count());
    }

   private:
    std::uint64_t& total_;
    clock_type::time_point start_;
  };

  /// The dialog as the caller named it: Call-ID and From tag.
  [[nodiscard]] static std::string lease_id(const sip_message& m) {
    std::string id(m.call_id);
    id += ';';
    id += m.from_tag;
    return id;
  }

  /// Method, From number, Call-ID, From tag, To tag and CSeq: leases are
  /// per number, so a request copying another number's dialog is no
  /// retransmission of that number's request.
  [[nodiscard]] static std::string transaction_key(const sip_message& m) {
    std::string k(m.method);
    k += '\n';
    k += m.from_user;
    k += '\n';
    k += m.call_id;
    k += '\n';
    k += m.from_tag;
    k += '\n';
    k += m.to_tag;
    k += '\n';
    k += std::to_string(m.cseq);
    return k;
  }

  /// A response echoing the request's Via, From, To, Call-ID and CSeq; for
  /// the final answer to an INVITE, the To gets our tag (the same one for
  /// every retransmission: it is derived from the dialog).
  [[nodiscard]] std::string response(const sip_message& m, int code, std::string_view reason,
                                     bool dialog, const std::string& extra = {}) const {
    std::string r = "SIP/2.0 " + std::to_string(code) + " ";
    r += reason;
    r += "\r\n";
    for (std::size_t i = 0; i < m.via_count; ++i) {
      r += "Via: ";
      r += m.via[i];
      r += "\r\n";
    }
    r += "From: ";
    r += m.from;
    r += "\r\nTo: ";
    r += m.to;
    if (dialog && !m.to_has_tag) {
      r += ";tag=";
      r += dialog_tag(m.call_id, m.from_tag, m.from_user);
    }
    r += "\r\nCall-ID: ";
    r += m.call_id;
    r += "\r\nCSeq: " + std::to_string(m.cseq) + " ";
    r += m.method;
    r += "\r\n";
    if (dialog && code == 200) r += "Contact: <" + contact_ + ">\r\n";
    r += extra;
    r += "Content-Length: 0\r\n\r\n";
    return r;
  }

  [[nodiscard]] static std::string to_hex16(std::uint64_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (std::size_t i = 16; i-- > 0; v >>= 4) s[i] = digits[v & 15];
    return s;
  }

  std::unique_ptr<admission> admission_;
  std::string contact_;
  transaction_cache cache_;
  ratelimit::detail::siphash_key secret_;
  counters c_;
};

}  // namespace sipfd
