// SPDX-License-Identifier: Apache-2.0
// Reads a replay trace (timestamp,key[,cost[,label]]) event by event, validating every line.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "csv.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/rate.hpp"
#include "timestamp.hpp"

namespace ratelimit::replay {

/// One event of a trace. `key` is valid until the next read.
struct event {
  std::int64_t ts_us = 0;  ///< microseconds since the Unix epoch
  std::string_view key;    ///< 1..512 bytes, exactly as in the file (quotes removed)
  units cost = 1;          ///< 1..2^50; omitted or empty = 1
  signed char label = -1;  ///< 1 = abusive, 0 = normal, -1 = not labelled
  std::size_t line = 0;    ///< physical line (1-based) on which the event starts
};

/// A bad line: its physical line number and what is wrong with it.
class input_error : public std::runtime_error {
 public:
  input_error(std::size_t line, const std::string& what)
      : std::runtime_error("line " + std::to_string(line) + ": " + what), line_(line) {}
  [[nodiscard]] std::size_t line() const noexcept { return line_; }

 private:
  std::size_t line_;
};

/// Quotes a field for an error message: at most 60 bytes, control bytes and
/// byte-order marks (invisible in a terminal) escaped.
[[nodiscard]] inline std::string show_field(std::string_view s) {
  std::string out = "\"";
  const std::size_t n = s.size() > 60 ? 60 : s.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (s.substr(i, 3) == "\xef\xbb\xbf") {
      out += "\\ufeff";
      i += 2;
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += s.size() > n ? "\"..." : "\"";
  return out;
}

/// True when `field`, the first field of the first record, names a column
/// rather than attempts a timestamp: it starts with an ASCII letter or an
/// underscore. Anything else (a digit, a sign, a space, a dot, a byte-order
/// mark, any other byte, or nothing) is a timestamp attempt, so a first line
/// such as ` 1000000`, `+100` or `2026-11-30T04:52:46+01:00` is reported as a
/// bad timestamp instead of being dropped as a header.
[[nodiscard]] constexpr bool is_header_name(std::string_view field) noexcept {
  if (field.empty()) return false;
  const char c = field.front();
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

/// Reads events from a trace in the replay format.
///
/// - A UTF-8 byte-order mark at the start of the input is skipped.
/// - A first record whose first field is a column name (`is_header_name`) is a
///   header and is skipped; any other first record must be a valid event.
/// - Each event has 2 to 4 fields: timestamp, key, cost (empty or omitted = 1), label (0/1,
///   empty or omitted = unlabelled).
/// - A bad line throws `input_error`, or, with `skip_bad_lines`, is skipped and
///   every physical line it took (a multi-line quoted record takes several) is
///   counted.
///
/// Thread safety: one reader per thread.
class trace_reader {
 public:
  explicit trace_reader(std::istream& in, bool skip_bad_lines = false,
                        std::size_t chunk_size = std::size_t{1} << 20)
      : csv_(in, chunk_size), skip_(skip_bad_lines) {}

  /// Makes a timestamp after `max_us` a bad line, for a store that cannot
  /// take the parser's whole range; `why` ends the message (say which store
  /// and why).
  void limit_timestamps(std::int64_t max_us, std::string why) {
    max_ts_ = max_us;
    max_ts_why_ = std::move(why);
  }

  /// Reads the next event; false at the end of the input.
  /// @throws input_error for a bad line unless skipping bad lines
  bool next(event& e) {
    for (;;) {
      const csv_reader::status st = csv_.next();
      if (st == csv_reader::status::end) return false;
      if (st == csv_reader::status::error) {
        first_ = false;
        bad(csv_.error());
        continue;
      }
      const bool first = first_;
      first_ = false;
      if (first && is_header_name(csv_.field(0))) {
        header_line_ = csv_.line();
        continue;
      }
      const char* why = convert(e);
      if (why == nullptr) return true;
      bad(message_);
    }
  }

  /// Physical lines skipped as bad (with skip_bad_lines).
  [[nodiscard]] std::size_t skipped() const noexcept { return skipped_; }
  /// Line of the header, or 0 if the file has none.
  [[nodiscard]] std::size_t header_line() const noexcept { return header_line_; }
  /// First bad line skipped and its message (with skip_bad_lines), for a summary.
  [[nodiscard]] const std::string& first_skipped() const noexcept { return first_skipped_; }
  /// Bytes held by the reader itself.
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return csv_.memory_bytes(); }

 private:
  /// Reports the current record as bad: throws, or counts every physical line it took.
  void bad(const std::string& why) {
    const std::size_t line = csv_.line();
    if (!skip_) throw input_error(line, why);
    if (skipped_ == 0) first_skipped_ = "line " + std::to_string(line) + ": " + why;
    skipped_ += std::max<std::size_t>(csv_.next_line() - line, 1);
  }

  /// Fills `e` from the current record; nullptr on success, else sets message_.
  const char* convert(event& e) {
    const std::size_t n = csv_.field_count();
    const std::string_view ts = csv_.field(0);
    if (const char* why = parse_timestamp(ts, e.ts_us)) {
      message_ = "bad timestamp " + show_field(ts) + ": " + why;
      return message_.c_str();
    }
    if (e.ts_us > max_ts_) {
      message_ = "timestamp " + show_field(ts) + " (" + std::to_string(e.ts_us) + " us) is after " +
                 std::to_string(max_ts_) + " us, " + max_ts_why_;
      return message_.c_str();
    }
    if (n < 2 || n > 4) {
      message_ = "expected 2 to 4 fields (timestamp,key[,cost[,label]]), found " +
                 std::to_string(n);
      return message_.c_str();
    }
    e.key = csv_.field(1);
    if (e.key.empty()) {
      message_ = "empty key";
      return message_.c_str();
    }
    if (e.key.size() > max_key_bytes) {
      message_ = "key of " + std::to_string(e.key.size()) + " bytes exceeds the maximum of " +
                 std::to_string(max_key_bytes) + " bytes";
      return message_.c_str();
    }
    e.cost = 1;
    if (n >= 3 && !csv_.field(2).empty()) {
      const std::string_view c = csv_.field(2);
      std::size_t i = 0;
      std::int64_t v = 0;
      if (!ratelimit::detail::parse_digits(c, i, max_units, v) || i != c.size() || v < 1) {
        message_ = "bad cost " + show_field(c) + ": expected a whole number from 1 to " +
                   std::to_string(max_units);
        return message_.c_str();
      }
      e.cost = v;
    }
    e.label = -1;
    if (n >= 4 && !csv_.field(3).empty()) {
      const std::string_view l = csv_.field(3);
      if (l != "0" && l != "1") {
        message_ = "bad label " + show_field(l) + ": expected 0 (normal) or 1 (abusive)";
        return message_.c_str();
      }
      e.label = static_cast<signed char>(l[0] - '0');
    }
    e.line = csv_.line();
    return nullptr;
  }

  csv_reader csv_;
  bool skip_;
  bool first_ = true;
  std::int64_t max_ts_ = max_timestamp_us;
  std::string max_ts_why_;
  std::size_t header_line_ = 0;
  std::size_t skipped_ = 0;
  std::string message_;
  std::string first_skipped_;
};

}  // namespace ratelimit::replay
