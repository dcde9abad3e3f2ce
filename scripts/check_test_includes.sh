#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compiles every file of the unity-built test binaries on its own (-fsyntax-only), so that an #include the unity prelude hides is found; not part of CI.
#
# Usage: scripts/check_test_includes.sh [--compiler CXX] [build-dir]   (default build/includes)
# The tests/redis, tests/cluster, tests/sentinel and tests/asio files are
# compiled as one translation unit per directory, after a prelude holding
# every header any of them includes: a file that forgets one still builds
# there. This builds the target check_test_includes (tests/CMakeLists.txt),
# which compiles each file alone with its binary's flags. Exits non-zero,
# naming the file, when one does not compile alone.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
compiler=""
build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --compiler) [ $# -ge 2 ] || { sed -n 5p "$0" >&2; exit 2; }; compiler="$2"; shift 2 ;;
    -h|--help) sed -n 5p "$0"; exit 0 ;;
    *) build="$1"; shift ;;
  esac
done
build="${build:-$root/build/includes${compiler:+-$(basename "$compiler")}}"

args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DRATELIMIT_WERROR=ON
      -DRATELIMIT_BUILD_TESTS=ON -DRATELIMIT_BUILD_EXAMPLES=ON -DRATELIMIT_BUILD_BENCHMARKS=OFF)
[ -n "$compiler" ] && args+=(-DCMAKE_CXX_COMPILER="$compiler")
if pkg-config --exists hiredis openssl; then
  args+=(-DRATELIMIT_REDIS=ON)
fi
cmake "${args[@]}" >/dev/null
cmake --build "$build" -j2 --target check_test_includes
echo "check_test_includes: every unity-built test file compiles on its own"
