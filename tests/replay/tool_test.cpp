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

/// Runs the tool through the shell with `args` (already quoted) and returns its exit status.
result run(const std::string& args) {
  const fs::path dir = fs::temp_directory_path();
  // ctest runs test cases in parallel processes: name the files after this one.
  const std::string tag = std::to_string(::getpid());
  const fs::path out = dir / ("ratelimit_replay_tool_out_" + tag + ".txt");
  const fs::path err = dir / ("ratelimit_replay_tool_err_" + tag + ".txt");
  const std::string cmd = std::string("'") + RATELIMIT_REPLAY_EXE + "' " + args + " >'" +
                          out.string() + "' 2>'" + err.string() + "'";
  const int raw = std::system(cmd.c_str());
  result r{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

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

}  // namespace
