// SPDX-License-Identifier: Apache-2.0
// Options of the Redis store: where the server is, timeouts, failure policy.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/printable.hpp"

namespace ratelimit::redis {

/// What a check does when Redis cannot be reached (connection refused or
/// broken, timeout, circuit breaker open) or answers with an error.
enum class failure_policy : unsigned char {
  throw_error,  ///< throw the connection_error / timeout_error / script_error
  fail_open,    ///< admit (decision.source == fail_open); nothing is recorded anywhere
  fail_closed,  ///< reject (decision.source == fail_closed, retry_after 0: nothing is known)
  fallback,  ///< decide with an in-process limiter at limit / fallback_divisor (source == fallback)
};

/// How a TLS connection checks the server's certificate.
enum class tls_verify : unsigned char {
  full,   ///< a chain to a trusted CA, the validity dates and the host name (or IP address)
  chain,  ///< the chain and the dates, not the name (explicit opt-out of name checks)
  none,   ///< nothing: encrypted, but anyone can pose as the server (explicit opt-out)
};

/// TLS to Redis (`rediss://`; see README "TLS"). Over TCP only. An aggregate.
struct tls_options {
  /// Use TLS. Off by default; on for `rediss://` and `rediss-cluster://` URLs.
  bool enabled = false;
  /// PEM file of trusted CA certificates. With ca_dir also empty, the
  /// system's trusted CAs are used.
  std::string ca_file;
  /// Directory of trusted CA certificates in OpenSSL's hashed layout
  /// (`openssl rehash`).
  std::string ca_dir;
  /// Client certificate (PEM, chain allowed) for servers that require one
  /// (mutual TLS, `tls-auth-clients yes`). Needs key_file.
  std::string cert_file;
  /// Private key (PEM, unencrypted) of cert_file.
  std::string key_file;
  /// Name sent as SNI and checked against the certificate; empty = the host
  /// connected to (an IP address host is checked against the certificate's
  /// IP addresses and sends no SNI). Cluster nodes all share it.
  std::string server_name;
  /// What is checked (default: everything).
  tls_verify verify = tls_verify::full;
};

/// One Sentinel's TCP address.
struct sentinel_address {
  std::string host = "127.0.0.1";
  int port = 26379;
};

/// Redis Sentinel (see ratelimit/redis/sentinel.hpp): the store asks these
/// sentinels in turn where the master named `master_name` is, each time it
/// opens a connection. Used when `master_name` is not empty; `options::host`
/// and `port` are then ignored, and user, password and database apply to the
/// master. A redis_store only (the cluster store refuses it).
struct sentinel_options {
  /// Sentinels asked in turn (the one that answered moves to the front).
  std::vector<sentinel_address> sentinels;
  /// Name of the master as the sentinels monitor it; empty = no Sentinel.
  std::string master_name;
  /// ACL user for AUTH at the sentinels; empty = the default user. Set
  /// without `password`, the store's constructor throws std::invalid_argument.
  std::string user;
  /// Password for AUTH at the sentinels; empty = no AUTH there.
  std::string password;
};

/// Where and how to reach Redis. An aggregate: every field has a default.
struct options {
  /// Host name or address for TCP. Ignored when `unix_socket` is set.
  std::string host = "127.0.0.1";
  /// TCP port.
  int port = 6379;
  /// Path of a unix domain socket; empty = use TCP (`host`, `port`).
  std::string unix_socket;
  /// Database index sent with SELECT after connecting; 0 = the default database (no SELECT).
  int database = 0;
  /// ACL user name for AUTH; empty = the default user (AUTH with the password
  /// alone). Set without `password`, the store's constructor throws
  /// std::invalid_argument.
  std::string user;
  /// Password for AUTH; empty = no AUTH.
  std::string password;
  /// TLS settings; `tls.enabled` false = plain TCP.
  tls_options tls;
  /// Longest wait to establish one connection (name resolution, TCP connect,
  /// TLS handshake, AUTH, SELECT); 0 = 200 ms.
  std::chrono::milliseconds connect_timeout{200};
  /// Longest wait for a check's round trip, including the wait for a pooled
  /// connection; 0 = 100 ms. A check that must also connect may take up to
  /// connect_timeout + command_timeout.
  std::chrono::milliseconds command_timeout{100};
  /// Connections in the pool (each serves one thread at a time); 0 = 4.
  std::size_t pool_size = 4;
  /// Connections shared by all checks through the multiplexer (see
  /// multiplexer.hpp and README "Multiplexing and async checks"); 0 = single
  /// checks use the pool (one connection per check in flight). Async checks
  /// (redis_store::async_apply) always go through the multiplexer, with
  /// max(1, multiplex) connections. Batches, apply_once, reset and ping use the pool.
  /// At most 256 (more throws std::invalid_argument when the store is made).
  std::size_t multiplex = 0;
  /// Most checks one multiplexer holds at a time, from submission to answer
  /// (queued, being written, or written and waiting for their reply); 0 =
  /// 65536. A check submitted while that many are pending is refused with
  /// multiplexer_full (a connection_error naming this cap), decided by the
  /// failure policy and counted in stats().errors, but no failure for the
  /// circuit breaker (Redis did not fail): a stalled server cannot make the
  /// queue grow without bound. A cluster check sent behind an ASKING counts
  /// once (the ASKING takes no place of its own).
  std::size_t multiplex_max_pending = 0;
  /// How long a pooled single check polls its connection for the reply
  /// without sleeping before it blocks (a bounded busy-poll; see
  /// docs/semantics.md "Busy-polling for the reply"); 0 = never (the default:
  /// the thread blocks at once). Worth it only when the client and Redis run
  /// on different, otherwise idle cores of one machine, where it saves the
  /// client's wake-up: each spinning check burns up to this much CPU. A spin
  /// that finds no reply, or during which the thread was preempted, turns
  /// spinning off for the next 1, 2, 4 ... 256 checks of that connection.
  /// Plain TCP and unix sockets only (TLS connections never spin); never
  /// past the check's deadline. 0..1000 us (else the store's constructor
  /// throws std::invalid_argument).
  std::chrono::microseconds read_spin{0};
  /// Whether a blocking check of redis_store's multiplexer may drive its
  /// connection itself when nobody else does (leader/follower, see
  /// docs/semantics.md, "Who does a connection's I/O"),
  /// instead of handing it to the store's I/O thread and waiting. Opt-in
  /// while it is new: it saves the hop to the I/O thread and back (16
  /// blocking threads, one connection: 0.64x -> 0.76x of redis-benchmark in
  /// one loaded run). Async checks and cluster_store never lead.
  bool multiplex_lead = false;
  /// Prefix of every Redis key: `<prefix>{<user key>}:<policy>`; may be empty.
  std::string prefix = "rl:";
  /// What a check does when Redis fails (see failure_policy).
  failure_policy on_failure = failure_policy::throw_error;
  /// For failure_policy::fallback: the local limiter admits limit / divisor
  /// (rounded down, at least 1) per period, typically the number of
  /// application instances; 0 = 1.
  units fallback_divisor = 1;
  /// With caller-supplied time, real time and the caller's time run at
  /// different speeds, so every TTL is raised to at least this; 0 = none
  /// (TTLs are then computed in caller time). Server time never uses it.
  std::chrono::milliseconds caller_time_ttl_floor{std::chrono::minutes{5}};
  /// Consecutive failed round trips that open the circuit breaker; 0 = 3.
  std::uint32_t breaker_threshold = 3;
  /// First cool-down of an open breaker. While the breaker is open every check
  /// is answered by the failure policy at once and none goes to Redis; a
  /// background thread of the store PINGs Redis once per cool-down (within
  /// connect_timeout + command_timeout) and closes the breaker when it answers.
  /// Each failed probe doubles the cool-down up to breaker_max_cooldown. 0 = 200 ms.
  std::chrono::milliseconds breaker_cooldown{200};
  /// Longest cool-down; 0 = 5 s.
  std::chrono::milliseconds breaker_max_cooldown{5000};
  /// Resolves `host` to numeric addresses, tried in order; empty = the system
  /// resolver (getaddrinfo). Called for each new connection to a host that is
  /// not a numeric address, on a helper thread that the connect waits for at
  /// most connect_timeout: when it takes longer the connect fails with
  /// timeout_error and the thread finishes on its own with its own copy of
  /// this function (which must therefore stay callable after the store is
  /// gone). Throwing, or returning no address or anything but numeric
  /// addresses, fails the connect with connection_error.
  std::function<std::vector<std::string>(const std::string& host)> resolver;
  /// Receives a warning about the server's configuration (one line without a
  /// newline): an `allkeys-*` or `volatile-ttl` maxmemory-policy, under which Redis may evict
  /// the limiter's keys. Called at most once per connection pool (one per
  /// store; one per node of a cluster store), from the checking thread that
  /// made the connection; exceptions it throws are ignored. Empty = write the
  /// line to stderr.
  std::function<void(std::string_view)> on_warning;
  /// Find the master through Redis Sentinel (see sentinel_options); default: not.
  sentinel_options sentinel;
};

namespace detail {

/// Where the userinfo of `rest` (a URL after its `scheme://`) ends: its '@',
/// or npos without one. For `unix://` the socket path starts with '/' and
/// may hold '@': no userinfo when `rest` starts with '/', else it ends at
/// the first "@/" (a password cannot hold "@/" there). Otherwise it ends at
/// the last '@'.
[[nodiscard]] inline std::size_t userinfo_end(std::string_view rest, bool unix_path) noexcept {
  if (!unix_path) return rest.rfind('@');
  if (rest.starts_with('/')) return std::string_view::npos;
  return rest.find("@/");
}

/// The bytes a userinfo, as userinfo_end finds it, must not hold: '?' and
/// '#', and '/' unless the URL is a `unix://` one. Each ends the host part
/// of a URL (a query, a fragment, a path), so a userinfo holding one has
/// run past the host: an '@' in a query value (`redis://h?ca=/a@b`) or in
/// a path would end it there and connect to whatever follows.
[[nodiscard]] constexpr std::string_view userinfo_delimiters(bool unix_path) noexcept {
  return unix_path ? "?#" : "/?#";
}

/// `s` as a message quotes a name or a part of a URL: printable ASCII as
/// is, every other byte, `"` and `\\` as `\\xNN` (detail::printable, not
/// cut short), so no CR, LF or other control byte of a URL reaches a log
/// line through an exception message.
[[nodiscard]] inline std::string escaped_name(std::string_view s) {
  return ratelimit::detail::printable(s, std::string_view::npos);
}

/// The forms of Redis URL, as bits of url_parameter::forms.
inline constexpr unsigned url_form_redis = 1U;           ///< redis://
inline constexpr unsigned url_form_rediss = 2U;          ///< rediss://
inline constexpr unsigned url_form_cluster = 4U;         ///< redis-cluster://
inline constexpr unsigned url_form_rediss_cluster = 8U;  ///< rediss-cluster://
inline constexpr unsigned url_form_unix = 16U;           ///< unix://
inline constexpr unsigned url_form_sentinel = 32U;       ///< redis-sentinel://
inline constexpr unsigned url_form_all = 63U;

/// A query parameter of the Redis URL forms: its name, the url_form_ bits
/// of the forms that take it, whether it is a connection setting the forms
/// share (`shared`: taken out of the query by take_multiplex_query, and
/// named after a form's own parameters in a "known: ..." list), and whether
/// its value is a number (`number`: read by parse_url_int, and shown by
/// redacted_url only when quotable_number).
struct url_parameter {
  std::string_view name;
  unsigned forms;
  bool shared;
  bool number;
};

/// Every query parameter a Redis URL form takes, in the order messages
/// name them: the one list known_parameter, likely_misspelling,
/// tls_parameter and the "known: ..." of messages (parameter_list) read.
/// The cluster forms refuse read_spin_us= by name (the cluster store never
/// spins).
inline constexpr url_parameter url_parameters[] = {
    {"db", url_form_unix | url_form_sentinel, false, true},
    {"multiplex", url_form_all, true, true},
    {"read_spin_us", url_form_all & ~(url_form_cluster | url_form_rediss_cluster), true, true},
    {"ca", url_form_rediss | url_form_rediss_cluster, false, false},
    {"ca_dir", url_form_rediss | url_form_rediss_cluster, false, false},
    {"cert", url_form_rediss | url_form_rediss_cluster, false, false},
    {"key", url_form_rediss | url_form_rediss_cluster, false, false},
    {"sni", url_form_rediss | url_form_rediss_cluster, false, false},
    {"verify", url_form_rediss | url_form_rediss_cluster, false, false},
    {"sentinel_user", url_form_sentinel, false, false},
    {"sentinel_password", url_form_sentinel, false, false},
};

/// The url_form_ bits of the forms that take query parameter `name`; 0
/// for a name no form takes.
[[nodiscard]] constexpr unsigned parameter_forms(std::string_view name) noexcept {
  for (const url_parameter& p : url_parameters) {
    if (p.name == name) return p.forms;
  }
  return 0;
}

/// True for the name of every query parameter a Redis URL form takes.
[[nodiscard]] constexpr bool known_parameter(std::string_view name) noexcept {
  return parameter_forms(name) != 0;
}

/// True for the names of the TLS parameters (apply_tls_query): those only
/// the rediss forms take.
[[nodiscard]] constexpr bool tls_parameter(std::string_view name) noexcept {
  const unsigned forms = parameter_forms(name);
  return forms != 0 && (forms & ~(url_form_rediss | url_form_rediss_cluster)) == 0;
}

/// True for the names of the parameters only `redis-sentinel://` takes.
[[nodiscard]] constexpr bool sentinel_parameter(std::string_view name) noexcept {
  return parameter_forms(name) == url_form_sentinel;
}

/// True for the name of a parameter whose value is a number
/// (url_parameter::number).
[[nodiscard]] constexpr bool number_parameter(std::string_view name) noexcept {
  for (const url_parameter& p : url_parameters) {
    if (p.number && p.name == name) return true;
  }
  return false;
}

/// True for the name of a shared parameter (url_parameter::shared).
[[nodiscard]] constexpr bool shared_parameter(std::string_view name) noexcept {
  for (const url_parameter& p : url_parameters) {
    if (p.shared && p.name == name) return true;
  }
  return false;
}

/// The names of the parameters the form `form` (a url_form_ bit) takes and
/// none of the forms `except` does, its own before the shared ones, each
/// followed by `suffix`, separated by ", " but the last by `last`:
/// `multiplex, read_spin_us` (redis://), `db=, multiplex= and read_spin_us=`
/// (unix://, suffix "=", last " and ").
[[nodiscard]] inline std::string parameter_list(unsigned form, unsigned except = 0,
                                                std::string_view suffix = {},
                                                std::string_view last = ", ") {
  std::vector<std::string_view> names;
  for (const bool shared : {false, true}) {
    for (const url_parameter& p : url_parameters) {
      if (p.shared == shared && (p.forms & form) != 0 && (p.forms & except) == 0) {
        names.push_back(p.name);
      }
    }
  }
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? last : std::string_view(", ");
    out += names[i];
    out += suffix;
  }
  return out;
}

/// The edit distance (Levenshtein: insertions, deletions, substitutions)
/// between `a` and `b`, or `most + 1` when it is larger than `most`.
[[nodiscard]] inline std::size_t edit_distance(std::string_view a, std::string_view b,
                                               std::size_t most) noexcept {
  if (a.size() > b.size()) std::swap(a, b);
  if (b.size() - a.size() > most || b.size() > 32) return most + 1;
  std::size_t row[33];  // distances from a prefix of b to all of a's prefixes
  for (std::size_t i = 0; i <= a.size(); ++i) row[i] = i;
  for (std::size_t j = 1; j <= b.size(); ++j) {
    std::size_t diagonal = row[0];
    row[0] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      const std::size_t up = row[i];
      row[i] = std::min({row[i] + 1, row[i - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return std::min(row[a.size()], most + 1);
}

/// True when a query parameter name that is no known_parameter may be quoted
/// in a message, as a likely misspelling of a known one: it is made of
/// [a-z_] only and lies within edit distance 2 of a known name (1 of the
/// names of up to 3 bytes: db, ca, key, sni; else any short lowercase word
/// would do). Any other name is not quoted (nor shown by redacted_url): a
/// password pasted in the wrong place (`redis://h?S3CRET=1`,
/// `redis://h/1&S3CRET=1`) would otherwise reach the logs as "unknown
/// parameter \"S3CRET\"". The cost: a name far from every known one
/// (`?tls=1`, `?cafile=x`) is refused without being named.
[[nodiscard]] inline bool likely_misspelling(std::string_view name) noexcept {
  if (name.empty() ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string_view::npos) {
    return false;
  }
  for (const url_parameter& known : url_parameters) {
    const std::size_t most = known.name.size() <= 3 ? 1 : 2;
    if (edit_distance(name, known.name, most) <= most) return true;
  }
  return false;
}

/// What a message says of an unknown parameter whose name is no
/// likely_misspelling (it may be a password pasted in the wrong place):
/// `an unknown parameter (its name is not quoted: ...)`, ending with
/// `known` ("known: ...") when that is not empty.
[[nodiscard]] inline std::string unquoted_parameter(std::string_view known = {}) {
  return "an unknown parameter (its name is not quoted: it is no likely misspelling of a known "
         "one, and may be a password" +
         (known.empty() ? std::string(")") : "; " + std::string(known) + ")");
}

/// How a message names the query parameter `name` (known or not):
/// `parameter "NAME"` for a known name or a likely_misspelling, else
/// unquoted_parameter().
[[nodiscard]] inline std::string parameter_named(std::string_view name) {
  if (known_parameter(name) || likely_misspelling(name)) {
    return "parameter \"" + escaped_name(name) + "\"";
  }
  return unquoted_parameter();
}

/// True for the known parameters whose values are no secret, which
/// redacted_url shows: all but `sentinel_password`.
[[nodiscard]] inline bool shown_parameter(std::string_view name) noexcept {
  return known_parameter(name) && name != "sentinel_password";
}

/// Where the port of `item` (one `HOST[:PORT]` or `[IPV6][:PORT]` of a
/// URL) starts, past its ':'; npos without one. Unbracketed, the port
/// follows the first ':' (parse_url refuses a second one).
[[nodiscard]] inline std::size_t port_start(std::string_view item) noexcept {
  if (item.starts_with('[')) {
    const auto close = item.find("]:");
    return close == std::string_view::npos ? std::string_view::npos : close + 2;
  }
  const auto colon = item.find(':');
  return colon == std::string_view::npos ? std::string_view::npos : colon + 1;
}

/// True when the port `port` of a URL may be quoted: its text before the
/// first '&' (what follows is the query run on, which quoted_part cuts) is
/// a port, 1..65535 in 1 to 5 decimal digits, or empty. Anything else may be
/// a password whose user was read as the host because the "USER@HOST" was
/// left out (`redis://default:hunter2` has host `default`, port `hunter2`;
/// `redis://:123456` and `redis://default:123456` a numeric password as
/// the port): such a port is hidden from every message (redacted_url,
/// parse_url_port, quoted_host_item).
[[nodiscard]] inline bool quotable_port(std::string_view port) noexcept {
  port = port.substr(0, port.find('&'));
  if (port.empty()) return true;
  // Five digits at most: `:0001234` may be a numeric password too
  // (parse_url_port takes such a port, and no message quotes it).
  if (port.size() > 5) return false;
  int v = 0;
  for (const char c : port) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  return v >= 1 && v <= 65535;
}

/// True when `s`, a number of a URL that parse_url_int reads (a database,
/// a multiplex= or read_spin_us= value), may be quoted in a message or
/// shown by redacted_url: it is empty or all decimal digits, at most 10 of
/// them (as many as parse_url_int reads). Anything else may be a secret, a
/// password pasted in the wrong place (`redis://h?multiplex=S3CRET` said
/// bad multiplex "S3CRET", `redis://h/12345678901234` bad database
/// "12345678901234"), and is given by its length only. A port follows
/// stricter rules (quotable_port).
[[nodiscard]] constexpr bool quotable_number(std::string_view s) noexcept {
  return s.size() <= 10 && s.find_first_not_of("0123456789") == std::string_view::npos;
}

/// What a message says of a port that quotable_port refuses: that it is
/// no number (or, all digits, no number from 1 to 65535), its length
/// (before any '&'), and the likely cause; never its text. One holding ':'
/// may also be the rest of an IPv6 address written without brackets.
[[nodiscard]] inline std::string unquoted_port_text(std::string_view port) {
  port = port.substr(0, port.find('&'));
  const bool digits = std::all_of(port.begin(), port.end(),
                                  [](char c) { return c >= '0' && c <= '9'; });
  return (digits ? "is not a number from 1 to 65535 (" + std::to_string(port.size()) +
                       (port.size() == 1 ? " digit" : " digits")
                 : "is not a number (" + std::to_string(port.size()) +
                       (port.size() == 1 ? " byte" : " bytes")) +
         ", not quoted: it may be a password given without \"USER@HOST\"; is the '@' "
         "missing?" +
         (port.find(':') == std::string_view::npos
              ? std::string(")")
              : std::string(" Or an IPv6 address needs brackets: [::1]:6379)"));
}

/// The index of the first space or control byte (0x00-0x20, 0x7f) in `s`,
/// npos when none: no host, master name or socket path of a URL holds one,
/// and what follows one may be anything (`/mymaster password S3CRET`).
[[nodiscard]] inline std::size_t first_blank(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c <= 0x20 || c == 0x7f) return i;
  }
  return std::string_view::npos;
}

/// `url` as error messages quote it, without its secrets and with every
/// byte escaped as escaped_name does: the password of
/// its userinfo (all of a userinfo without ':', which parse_url reads as a
/// password; the userinfo ends as userinfo_end says; all of a userinfo that
/// holds one of userinfo_delimiters, which parse_url refuses, as its user
/// part may then be a password or a query value), the value of every query
/// parameter (from '=' to the next '&' or the end) whose name is not one of
/// shown_parameter's known, non-secret ones, so `sentinel_password`, and a
/// misspelt one (`sentinel_pasword=`), too, and all of an item of the query
/// (after the first '?' behind the userinfo) without '=' that is no known
/// parameter name: it may be the end of a value holding '&'
/// (`?sentinel_password=p&ss`) or a secret whose '=' was mistyped
/// (`?sentinel_password:s3cret`), and all of every item (its name too)
/// that is no known parameter and follows, anywhere later in the query, an
/// item whose value is hidden: `?sentinel_password=p&ss=1` may be the
/// password "p&ss=1", so `ss` is no name to show, and all of every item
/// `NAME=...` anywhere whose NAME is no known parameter nor a
/// likely_misspelling of one (`redis://h?S3CRET=1`, `redis://h/1&S3CRET=1`
/// read `redis://h?***`, `redis://h/1&***`). A port that is not a number
/// (quotable_port) is hidden as well: `redis://default:hunter2` (the
/// "USER@" left out) has the password as its port. Each hidden stretch
/// reads `***`. A URL where "://" does not directly follow its leading run
/// of scheme characters (letters, digits, '+', '-', '.'), as with a mistyped
/// scheme (`redis:/u:PW@h`, `redis//u:PW@h`, even with a "://" further on:
/// `redis:/u:PW@h?ca=file:///x`), cannot be split into its parts: only that
/// run is shown, followed by `***`, and only when ':' or '/' follows it; a
/// bare word (`hunter2`, a password given as the URL) is all `***`. In a
/// host item (between the userinfo and the path, split at ','), everything
/// after a '&', ';' or '=' is hidden: parse_url refuses such a host, and
/// `redis://h;password=S3CRET` is no host name.
///
/// Past the userinfo and the hosts only what is known to be safe is shown
/// (an allow-list, so that no typo shows a secret): the value of a
/// shown_parameter only when it holds nothing but [A-Za-z0-9._/:-]
/// (`?multiplex=2;password=S3CRET` reads `?multiplex=***`), and that of a
/// number_parameter only when quotable_number (`?multiplex=S3CRET` reads
/// `?multiplex=***`); the path
/// (after the hosts' '/', up to a '&', '?' or '#') only when a
/// quotable_number (`redis://h/***`), or for `redis-sentinel://` the master name up to its
/// first byte outside [A-Za-z0-9._:-] (`redis-sentinel://s/m***`); a
/// `unix://` socket path up to its first '&', ';', '=' or ','; a fragment
/// as `#***`; a bracketed host without ':' (no IPv6 address) as `[***]`.
[[nodiscard]] inline std::string redacted_url(std::string_view url) {
  const auto scheme = std::min(
      url.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-."),
      url.size());
  if (url.substr(scheme, 3) != "://") {
    // No scheme: a "://" further on (`redis:/u:PW@h?ca=file:///x`) is no
    // scheme's end. The leading run is shown only where ':' or '/' follows
    // it (a mistyped scheme); a bare word (REDIS_URL=hunter2) may be a secret.
    if (scheme < url.size() && (url[scheme] == ':' || url[scheme] == '/')) {
      return escaped_name(url.substr(0, scheme)) + "***";
    }
    return "***";
  }
  std::vector<char> hide(url.size() + 1, 0);
  std::size_t empty_password_at = std::string_view::npos;
  std::size_t at = std::string_view::npos;
  bool whole = false;  // hide the user part of the userinfo as well
  if (scheme != std::string_view::npos) {
    const std::string_view rest = url.substr(scheme + 3);
    const bool unix_path = url.starts_with("unix://");
    auto end = userinfo_end(rest, unix_path);
    // A relative unix path holding '@' (refused by parse_url): what is before
    // its last '@' may be a password, and so may the part before a ':' in it.
    if (unix_path && end == std::string_view::npos && !rest.starts_with('/')) {
      end = rest.rfind('@');
      whole = true;
      // `unix://default:S3CRET/tmp/s` (the '@' left out, refused by
      // parse_url): what follows a ':' before the first '/' may be a password.
      if (const auto colon = rest.find(':');
          end == std::string_view::npos && colon < rest.find('/')) {
        const std::size_t from = scheme + 3 + colon + 1;
        const std::size_t to = std::min(url.find_first_of("/?", from), url.size());
        std::fill(hide.begin() + static_cast<std::ptrdiff_t>(from),
                  hide.begin() + static_cast<std::ptrdiff_t>(to), 1);
      }
    }
    if (end != std::string_view::npos) at = scheme + 3 + end;
    if (end != std::string_view::npos && rest.substr(0, end).find_first_of(userinfo_delimiters(
                                             unix_path)) != std::string_view::npos) {
      // Refused by parse_url: no real userinfo, so ':' need not follow the user.
      whole = true;
    }
  }
  if (scheme != std::string_view::npos && at != std::string_view::npos && at >= scheme + 3) {
    const std::string_view cred = url.substr(scheme + 3, at - scheme - 3);
    const auto colon = whole ? std::string_view::npos : cred.find(':');
    const std::size_t from = scheme + 3 + (colon == std::string_view::npos ? 0 : colon + 1);
    if (from == at) empty_password_at = at;
    std::fill(hide.begin() + static_cast<std::ptrdiff_t>(from),
              hide.begin() + static_cast<std::ptrdiff_t>(at), 1);
  }
  const auto hide_range = [&hide](std::size_t from, std::size_t to) {
    std::fill(hide.begin() + static_cast<std::ptrdiff_t>(from),
              hide.begin() + static_cast<std::ptrdiff_t>(to), 1);
  };
  // A fragment (parse_url refuses any): all of it after the '#' is hidden.
  const std::size_t fragment = std::min(
      url.find('#', at != std::string_view::npos ? at + 1 : scheme + 3), url.size());
  if (fragment < url.size()) hide_range(fragment + 1, url.size());
  bool after_secret = false;  // an item before this one had its value hidden
  if (scheme != std::string_view::npos && !url.starts_with("unix://")) {
    // The hosts: from the userinfo's end to the path, query or fragment,
    // split at ',' in the cluster and Sentinel forms, which list several;
    // elsewhere a ',' is part of the one host item (`redis://u:abc,S3CRET`,
    // "USER@" left out, has all of `abc,S3CRET` as its port).
    std::size_t from = at != std::string_view::npos ? at + 1 : scheme + 3;
    const std::size_t hosts_end = std::min(url.find_first_of("/?#", from), url.size());
    const bool several = url.starts_with("redis-cluster://") ||
                         url.starts_with("rediss-cluster://") ||
                         url.starts_with("redis-sentinel://");
    while (from < hosts_end) {
      const std::size_t comma = several ? std::min(url.find(',', from), hosts_end) : hosts_end;
      std::string_view item = url.substr(from, comma - from);
      // What follows a space or control byte, or a bracketed address's ']'
      // when no ':' does (`redis://[::1]x:S3CRET`), is hidden: no host holds
      // one, and parse_url quotes neither.
      if (const auto blank = first_blank(item); blank != std::string_view::npos) {
        hide_range(from + blank + 1, comma);
        item = item.substr(0, blank + 1);
      }
      if (item.starts_with('[')) {
        if (const auto close = item.find(']');
            close != std::string_view::npos && close + 1 < item.size() && item[close + 1] != ':') {
          hide_range(from + close + 1, from + item.size());
          item = item.substr(0, close + 1);
        }
      }
      if (const auto bad = item.find_first_of(several ? "&;=" : "&;=,");
          bad != std::string_view::npos) {
        // No host holds one (parse_url refuses it): what follows may be
        // `password=SECRET` (`redis://h;password=S3CRET`), or after a ','
        // in a one-host form anything (`redis://[::1],default:S3CRET`).
        // The ',' itself is hidden with what follows (it joins no list here).
        const std::size_t start = from + bad + (item[bad] == ',' ? 0 : 1);
        std::fill(hide.begin() + static_cast<std::ptrdiff_t>(start),
                  hide.begin() + static_cast<std::ptrdiff_t>(comma), 1);
        item = item.substr(0, bad);
      }
      if (item.starts_with('[')) {
        // `[NAME]` with no ':' is no IPv6 address and may be anything.
        const std::size_t close = std::min(item.find(']'), item.size());
        if (item.substr(1, close - 1).find(':') == std::string_view::npos && close > 1) {
          hide_range(from + 1, from + close);
        }
      }
      if (const auto port = port_start(item);
          port != std::string_view::npos && !quotable_port(item.substr(port))) {
        std::fill(hide.begin() + static_cast<std::ptrdiff_t>(from + port),
                  hide.begin() + static_cast<std::ptrdiff_t>(from + item.size()), 1);
      }
      from = comma + 1;
    }
    if (hosts_end < url.size() && url[hosts_end] == '/') {
      // The path (a database, a master name) up to a '&', '?' or '#': a
      // database is shown only when quotable_number, a master name up to its
      // first byte that no master name of a URL holds; what follows may be
      // a secret (`redis://h/S3CRET`, `redis-sentinel://s/m;auth:S3CRET`).
      const std::size_t path_end = std::min(url.find_first_of("&?#", hosts_end + 1), url.size());
      const std::string_view item = url.substr(hosts_end + 1, path_end - hosts_end - 1);
      const std::size_t cut = std::min(
          url.starts_with("redis-sentinel://")
              ? item.find_first_not_of(
                    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")
          : quotable_number(item) ? std::string_view::npos
                                  : 0,
          item.size());
      if (cut < item.size()) {
        hide_range(hosts_end + 1 + cut, path_end);
        after_secret = true;
      }
    }
  } else if (scheme != std::string_view::npos) {
    // The socket path of a unix:// URL, up to its query: shown up to a '&',
    // ';', '=' or ',' (`unix:///tmp/s;password=S3CRET`).
    const std::size_t from = at != std::string_view::npos ? at + 1 : scheme + 3;
    const std::size_t path_end = std::min(url.find_first_of("?#", from), url.size());
    const std::size_t blank = first_blank(url.substr(from, path_end - from));
    if (const std::size_t cut = std::min(
            {url.find_first_of("&;=,", from),
             blank == std::string_view::npos ? std::string_view::npos : from + blank, path_end});
        cut < path_end) {
      hide_range(cut, path_end);
      after_secret = true;
    }
  }
  const std::size_t query = url.find('?', at != std::string_view::npos       ? at + 1
                                          : scheme != std::string_view::npos ? scheme + 3
                                                                             : 0);
  // Where the hosts (or a unix:// path) begin: past the userinfo.
  const std::size_t hosts_start = at != std::string_view::npos ? at + 1 : scheme + 3;
  for (std::size_t i = 0; i < fragment; ++i) {
    if (url[i] != '?' && url[i] != '&') continue;
    const std::size_t end = std::min(url.find('&', i + 1), fragment);
    const std::string_view item = url.substr(i + 1, end - i - 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || (after_secret && !known_parameter(item.substr(0, eq)))) {
      // In the query, after a hidden item, or after the hosts (a path's
      // `&S3CRET`: `redis://h/0&S3CRET`), such an item is no known name and
      // hidden; before the hosts it is in the userinfo.
      if ((i >= query || after_secret || i >= hosts_start) && !item.empty() &&
          !known_parameter(item)) {
        std::fill(hide.begin() + static_cast<std::ptrdiff_t>(i + 1),
                  hide.begin() + static_cast<std::ptrdiff_t>(end), 1);
      }
      continue;
    }
    if (const std::string_view name = item.substr(0, eq);
        !known_parameter(name) && !likely_misspelling(name)) {
      // `redis://h?S3CRET=1`, `redis://h/1&S3CRET=1`: a name that no
      // message quotes (likely_misspelling) is hidden with its value.
      hide_range(i + 1, at > i ? std::min(end, at) : end);
      after_secret = true;
      continue;
    }
    const std::size_t from = i + 1 + eq + 1;
    if (from == end) continue;
    // A value is shown only when the name is a known, non-secret one and the
    // value holds nothing but safe bytes: `?multiplex=2;password=S3CRET`
    // (';' typed for '&') hides all of `2;password=S3CRET`.
    // Such a value in a userinfo (`redis://s3cret@h?sni=a:b@c`) is hidden
    // up to the '@' only: what follows is the host.
    // The value of a number (db=, multiplex=, read_spin_us=) only when
    // quotable_number: `?multiplex=S3CRET` reads `?multiplex=***`.
    const bool shown = shown_parameter(item.substr(0, eq));
    const std::size_t to = shown && at > i ? std::min(end, at) : end;
    if (const std::string_view value = url.substr(from, to - from);
        shown &&
        value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789._/:-") == std::string_view::npos &&
        (!number_parameter(item.substr(0, eq)) || quotable_number(value))) {
      continue;
    }
    after_secret = true;
    hide_range(from, to);
  }
  std::string out;
  out.reserve(url.size() + 3);
  std::size_t shown_from = 0;  // start of the shown run being collected
  for (std::size_t i = 0; i <= url.size(); ++i) {
    if (i < url.size() && hide[i] == 0 && i != empty_password_at) continue;
    out += escaped_name(url.substr(shown_from, i - shown_from));
    if (i == url.size()) break;
    if (i == empty_password_at) out += "***";
    if (hide[i] != 0 && (i == 0 || hide[i - 1] == 0)) out += "***";
    shown_from = hide[i] != 0 ? i + 1 : i;
  }
  return out;
}

/// A part `s` of a URL's host, port or path, or a unix socket path, as a
/// message quotes it: escaped_name of the text up to its first '&', ';',
/// '=', ',', '?' or space, then `...` when cut there (`&...`), since what
/// follows may be `NAME=SECRET` (or the SECRET of one), which redacted_url
/// hides (`redis://h/1&sentinel_password=s3cret` quoted the database
/// "1&sentinel_password=s3cret"; `redis://h;password=s3cret` the host;
/// `unix:///tmp/s?S3CRET`, a path, the whole path).
[[nodiscard]] inline std::string quoted_part(std::string_view s) {
  const auto cut = s.find_first_of("&;=,? ");
  if (cut == std::string_view::npos) return escaped_name(s);
  return escaped_name(s.substr(0, cut + 1)) + "...";
}

/// "1 byte", "N bytes": a count of `unit` for a message.
[[nodiscard]] inline std::string count_of(std::size_t n, std::string_view unit) {
  return std::to_string(n) + ' ' + std::string(unit) + (n == 1 ? "" : "s");
}

/// The decimal number `s` (digits only), which must lie in lo..hi.
/// @param in_path `s` is a URL's path (`redis://h/DB`): a value that is no
///   number, or holds '&', ';' or '=', gets the hint that parameters follow '?'
/// @throws std::invalid_argument naming `s` and the URL; a value (`what`:
///   a database, multiplex, read_spin_us) whose text before any '&', ';'
///   or '=' is no quotable_number is not quoted, only its length
[[nodiscard]] inline int parse_url_int(std::string_view s, std::string_view url, const char* what,
                                       long long lo, long long hi, bool in_path = false) {
  bool ok = !s.empty() && s.size() <= 10;
  long long v = 0;
  for (const char c : s) {
    if (!ok || c < '0' || c > '9') {
      ok = false;
      break;
    }
    v = v * 10 + (c - '0');
  }
  if (const std::string_view head = s.substr(0, s.find_first_of("&;="));
      !ok && !quotable_number(head)) {
    // `redis://h/sentinel_password=S3CRET` ('/' typed for '?') said bad
    // database "sentinel_password=S3CRET", and `redis://h?multiplex=S3CRET`
    // bad multiplex "S3CRET": a value that is no number may be anything, a
    // secret too. Digits up to a '&', ';' or '=' are quoted as quoted_part
    // cuts them (`"1&..."`).
    if (head.find_first_not_of("0123456789") == std::string_view::npos) {
      // More than 10 digits (`redis://h/12345678901234`): a numeric secret?
      throw std::invalid_argument("ratelimit: bad " + std::string(what) + " in redis URL \"" +
                                  redacted_url(url) + "\": it is not a number from " +
                                  std::to_string(lo) + " to " + std::to_string(hi) + " (" +
                                  count_of(head.size(), "digit") + ", not quoted)");
    }
    throw std::invalid_argument("ratelimit: bad " + std::string(what) + " in redis URL \"" +
                                redacted_url(url) + "\": it is not a number (" +
                                count_of(s.size(), "byte") + ", not quoted" +
                                (in_path ? "; parameters follow '?'" : "") + ") (expected " +
                                std::to_string(lo) + ".." + std::to_string(hi) + ")");
  }
  if (!ok || v < lo || v > hi) {
    const bool parameter_in_path = in_path && s.find_first_of("&;=") != std::string_view::npos;
    throw std::invalid_argument("ratelimit: bad " + std::string(what) + " \"" + quoted_part(s) +
                                "\" in redis URL \"" + redacted_url(url) + "\" (expected " +
                                std::to_string(lo) + ".." + std::to_string(hi) +
                                (parameter_in_path ? "; parameters follow '?'" : "") + ")");
  }
  return static_cast<int>(v);
}

[[noreturn]] inline void bad_url(std::string_view url, const std::string& why) {
  throw std::invalid_argument("ratelimit: redis URL \"" + redacted_url(url) + "\" " + why);
}

/// The port `s` of `url`, 1..65535. A port that is not a number from 1 to
/// 65535 is not quoted (quotable_port: it may be a password whose "USER@"
/// was left out, `redis://:123456`), only the empty one is.
/// @throws std::invalid_argument saying so (the URL redacted)
[[nodiscard]] inline int parse_url_port(std::string_view s, std::string_view url) {
  // Leading zeros are taken (`:006379` is 6379), up to ten digits in all as
  // parse_url_int reads them, though quotable_port hides such a port.
  if (s.size() > 5 && s.size() <= 10 &&
      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    const auto v = std::stoll(std::string(s));
    if (v >= 1 && v <= 65535) return static_cast<int>(v);
  }
  if (!quotable_port(s)) {
    throw std::invalid_argument("ratelimit: bad port in redis URL \"" + redacted_url(url) +
                                "\": the port " + unquoted_port_text(s));
  }
  return parse_url_int(s, url, "port", 1, 65535);
}

/// One `HOST[:PORT]` `part` of a URL listing several hosts (a cluster seed,
/// a sentinel) as a message quotes it, in double quotes: quoted_part, but
/// with a port that is not a number (quotable_port) read as `***`, and the
/// text of a bracketed host without ':' (no IPv6 address) as `[***]`.
[[nodiscard]] inline std::string quoted_host_item(std::string_view part) {
  if (part.starts_with('[')) {
    // `[NAME]` with no ':' is no IPv6 address and may be anything: `[***]`,
    // as redacted_url shows it.
    const std::size_t close = std::min(part.find(']'), part.size());
    if (const std::string_view inside = part.substr(1, close - 1);
        !inside.empty() && inside != "***" && inside.find(':') == std::string_view::npos) {
      return quoted_host_item("[***" + std::string(part.substr(close)));
    }
    // Only ":PORT" may follow the ']': anything else is hidden, as
    // redacted_url hides it (`[::1]x:S3CRET`).
    if (close + 1 < part.size() && part[close + 1] != ':') {
      return "\"" + escaped_name(part.substr(0, close + 1)) + "***\"";
    }
  }
  const std::string_view head = part.substr(0, part.find_first_of("&;="));
  const auto port = port_start(head);
  if (port == std::string_view::npos || quotable_port(head.substr(port))) {
    return "\"" + quoted_part(part) + "\"";
  }
  return "\"" + escaped_name(head.substr(0, port)) + "***" +
         (head.size() < part.size() ? std::string(1, part[head.size()]) + "..." : "") + "\"";
}

/// Why quoted_host_item hid the port of `part`, for the end of a message
/// (": its port is not a number (...)"); "" when it did not.
[[nodiscard]] inline std::string host_item_why(std::string_view part) {
  const std::string_view head = part.substr(0, part.find_first_of("&;="));
  const auto port = port_start(head);
  if (port == std::string_view::npos || quotable_port(head.substr(port))) return {};
  return ": its port " + unquoted_port_text(head.substr(port));
}

/// True for RFC 3986's unreserved characters: letters, digits and `-._~`.
[[nodiscard]] inline bool unreserved(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

/// The IPv6 host `fe80::1%25eth0` of a URL (RFC 6874) as getaddrinfo takes
/// it: `fe80::1%eth0`. The zone id after `%25` is percent-decoded; it must
/// be 1..64 bytes, each (decoded) a letter, digit or `-._~`, so that no NUL,
/// CR, LF, space or other control byte reaches a resolver or a message.
/// @throws std::invalid_argument naming the URL
[[nodiscard]] inline std::string ipv6_with_zone(std::string_view host, std::string_view url) {
  const auto pct = host.find('%');
  if (pct == std::string_view::npos) return std::string(host);
  const std::string_view zone = host.substr(pct + 1);
  if (!zone.starts_with("25") || zone.size() == 2) {
    bad_url(url,
            "has a '%' in its IPv6 address that does not start a zone id (write %25ZONE, "
            "RFC 6874)");
  }
  std::string out(host.substr(0, pct));
  out += '%';
  const std::size_t start = out.size();
  const auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  for (std::size_t i = 2; i < zone.size(); ++i) {
    char c = zone[i];
    if (c == '%') {
      if (i + 2 >= zone.size() || hex(zone[i + 1]) < 0 || hex(zone[i + 2]) < 0) {
        bad_url(url, "has a bad percent-encoding in its IPv6 zone id");
      }
      c = static_cast<char>(hex(zone[i + 1]) * 16 + hex(zone[i + 2]));
      i += 2;
    }
    if (!unreserved(c)) {
      bad_url(url, "has an IPv6 zone id with a byte other than letters, digits and -._~");
    }
    out += c;
  }
  if (out.size() - start > 64) bad_url(url, "has an IPv6 zone id longer than 64 bytes");
  return out;
}

/// True when `s` holds a control byte (0x00-0x1f, 0x7f), or with `space`
/// a space as well.
[[nodiscard]] inline bool has_control_byte(std::string_view s, bool space = false) noexcept {
  return std::any_of(s.begin(), s.end(), [space](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c < 0x20 || c == 0x7f || (space && c == ' ');
  });
}

/// Why a Sentinel master name cannot be used, "" when it can: it must hold
/// no space and no control byte (0x00-0x20, 0x7f): the sentinels announce
/// failovers as space-separated "+switch-master NAME ..." lines, which such a
/// name could never match.
[[nodiscard]] inline std::string bad_master_name(std::string_view name) {
  if (name.empty()) return "is empty";
  for (std::size_t at = 0; at < name.size(); ++at) {
    const auto b = static_cast<unsigned char>(name[at]);
    if (b <= 0x20 || b == 0x7f) {
      // Quoted up to that byte: `/mymaster password S3CRET` is no name.
      return "\"" + escaped_name(name.substr(0, at + 1)) + (at + 1 < name.size() ? "..." : "") +
             "\" holds a space or control byte (the sentinels name a master in space-separated "
             "lines)";
    }
  }
  return {};
}

/// Reads the userinfo `cred` of `url` (the text before the '@' that ends
/// it) into `o`: `PASSWORD`, or `USER:PASSWORD` split at the first ':' (an
/// empty USER, as in `:PASSWORD`, is the default user). The password must not
/// be empty: `@h`, `:@h` and `USER:@h` would connect without AUTH (and drop
/// USER), so they are refused; leave the userinfo out for no AUTH.
/// @throws std::invalid_argument naming the empty password (and the URL, redacted)
inline void take_userinfo(std::string_view cred, options& o, std::string_view url) {
  const auto colon = cred.find(':');
  const std::string_view user = colon == std::string_view::npos ? std::string_view()
                                                                : cred.substr(0, colon);
  const std::string_view password = colon == std::string_view::npos ? cred : cred.substr(colon + 1);
  if (password.empty()) {
    bad_url(url, user.empty()
                     ? "has an empty password before '@' (write [USER]:PASSWORD@, or no '@' "
                       "for no AUTH)"
                     : "has user \"" + escaped_name(user) +
                           "\" with an empty password (AUTH needs one; write USER:PASSWORD@)");
  }
  o.user = std::string(user);
  o.password = std::string(password);
}

/// Refuses a ',' in the userinfo `cred` of a URL that lists several hosts
/// (`redis-cluster://`, `rediss-cluster://`, `redis-sentinel://`). The
/// userinfo ends at the last '@', so a host written with an '@' of its own
/// (`redis-cluster://a:7000,:@b`) would turn the hosts before it into a user
/// and password (user `a`, password `7000,:`) and drop them from the list
/// without an error. URLs are not percent-decoded (`%2C` would be sent as
/// those three bytes), so a user or password holding ',' is set in code,
/// in `fields`.
/// @throws std::invalid_argument saying so (the URL redacted, no credential quoted)
inline void refuse_comma_in_userinfo(std::string_view cred, std::string_view url,
                                     std::string_view fields) {
  if (cred.find(',') == std::string_view::npos) return;
  bad_url(url,
          "has a ',' before its last '@': the hosts follow one [USER:]PASSWORD@ (did a "
          "host get an '@' of its own?); a user or password holding ',' cannot be written "
          "in this URL (no percent-decoding: %2C stays three bytes), set " +
              std::string(fields) + " in code");
}

/// Refuses a userinfo `cred` (of `url`, as userinfo_end found it) that holds
/// one of userinfo_delimiters: it then runs past the host, into a query, a
/// path or a fragment, whose '@' ended it. `redis://h?x=1@evil` would
/// otherwise connect to `evil` sending `h?x=1` as the password, and
/// `redis://h:6379?ca=/a@b` to `b`. URLs are not percent-decoded (`%3F`
/// would be sent as those three bytes), so a user or password holding such a
/// byte, and a query value holding '@', are set in code, in `fields`.
/// @throws std::invalid_argument naming the byte (the URL redacted, no credential quoted)
inline void refuse_delimiter_in_userinfo(std::string_view cred, std::string_view url,
                                         bool unix_path, std::string_view fields) {
  const auto bad = cred.find_first_of(userinfo_delimiters(unix_path));
  if (bad == std::string_view::npos) return;
  const std::string which = std::string("'") + cred[bad] + "'";
  if (unix_path) {
    bad_url(url, "has a " + which +
                     " before its first \"@/\", where its userinfo ends (an '@' in a query value "
                     "would end it there); a user or password holding '?' or '#' cannot be "
                     "written in a unix:// URL (no percent-decoding: %3F stays three bytes), set " +
                     std::string(fields) + " in code");
  }
  bad_url(url, "has a " + which +
                   " before its last '@', where its userinfo ends (an '@' in a query value, a "
                   "path or a fragment would make the text before it a password and the text "
                   "after it the host); a user or password holding '/', '?' or '#' cannot be "
                   "written in this URL (no percent-decoding: %3F stays three bytes), nor a query "
                   "value holding '@': set " +
                   std::string(fields) + " in code");
}

/// Refuses a '#' in `rest` (`url` after its `scheme://`; called once the
/// userinfo passed refuse_delimiter_in_userinfo): it would start a fragment,
/// which means nothing in a Redis URL, and was taken as part of whatever
/// held it, `redis://h#x` connecting to the host "h#x",
/// `redis-sentinel://s/m#x` asking for master "m#x" and `?sni=a#b` naming
/// the server "a#b". Nothing is percent-decoded (`%23` stays three bytes),
/// so a host, socket path, master name or parameter value holding '#' is set
/// in code, in `fields`.
/// @throws std::invalid_argument saying so (the URL redacted, no value quoted)
inline void refuse_fragment(std::string_view rest, std::string_view url, std::string_view fields) {
  if (rest.find('#') == std::string_view::npos) return;
  bad_url(url,
          "has a '#': a URL fragment means nothing here, and a host, socket path, master name "
          "or parameter value holding '#' cannot be written in a Redis URL (no "
          "percent-decoding: %23 stays three bytes); set " +
              std::string(fields) + " in code");
}

/// Refuses the query item `item` of `url` when it holds no '=' and is no
/// known parameter name, without quoting it: it may be the end of a value
/// holding '&' (`?sentinel_password=p&ss`) or a secret whose '=' was
/// mistyped (`?sentinel_password:s3cret`), and used to be quoted as a
/// parameter name (redacted_url hides it too).
/// @throws std::invalid_argument saying so
inline void refuse_unnamed_item(std::string_view item, std::string_view url) {
  if (item.empty() || item.find('=') != std::string_view::npos || known_parameter(item)) return;
  bad_url(url,
          "has a parameter without '=' (NAME=VALUE; not quoted, as it may be the end of a value "
          "holding '&', which cannot be written in a URL, or a secret with a mistyped '=')");
}

/// Refuses parameter `name` of the query of a `redis://` or `rediss://` URL
/// (with `cluster`, `redis-cluster://` or `rediss-cluster://`; `tls` for
/// the rediss forms) that takes no such parameter, saying where it belongs:
/// `db` in the path (a cluster has only database 0), a TLS parameter in the
/// rediss form, `sentinel_user`/`sentinel_password` in `redis-sentinel://`.
/// Called with what is left once multiplex= and read_spin_us= are taken.
/// @throws std::invalid_argument naming the parameter (the URL redacted)
[[noreturn]] inline void misplaced_parameter(std::string_view name, std::string_view url, bool tls,
                                             bool cluster) {
  const std::string quoted = "\"" + escaped_name(name) + "\"";
  const std::string tls_scheme = cluster ? "rediss-cluster://" : "rediss://";
  const std::string scheme = tls ? tls_scheme : cluster ? "redis-cluster://" : "redis://";
  if (name == "db") {
    if (cluster) bad_url(url, "has parameter \"db\": a cluster has only database 0");
    bad_url(url, "has parameter \"db\": a " + scheme + " URL takes its database in the path (" +
                     scheme + "HOST[:PORT]/DB; ?db= is for unix:// and redis-sentinel://)");
  }
  if (!tls && tls_parameter(name)) {
    bad_url(url, "has TLS parameter " + quoted + ": TLS parameters need " + tls_scheme);
  }
  if (sentinel_parameter(name)) {
    bad_url(url, "has parameter " + quoted + ", which only a redis-sentinel:// URL takes");
  }
  const unsigned plain_form = cluster ? url_form_cluster : url_form_redis;
  const unsigned tls_form = cluster ? url_form_rediss_cluster : url_form_rediss;
  const std::string known = "known: " + (tls ? parameter_list(tls_form)
                                             : parameter_list(plain_form) + "; with " + tls_scheme +
                                                   " also " + parameter_list(tls_form, plain_form));
  if (!likely_misspelling(name)) {
    // `redis://h?S3CRET=1`: a secret in the wrong place (see likely_misspelling).
    bad_url(url, "has " + unquoted_parameter(known));
  }
  bad_url(url, "has unknown parameter " + quoted + " (" + known + ")");
}

/// Applies the query `k=v&k=v` of a `rediss://` URL to `t`: ca, ca_dir, cert,
/// key, sni, verify (full, chain or none). Each at most once, none empty.
/// Another name is refused by misplaced_parameter (`cluster`: of a
/// `rediss-cluster://` URL).
/// @throws std::invalid_argument naming the bad parameter (and the URL, redacted)
inline void apply_tls_query(tls_options& t, std::string_view query, std::string_view url,
                            bool cluster = false) {
  std::vector<std::string_view> seen;
  for (;;) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    refuse_unnamed_item(item, url);
    // Before any message that quotes the name (a value missing, given
    // twice): misplaced_parameter quotes an unknown one only when it is a
    // likely misspelling.
    if (!tls_parameter(name)) misplaced_parameter(name, url, true, cluster);
    if (eq == std::string_view::npos || eq + 1 == item.size()) {
      bad_url(url, "has parameter \"" + escaped_name(name) + "\" without a value (NAME=VALUE)");
    }
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
      bad_url(url, "gives parameter \"" + escaped_name(name) + "\" twice");
    }
    seen.push_back(name);
    const std::string value(item.substr(eq + 1));
    if (has_control_byte(value) && tls_parameter(name)) {
      // No file name worth reading holds one (the messages of a store that
      // cannot read the file quote it escaped).
      bad_url(url, "has a control byte in the value of parameter \"" + escaped_name(name) +
                       "\" (set options::tls in code for such a value)");
    }
    if (value.find('?') != std::string::npos) {
      // `?ca=/x?multiplex=2` would read the file "/x?multiplex=2".
      bad_url(url, "has a '?' in the value of parameter \"" + escaped_name(name) +
                       "\" (parameters are separated by '&')");
    }
    if (const auto bad = value.find_first_of(";="); bad != std::string::npos) {
      // `?sni=x;password=S3CRET` (';' typed for '&') named the server
      // "x;password=S3CRET", which TLS and connect errors quote. No host
      // name holds ';' or '='; a file name holding one is set in code.
      // The value is not quoted.
      bad_url(url, "has a '" + std::string(1, value[bad]) + "' in the value of parameter \"" +
                       escaped_name(name) +
                       "\" (not quoted; parameters are separated by '&'; set options::tls in code "
                       "for such a value)");
    }
    if (name == "ca") {
      t.ca_file = value;
    } else if (name == "ca_dir") {
      t.ca_dir = value;
    } else if (name == "cert") {
      t.cert_file = value;
    } else if (name == "key") {
      t.key_file = value;
    } else if (name == "sni") {
      t.server_name = value;
    } else if (name == "verify") {
      if (value == "full") {
        t.verify = tls_verify::full;
      } else if (value == "chain") {
        t.verify = tls_verify::chain;
      } else if (value == "none") {
        t.verify = tls_verify::none;
      } else {
        bad_url(url, "has verify=\"" + escaped_name(value) + "\" (expected full, chain or none)");
      }
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
}

/// Refuses credentials set in code that would be dropped without a word:
/// AUTH is sent only with a password, so a `user` (or `sentinel.user`, when
/// Sentinel is used) with an empty password would connect as the default
/// user, with no AUTH and no error. `where` starts the message.
/// @throws std::invalid_argument naming the field (never the password)
inline void check_credentials(const options& o, std::string_view where) {
  if (!o.user.empty() && o.password.empty()) {
    throw std::invalid_argument(std::string(where) + ": options::user \"" + escaped_name(o.user) +
                                "\" is set but options::password is empty (AUTH needs a "
                                "password; clear user for no AUTH)");
  }
  const bool sentinel = !o.sentinel.master_name.empty() || !o.sentinel.sentinels.empty();
  if (sentinel && !o.sentinel.user.empty() && o.sentinel.password.empty()) {
    throw std::invalid_argument(std::string(where) + ": options::sentinel.user \"" +
                                escaped_name(o.sentinel.user) +
                                "\" is set but options::sentinel.password is empty (AUTH at the "
                                "sentinels needs a password; clear sentinel.user for no AUTH)");
  }
}

/// Most connections one multiplexer may have (options::multiplex).
inline constexpr std::size_t max_multiplex_connections = 256;

/// Longest busy-poll for a reply (options::read_spin).
inline constexpr std::chrono::microseconds max_read_spin{1000};

/// Refuses an options::read_spin outside 0..max_read_spin.
/// @throws std::invalid_argument naming the value
inline void check_read_spin(std::chrono::microseconds spin) {
  if (spin.count() < 0 || spin > max_read_spin) {
    throw std::invalid_argument("ratelimit: redis: options::read_spin " +
                                std::to_string(spin.count()) + " us is outside 0.." +
                                std::to_string(max_read_spin.count()) + " us");
  }
}

/// True when the text after the first '?' of a `unix://` URL (past its
/// userinfo) is a query rather than the rest of a socket path: one of its
/// items, split at '&' and '?', starts with `db=`, `multiplex=`,
/// `read_spin_us=`, a TLS or a Sentinel parameter's `NAME=`, or is
/// `multiplex` or `read_spin_us` alone.
[[nodiscard]] inline bool unix_query_named(std::string_view query) noexcept {
  for (;;) {
    const auto end = query.find_first_of("&?");
    const std::string_view item = query.substr(0, end);
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    if (eq != std::string_view::npos && known_parameter(name)) return true;
    if (shared_parameter(item)) return true;
    if (end == std::string_view::npos) return false;
    query.remove_prefix(end + 1);
  }
}

/// Takes `multiplex=N` (0..max_multiplex_connections, at most once) out
/// of the query of a URL (redis://, rediss://, their cluster forms), the
/// query starting at the first `?` after the userinfo; what is left of the
/// query stays in `rest`. With `read_spin`, takes `read_spin_us=N`
/// (0..1000, at most once) as well and sets it there (untouched without the
/// parameter).
/// @param unix_path a `unix://` URL's rest: the text after its first '?'
///   is a query only when unix_query_named says so (else it is part of the
///   socket path, left as is); the query then holds no second '?', with
///   `db=`, multiplex= or read_spin_us= nothing else, `db=` at most once,
///   and no empty parameter; a TLS or Sentinel parameter (`NAME=`) there is
///   refused by name
/// @param spin_refusal when not empty, a `read_spin_us` parameter is
///   refused with this text before its value is read (the cluster forms,
///   which take none: a bad value was reported as out of range before)
/// @return N, or 0 without the parameter
/// @throws std::invalid_argument naming the bad value and the URL (redacted)
[[nodiscard]] inline std::size_t take_multiplex_query(
    std::string& rest, std::string_view url, bool unix_path = false,
    std::chrono::microseconds* read_spin = nullptr, std::string_view spin_refusal = {}) {
  // The caller refused a userinfo holding '?' (refuse_delimiter_in_userinfo),
  // so an '@' in a query value cannot hide the query in a userinfo here. A
  // unix:// userinfo ends at the first "@/", and its path may hold '@':
  // searched from the last '@', `unix:///t/s?multiplex=2&x=a@b` connected
  // to the path "/t/s?multiplex=2&x=a@b" with multiplex 0.
  const auto at = unix_path ? userinfo_end(rest, true) : rest.rfind('@');
  const auto q = rest.find('?', at == std::string::npos ? 0 : at + 1);
  if (q == std::string::npos) return 0;
  if (unix_path) {
    const std::string_view after = std::string_view(rest).substr(q + 1);
    if (!unix_query_named(after)) return 0;  // a socket path holding '?'
    if (after.find('?') != std::string_view::npos) {
      // `unix:///t/a?b?db=2` connected to the path "/t/a?b" on database 2.
      bad_url(url,
              "has a second '?' in its query (in a unix:// URL whose text after the first '?' "
              "holds a parameter's NAME=, such as db= or multiplex=, that '?' starts the "
              "query, and '&' separates its parameters)");
    }
  }
  std::string kept;
  bool others = false;  // parameters other than multiplex (empty ones too: refused later)
  std::size_t n = 0;
  bool seen = false;           // multiplex=
  bool seen_spin = false;      // read_spin_us= (only with `read_spin`)
  bool not_db = false;         // a unix:// query holds a parameter other than db=
  std::string_view not_unix;   // the first such item
  int db_items = 0;            // db= items of a unix:// query
  std::string_view elsewhere;  // the first TLS or Sentinel parameter of a unix:// query
  std::string_view query = std::string_view(rest).substr(q + 1);
  for (;;) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    if (item.starts_with("multiplex=") || item == "multiplex") {
      if (seen) bad_url(url, "gives parameter \"multiplex\" twice");
      seen = true;
      n = static_cast<std::size_t>(
          parse_url_int(item.substr(std::min(item.size(), std::size_t{10})), url, "multiplex", 0,
                        static_cast<long long>(max_multiplex_connections)));
    } else if (read_spin != nullptr &&
               (item.starts_with("read_spin_us=") || item == "read_spin_us")) {
      if (!spin_refusal.empty()) bad_url(url, std::string(spin_refusal));
      if (seen_spin) bad_url(url, "gives parameter \"read_spin_us\" twice");
      seen_spin = true;
      *read_spin = std::chrono::microseconds(
          parse_url_int(item.substr(std::min(item.size(), std::size_t{13})), url, "read_spin_us", 0,
                        max_read_spin.count()));
    } else {
      if (unix_path && item.starts_with("db=")) ++db_items;
      if (const std::string_view name = item.substr(0, item.find('='));
          unix_path && elsewhere.empty() && name.size() < item.size() && known_parameter(name) &&
          (parameter_forms(name) & url_form_unix) == 0) {
        elsewhere = name;
      }
      if (unix_path && !item.empty() && !item.starts_with("db=") && !not_db) {
        not_db = true;
        not_unix = item;
      }
      if (others) kept += '&';
      kept += item;
      others = true;
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  seen = seen || seen_spin;
  // With db= (unix://) the '?' starts a query too: `unix:///t/s?sni=x&db=1`
  // would connect to the path "/t/s?sni=x&db=1" on database 0, and
  // `unix:///t/s?db=1&sni=x` was refused as a bad database "1&sni=x".
  const std::string_view beside = seen ? "multiplex= or read_spin_us=" : "db=";
  if (unix_path && db_items > 1) bad_url(url, "gives parameter \"db\" twice");
  if ((seen || db_items > 0) && not_db) {
    // `unix:///t/s?multiplex=2&x=1&db=1` would connect to "/t/s?x=1&db=1".
    refuse_unnamed_item(not_unix, url);
    bad_url(url, "has " + parameter_named(not_unix.substr(0, not_unix.find('='))) + " beside " +
                     std::string(beside) + " (a unix:// URL takes only " +
                     parameter_list(url_form_unix, 0, "=", " and ") + ")");
  }
  if (!elsewhere.empty()) {
    // `unix:///t/s?sni=x` would connect to the path "/t/s?sni=x".
    bad_url(url, "has parameter \"" + std::string(elsewhere) +
                     "\", which a unix:// URL does not take (a unix:// URL takes only " +
                     parameter_list(url_form_unix, 0, "=", " and ") + ")");
  }
  // With multiplex= the '?' surely starts a query: an empty parameter there
  // (`unix:///t/s?&multiplex=2&db=1`) would leave the rest read as a path.
  if ((seen || db_items > 0) && others &&
      (kept.empty() || kept.front() == '&' || kept.back() == '&' ||
       kept.find("&&") != std::string::npos)) {
    bad_url(url, "has an empty parameter beside " + std::string(beside) + " (a stray '&')");
  }
  rest = rest.substr(0, q) + (others ? "?" + kept : std::string());
  return n;
}

/// Splits the query (after the first `?` behind the userinfo) off `rest` and
/// applies it to `t`; a query on a URL without TLS is refused, naming its
/// first parameter and what it needs (misplaced_parameter; `cluster`: of a
/// `redis-cluster://` or `rediss-cluster://` URL).
inline void take_tls_query(std::string_view& rest, tls_options& t, std::string_view url,
                           bool cluster = false) {
  const auto at = rest.rfind('@');
  const auto q = rest.find('?', at == std::string_view::npos ? 0 : at + 1);
  // The caller refused a userinfo holding '?' (refuse_delimiter_in_userinfo).
  if (q == std::string_view::npos) return;
  if (rest.substr(q + 1).find_first_not_of('&') == std::string_view::npos) {
    bad_url(url, "has no parameter after '?'");
  }
  if (!t.enabled) {
    // `redis://h?read_spin_us=5&db=1` said "TLS parameters need rediss://".
    std::string_view query = rest.substr(q + 1);
    query.remove_prefix(query.find_first_not_of('&'));
    const std::string_view item = query.substr(0, query.find('&'));
    refuse_unnamed_item(item, url);
    misplaced_parameter(item.substr(0, item.find('=')), url, false, cluster);
  }
  apply_tls_query(t, rest.substr(q + 1), url, cluster);
  rest = rest.substr(0, q);
}

}  // namespace detail

[[nodiscard]] inline options parse_url(std::string_view url);

namespace detail {

/// parse_url for `redis-sentinel://` (see there).
[[nodiscard]] inline options parse_sentinel_url(std::string_view url) {
  options o;
  std::string_view rest = url.substr(std::string_view("redis-sentinel://").size());
  const auto at = userinfo_end(rest, false);
  if (at != std::string_view::npos) {
    // `redis-sentinel://s/m?sentinel_password=p@ss` would be password
    // `s/m?sentinel_password=p` and sentinel `ss`.
    refuse_delimiter_in_userinfo(rest.substr(0, at), url, false,
                                 "options::user, options::password and options::sentinel");
  }
  refuse_fragment(rest, url, "options::sentinel");
  if (at != std::string_view::npos) {
    const std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    refuse_comma_in_userinfo(cred, url, "options::user and options::password");
    take_userinfo(cred, o, url);
  }
  std::string_view query;
  bool has_query = false;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    has_query = true;
  }
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) bad_url(url, "has no /MASTER_NAME after the sentinels");
  const std::string_view name = rest.substr(slash + 1);
  if (name.empty()) bad_url(url, "has an empty MASTER_NAME");
  if (const auto blank = first_blank(name);
      blank != std::string_view::npos && blank < name.find_first_of("/&;=,")) {
    // A space or control byte first: quoted up to it (bad_master_name), as
    // `/mymaster password S3CRET/0` would quote the rest up to the '/'.
    bad_url(url, "has master name " + bad_master_name(name));
  }
  if (const auto second = name.find('/');
      second != std::string_view::npos && second < name.find_first_of("&;=,")) {
    // Quoted up to that '/' (the URL's second): `/m/sentinel_password=S3CRET`
    // ('/' for '?') quoted the secret. A '&', ';', '=' or ',' before it
    // is the one named (below): `/m;password=S3CRET/0` quoted the secret.
    bad_url(url, "has a '/' in MASTER_NAME \"" + escaped_name(name.substr(0, second + 1)) +
                     (second + 1 < name.size() ? "..." : "") + "\" (use ?db=N for a database)");
  }
  // '&' where '?' was meant: `/mymaster&db=2` named master "mymaster&db=2"
  // on database 0, and `/m&sentinel_password=S3CRET` sent no AUTH and put
  // the secret in the master name (and so in "no master ..." errors); so
  // did ';', '=' and ',' (`/m;sentinel_password=S3CRET`, `/m=S3CRET`). A
  // name holding one is set in code. Quoted up to that byte.
  if (const auto bad = name.find_first_of("&;=,"); bad != std::string_view::npos) {
    bad_url(url, "has a '" + std::string(1, name[bad]) + "' in MASTER_NAME \"" +
                     escaped_name(name.substr(0, bad + 1)) +
                     "...\" (parameters follow '?'; set a master name holding '&', ';', '=' "
                     "or ',' in options::sentinel.master_name)");
  }
  if (const std::string why = bad_master_name(name); !why.empty()) {
    bad_url(url, "has master name " + why);
  }
  o.sentinel.master_name = std::string(name);
  std::string_view hosts = rest.substr(0, slash);
  for (;;) {
    const auto comma = hosts.find(',');
    const std::string_view part = hosts.substr(0, comma);
    if (part.empty()) bad_url(url, "needs HOST[:PORT] sentinels separated by commas");
    options one;
    try {
      one = parse_url("redis://" + std::string(part));
    } catch (const std::invalid_argument&) {
      bad_url(url, "has a bad sentinel " + quoted_host_item(part) + host_item_why(part));
    }
    const bool has_port = part.starts_with('[') ? part.find("]:") != std::string_view::npos
                                                : part.find(':') != std::string_view::npos;
    if (one.database != 0 || part.find('/') != std::string_view::npos) {
      bad_url(url, "has a bad sentinel \"" + quoted_part(part) + "\"");
    }
    o.sentinel.sentinels.push_back(sentinel_address{one.host, has_port ? one.port : 26379});
    if (comma == std::string_view::npos) break;
    hosts.remove_prefix(comma + 1);
  }
  bool seen_db = false;
  bool seen_user = false;
  bool seen_password = false;
  bool seen_multiplex = false;
  bool seen_spin = false;
  if (has_query && query.find_first_not_of('&') == std::string_view::npos) {
    bad_url(url, "has no parameter after '?'");
  }
  while (has_query) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    const auto eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view()
                                                                : item.substr(eq + 1);
    if (item.empty()) bad_url(url, "has an empty parameter (a stray '&')");
    if (eq == std::string_view::npos) {
      refuse_unnamed_item(item, url);
      bad_url(url, "has no '=' after parameter \"" + escaped_name(key) + "\"");
    }
    // An unknown name anywhere after sentinel_password= (the one secret
    // parameter) is not quoted, here or in any later message: it may be the
    // tail of a password holding '&' (`?sentinel_password=p&ss=1` said
    // unknown parameter "ss", the end of the password "p&ss=1"). An unknown
    // name before it, or with no sentinel_password= at all, is quoted only
    // when it is a likely misspelling, with the known names. redacted_url
    // hides such an item whole in the quoted URL.
    if (seen_password && !known_parameter(key)) {
      bad_url(url,
              "has an unknown parameter after sentinel_password= (not quoted: it may be the end "
              "of a password holding '&', which cannot be written in a URL; set "
              "options::sentinel.password in code for such a password)");
    }
    if (!known_parameter(key)) {
      // Before any message that quotes the name: quoted only when it is a
      // likely misspelling (`?S3CRET=1` is no name to quote).
      const std::string known = "known: " + parameter_list(url_form_sentinel);
      if (!likely_misspelling(key)) bad_url(url, "has " + unquoted_parameter(known));
      bad_url(url, "has an unknown parameter \"" + escaped_name(key) + "\" (" + known + ")");
    }
    if (value.find('?') != std::string_view::npos) {
      // `?sentinel_user=u?db=2` would hide the database in the user name.
      bad_url(url, "has a '?' in the value of parameter \"" + escaped_name(key) +
                       "\" (parameters are separated by '&'; set options::sentinel in code for "
                       "such a value)");
    }
    const auto once = [&](bool& seen) {
      if (seen) bad_url(url, "sets \"" + std::string(key) + "\" twice");
      seen = true;
    };
    // An empty credential would silently mean no AUTH at the sentinels.
    const auto no_value = [&] {
      bad_url(url, "has parameter \"" + std::string(key) +
                       "\" without a value (leave the parameter out for no AUTH)");
    };
    if (key == "db") {
      once(seen_db);
      o.database = parse_url_int(value, url, "database", 0, 999'999'999);
    } else if (key == "sentinel_user") {
      once(seen_user);
      if (value.empty()) no_value();
      if (const auto bad = value.find_first_of(";="); bad != std::string_view::npos) {
        // `?sentinel_user=u;sentinel_password=S3CRET` (';' typed for '&')
        // was the user "u;sentinel_password=S3CRET", which messages quote.
        bad_url(url, "has a '" + std::string(1, value[bad]) +
                         "' in the value of parameter \"sentinel_user\" (not quoted; parameters "
                         "are separated by '&'; set options::sentinel.user in code for such a "
                         "user)");
      }
      o.sentinel.user = std::string(value);
    } else if (key == "sentinel_password") {
      once(seen_password);
      if (value.empty()) no_value();
      o.sentinel.password = std::string(value);
    } else if (key == "multiplex") {
      once(seen_multiplex);
      o.multiplex = static_cast<std::size_t>(parse_url_int(
          value, url, "multiplex", 0, static_cast<long long>(max_multiplex_connections)));
    } else if (key == "read_spin_us") {
      once(seen_spin);
      o.read_spin = std::chrono::microseconds(
          parse_url_int(value, url, "read_spin_us", 0, max_read_spin.count()));
    } else if (tls_parameter(key)) {
      // It was "an unknown parameter", as if misspelt.
      bad_url(url, "has TLS parameter \"" + std::string(key) +
                       "\": a redis-sentinel:// URL takes none (set options::tls in code; it "
                       "applies to the sentinels and the master)");
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  if (seen_user && !seen_password) {
    // The pool sends AUTH only with a password: the user would be dropped.
    bad_url(url,
            "has parameter \"sentinel_user\" without \"sentinel_password\" (AUTH at the "
            "sentinels needs a password)");
  }
  return o;
}

}  // namespace detail

/// Parses `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` or
/// `unix://[[USER]:PASSWORD@]/PATH[?db=DB]` into options (other fields keep
/// their defaults). An IPv6 HOST is written in brackets:
/// `redis://[::1]:6379`, with an optional zone id after `%25` (RFC 6874:
/// `redis://[fe80::1%25eth0]:6379` connects to `fe80::1%eth0`; the zone id
/// is percent-decoded and must be letters, digits and `-._~`, 1..64 bytes).
/// In `unix://` URLs the socket path may hold '@': with no userinfo the URL
/// is `unix:///PATH`; a userinfo ends at the first `@/`; a relative path
/// holding '@' is refused (`unix://pw@run/s.sock` is no password and path), and so is one
/// holding ':' before its first '/' (`unix://default:S3CRET/tmp/s`, the '@'
/// left out: quoted as `unix://default:***/tmp/s`). PORT is 1..65535.
/// No other percent-decoding. A userinfo must hold a password (`USER:@`,
/// `:@` and a bare `@` are refused: they would connect without AUTH); leave
/// the userinfo out for no AUTH. The userinfo ends at the last '@' (in
/// `unix://`, the first `@/`) and may hold '@', but no '?' or '#', nor,
/// except in `unix://`, '/' (refuse_delimiter_in_userinfo): those end the
/// host part, so such a userinfo has run into a query, path or fragment
/// (`redis://h?x=1@evil` would connect to `evil`). A user or password
/// holding them, and a query value holding '@', are set in code. A '#'
/// anywhere in a URL of any form is refused (refuse_fragment): a fragment
/// means nothing here, and `redis://h#x` connected to the host "h#x"; a
/// host, path, master name or value holding '#' is set in code; so is a
/// host holding a space, a control byte (0x00-0x1f, 0x7f), '&', ';' or '='
/// (no host name holds one: `redis://h;password=S3CRET`), a socket path
/// or TLS parameter value holding a control byte, and a TLS parameter or
/// `sentinel_user` value holding ';' or '=' (`?sni=x;password=S3CRET`,
/// refused naming the parameter, the value not quoted). A socket path may
/// hold ';', '&' and '=', which connect errors quote it up to
/// (detail::quoted_part). Error messages quote
/// the URL with its password replaced by `***` (and a port that is not a
/// number from 1 to 65535, which may be a password whose "USER@" was left
/// out, as in `redis://default:hunter2` or `redis://:123456`: never
/// quoted), every byte outside
/// printable ASCII (and `"`, `\`) escaped as `\xNN` (detail::printable).
/// `rediss://` is `redis://` over TLS (options::tls), with optional
/// parameters `?ca=FILE&ca_dir=DIR&cert=FILE&key=FILE&sni=NAME&verify=full|chain|none`
/// (values without `&`, `@`, `?`, `#`, `;`, `=` or a control byte, see above); files are read
/// when the store is made.
/// `redis://`, `rediss://` and `unix://` also take `?multiplex=N` (0..256,
/// at most once; options::multiplex), alone or among the other parameters
/// (an empty parameter, as in `?&multiplex=2` or a trailing `&`, is refused),
/// and `?read_spin_us=N` (0..1000, at most once; options::read_spin) by
/// the same rules.
/// A '?' inside the value of a TLS or Sentinel parameter is refused (a second
/// '?' is no separator: `?ca=F?multiplex=2` would name the file "F?multiplex=2"),
/// and so is a `redis://`, `rediss://` or `redis-sentinel://` URL with no
/// parameter after its '?'. A parameter the form does not take is refused by
/// name, saying where it belongs (misplaced_parameter: `?db=` on redis://, a
/// TLS parameter without rediss://, a Sentinel one outside redis-sentinel://).
/// An unknown parameter is named only when it is a likely_misspelling of a
/// known one (`?multiplx=2`); any other name (`?S3CRET=1`, a password
/// pasted in the wrong place) is not quoted.
/// A `unix://` path may hold '?' (and '@'), except where the text after the
/// first '?' past the userinfo holds, at its start or after a '&' or '?',
/// `db=`, `multiplex=`, `read_spin_us=` or a TLS or Sentinel `NAME=`: that
/// '?' then starts the query, which holds no second '?' and nothing but
/// those three (`db=` once, no empty parameter); a TLS or Sentinel
/// parameter there is refused by name.
///
/// Sentinel (ratelimit/redis/sentinel.hpp):
/// `redis-sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER_NAME[?PARAMS]`
/// lists the sentinels (PORT 26379 when omitted) and names the master (a
/// MASTER_NAME holding '/', '&', ';', '=' or ',' is set in code); the
/// userinfo is for the master (as in redis://), PARAMS are `&`-separated
/// `db=DB`, `sentinel_user=USER`, `sentinel_password=PASSWORD` (AUTH at the
/// sentinels), `multiplex=N` and `read_spin_us=N`, each at most once, none empty;
/// `sentinel_user` only with `sentinel_password`. The userinfo follows the
/// rule of redis:// above, so a query value cannot hold '@' (set
/// options::sentinel in code for such a password), and must not hold ','
/// either (a sentinel written with an '@' of its own would otherwise become
/// part of the password): set options::user/password in code for a
/// credential holding ','.
/// @throws std::invalid_argument quoting the URL and the bad part
[[nodiscard]] inline options parse_url(std::string_view url) {
  if (url.starts_with("redis-sentinel://")) return detail::parse_sentinel_url(url);
  options o;
  std::string_view rest;
  bool unix_path = false;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("rediss://")) {
    rest = url.substr(9);
    o.tls.enabled = true;
  } else if (url.starts_with("unix://")) {
    rest = url.substr(7);
    unix_path = true;
  } else {
    detail::bad_url(url, "must start with redis://, rediss://, unix:// or redis-sentinel://");
  }
  if (const auto at = detail::userinfo_end(rest, unix_path); at != std::string_view::npos) {
    detail::refuse_delimiter_in_userinfo(rest.substr(0, at), url, unix_path,
                                         o.tls.enabled
                                             ? "options::user, options::password and options::tls"
                                             : "options::user and options::password");
  }
  detail::refuse_fragment(rest, url,
                          o.tls.enabled ? "options::host and options::tls"
                          : unix_path   ? "options::unix_socket"
                                        : "options::host");
  std::string without_multiplex(rest);  // rest without `multiplex=N`; rest views it
  o.multiplex = detail::take_multiplex_query(without_multiplex, url, unix_path, &o.read_spin);
  rest = without_multiplex;
  if (!unix_path) detail::take_tls_query(rest, o.tls, url);
  if (const auto at = detail::userinfo_end(rest, unix_path); at != std::string_view::npos) {
    const std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    detail::take_userinfo(cred, o, url);
  }
  constexpr long long max_db = 999'999'999;
  if (unix_path) {
    if (const auto q = rest.find("?db="); q != std::string_view::npos) {
      o.database = detail::parse_url_int(rest.substr(q + 4), url, "database", 0, max_db);
      rest = rest.substr(0, q);
    }
    if (rest.empty()) detail::bad_url(url, "has no socket path");
    if (!rest.starts_with('/') && rest.find('@') != std::string_view::npos) {
      // `unix://pw@run/redis.sock`: a userinfo before a relative path, or a
      // path holding '@'? Connecting to it would put a password in messages.
      detail::bad_url(url,
                      "has a relative socket path holding '@' (a userinfo ends at the first "
                      "\"@/\": write an absolute path)");
    }
    if (const auto colon = rest.find(':'); !rest.starts_with('/') && colon < rest.find('/')) {
      // `unix://default:S3CRET/tmp/redis.sock` or `unix://:S3CRET` (the '@'
      // left out) was the relative path "default:S3CRET/tmp/redis.sock",
      // which connect errors quote.
      detail::bad_url(url,
                      "has a relative socket path holding ':' before its first '/' (a password "
                      "given without '@'? write USER:PASSWORD@/PATH, or an absolute path)");
    }
    if (detail::has_control_byte(rest)) {
      // Every connect error quotes the path: no CR or LF into a log line.
      detail::bad_url(url,
                      "has a socket path holding a control byte (set options::unix_socket in "
                      "code for such a path)");
    }
    o.unix_socket = std::string(rest);
    return o;
  }
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 < rest.size()) {
      o.database = detail::parse_url_int(rest.substr(slash + 1), url, "database", 0, max_db, true);
    }
    rest = rest.substr(0, slash);
  }
  std::string_view host = rest;
  std::string_view port;
  bool has_port = false;
  if (rest.starts_with('[')) {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) detail::bad_url(url, "opens [ without closing ]");
    host = rest.substr(1, close - 1);
    if (host.find(':') == std::string_view::npos || host.find('[') != std::string_view::npos) {
      // Without ':' the bracketed text may be anything (a secret, too):
      // quoted by its length only, as redacted_url hides it.
      detail::bad_url(
          url, !host.empty() && host.find(':') == std::string_view::npos
                   ? "holds a bracketed host of " + detail::count_of(host.size(), "byte") +
                         " without ':', which is no IPv6 address (not quoted)"
                   : "holds \"[" + detail::escaped_name(host) + "]\", which is no IPv6 address");
    }
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        // Not quoted: only ":PORT" may follow, and this may be anything.
        detail::bad_url(url, "has " + detail::count_of(after.size(), "byte") +
                                 " after the IPv6 address where only :PORT may follow "
                                 "(not quoted)");
      }
      port = after.substr(1);
      has_port = true;
    }
  } else {
    if (rest.find_first_of("[]") != std::string_view::npos) {
      detail::bad_url(url, "has a bracket outside [IPv6 address]");
    }
    if (const auto colon = rest.find(':'); colon != std::string_view::npos) {
      if (rest.find(':', colon + 1) != std::string_view::npos) {
        detail::bad_url(url,
                        "has an IPv6 address without brackets (write redis://[::1]:6379), or a "
                        "password holding ':' given without \"USER@HOST\" (is the '@' missing?)");
      }
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
      has_port = true;
    }
  }
  if (has_port) o.port = detail::parse_url_port(port, url);
  if (host.empty()) detail::bad_url(url, "has no host");
  if (const auto bad = host.find_first_of("&;=,"); bad != std::string_view::npos) {
    // `redis://h&password=S3CRET` took the host "h&password=S3CRET", which
    // every connect error quotes; no host name holds one of these bytes
    // (a ',' lists hosts only in the cluster and Sentinel forms).
    detail::bad_url(url, "has a '" + std::string(1, host[bad]) + "' in host \"" +
                             detail::quoted_part(host) +
                             "\" (no host name holds one; parameters follow '?')");
  }
  if (detail::has_control_byte(host, true)) {
    // No host name holds one, and every connect error quotes the host.
    detail::bad_url(url, "has a host holding a space or a control byte");
  }
  o.host = rest.starts_with('[') ? detail::ipv6_with_zone(host, url) : std::string(host);
  return o;
}

}  // namespace ratelimit::redis
