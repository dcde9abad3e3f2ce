// SPDX-License-Identifier: Apache-2.0
// Tests of cli.hpp in process: argument parsing, exit codes, and no partial output on bad input.
#include "cli.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using ratelimit::replay::run_replay;

struct result {
  int status;
  std::string out;
  std::string err;
};

result run(const std::vector<std::string>& args, const std::string& std_in = "") {
  std::istringstream in(std_in);
  std::ostringstream out, err;
  const int status = run_replay(args, in, out, err);
  return {status, out.str(), err.str()};
}

/// A temporary trace file, removed at the end of the test.
class temp_file {
 public:
  explicit temp_file(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             // ctest runs test cases in parallel processes: name files after this one.
             ("ratelimit_replay_cli_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter_++) + ".csv"))
                .string();
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~temp_file() { std::remove(path_.c_str()); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

const std::string good = "ts,key\n1000000000,a\n1000000001,a\n1009999999,a\n1010000000,a\n";
const std::string expected =
    "ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us\n"
    "1000000000,a,1,1,1,0,10000000\n"
    "1000000001,a,1,1,0,0,10000000\n"
    "1009999999,a,1,0,0,1,2\n"
    "1010000000,a,1,1,0,0,10000000\n";

TEST(ReplayCli, DecisionsFromAFileAndFromStdin) {
  temp_file f(good);
  const auto a = run({"--policy", "sliding_log", "--rate", "2/10s", "--decisions", f.path()});
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, expected);
  EXPECT_EQ(a.err, "");
  const auto b = run({"--decisions", "-", "--rate=2/10s", "--policy=sliding_log"}, good);
  EXPECT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(b.out, expected);
}

// Verifies an unsorted log gives one output on every run: the decisions there
// depend on which keys the memory store reclaimed (its reclaim rule), and that
// must not follow a hash key drawn at random per run.
TEST(ReplayCli, UnsortedLogGivesTheSameDecisionsOnEveryRun) {
  std::string log;
  for (int i = 0; i < 3; ++i) log += "0,x" + std::to_string(i) + "\n";
  for (int i = 0; i < 300; ++i) log += "5000000,z" + std::to_string(i) + "\n";
  for (int i = 0; i < 64; ++i) log += "1000,y" + std::to_string(i) + "\n";
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 4; ++j) log += "999999,y" + std::to_string(i) + "\n";
  }
  for (int i = 0; i < 64; ++i) log += "5500000,y" + std::to_string(i) + "\n";
  const auto first = run({"--policy", "fixed_window", "--rate", "5/s", "--decisions", "-"}, log);
  ASSERT_EQ(first.status, 0) << first.err;
  for (int n = 0; n < 8; ++n) {
    const auto again = run({"--policy", "fixed_window", "--rate", "5/s", "--decisions", "-"}, log);
    ASSERT_EQ(again.status, 0) << again.err;
    ASSERT_EQ(again.out, first.out) << "run " << n + 2 << " decided otherwise";
  }
}

// Verifies a bad line fails the run with its line number and writes nothing, from a file
// (validated in a first pass) and from stdin (output buffered).
TEST(ReplayCli, BadLineWritesNothing) {
  const std::string bad = good + "# a comment\n1010000001,a,zero\n1010000002,a\n";
  temp_file f(bad);
  for (const std::string& input : {f.path(), std::string("-")}) {
    const auto r = run({"--policy", "fixed_window", "--rate", "2/10s", "--decisions", input}, bad);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("line 7: bad cost \"zero\""), std::string::npos) << r.err;
  }
}

// Verifies a first line that attempts a timestamp is not taken for a header:
// the run fails naming line 1 and writes nothing.
TEST(ReplayCli, AFirstLineThatIsABadTimestampIsAnErrorNotAHeader) {
  const std::string bad = " 1000000000,a\n1000000001,a\n";
  temp_file f(bad);
  for (const std::string& input : {f.path(), std::string("-")}) {
    const auto r = run({"--policy", "fixed_window", "--rate", "2/10s", "--decisions", input}, bad);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("line 1: bad timestamp \" 1000000000\""), std::string::npos) << r.err;
  }
  const auto summary = run({"--rate", "2/10s", "-"}, bad);
  EXPECT_EQ(summary.status, 2);
  EXPECT_NE(summary.err.find("line 1: bad timestamp"), std::string::npos) << summary.err;
}

TEST(ReplayCli, SkipBadLinesCountsThem) {
  const std::string bad = good + "oops,a\n1010000001,\n";
  temp_file f(bad);
  for (const std::string& input : {f.path(), std::string("-")}) {
    const auto r = run(
        {"--policy", "sliding_log", "--rate", "2/10s", "--skip-bad-lines", "--decisions", input},
        bad);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, expected);
    EXPECT_NE(r.err.find("skipped 2 bad line(s); first: line 6: bad timestamp"), std::string::npos)
        << r.err;
  }
}

TEST(ReplayCli, UsageErrorsExitTwoNamingTheProblem) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--policy", "gcra", "--rate", "1/s", "--decisions", "-", "--frobnicate"},
       "\"--frobnicate\""},
      {{"--policy", "gcra", "--rate", "1/s", "--decisions"}, "missing INPUT"},
      {{"--policy", "gcra", "--decisions", "-"}, "missing --rate"},
      {{"--policy", "gcra", "--rate", "1/fortnight", "--decisions", "-"}, "fortnight"},
      {{"--policy", "leaky", "--rate", "1/s", "--decisions", "-"}, "unknown policy \"leaky\""},
      {{"--rate", "1/s", "--decisions", "-"}, "--decisions needs --policy"},
      {{"--policy", "gcra", "--rate", "1/s", "--burst", "0", "--decisions", "-"}, "--burst"},
      {{"--policy", "sliding_log", "--rate", "1/s", "--burst", "3", "--decisions", "-"},
       "--burst applies to token_bucket and gcra"},
      {{"--policy", "gcra", "--rate", "1/s", "--count-rejected", "--decisions", "-"},
       "--count-rejected applies to the window policies"},
      {{"--policy", "gcra", "--rate", "1/s", "--decisions", "a.csv", "b.csv"},
       "more than one INPUT"},
      {{"--policy", "gcra", "--rate", "1/s", "--decisions=yes", "-"}, "takes no value"},
      {{"--policy", "gcra", "--rate"}, "--rate needs a value"},
      {{"--rate", "1/s", "--sweep", "9..5", "-"}, "invalid --sweep"},
      {{"--rate", "1/s", "--sweep", "1..100000000", "-"},
       "--sweep \"1..100000000\" has 100000000 limits; at most 1000"},
      {{"--rate", "1/s", "--plot", "x.svg", "-"}, "--plot needs --sweep"},
      {{"--rate", "1/s", "--store", "redis://127.0.0.1:6379", "-"}, "--decisions only"},
      {{"--policy", "gcra", "--rate", "1/s", "--store", "mongodb://x", "--decisions", "-"},
       "unknown store"},
      {{"--policy", "gcra", "--rate", "1/s", "--decisions", "/nonexistent/trace.csv"},
       "cannot open"},
      {{"--policy", "gcra", "--rate", "3/us", "--decisions", "-"}, "--rate 3/1us: gcra"},
      {{"--policy", "gcra", "--rate", "10/15min", "--burst", "1125899906842624", "--decisions",
        "-"},
       "--burst 1125899906842624: gcra burst"},
      {{"--policy", "token_bucket", "--rate", "10/15min", "--burst", "1125899906842624",
        "--decisions", "-"},
       "--burst 1125899906842624: token_bucket burst"},
  };
  for (const auto& c : cases) {
    const auto r = run(c.args, good);
    EXPECT_EQ(r.status, 2) << c.message;
    EXPECT_EQ(r.out, "") << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.message << " -> " << r.err;
  }
}

// Verifies that an input the tool cannot read (a directory; the same read
// error as EIO half way through a file) fails the run instead of being
// replayed as an empty or truncated log with exit status 0.
TEST(ReplayCli, AnInputThatCannotBeReadFailsTheRun) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::vector<std::vector<std::string>> cases = {
      {"--policy", "gcra", "--rate", "1/s", "--decisions", dir},
      {"--policy", "gcra", "--rate", "1/s", "--skip-bad-lines", "--decisions", dir},
      {"--rate", "1/s", dir},
      {"--rate", "1/s", "--skip-bad-lines", dir},
  };
  for (const auto& args : cases) {
    const auto r = run(args);
    EXPECT_EQ(r.status, 1) << args.back() << " -> " << r.err;
    EXPECT_NE(r.err.find("cannot read"), std::string::npos) << r.err;
  }
  // Standard input redirected from a directory.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--policy", "gcra", "--rate", "1/s", "--decisions", "-"},
        std::vector<std::string>{"--rate", "1/s", "-"}}) {
    std::ifstream in(dir, std::ios::binary);
    std::ostringstream out, err;
    EXPECT_EQ(run_replay(args, in, out, err), 1) << err.str();
    EXPECT_NE(err.str().find("cannot read"), std::string::npos) << err.str();
  }
}

#ifndef RATELIMIT_REPLAY_HAVE_REDIS
TEST(ReplayCli, RedisStoreNeedsRedisSupport) {
  const auto r = run({"--policy", "gcra", "--rate", "1/s", "--store", "redis://127.0.0.1:6379",
                      "--decisions", "-"},
                     good);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("built without Redis support"), std::string::npos) << r.err;
}
#endif

TEST(ReplayCli, HelpExitsZero) {
  const auto r = run({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--decisions"), std::string::npos);
}

TEST(ReplayCli, SummaryAndSweepInOneRun) {
  const std::string trace = "ts,key,cost,label\n0,n,1,0\n1,a,1,1\n2,a,1,1\n3,a,1,1\n";
  const auto r = run({"--rate", "2/10s", "--sweep", "1,2", "-"}, trace);
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* s :
       {"fixed_window", "sliding_log", "sliding_counter", "token_bucket", "gcra",
        "Threshold sweep: sliding_log", "abusive caught", "normal wrongly blocked", "p99.9"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

// Verifies a policy that cannot take the rate or the burst is shown as n/a,
// naming the flag, while the others still run.
TEST(ReplayCli, SummaryShowsAPolicyThatCannotTakeTheRateAsNotAvailable) {
  const std::string trace = "ts,key\n0,a\n0,a\n1,a\n";
  const auto fast = run({"--rate", "3/us", "-"}, trace);
  EXPECT_EQ(fast.status, 0) << fast.err;
  EXPECT_NE(fast.out.find("gcra                     n/a"), std::string::npos) << fast.out;
  EXPECT_NE(fast.out.find("n/a gcra: --rate 3/1us: gcra emission interval"), std::string::npos)
      << fast.out;
  EXPECT_NE(fast.out.find("token_bucket               3"), std::string::npos) << fast.out;
  const auto burst = run({"--rate", "10/15min", "--burst", "1125899906842624", "-"}, trace);
  EXPECT_EQ(burst.status, 0) << burst.err;
  EXPECT_NE(burst.out.find("n/a token_bucket: --burst 1125899906842624: "), std::string::npos)
      << burst.out;
  EXPECT_NE(burst.out.find("n/a gcra: --burst 1125899906842624: "), std::string::npos) << burst.out;
  EXPECT_NE(burst.out.find("sliding_log                3"), std::string::npos) << burst.out;
}

// Verifies a swept limit a policy cannot take is n/a in the tables and the
// chart, naming --sweep, while the other points run.
TEST(ReplayCli, SweepShowsALimitAPolicyCannotTakeAsNotAvailable) {
  const std::string svg = (std::filesystem::temp_directory_path() /
                           ("ratelimit_replay_cli_na_" + std::to_string(::getpid()) + ".svg"))
                              .string();
  const auto r = run({"--rate", "1/us", "--sweep", "1,3", "--policy", "gcra", "--plot", svg, "-"},
                     "ts,key,cost,label\n0,a,1,1\n0,a,1,1\n1,n,1,0\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("      3           n/a"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the first: --sweep limit 3: gcra emission interval"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("      1        50.00%"), std::string::npos) << r.out;
  std::remove(svg.c_str());
}

TEST(ReplayCli, WritesAPlot) {
  const std::string svg = (std::filesystem::temp_directory_path() /
                           ("ratelimit_replay_cli_plot_" + std::to_string(::getpid()) + ".svg"))
                              .string();
  const auto r = run({"--rate", "2/10s", "--sweep", "1..3", "--plot", svg, "-"},
                     "0,n,1,0\n1,a,1,1\n2,a,1,1\n3,a,1,1\n");
  EXPECT_EQ(r.status, 0) << r.err;
  std::ifstream f(svg);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("<svg"), std::string::npos);
  EXPECT_NE(text.str().find("Normal callers wrongly blocked"), std::string::npos);
  EXPECT_NE(text.str().find("sliding_counter"), std::string::npos);
  std::remove(svg.c_str());
}

}  // namespace
