#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs the in-process A/B benchmark of this tree's memory store against a baseline commit's.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/core/ab/run.sh BASELINE_COMMIT [ROUNDS]

Extracts BASELINE_COMMIT's include/ into a temporary directory, compiles
store_under_test.cpp against it (namespace renamed to ratelimit_baseline)
and against this tree's include/, links both with main.cpp into one binary
and runs it (default 15 rounds). Needs g++ with C++20.
USAGE
}

if [[ $# -lt 1 ]]; then
  usage >&2
  exit 2
fi
if [[ "$1" == "-h" || "$1" == "--help" ]]; then
  usage
  exit 0
fi
baseline="$1"
rounds="${2:-15}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

git -C "$root" archive "$baseline" include | tar -x -C "$work"
flags=(-O3 -DNDEBUG -std=gnu++20)
g++ "${flags[@]}" -I"$work/include" -Dratelimit=ratelimit_baseline -DAB_MAKE=make_baseline \
  -c "$here/store_under_test.cpp" -o "$work/baseline.o"
g++ "${flags[@]}" -I"$root/include" -DAB_MAKE=make_candidate \
  -c "$here/store_under_test.cpp" -o "$work/candidate.o"
g++ "${flags[@]}" "$here/main.cpp" "$work/baseline.o" "$work/candidate.o" -o "$work/ab_core"
"$work/ab_core" "$rounds"
