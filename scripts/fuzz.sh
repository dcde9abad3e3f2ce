#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets with clang++ (ASan+UBSan) and runs each for a bounded time on a copy of its seed corpus.
#
# Usage: scripts/fuzz.sh [build-dir]   (default build/fuzz)
# Environment: RATELIMIT_FUZZ_SECONDS per target (default 25: 5 targets, so about
# 2 minutes of fuzzing and under 3 with the build), RATELIMIT_FUZZ_TARGETS to run
# a subset ("fuzz_csv fuzz_rate").
# Exits non-zero if any target finds a crash, a leak, a timeout or a failed
# property check; the input is kept under <build-dir>/fuzz-artifacts/<target>/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${1:-build/fuzz}"
seconds="${RATELIMIT_FUZZ_SECONDS:-25}"
targets=(${RATELIMIT_FUZZ_TARGETS:-fuzz_csv fuzz_timestamp fuzz_rate fuzz_redis_url fuzz_script_reply})

cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRATELIMIT_WERROR=ON -DRATELIMIT_BUILD_FUZZERS=ON -DRATELIMIT_REDIS=ON \
  -DRATELIMIT_BUILD_TESTS=OFF -DRATELIMIT_BUILD_EXAMPLES=OFF -DRATELIMIT_BUILD_BENCHMARKS=OFF \
  -DRATELIMIT_SANITIZE= >/dev/null
cmake --build "$build" -j2 --target "${targets[@]}"

summary=()
failed=()
for t in "${targets[@]}"; do
  # A copy: libFuzzer adds the inputs it finds to its corpus directory, and the
  # checked-in seeds must stay as they are.
  corpus="$build/fuzz-corpus/$t"
  artifacts="$build/fuzz-artifacts/$t/"
  log="$build/fuzz-logs/$t.log"
  rm -rf "$corpus" "$artifacts"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  echo "fuzz: $t for ${seconds}s"
  rc=0
  "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus" >"$log" 2>&1 || rc=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)"
  inputs="$(find "$corpus" -type f | wc -l)"
  if [ "$rc" -eq 0 ]; then
    summary+=("fuzz: $t ok: ${runs:-?} runs, coverage ${cov:-?} edges, corpus $inputs inputs")
  else
    summary+=("fuzz: $t FAILED (exit $rc): see $log; input in $artifacts")
    failed+=("$t")
    # The report: the sanitizer or check message and the stack, not the whole log.
    grep -n -m1 -A40 -E '^==[0-9]+==ERROR|fuzz check failed|runtime error|deadly signal|ERROR: libFuzzer' "$log" >&2 || tail -40 "$log" >&2
  fi
done

printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
