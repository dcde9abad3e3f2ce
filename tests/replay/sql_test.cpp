// SPDX-License-Identifier: Apache-2.0
// Checks docs/replay.md: the SQL window query flags exactly the calls the sliding log rejects
// under --count-rejected with cost 1, on generated traces, in SQLite.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gen_trace.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "replay.hpp"

namespace {

using namespace ratelimit;
using namespace ratelimit::replay;

struct db_closer {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
using db_ptr = std::unique_ptr<sqlite3, db_closer>;

struct row {
  std::int64_t ts;
  std::string key;
  std::int64_t cost;
};

/// Loads rows into SQLite (seq = input order) and returns, per row, the query's 0/1 flag.
std::vector<int> sql_flags(const std::vector<row>& rows, const std::string& query) {
  sqlite3* raw = nullptr;
  EXPECT_EQ(sqlite3_open(":memory:", &raw), SQLITE_OK);
  db_ptr db(raw);
  char* msg = nullptr;
  EXPECT_EQ(sqlite3_exec(db.get(),
                         "create table calls(seq integer primary key, ts integer not null, "
                         "key blob not null, cost integer not null);",
                         nullptr, nullptr, &msg),
            SQLITE_OK);
  sqlite3_exec(db.get(), "begin", nullptr, nullptr, nullptr);
  sqlite3_stmt* ins = nullptr;
  sqlite3_prepare_v2(db.get(), "insert into calls(seq, ts, key, cost) values(?, ?, ?, ?)", -1, &ins,
                     nullptr);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    sqlite3_bind_int64(ins, 1, static_cast<sqlite3_int64>(i));
    sqlite3_bind_int64(ins, 2, rows[i].ts);
    sqlite3_bind_blob(ins, 3, rows[i].key.data(), static_cast<int>(rows[i].key.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(ins, 4, rows[i].cost);
    EXPECT_EQ(sqlite3_step(ins), SQLITE_DONE);
    sqlite3_reset(ins);
  }
  sqlite3_finalize(ins);
  sqlite3_exec(db.get(), "commit", nullptr, nullptr, nullptr);
  sqlite3_stmt* q = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db.get(), query.c_str(), -1, &q, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db.get());
  std::vector<int> flags(rows.size(), -1);
  while (sqlite3_step(q) == SQLITE_ROW) {
    flags[static_cast<std::size_t>(sqlite3_column_int64(q, 0))] = sqlite3_column_int(q, 1);
  }
  sqlite3_finalize(q);
  return flags;
}

/// The query of docs/replay.md: 1 where the calls in (ts - W, ts] exceed the limit.
std::string window_query(std::int64_t w_us, units limit, const char* measure = "count(*)") {
  return "select seq, " + std::string(measure) +
         " over (partition by key order by ts range between " + std::to_string(w_us - 1) +
         " preceding and current row) > " + std::to_string(limit) + " from calls";
}

/// The tie-exact variant: peers (same key, same microsecond) count only if earlier in the file.
std::string tie_exact_query(std::int64_t w_us, units limit) {
  return "select seq, count(*) over (partition by key order by ts range between " +
         std::to_string(w_us - 1) +
         " preceding and current row exclude ties) + row_number() over (partition by key, ts "
         "order by seq) - 1 > " +
         std::to_string(limit) + " from calls";
}

/// 1 where the sliding log (count_rejected as given) rejects, in input order.
std::vector<int> log_flags(const std::vector<row>& rows, const rate& r, bool count_rejected) {
  const sliding_window_log::config cfg(r, window_options{count_rejected});
  memory_store<sliding_window_log> store;
  std::vector<int> flags;
  for (const row& x : rows) {
    flags.push_back(store.apply(cfg, x.key, timestamp{x.ts}, x.cost, access::consume).allowed ? 0
                                                                                              : 1);
  }
  return flags;
}

std::vector<row> generated(std::uint64_t seed) {
  gen_options o;
  o.seed = seed;
  o.subscribers = 400;
  o.calls_per_day = 12;
  o.call_centres = 3;
  o.robocallers = 4;
  o.edge_bursters = 2;
  const gen_trace t = generate_trace(o);
  std::vector<row> rows;
  for (const gen_event& e : t.events) rows.push_back({e.ts_us, t.keys[e.key], 1});
  return rows;
}

std::size_t ones(const std::vector<int>& v) {
  std::size_t n = 0;
  for (const int x : v) n += x == 1 ? 1 : 0;
  return n;
}

// Verifies the documented agreement on generated traces, at several limits and windows,
// including window edges where a call lands exactly W after another.
TEST(SqlWindowQuery, AgreesWithSlidingLogUnderCountRejected) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    std::vector<row> rows = generated(seed);
    // Calls exactly W and W - 1us after another, to pin the frame's edge.
    rows.push_back({rows.back().ts + 1, "edge", 1});
    rows.push_back({rows.back().ts + 900'000'000, "edge", 1});
    rows.push_back({rows.back().ts + 899'999'999, "edge", 1});
    for (const char* rt : {"3/1min", "10/15min", "25/15min", "1/1h"}) {
      const rate r = rate::parse(rt);
      const auto sql = sql_flags(rows, window_query(r.period().count(), r.limit()));
      const auto log = log_flags(rows, r, true);
      EXPECT_GT(ones(log), 0u) << rt;
      EXPECT_EQ(sql, log) << "seed " << seed << ", rate " << rt;
    }
  }
}

TEST(SqlWindowQuery, ExactEdge) {
  // 1 per 10 s: a call exactly 10 s after the first is admitted, 1 us earlier it is not.
  const std::vector<row> rows = {{0, "k", 1},
                                 {9'999'999, "k", 1},
                                 {10'000'000, "k", 1},
                                 {19'999'999, "k", 1},
                                 {29'999'999, "k", 1}};
  const rate r = rate::parse("1/10s");
  EXPECT_EQ(log_flags(rows, r, true), (std::vector<int>{0, 1, 1, 1, 0}));
  EXPECT_EQ(sql_flags(rows, window_query(10'000'000, 1)), (std::vector<int>{0, 1, 1, 1, 0}));
}

// Verifies where the plain query and the log part ways, as docs/replay.md says.
TEST(SqlWindowQuery, DisagreesWhereDocumented) {
  const rate r = rate::parse("2/10s");
  // Two calls of one key in the same microsecond: the frame counts both peers for both rows.
  const std::vector<row> ties = {{0, "k", 1}, {5, "k", 1}, {5, "k", 1}};
  EXPECT_EQ(log_flags(ties, r, true), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(sql_flags(ties, window_query(10'000'000, 2)), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(sql_flags(ties, tie_exact_query(10'000'000, 2)), (std::vector<int>{0, 0, 1}));
  // Without count_rejected the log forgets rejected attempts; the query never does.
  const std::vector<row> steady = {
      {0, "k", 1}, {4'000'000, "k", 1}, {8'000'000, "k", 1}, {12'000'000, "k", 1}};
  EXPECT_EQ(log_flags(steady, r, false), (std::vector<int>{0, 0, 1, 0}));
  EXPECT_EQ(sql_flags(steady, window_query(10'000'000, 2)), (std::vector<int>{0, 0, 1, 1}));
  // A key's calls out of time order: the log decides at its newest entry, SQL sorts.
  const std::vector<row> backwards = {{20'000'000, "k", 1}, {0, "k", 1}, {1, "k", 1}};
  EXPECT_EQ(log_flags(backwards, rate::parse("1/10s"), true), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(sql_flags(backwards, window_query(10'000'000, 1)), (std::vector<int>{0, 0, 1}));
}

// Verifies the cost variant: with costs, sum(cost) replaces count(*).
TEST(SqlWindowQuery, SumOfCostsAgreesUnderCountRejected) {
  std::vector<row> rows = generated(7);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i].cost = 1 + static_cast<std::int64_t>(i % 3);
  const rate r = rate::parse("12/15min");
  EXPECT_EQ(sql_flags(rows, window_query(r.period().count(), r.limit(), "sum(cost)")),
            log_flags(rows, r, true));
}

}  // namespace
