// SPDX-License-Identifier: Apache-2.0
// Exceptions of the Redis store: unreachable server, timeout, script failure.
#pragma once

#include "ratelimit/errors.hpp"

namespace ratelimit::redis {

/// The server could not be reached or the connection broke (name not
/// resolved, refused, reset, closed, authentication or SELECT failed, circuit
/// breaker open), or the server answered that it cannot serve checks now
/// (READONLY from a demoted master, LOADING, MASTERDOWN, BUSY, MISCONF,
/// NOREPLICAS, NOAUTH, WRONGPASS): the connection is then dropped.
class connection_error : public store_error {
 public:
  using store_error::store_error;
};

/// A connect, pool wait or command did not finish within its timeout. The
/// command may or may not have run on the server, so it is never retried.
class timeout_error : public connection_error {
 public:
  using connection_error::connection_error;
};

/// Redis answered the script with an error other than NOSCRIPT and the
/// answers of connection_error (for example OOM, NOPERM, or a key of the
/// wrong type), or with a malformed reply.
class script_error : public store_error {
 public:
  using store_error::store_error;
};

}  // namespace ratelimit::redis
