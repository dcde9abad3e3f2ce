// SPDX-License-Identifier: Apache-2.0
// Library version, kept in step with project(VERSION) in CMakeLists.txt.
#pragma once

#define RATELIMIT_VERSION_MAJOR 0
#define RATELIMIT_VERSION_MINOR 1
#define RATELIMIT_VERSION_PATCH 0

namespace ratelimit {
/// "major.minor.patch" of the headers in use.
inline constexpr const char* version_string = "0.1.0";
}  // namespace ratelimit
