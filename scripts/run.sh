#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds ratelimit-replay in Release into ./build/run and replays the bundled call log through every policy.
#
# Usage: scripts/run.sh            summary of the five policies + threshold sweep on
#                                  examples/data/sample_calls.csv (chart: build/run/sweep.svg)
#        scripts/run.sh ARGS...    ratelimit-replay ARGS... (e.g. --help, or your own log)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build/run"

bash "$root/scripts/deps.sh" >&2
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DRATELIMIT_BUILD_TESTS=OFF \
  -DRATELIMIT_BUILD_EXAMPLES=ON >&2
cmake --build "$build_dir" -j2 --target ratelimit_replay >&2

replay="$build_dir/examples/replay/ratelimit-replay"
if [ "$#" -eq 0 ]; then
  set -- --rate 10/15min --sweep 5..30 --plot "$build_dir/sweep.svg" \
    "$root/examples/data/sample_calls.csv"
fi
exec "$replay" "$@"
