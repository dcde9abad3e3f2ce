// SPDX-License-Identifier: Apache-2.0
// Exceptions for infrastructure failures; bad configuration uses std::invalid_argument.
#pragma once

#include <stdexcept>
#include <string>

namespace ratelimit {

/// Root of the library's failure tree. A denial is never an exception: it is a
/// `decision` with `allowed == false`.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A store could not apply a check (unreachable server, protocol failure).
/// Callers catch this to fail open or fail closed.
class store_error : public error {
 public:
  using error::error;
};

}  // namespace ratelimit
