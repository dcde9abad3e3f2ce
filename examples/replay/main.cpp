// SPDX-License-Identifier: Apache-2.0
// ratelimit-replay: replays a call log through the rate-limiting policies (see --help).
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int status = ratelimit::replay::run_replay(args, std::cin, std::cout, std::cerr);
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "ratelimit-replay: failure: cannot write to standard output\n";
    return 1;
  }
  return status;
}
