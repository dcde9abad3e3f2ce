// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the replay tool's streaming CSV reader and trace reader, chunked against unchunked.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "csv.hpp"
#include "fuzz_check.hpp"
#include "trace.hpp"

namespace {

namespace rp = ratelimit::replay;

/// What one call of csv_reader::next() reported.
struct outcome {
  rp::csv_reader::status st;
  std::size_t line;
  std::size_t count;
  std::vector<std::string> fields;
  std::string error;
  bool operator==(const outcome&) const = default;
};

std::vector<outcome> read_all(std::string_view text, std::size_t chunk) {
  std::istringstream in{std::string(text)};
  rp::csv_reader reader(in, chunk);
  std::vector<outcome> out;
  for (;;) {
    outcome o{reader.next(), reader.line(), reader.field_count(), {}, {}};
    if (o.st == rp::csv_reader::status::end) break;
    if (o.st == rp::csv_reader::status::record) {
      RATELIMIT_FUZZ_CHECK(o.count >= 1, "a record without fields");
      const std::size_t kept = o.count < rp::csv_reader::max_fields ? o.count
                                                                    : rp::csv_reader::max_fields;
      for (std::size_t i = 0; i < kept; ++i) {
        const std::string_view f = reader.field(i);
        RATELIMIT_FUZZ_CHECK(f.size() <= text.size(), "a field longer than the input");
        // A field without a quote is a verbatim slice of the input; anything
        // else means the reader read outside what it was given.
        if (f.find('"') == std::string_view::npos && !f.empty()) {
          RATELIMIT_FUZZ_CHECK(text.find(f) != std::string_view::npos,
                               "a field that is not in the input");
        }
        o.fields.emplace_back(f);
      }
    } else {
      RATELIMIT_FUZZ_CHECK(!reader.error().empty(), "an error without a message");
    }
    RATELIMIT_FUZZ_CHECK(o.line >= 1 && o.line <= text.size() + 1, "line number out of range");
    out.push_back(std::move(o));
    RATELIMIT_FUZZ_CHECK(out.size() <= text.size() + 1, "more results than input bytes");
  }
  return out;
}

}  // namespace

// The first byte picks the chunk size (2 .. 65 bytes); the rest is the CSV.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 2 + data[0] % 64;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  // Chunk boundaries must not change a single field, line number or error.
  const std::vector<outcome> whole = read_all(text, text.size() + 2);
  const std::vector<outcome> chunked = read_all(text, chunk);
  RATELIMIT_FUZZ_CHECK(whole == chunked, "chunked reading differs from reading all at once");

  // The trace reader on top: every event it accepts is valid.
  std::istringstream in{std::string(text)};
  rp::trace_reader trace(in, /*skip_bad_lines=*/true, chunk);
  rp::event e;
  std::size_t events = 0;
  while (trace.next(e)) {
    RATELIMIT_FUZZ_CHECK(e.ts_us >= 0 && e.ts_us <= rp::max_timestamp_us,
                         "event time out of range");
    RATELIMIT_FUZZ_CHECK(!e.key.empty() && e.key.size() <= text.size(), "bad event key");
    RATELIMIT_FUZZ_CHECK(e.cost >= 1 && e.cost <= ratelimit::max_units, "event cost out of range");
    RATELIMIT_FUZZ_CHECK(e.label >= -1 && e.label <= 1, "event label out of range");
    RATELIMIT_FUZZ_CHECK(e.line >= 1 && e.line <= text.size() + 1, "event line out of range");
    RATELIMIT_FUZZ_CHECK(++events <= text.size(), "more events than input bytes");
  }
  return 0;
}
