// SPDX-License-Identifier: Apache-2.0
// The SIP front door's parser: just the parts of a UDP SIP request it needs
// (start line, Via, From, To, Call-ID, CSeq, Content-Length), strictly.
//
// Every datagram is hostile. `parse` never throws and never reads outside the
// datagram; anything it does not understand is `malformed` with a reason, and
// the server drops it. Deliberately narrower than RFC 3261: CRLF line ends
// only, no header folding, no NUL or other control bytes in the header part,
// at most 64 header lines; a front door may refuse what it need not serve.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sipfd {

/// Largest datagram accepted (bytes); longer ones are dropped as malformed.
inline constexpr std::size_t max_datagram = 8192;
/// Most header lines in one message.
inline constexpr std::size_t max_headers = 64;
/// Most Via headers copied into a response.
inline constexpr std::size_t max_vias = 8;
/// Longest Call-ID, From tag and From user accepted (bytes). Together they
/// keep a lease id (Call-ID ';' tag) within the library's 256 bytes.
inline constexpr std::size_t max_call_id = 160;
inline constexpr std::size_t max_tag = 64;
inline constexpr std::size_t max_user = 64;

/// What `parse` made of a datagram.
enum class parse_result : unsigned char {
  request,    ///< a well-formed request: the fields below are set
  response,   ///< a SIP response (the front door ignores them)
  malformed,  ///< anything else: `reason` says why
};

/// A parsed request. Views into the datagram: valid while it lives.
struct sip_message {
  std::string_view method;                       ///< "INVITE", "ACK", "BYE", ...
  std::string_view uri;                          ///< the Request-URI, verbatim
  std::array<std::string_view, max_vias> via{};  ///< Via values in order
  std::size_t via_count = 0;
  std::string_view from;       ///< From value, verbatim
  std::string_view from_user;  ///< user part of the From URI (the calling number)
  std::string_view from_tag;   ///< From tag parameter, empty when absent
  std::string_view to;         ///< To value, verbatim
  bool to_has_tag = false;     ///< the To value carries a tag (in-dialog request)
  std::string_view to_tag;     ///< To tag parameter, empty when absent
  std::string_view call_id;
  std::uint32_t cseq = 0;          ///< CSeq number, 0 .. 2^31 - 1
  std::string_view cseq_method;    ///< equal to `method`
  std::size_t content_length = 0;  ///< body bytes (whole rest when the header is absent)
  const char* reason = "";         ///< why the datagram is malformed
};

namespace detail {

[[nodiscard]] constexpr char lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

[[nodiscard]] constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

[[nodiscard]] constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// RFC 3261 "token" characters (methods, header names).
[[nodiscard]] constexpr bool is_token_char(char c) noexcept {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '-':
    case '.':
    case '!':
    case '%':
    case '*':
    case '_':
    case '+':
    case '`':
    case '\'':
    case '~': return true;
    default: return false;
  }
}

[[nodiscard]] constexpr bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_token_char(c)) return false;
  }
  return true;
}

/// Printable ASCII other than space and the URI/header delimiters.
[[nodiscard]] constexpr bool is_word_char(char c) noexcept {
  return c > ' ' && c < 0x7f && c != '<' && c != '>' && c != ';' && c != '@' && c != ',' &&
         c != '"';
}

[[nodiscard]] constexpr bool all_word_chars(std::string_view s) noexcept {
  for (char c : s) {
    if (!is_word_char(c)) return false;
  }
  return true;
}

/// Decimal digits to a value <= max; false for empty, non-digits or overflow.
[[nodiscard]] constexpr bool parse_number(std::string_view s, std::uint64_t max,
                                          std::uint64_t& out) noexcept {
  if (s.empty() || s.size() > 10) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v > max) return false;
  out = v;
  return true;
}

/// The value of parameter `name` (";tag=...") in `params`, a header's text
/// after its URI; `found` false when absent.
[[nodiscard]] constexpr std::string_view param(std::string_view params, std::string_view name,
                                               bool& found) noexcept {
  found = false;
  std::size_t i = 0;
  while (i < params.size()) {
    const std::size_t semi = params.find(';', i);
    if (semi == std::string_view::npos) break;
    std::size_t end = params.find(';', semi + 1);
    if (end == std::string_view::npos) end = params.size();
    const std::string_view p = trim(params.substr(semi + 1, end - semi - 1));
    const std::size_t eq = p.find('=');
    if (iequals(trim(p.substr(0, eq)), name)) {
      found = true;
      return eq == std::string_view::npos ? std::string_view{} : trim(p.substr(eq + 1));
    }
    i = end;
  }
  return {};
}

/// Splits a From/To value into its URI and the parameters after it:
/// `"Name" <sip:user@host>;tag=x` or `sip:user@host;tag=x`. False when the
/// angle brackets or quotes do not close.
[[nodiscard]] constexpr bool split_name_addr(std::string_view v, std::string_view& uri,
                                             std::string_view& params) noexcept {
  std::size_t i = 0;
  if (!v.empty() && v.front() == '"') {  // quoted display name
    i = 1;
    while (i < v.size() && v[i] != '"') i += (v[i] == '\\') ? 2 : 1;
    if (i >= v.size()) return false;
    ++i;
  }
  const std::size_t lt = v.find('<', i);
  if (lt != std::string_view::npos) {
    const std::size_t gt = v.find('>', lt + 1);
    if (gt == std::string_view::npos) return false;
    uri = v.substr(lt + 1, gt - lt - 1);
    params = v.substr(gt + 1);
    return true;
  }
  if (i != 0) return false;  // a display name needs <...>
  const std::size_t semi = v.find(';');
  uri = trim(v.substr(0, semi));
  params = semi == std::string_view::npos ? std::string_view{} : v.substr(semi);
  return true;
}

/// The user part of a sip:, sips: or tel: URI (without a password or user
/// parameters); empty when it has none.
[[nodiscard]] constexpr std::string_view uri_user(std::string_view uri) noexcept {
  std::string_view rest;
  if (uri.size() > 4 && iequals(uri.substr(0, 4), "sip:")) {
    rest = uri.substr(4);
  } else if (uri.size() > 5 && iequals(uri.substr(0, 5), "sips:")) {
    rest = uri.substr(5);
  } else if (uri.size() > 4 && iequals(uri.substr(0, 4), "tel:")) {
    rest = uri.substr(4);
    return rest.substr(0, rest.find(';'));
  } else {
    return {};
  }
  const std::size_t at = rest.find('@');
  if (at == std::string_view::npos) return {};  // sip:host, no user
  std::string_view user = rest.substr(0, at);
  user = user.substr(0, user.find(':'));  // userinfo = user [":" password]
  return user.substr(0, user.find(';'));  // user parameters are not part of the number
}

}  // namespace detail

/// Parses one datagram. Never throws; on `malformed`, `m.reason` says why.
[[nodiscard]] inline parse_result parse(std::string_view d, sip_message& m) noexcept {
  using namespace detail;
  m = sip_message{};
  const auto bad = [&m](const char* why) {
    m.reason = why;
    return parse_result::malformed;
  };
  if (d.empty()) return bad("empty datagram");
  if (d.size() > max_datagram) return bad("datagram too large");
  const std::size_t head_end = d.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return bad("no end of headers (truncated?)");
  const std::string_view head = d.substr(0, head_end + 2);  // every line ends in CRLF
  const std::string_view body = d.substr(head_end + 4);
  for (std::size_t i = 0; i < head.size(); ++i) {
    const char c = head[i];
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\r' && c != '\n') || u == 0x7f) {
      return bad("control byte in the headers");
    }
    // A CR or LF outside a CRLF pair would stay inside a header value and be
    // echoed into the response (a header of the sender's making).
    if ((c == '\r' && (i + 1 == head.size() || head[i + 1] != '\n')) ||
        (c == '\n' && (i == 0 || head[i - 1] != '\r'))) {
      return bad("bare CR or LF in the headers");
    }
  }

  std::size_t pos = 0;
  const auto next_line = [&](std::string_view& line) {
    const std::size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) return false;
    line = head.substr(pos, e - pos);
    pos = e + 2;
    return true;
  };

  std::string_view start;
  if (!next_line(start) || start.empty()) return bad("empty start line");
  if (start.substr(0, 8) == "SIP/2.0 ") return parse_result::response;
  const std::size_t sp1 = start.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : start.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || start.substr(sp2 + 1) != "SIP/2.0") {
    return bad("start line is not 'METHOD URI SIP/2.0'");
  }
  m.method = start.substr(0, sp1);
  m.uri = start.substr(sp1 + 1, sp2 - sp1 - 1);
  if (!is_token(m.method)) return bad("bad method");
  if (m.uri.empty() || m.uri.find(' ') != std::string_view::npos) return bad("bad Request-URI");

  bool have_cl = false;
  std::size_t headers = 0;
  std::string_view line;
  while (next_line(line)) {
    if (line.empty()) break;
    if (++headers > max_headers) return bad("too many headers");
    if (line.front() == ' ' || line.front() == '\t') return bad("folded header line");
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) return bad("header line without ':'");
    const std::string_view name = trim(line.substr(0, colon));
    const std::string_view value = trim(line.substr(colon + 1));
    if (!is_token(name)) return bad("bad header name");
    if (iequals(name, "Via") || iequals(name, "v")) {
      if (value.empty()) return bad("empty Via");
      if (m.via_count == max_vias) return bad("too many Via headers");
      m.via[m.via_count++] = value;
    } else if (iequals(name, "From") || iequals(name, "f")) {
      if (!m.from.empty()) return bad("two From headers");
      if (value.empty()) return bad("empty From");
      m.from = value;
    } else if (iequals(name, "To") || iequals(name, "t")) {
      if (!m.to.empty()) return bad("two To headers");
      if (value.empty()) return bad("empty To");
      m.to = value;
    } else if (iequals(name, "Call-ID") || iequals(name, "i")) {
      if (!m.call_id.empty()) return bad("two Call-ID headers");
      if (value.empty() || value.size() > max_call_id) return bad("Call-ID empty or too long");
      if (value.find_first_of(" \t") != std::string_view::npos) return bad("Call-ID with spaces");
      m.call_id = value;
    } else if (iequals(name, "CSeq")) {
      if (!m.cseq_method.empty()) return bad("two CSeq headers");
      const std::size_t sp = value.find_first_of(" \t");
      if (sp == std::string_view::npos) return bad("CSeq without a method");
      std::uint64_t n = 0;
      if (!parse_number(value.substr(0, sp), 0x7fffffffu, n)) return bad("bad CSeq number");
      m.cseq = static_cast<std::uint32_t>(n);
      m.cseq_method = trim(value.substr(sp + 1));
      if (m.cseq_method.empty()) return bad("CSeq without a method");
    } else if (iequals(name, "Content-Length") || iequals(name, "l")) {
      if (have_cl) return bad("two Content-Length headers");
      std::uint64_t n = 0;
      if (!parse_number(value, max_datagram, n)) return bad("bad Content-Length");
      have_cl = true;
      m.content_length = static_cast<std::size_t>(n);
    }
  }

  if (m.via_count == 0) return bad("no Via");
  if (m.from.empty()) return bad("no From");
  if (m.to.empty()) return bad("no To");
  if (m.call_id.empty()) return bad("no Call-ID");
  if (m.cseq_method.empty()) return bad("no CSeq");
  if (m.cseq_method != m.method) return bad("CSeq method differs from the request method");
  if (have_cl) {
    if (m.content_length > body.size()) return bad("body shorter than Content-Length (truncated)");
  } else {
    m.content_length = body.size();
  }

  std::string_view uri;
  std::string_view params;
  if (!split_name_addr(m.from, uri, params)) return bad("bad From");
  m.from_user = uri_user(uri);
  if (m.from_user.empty() || m.from_user.size() > max_user || !all_word_chars(m.from_user)) {
    return bad("From has no usable user part");
  }
  bool found = false;
  m.from_tag = param(params, "tag", found);
  if (m.from_tag.size() > max_tag || !all_word_chars(m.from_tag)) return bad("bad From tag");
  if (!split_name_addr(m.to, uri, params)) return bad("bad To");
  m.to_tag = param(params, "tag", m.to_has_tag);
  if (m.to_tag.size() > max_tag || !all_word_chars(m.to_tag)) return bad("bad To tag");
  return parse_result::request;
}

}  // namespace sipfd
