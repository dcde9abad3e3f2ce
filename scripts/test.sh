#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures, builds and runs every ratelimit test with warnings as errors; exits non-zero on failure.
#
# Usage: scripts/test.sh [--sanitize address,undefined|thread] [--compiler CXX]
#                        [--build-dir DIR] [--build-type TYPE] [--no-benchmarks]
#                        [--build-only] [-- CTEST_ARGS...]
# The default build directory is ./build/test, with -<compiler> and -<sanitizers>
# appended when those are chosen (./build/test-clang++, ./build/test-thread, ...).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sanitize=""
compiler=""
build_dir=""
build_type="Debug"
benchmarks=1
run_tests=1
ctest_args=()

usage() {
  sed -n '4,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) [ $# -ge 2 ] || usage; sanitize="$2"; shift 2 ;;
    --sanitize=*) sanitize="${1#*=}"; shift ;;
    --compiler) [ $# -ge 2 ] || usage; compiler="$2"; shift 2 ;;
    --compiler=*) compiler="${1#*=}"; shift ;;
    --build-dir) [ $# -ge 2 ] || usage; build_dir="$2"; shift 2 ;;
    --build-dir=*) build_dir="${1#*=}"; shift ;;
    --build-type) [ $# -ge 2 ] || usage; build_type="$2"; shift 2 ;;
    --build-type=*) build_type="${1#*=}"; shift ;;
    --no-benchmarks) benchmarks=0; shift ;;
    --build-only) run_tests=0; shift ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "test.sh: unknown option '$1'" >&2; usage ;;
  esac
done

case "$sanitize" in
  ""|address|undefined|address,undefined|undefined,address|thread) ;;
  *) echo "test.sh: --sanitize takes address,undefined or thread, got '$sanitize'" >&2; exit 2 ;;
esac

if [ -z "$build_dir" ]; then
  build_dir="$root/build/test"
  [ -n "$compiler" ] && build_dir+="-$(basename "$compiler")"
  [ -n "$sanitize" ] && build_dir+="-${sanitize//,/-}"
fi
build_dir="$(realpath -m "$build_dir")"

bash "$root/scripts/deps.sh"

cmake_args=(
  -S "$root" -B "$build_dir"
  -DCMAKE_BUILD_TYPE="$build_type"
  -DRATELIMIT_WERROR=ON
  -DRATELIMIT_BUILD_TESTS=ON
  -DRATELIMIT_BUILD_EXAMPLES=ON
  -DRATELIMIT_SANITIZE="$sanitize"
  # Line tables only: sanitizer reports and backtraces keep file:line, and
  # the suite builds about a tenth faster than with full debug information.
  -DCMAKE_CXX_FLAGS_DEBUG=-g1
)
[ -n "$compiler" ] && cmake_args+=(-DCMAKE_CXX_COMPILER="$compiler")
# Benchmarks are compiled (not run) in plain builds; under sanitizers they add
# build time and measure nothing. CI compiles them once, in the g++ stage.
if [ -z "$sanitize" ] && [ "$benchmarks" -eq 1 ]; then
  cmake_args+=(-DRATELIMIT_BUILD_BENCHMARKS=ON)
else
  cmake_args+=(-DRATELIMIT_BUILD_BENCHMARKS=OFF)
fi
# The Redis store is built once its CMake module exists and hiredis and OpenSSL are installed.
if [ -f "$root/cmake/redis.cmake" ] && pkg-config --exists hiredis openssl; then
  cmake_args+=(-DRATELIMIT_REDIS=ON)
else
  cmake_args+=(-DRATELIMIT_REDIS=OFF)
fi

echo "test.sh: build dir $build_dir (compiler ${compiler:-default}, sanitize '${sanitize:-none}')"
cmake "${cmake_args[@]}"
cmake --build "$build_dir" -j2
[ "$run_tests" -eq 1 ] || exit 0

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
# The suppression of a race inside libcrypto (tests/tsan.supp) stays when the
# caller sets TSAN_OPTIONS, unless it names suppressions of its own.
case ":$TSAN_OPTIONS" in
  *:suppressions=*) ;;
  *) TSAN_OPTIONS="$TSAN_OPTIONS:suppressions=$root/tests/tsan.supp" ;;
esac
ctest --test-dir "$build_dir" --output-on-failure -j2 ${ctest_args[@]+"${ctest_args[@]}"}
