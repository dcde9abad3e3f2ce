#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds ratelimit-compare in Release into ./build/compare and compares the five policies at one rate.
#
# Usage: scripts/compare.sh            every policy at 10/15min: in process, on a throwaway
#                                      redis-server, and on examples/data/sample_calls.csv
#        scripts/compare.sh ARGS...    ratelimit-compare ARGS... (e.g. --help, --rate 100/min my_log.csv)
# Both also write build/compare/compare.csv and compare.svg, each unless ARGS give
# --csv or --svg themselves (and neither with --help).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build/compare"

bash "$root/scripts/deps.sh" >&2
redis=OFF
if pkg-config --exists hiredis; then redis=ON; fi
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DRATELIMIT_BUILD_TESTS=OFF \
  -DRATELIMIT_BUILD_EXAMPLES=ON -DRATELIMIT_REDIS="$redis" >&2
cmake --build "$build_dir" -j2 --target ratelimit_compare >&2

compare="$build_dir/examples/compare/ratelimit-compare"
csv=1
svg=1
for arg in "$@"; do
  case "$arg" in
    --) break ;;
    --csv|--csv=*) csv=0 ;;
    --svg|--svg=*) svg=0 ;;
    -h|--help) csv=0; svg=0 ;;
  esac
done
# In front of ARGS, so that they stay options even after a "--" in ARGS.
if [ "$svg" -eq 1 ]; then set -- --svg "$build_dir/compare.svg" "$@"; fi
if [ "$csv" -eq 1 ]; then set -- --csv "$build_dir/compare.csv" "$@"; fi
exec "$compare" "$@"
