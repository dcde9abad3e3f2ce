// SPDX-License-Identifier: Apache-2.0
// Test helper: runs ratelimit-replay --decisions on one store and on the in-process store and compares the bytes.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rltest {

struct run_result {
  int status = -1;
  std::string out;
};

/// Runs `args` (argv[0] is the program path) and collects its standard output.
inline run_result run(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  run_result r;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// A small generated telephony trace plus a hand-written file of awkward
/// keys, costs and out-of-order times.
inline std::vector<std::string> traces() {
  // Test binaries run in parallel: name the files after this process.
  const std::string dir = ::testing::TempDir() + std::to_string(::getpid()) + "_";
  const std::string generated = dir + "replay_store_generated.csv";
  const run_result gen = run({RATELIMIT_GEN_TRACE_BIN, "--seed", "7", "--subscribers", "150",
                              "--call-centres", "2", "--robocallers", "3", "--edge-bursters", "2",
                              "--out", generated});
  if (gen.status != 0) throw std::runtime_error("ratelimit-gen-trace failed");
  const std::string awkward = dir + "replay_store_awkward.csv";
  std::ofstream f(awkward, std::ios::binary);
  f << "ts,key,cost,label\n"
       "# comment line\n"
       "0,\"a,b\",1\n"
       "1000000,\"say \"\"hi\"\"\",2\n"
       "1000001,{braces},3,1\n"
       "899999999,\"a,b\",1\n"
       "900000000,\"a,b\",4\n"
       "900000000,\"a,b\",1\n"
       "500000000,\"a,b\",1\n"
       "1732950000.25,k\xc3\xa9y,11\n"
       "2026-11-30T04:52:46.123456Z,k\xc3\xa9y,1\n"
       "2026-11-30T04:52:46.123Z,space key ,2\n"
       "2026-11-30T04:52:46Z,space key ,1\n";
  return {generated, awkward};
}

struct variant {
  const char* policy;
  std::vector<std::string> extra;
};

/// Replays both traces through every policy variant at 10/15min on the
/// in-process store and on `store_url`; every byte of the output must agree.
inline void expect_identical_replay(const std::string& store_url) {
  const std::vector<variant> variants = {
      {"fixed_window", {}},
      {"fixed_window", {"--count-rejected"}},
      {"sliding_log", {}},
      {"sliding_log", {"--count-rejected"}},
      {"sliding_counter", {}},
      {"sliding_counter", {"--count-rejected"}},
      {"token_bucket", {}},
      {"token_bucket", {"--burst", "3"}},
      {"gcra", {}},
      {"gcra", {"--burst", "3"}},
  };
  const std::vector<std::string> files = traces();
  // Removes the trace files however the loop below ends (an ASSERT returns).
  struct remove_files {
    const std::vector<std::string>& paths;
    ~remove_files() {
      for (const std::string& p : paths) std::remove(p.c_str());
    }
  } cleanup{files};
  for (const std::string& trace : files) {
    for (const variant& v : variants) {
      std::vector<std::string> args = {RATELIMIT_REPLAY_BIN, "--policy", v.policy, "--rate",
                                       "10/15min"};
      args.insert(args.end(), v.extra.begin(), v.extra.end());
      std::vector<std::string> memory_args = args;
      memory_args.insert(memory_args.end(), {"--decisions", trace});
      std::vector<std::string> store_args = args;
      store_args.insert(store_args.end(), {"--store", store_url, "--decisions", trace});
      const run_result mem = run(memory_args);
      const run_result other = run(store_args);
      ASSERT_EQ(mem.status, 0) << v.policy << " " << trace;
      ASSERT_EQ(other.status, 0) << v.policy << " " << trace << " on " << store_url;
      ASSERT_GT(mem.out.size(), 100u);
      EXPECT_EQ(mem.out, other.out) << v.policy << " " << trace << " on " << store_url;
    }
  }
}

}  // namespace rltest
