// SPDX-License-Identifier: Apache-2.0
// ratelimit-replay --decisions prints byte-identical output on the in-process store and on Redis.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "redis/redis_server.hpp"
#include "support/replay_compare.hpp"

// Verifies "output is identical whatever the store": every policy, with and
// without count_rejected or a burst, on a generated and a hand-written trace.
TEST(ReplayTool, DecisionsAreByteIdenticalOnMemoryAndRedis) {
  const ratelimit::redis::options o = rltest::shared_redis();
  rltest::expect_identical_replay("redis://" + o.host + ":" + std::to_string(o.port));
}

namespace {

struct shell_result {
  int status = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Runs `command` through the shell, collecting standard output and error.
shell_result shell(const std::string& command) {
  const std::string base = ::testing::TempDir() + std::to_string(::getpid()) + "_replay_shell_";
  const int raw = std::system((command + " >'" + base + "out' 2>'" + base + "err'").c_str());
  shell_result r{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(base + "out"), slurp(base + "err")};
  std::remove((base + "out").c_str());
  std::remove((base + "err").c_str());
  return r;
}

}  // namespace

// Verifies a time the Lua scripts cannot hold exactly (past 2^52 us) is refused
// before any output, naming its line and why, from a file and from standard
// input, while the in-memory store replays the same file.
TEST(ReplayTool, RedisRefusesATimeItCannotTakeBeforeAnyOutput) {
  const ratelimit::redis::options o = rltest::shared_redis();
  const std::string url = "redis://" + o.host + ":" + std::to_string(o.port);
  const std::string path = ::testing::TempDir() + std::to_string(::getpid()) + "_late.csv";
  std::string text = "ts,key\n";
  for (int i = 0; i < 5000; ++i) text += "1000000,k" + std::to_string(i % 7) + "\n";
  text += "4503599627370496,k\n4503599627370497,k\n1000001,k\n";  // 2^52 is fine, 2^52 + 1 is not
  std::ofstream(path, std::ios::binary) << text;
  const std::string tool = std::string("'") + RATELIMIT_REPLAY_BIN + "' --policy gcra --rate 10/s";
  for (const std::string& input : {"'" + path + "'", "- <'" + path + "'"}) {
    const shell_result r = shell(tool + " --store " + url + " --decisions " + input);
    EXPECT_EQ(r.status, 2) << input << ": " << r.err;
    EXPECT_TRUE(r.out.empty() || r.out ==
                                     "ts_us,key,cost,allowed,remaining,retry_after_us,"
                                     "reset_after_us\n")
        << input << ": " << r.out.substr(0, 200);
    EXPECT_NE(r.err.find("line 5003: timestamp \"4503599627370497\""), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Lua"), std::string::npos) << r.err;
  }
  const shell_result skipped = shell(tool + " --store " + url + " --skip-bad-lines --decisions '" +
                                     path + "'");
  EXPECT_EQ(skipped.status, 0) << skipped.err;
  EXPECT_NE(skipped.err.find("skipped 1 bad line(s); first: line 5003"), std::string::npos)
      << skipped.err;
  const shell_result memory = shell(tool + " --decisions '" + path + "'");
  EXPECT_EQ(memory.status, 0) << memory.err;
  EXPECT_NE(memory.out.find("4503599627370497,k,1,"), std::string::npos);
  std::remove(path.c_str());
}
