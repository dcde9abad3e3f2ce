// SPDX-License-Identifier: Apache-2.0
// A streaming RFC 4180 CSV record reader with physical line numbers, and a field writer.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ratelimit::replay {

/// Reads CSV records from a stream in constant memory (one chunk, grown only
/// for a record longer than it).
///
/// Dialect (RFC 4180 plus what logs need):
/// - Fields are separated by `,`; records end at LF or CRLF (a CR before LF is
///   not data; a lone CR elsewhere is).
/// - A field that starts with `"` is quoted: it may hold commas, CR, LF
///   (the record then spans several physical lines) and `""` for one quote.
///   After the closing quote only `,` or the end of the record may follow.
/// - A `"` inside an unquoted field is an error (quote the whole field), so
///   every field has one meaning.
/// - A NUL byte anywhere is an error: text CSV cannot carry it, and it usually
///   means the file is not text at all (UTF-16, binary).
/// - Whole lines starting with `#` are comments; empty lines are skipped. Both
///   still count as physical lines.
/// - A UTF-8 byte-order mark (EF BB BF) at the very start of the input is not
///   data (spreadsheets write one); anywhere else it is.
/// - A record longer than `max_record_bytes` is an error, so that a stray
///   quote cannot make the reader hold the rest of the input in memory.
/// Nothing is trimmed.
///
/// Thread safety: one reader per thread.
class csv_reader {
 public:
  /// At most this many fields are kept per record; `field_count()` still counts all.
  static constexpr std::size_t max_fields = 8;

  enum class status { record, end, error };

  /// Default `max_record_bytes`: far above any valid replay record (a key is
  /// at most 512 bytes), far below what would strain memory.
  static constexpr std::size_t default_max_record_bytes = std::size_t{1} << 20;

  /// @param in               the stream; read in binary chunks
  /// @param chunk_size       bytes read at once (small values exercise chunk boundaries in tests)
  /// @param max_record_bytes longest record accepted (at least 2)
  explicit csv_reader(std::istream& in, std::size_t chunk_size = std::size_t{1} << 20,
                      std::size_t max_record_bytes = default_max_record_bytes)
      : in_(in),
        buf_(std::max<std::size_t>(chunk_size, 2)),
        max_record_(std::max<std::size_t>(max_record_bytes, 2)) {}

  /// Reads the next record. Its fields stay valid until the next call.
  /// On `status::error`, `error()` says why and `line()` is the record's first
  /// line. The reader then goes on after the physical line where the error was
  /// found, except for a quoted field that never closes (at the end of the
  /// input, or within `max_record_bytes`): it goes on at the line after the
  /// one where that field opened, since nothing after it can be trusted to be
  /// part of the field. `next_line() - line()` is the number of physical lines
  /// the bad record took with it.
  /// @throws std::runtime_error when the stream reports a read error
  status next() {
    for (;;) {
      const parse_result r = parse(pos_);
      if (r == parse_result::need_more) {
        if (end_ - pos_ >= max_record_) return too_long();
        fill();
        continue;
      }
      if (r == parse_result::skip) continue;
      if (r == parse_result::end) return status::end;
      return r == parse_result::record ? status::record : status::error;
    }
  }

  /// Physical line (1-based) on which the last record or error started.
  [[nodiscard]] std::size_t line() const noexcept { return record_line_; }
  /// Physical line on which the next record will start: one past the last
  /// line the last record (or bad record) took.
  [[nodiscard]] std::size_t next_line() const noexcept { return line_; }
  /// Fields of the last record (at most max_fields).
  [[nodiscard]] const std::string_view* fields() const noexcept { return fields_.data(); }
  [[nodiscard]] std::string_view field(std::size_t i) const noexcept { return fields_[i]; }
  /// Number of fields in the last record (may exceed max_fields).
  [[nodiscard]] std::size_t field_count() const noexcept { return count_; }
  /// Why the last record failed.
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  /// Bytes held by the reader (its chunk buffer and unescaping scratch).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t n = buf_.capacity();
    for (const auto& s : scratch_) n += s.capacity();
    return n;
  }

 private:
  enum class parse_result { record, skip, error, end, need_more };

  /// Moves the unread tail to the front and reads more; grows the buffer when
  /// one record fills it.
  void fill() {
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
    in_.read(buf_.data() + end_, static_cast<std::streamsize>(buf_.size() - end_));
    const auto got = static_cast<std::size_t>(in_.gcount());
    end_ += got;
    // A read error (EIO, a directory opened as a file) also ends the data;
    // taken for the end, it would replay a truncated or empty log as a
    // success.
    if (in_.bad()) throw std::runtime_error("cannot read the input (a read error, or a directory)");
    if (got == 0) eof_ = true;
  }

  parse_result fail(std::size_t at, std::string why) {
    error_ = std::move(why);
    if (err_line_ != record_line_) error_ += " (on line " + std::to_string(err_line_) + ")";
    // Resume after the end of the physical line where the error was found.
    const char* nl = static_cast<const char*>(std::memchr(buf_.data() + at, '\n', end_ - at));
    pos_ = nl != nullptr ? static_cast<std::size_t>(nl - buf_.data()) + 1 : end_;
    line_ = err_line_ + 1;
    if (nl == nullptr && !eof_) skipping_ = true;
    return parse_result::error;
  }

  /// Drops the current record's first physical line only and goes on at the
  /// next one: for a quoted field that never closes, where the lines after
  /// the opening quote are better read as records of their own.
  parse_result fail_first_line(std::string why) {
    error_ = std::move(why);
    const char* nl = static_cast<const char*>(std::memchr(buf_.data() + pos_, '\n', end_ - pos_));
    if (nl != nullptr) {
      pos_ = static_cast<std::size_t>(nl - buf_.data()) + 1;
    } else {
      pos_ = end_;
      if (!eof_) skipping_ = true;
    }
    line_ = record_line_ + 1;
    return parse_result::error;
  }

  /// The record at pos_ has reached max_record_ bytes without ending.
  status too_long() {
    const bool quoted = std::memchr(buf_.data() + pos_, '\n', end_ - pos_) != nullptr;
    fail_first_line(quoted ? "a quoted field runs on for more than " + std::to_string(max_record_) +
                                 " bytes (is its closing quote missing?)"
                           : "line longer than " + std::to_string(max_record_) + " bytes");
    return status::error;
  }

  /// Parses one record starting at p, or reports that more input is needed.
  parse_result parse(std::size_t p) {
    const char* b = buf_.data();
    if (!bom_checked_) {
      if (end_ - p < 3 && !eof_) return parse_result::need_more;
      bom_checked_ = true;
      if (end_ - p >= 3 && std::memcmp(b + p, "\xef\xbb\xbf", 3) == 0) {
        pos_ = p + 3;
        return parse_result::skip;
      }
    }
    if (skipping_) {  // the rest of a bad line that did not fit in the buffer
      const char* nl = static_cast<const char*>(std::memchr(b + p, '\n', end_ - p));
      if (nl == nullptr) {
        pos_ = end_;
        return eof_ ? parse_result::end : parse_result::need_more;
      }
      pos_ = static_cast<std::size_t>(nl - b) + 1;
      skipping_ = false;
      return parse_result::skip;
    }
    if (p == end_) return eof_ ? parse_result::end : parse_result::need_more;
    std::size_t line = line_;
    record_line_ = line_;
    err_line_ = line_;
    // Comments and empty lines.
    if (b[p] == '#' || b[p] == '\n' || (b[p] == '\r' && p + 1 < end_ && b[p + 1] == '\n')) {
      const char* nl = static_cast<const char*>(std::memchr(b + p, '\n', end_ - p));
      if (nl == nullptr) {
        // The rest of a long comment is skipped chunk by chunk, never held.
        if (!eof_) skipping_ = true;
        pos_ = end_;
      } else {
        pos_ = static_cast<std::size_t>(nl - b) + 1;
      }
      ++line_;
      return parse_result::skip;
    }
    if (b[p] == '\r' && p + 1 == end_ && !eof_) return parse_result::need_more;
    count_ = 0;
    for (;;) {
      std::string_view value;
      if (p < end_ && b[p] == '"') {
        // Quoted field: find the closing quote, unescaping "" on the way.
        const std::size_t start = p + 1;
        std::size_t q = start;
        bool escaped = false;
        for (;;) {
          while (q < end_ && b[q] != '"' && b[q] != '\n' && b[q] != '\0') ++q;
          if (q == end_) {
            if (!eof_) return parse_result::need_more;
            return fail_first_line("unterminated quoted field (opened on line " +
                                   std::to_string(record_line_) + ")");
          }
          if (b[q] == '\0') {
            err_line_ = line;
            return fail(q, nul_message());
          }
          if (b[q] == '\n') {
            ++line;
            ++q;
            continue;
          }
          if (q + 1 == end_ && !eof_) return parse_result::need_more;
          if (q + 1 < end_ && b[q + 1] == '"') {
            escaped = true;
            q += 2;
            continue;
          }
          break;
        }
        value = std::string_view(b + start, q - start);
        p = q + 1;
        if (escaped && count_ < max_fields) {
          std::string& s = scratch_[count_];
          s.clear();
          for (std::size_t i = 0; i < value.size(); ++i) {
            s += value[i];
            if (value[i] == '"') ++i;
          }
          value = s;
        }
        if (p < end_ && b[p] != ',' && b[p] != '\n' && b[p] != '\r') {
          err_line_ = line;
          return fail(p,
                      "unexpected character after a closing quote (a quoted field must end "
                      "at a comma or the end of the line)");
        }
        if (p < end_ && b[p] == '\r') {
          if (p + 1 == end_ && !eof_) return parse_result::need_more;
          if (p + 1 < end_ && b[p + 1] != '\n') {
            err_line_ = line;
            return fail(p, "unexpected character after a closing quote");
          }
        }
      } else {
        const std::size_t start = p;
        p = find_special(b, p, end_);
        if (p == end_ && !eof_) return parse_result::need_more;
        if (p < end_ && b[p] == '"') {
          err_line_ = line;
          return fail(p,
                      "a quote inside an unquoted field (quote the whole field and double "
                      "the quote)");
        }
        if (p < end_ && b[p] == '\0') {
          err_line_ = line;
          return fail(p, nul_message());
        }
        std::size_t stop = p;
        if (p < end_ && b[p] == '\n' && stop > start && b[stop - 1] == '\r') --stop;
        value = std::string_view(b + start, stop - start);
      }
      if (count_ < max_fields) fields_[count_] = value;
      ++count_;
      if (p < end_ && b[p] == ',') {
        ++p;
        continue;
      }
      if (p < end_ && b[p] == '\r') ++p;  // CRLF after a quoted field
      if (p < end_ && b[p] == '\n') {
        ++p;
        ++line;
      } else if (p == end_) {
        ++line;  // last line without a newline
      }
      pos_ = p;
      line_ = line;
      return parse_result::record;
    }
  }

  /// First position at or after p holding ',', LF, '"' or NUL (end if none).
  /// Eight bytes at a time on little-endian machines: each test flags the
  /// lowest matching byte exactly (false flags can only sit above a true one),
  /// so the lowest flag of their union is the first special byte.
  static std::size_t find_special(const char* b, std::size_t p, std::size_t end) noexcept {
    if constexpr (std::endian::native == std::endian::little) {
      constexpr std::uint64_t ones = 0x0101010101010101u;
      constexpr std::uint64_t highs = 0x8080808080808080u;
      const auto zero = [](std::uint64_t v) noexcept { return (v - ones) & ~v & highs; };
      while (end - p >= 8) {
        std::uint64_t x = 0;
        std::memcpy(&x, b + p, 8);
        const std::uint64_t m = zero(x ^ (ones * ',')) | zero(x ^ (ones * '\n')) |
                                zero(x ^ (ones * '"')) | zero(x);
        if (m != 0) return p + static_cast<std::size_t>(std::countr_zero(m)) / 8;
        p += 8;
      }
    }
    while (p < end && b[p] != ',' && b[p] != '\n' && b[p] != '"' && b[p] != '\0') ++p;
    return p;
  }

  static std::string nul_message() {
    return "NUL byte in the input (text CSV cannot carry NUL; is the file UTF-16 or binary?)";
  }

  std::istream& in_;
  std::vector<char> buf_;
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
  std::size_t max_record_;
  bool eof_ = false;
  bool skipping_ = false;
  bool bom_checked_ = false;
  std::size_t line_ = 1;         ///< physical line at pos_
  std::size_t record_line_ = 1;  ///< first line of the last record
  std::size_t err_line_ = 1;     ///< line where the last error was found
  std::array<std::string_view, max_fields> fields_{};
  std::array<std::string, max_fields> scratch_{};
  std::size_t count_ = 0;
  std::string error_;
};

/// True when `s` must be quoted to parse back to itself under the reader's dialect.
[[nodiscard]] inline bool csv_needs_quotes(std::string_view s) noexcept {
  for (const char c : s) {
    if (c == ',' || c == '"' || c == '\n' || c == '\r') return true;
  }
  // A leading '#' would read as a comment if the field started a line.
  return !s.empty() && s.front() == '#';
}

/// Appends `s` as one CSV field, quoted per RFC 4180 when needed.
inline void append_csv_field(std::string& out, std::string_view s) {
  if (!csv_needs_quotes(s)) {
    out.append(s);
    return;
  }
  out += '"';
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

}  // namespace ratelimit::replay
