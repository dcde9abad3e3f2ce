// SPDX-License-Identifier: Apache-2.0
// ratelimit-compare: the five policies at one rate, in process, on Redis and on a trace (see --help).
#include <iostream>
#include <string>
#include <vector>

#include "compare.hpp"

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int status = ratelimit::compare::run_compare(args, std::cin, std::cout, std::cerr,
                                                     RATELIMIT_COMPARE_SAMPLE);
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "ratelimit-compare: failure: cannot write to standard output\n";
    return 1;
  }
  return status;
}
