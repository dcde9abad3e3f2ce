#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tests scripts/compare.sh's arguments: a copy of it runs with deps.sh, cmake and pkg-config
# stubbed and ratelimit-compare replaced by a stub that prints its arguments, so nothing is
# built. The script must add --csv and --svg under build/compare unless they are given (or
# --help), in front of the user's arguments (an argument after -- is INPUT).
#
# Usage: tests/compare/compare_sh_test.sh [path/to/compare.sh]
set -u

script="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/compare.sh}"
h="$(mktemp -d)"
trap 'rm -rf "$h"' EXIT
mkdir -p "$h/scripts" "$h/bin" "$h/build/compare/examples/compare"
cp "$script" "$h/scripts/compare.sh"
printf '#!/bin/sh\n' >"$h/scripts/deps.sh"
printf '#!/bin/sh\nexit 0\n' >"$h/bin/cmake"
printf '#!/bin/sh\nexit 1\n' >"$h/bin/pkg-config"
tool="$h/build/compare/examples/compare/ratelimit-compare"
printf '#!/bin/sh\nfor a in "$@"; do printf "[%%s]" "$a"; done; echo\n' >"$tool"
chmod +x "$h/bin/cmake" "$h/bin/pkg-config" "$tool"

fail=0
expect() {
  local want="$1"
  shift
  local got
  got="$(PATH="$h/bin:$PATH" bash "$h/scripts/compare.sh" "$@" 2>/dev/null)"
  got="${got//$h/ROOT}"
  if [ "$got" != "$want" ]; then
    echo "FAIL: compare.sh $* gave the tool $got, want $want"
    fail=1
  else
    echo "ok: compare.sh $*"
  fi
}
csv="[--csv][ROOT/build/compare/compare.csv]"
svg="[--svg][ROOT/build/compare/compare.svg]"
expect "$csv$svg"
expect "$csv$svg[--rate][100/min][my.csv]" --rate 100/min my.csv
expect "$svg[--csv][x.csv]" --csv x.csv
expect "$csv[--svg=y.svg]" --svg=y.svg
expect "[--csv=x][--svg][y]" --csv=x --svg y
expect "[--help]" --help
expect "[--quick][-h]" --quick -h
expect "$csv$svg[--quick][--][--csv]" --quick -- --csv
exit "$fail"
