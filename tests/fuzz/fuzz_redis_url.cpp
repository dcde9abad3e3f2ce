// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: ratelimit::redis::parse_url (redis://, unix://, redis-sentinel://) and
// parse_cluster_url on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "ratelimit/redis/options.hpp"

namespace {

namespace rr = ratelimit::redis;

/// A message quoting a URL escapes its control bytes (no forged log lines).
bool escaped(std::string_view message) {
  for (const char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

bool valid_port(int port) {
  return port >= 1 && port <= 65535;
}

/// A bracketed IPv6 literal is the whole host: text after its ']' (a port)
/// must have been read as the port, not left in the host.
bool whole_host(const std::string& host) {
  const auto close = host.find(']');
  return close == std::string::npos || close + 1 == host.size();
}

void check_credentials(const rr::options& o, std::string_view url) {
  // No percent-decoding: user and password are verbatim parts of the URL.
  RATELIMIT_FUZZ_CHECK(o.user.empty() || url.find(o.user) != std::string_view::npos,
                       "a user that is not in the URL");
  RATELIMIT_FUZZ_CHECK(o.password.empty() || url.find(o.password) != std::string_view::npos,
                       "a password that is not in the URL");
  // A userinfo holding '?', '#' or (but in unix://) '/' ran past the host,
  // to an '@' in a query value, a path or a fragment.
  const std::string_view past_host = url.starts_with("unix://") ? "?#" : "/?#";
  RATELIMIT_FUZZ_CHECK(o.user.find_first_of(past_host) == std::string::npos &&
                           o.password.find_first_of(past_host) == std::string::npos,
                       "a user or password holding '?', '#' or '/' (the userinfo ran past the "
                       "host)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view url(reinterpret_cast<const char*>(data), size);

  // Anything but std::invalid_argument escapes and is reported as a crash.
  try {
    const rr::options o = rr::parse_url(url);
    RATELIMIT_FUZZ_CHECK(url.find('#') == std::string_view::npos,
                         "a URL holding '#' accepted (a fragment taken into a field)");
    RATELIMIT_FUZZ_CHECK(o.database >= 0, "negative database");
    check_credentials(o, url);
    // Connect errors quote the host or path: no control byte in either.
    RATELIMIT_FUZZ_CHECK(
        !rr::detail::has_control_byte(o.unix_socket) && !rr::detail::has_control_byte(o.host, true),
        "a socket path or host holding a control byte");
    if (o.unix_socket.empty()) {
      RATELIMIT_FUZZ_CHECK(!o.host.empty(), "accepted a TCP URL without a host");
      RATELIMIT_FUZZ_CHECK(whole_host(o.host), "text after an IPv6 literal left in the host");
      RATELIMIT_FUZZ_CHECK(valid_port(o.port), "accepted a port outside 1..65535");
    }
    // redis-sentinel://: a master name, at least one sentinel, each a host and a port.
    const rr::sentinel_options& s = o.sentinel;
    RATELIMIT_FUZZ_CHECK(s.master_name.empty() == s.sentinels.empty(),
                         "a master name without sentinels, or sentinels without one");
    RATELIMIT_FUZZ_CHECK(s.sentinels.size() <= size, "more sentinels than URL bytes");
    if (!s.sentinels.empty()) {
      RATELIMIT_FUZZ_CHECK(
          o.user.find(',') == std::string::npos && o.password.find(',') == std::string::npos,
          "a ',' in a Sentinel URL's user or password (a sentinel taken for one)");
    }
    for (const rr::sentinel_address& a : s.sentinels) {
      RATELIMIT_FUZZ_CHECK(!a.host.empty(), "a sentinel without a host");
      RATELIMIT_FUZZ_CHECK(whole_host(a.host), "text after an IPv6 literal left in a sentinel");
      RATELIMIT_FUZZ_CHECK(valid_port(a.port), "a sentinel port outside 1..65535");
    }
    RATELIMIT_FUZZ_CHECK(s.user.empty() || url.find(s.user) != std::string_view::npos,
                         "a sentinel user that is not in the URL");
    RATELIMIT_FUZZ_CHECK(s.password.empty() || url.find(s.password) != std::string_view::npos,
                         "a sentinel password that is not in the URL");
  } catch (const std::invalid_argument& e) {
    RATELIMIT_FUZZ_CHECK(std::string_view(e.what()).starts_with("ratelimit: "),
                         "a rejection without the library's prefix");
    RATELIMIT_FUZZ_CHECK(escaped(e.what()), "a rejection quoting a control or non-ASCII byte");
  }

  try {
    const rr::cluster_options o = rr::parse_cluster_url(url);
    RATELIMIT_FUZZ_CHECK(url.find('#') == std::string_view::npos,
                         "a cluster URL holding '#' accepted (a fragment taken into a field)");
    RATELIMIT_FUZZ_CHECK(!o.seeds.empty(), "a cluster URL without seeds");
    RATELIMIT_FUZZ_CHECK(o.seeds.size() <= size, "more seeds than URL bytes");
    for (const rr::node_address& n : o.seeds) {
      RATELIMIT_FUZZ_CHECK(!n.host.empty(), "a seed without a host");
      RATELIMIT_FUZZ_CHECK(whole_host(n.host), "text after an IPv6 literal left in a seed host");
      RATELIMIT_FUZZ_CHECK(valid_port(n.port), "a seed port outside 1..65535");
    }
    RATELIMIT_FUZZ_CHECK(o.node.unix_socket.empty() && o.node.database == 0,
                         "cluster node options with a socket or a database");
    check_credentials(o.node, url);
    RATELIMIT_FUZZ_CHECK(o.node.user.find(',') == std::string::npos &&
                             o.node.password.find(',') == std::string::npos,
                         "a ',' in a cluster URL's user or password (a seed taken for one)");
  } catch (const std::invalid_argument& e) {
    RATELIMIT_FUZZ_CHECK(std::string_view(e.what()).starts_with("ratelimit: "),
                         "a rejection without the library's prefix");
    RATELIMIT_FUZZ_CHECK(escaped(e.what()), "a rejection quoting a control or non-ASCII byte");
  }
  return 0;
}
