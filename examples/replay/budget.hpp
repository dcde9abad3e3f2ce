// SPDX-License-Identifier: Apache-2.0
// The memory the replay tools allow themselves, so that options they accept never end in bad_alloc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/resource.h>
#include <unistd.h>
#endif

namespace ratelimit::replay {

/// Refusal of a run whose memory estimate is over the budget: exit status 2,
/// the message names the option (or the input) at fault and the estimate.
class memory_budget_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Bytes the tools may use for data that grows with their options or input:
/// half of the physical memory, and at most half of the address-space limit
/// (RLIMIT_AS, `ulimit -v`) when one is set. Half leaves room for the rest of
/// the process and for allocator slack; a run over it is refused with an
/// estimate instead of dying of bad_alloc (or of the OOM killer) half way.
///
/// Thread safety: pure function of the process's limits.
[[nodiscard]] inline std::size_t default_memory_budget() noexcept {
  std::size_t budget = std::numeric_limits<std::size_t>::max();
#if defined(__unix__) || defined(__APPLE__)
#ifdef _SC_PHYS_PAGES
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    budget = static_cast<std::size_t>(pages) / 2 * static_cast<std::size_t>(page);
  }
#endif
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    budget = std::min(budget, static_cast<std::size_t>(lim.rlim_cur / 2));
  }
#endif
  return budget;
}

/// Bytes for people: "512 B", "3.4 MiB", "1.9 GiB", "7.3e+06 GiB".
[[nodiscard]] inline std::string format_bytes(double b) {
  std::ostringstream o;
  if (b < 1024) {
    o << std::fixed << std::setprecision(0) << b << " B";
  } else if (b < 1024.0 * 1024) {
    o << std::fixed << std::setprecision(1) << b / 1024 << " KiB";
  } else if (b < 1024.0 * 1024 * 1024) {
    o << std::fixed << std::setprecision(1) << b / 1024 / 1024 << " MiB";
  } else if (b < 1024.0 * 1024 * 1024 * 100'000) {
    o << std::fixed << std::setprecision(1) << b / 1024 / 1024 / 1024 << " GiB";
  } else {
    o << std::setprecision(2) << b / 1024 / 1024 / 1024 << " GiB";
  }
  return o.str();
}

}  // namespace ratelimit::replay
