// SPDX-License-Identifier: Apache-2.0
// Tests of the built ratelimit-replay executable: the stable decisions contract and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct result {
  int status;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Runs `exe` through the shell with `args` (already quoted) after the shell
/// commands `prefix` (e.g. a ulimit), and returns its exit status and output.
result run_exe(const std::string& exe, const std::string& args, const std::string& prefix = "") {
  const fs::path dir = fs::temp_directory_path();
  // ctest runs test cases in parallel processes: name the files after this one.
  const std::string tag = std::to_string(::getpid());
  const fs::path out = dir / ("ratelimit_replay_tool_out_" + tag + ".txt");
  const fs::path err = dir / ("ratelimit_replay_tool_err_" + tag + ".txt");
  const std::string cmd = prefix + "'" + exe + "' " + args + " >'" + out.string() + "' 2>'" +
                          err.string() + "'";
  const int raw = std::system(cmd.c_str());
  result r{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

result run(const std::string& args) {
  return run_exe(RATELIMIT_REPLAY_EXE, args);
}

// An address-space limit (ulimit -v) is what makes the old bad_alloc quick and
// harmless to provoke; the sanitizers reserve terabytes of address space and
// cannot run under one.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / (std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST(ReplayTool, DecisionsFromFileAndStdinAgree) {
  const fs::path p = write_temp(
      "ratelimit_replay_tool_in.csv",
      "2026-11-30T00:00:00Z,\"a,b\"\n2026-11-30T00:00:00.000500Z,\"a,b\"\n"
      "1796000000.000001,\"a,b\",2\n");
  const auto a = run("--policy token_bucket --rate 2/s --decisions '" + p.string() + "'");
  const auto b = run("--policy token_bucket --rate 2/s --decisions - <'" + p.string() + "'");
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out,
            "ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us\n"
            "1795996800000000,\"a,b\",1,1,1,0,500000\n"
            "1795996800000500,\"a,b\",1,1,0,0,999500\n"
            "1796000000000001,\"a,b\",2,1,0,0,1000000\n");
  fs::remove(p);
}

TEST(ReplayTool, ExitCodes) {
  EXPECT_EQ(run("--help").status, 0);
  const auto unknown = run("--policy gcra --rate 1/s --decisions - --nope </dev/null");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_NE(unknown.err.find("--nope"), std::string::npos);
  const fs::path p = write_temp("ratelimit_replay_tool_bad.csv", "ts,key\n1,a\n2\n");
  const auto bad = run("--policy gcra --rate 1/s --decisions '" + p.string() + "'");
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find("line 3"), std::string::npos) << bad.err;
  fs::remove(p);
}

TEST(ReplayTool, SampleRunsThroughEveryPolicy) {
  const auto r = run("--rate 10/15min --sweep 5..30 '" + std::string(RATELIMIT_REPLAY_SAMPLE) +
                     "'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("gcra"), std::string::npos);
  EXPECT_NE(r.out.find("Threshold sweep"), std::string::npos);
}

// Verifies options that would exhaust memory are refused up front with an
// estimate naming them (the generator used to die of bad_alloc after seconds
// under a 488 MiB address-space limit).
TEST(GenTrace, RefusesALogThatWouldNotFitInMemory) {
  if (sanitized) GTEST_SKIP() << "needs ulimit -v, which the sanitizers cannot run under";
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {"--calls-per-day 100000", "--subscribers 3000 with --calls-per-day 100000 over --days 1"},
      {"--subscribers 100000000", "--subscribers 100000000 with"},
      {"--edge-bursters 1000000 --edge-burst 100000 --days 3650", "--edge-bursters 1000000"},
  };
  for (const auto& c : cases) {
    const auto r = run_exe(RATELIMIT_GEN_TRACE_EXE, c.args, "ulimit -v 500000; ");
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("over the budget of 244.1 MiB"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
  }
  const auto fits = run_exe(RATELIMIT_GEN_TRACE_EXE, "--subscribers 300", "ulimit -v 500000; ");
  EXPECT_EQ(fits.status, 0) << fits.err;
  EXPECT_GT(fits.out.size(), 1000u);
}

TEST(GenTrace, RefusesAWindowWithoutAnEdgeInsideADay) {
  const auto r = run_exe(RATELIMIT_GEN_TRACE_EXE, "--window 1d");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--window \"1d\" must divide one day into two or more windows"),
            std::string::npos)
      << r.err;
}

// Verifies a sweep whose per-key state would not fit is refused naming --sweep
// and the estimate (it used to die of bad_alloc under a 976 MiB limit).
TEST(ReplayTool, SweepOverTheMemoryBudgetIsRefusedNamingSweep) {
  if (sanitized) GTEST_SKIP() << "needs ulimit -v, which the sanitizers cannot run under";
  std::string text = "ts,key\n";
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + ",k" + std::to_string(i) + "\n";
  const fs::path p = write_temp("ratelimit_replay_tool_keys.csv", text);
  const auto r = run_exe(RATELIMIT_REPLAY_EXE, "--rate 10/s --sweep 1..1000 '" + p.string() + "'",
                         "ulimit -v 1000000; ");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--sweep: 1000 limits x 5 policies run 5000 configurations"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("over the memory budget of 488.3 MiB"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  const auto small = run_exe(RATELIMIT_REPLAY_EXE, "--rate 10/s --sweep 1..5 '" + p.string() + "'",
                             "ulimit -v 1000000; ");
  EXPECT_EQ(small.status, 0) << small.err;
  fs::remove(p);
}

}  // namespace
