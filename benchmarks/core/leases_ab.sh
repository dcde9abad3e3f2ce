#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs two or more builds of ratelimit_leases_paired alternately and prints,
# per subject and build, the median ns per operation and the median ratio to
# the fixed-window check measured in the same run.
#
# Short runs (default 5 rounds each) alternated many times (default 21)
# spread a shared machine's load evenly over the builds; a build that lacks a
# subject (an older one without lease_hint) shows "-".
#
# Usage: benchmarks/core/leases_ab.sh [-n ITERATIONS] [-r ROUNDS] BIN... [-- ARGS...]
#   BIN   paths of ratelimit_leases_paired builds (before, after, ...)
#   ARGS  passed to every run, e.g. -- --keys 1   or   -- --long-ids
# Example:
#   benchmarks/core/leases_ab.sh /tmp/before/build/benchmarks/core/ratelimit_leases_paired \
#     build-bench/benchmarks/core/ratelimit_leases_paired -- --keys 1
set -euo pipefail

iterations=21
rounds=5
bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) iterations="$2"; shift 2 ;;
    -r) rounds="$2"; shift 2 ;;
    --) shift; break ;;
    *) bins+=("$1"); shift ;;
  esac
done
if [ ${#bins[@]} -lt 1 ]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "leases_ab.sh: not an executable: $b" >&2; exit 2; }
done

samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 0; i < iterations; ++i)); do
  for ((j = 0; j < ${#bins[@]}; ++j)); do
    # subject lines: NAME  ns/op  x-fixed  x-gcra (the name may hold spaces)
    "${bins[$j]}" --rounds "$rounds" "$@" |
      awk -v b="$j" '/^(check|pair|floor)/ {
        name = $0; sub(/ +[0-9.]+ +[0-9.]+ +[0-9.]+$/, "", name)
        print b "\t" name "\t" $(NF - 2) "\t" $(NF - 1) }' >>"$samples"
  done
done
echo "load average at end:   $(cut -d' ' -f1-3 /proc/loadavg)"
for ((j = 0; j < ${#bins[@]}; ++j)); do echo "build $j: ${bins[$j]}"; done

# Medians per (subject, build), subjects in their order of appearance.
awk -F'\t' -v nb="${#bins[@]}" '
  function median(list, n,    v, k) {
    n = split(list, v, " "); asort_num(v, n)
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  function asort_num(v, n,    i, j, t) {  # insertion sort (no gawk asort)
    for (i = 2; i <= n; ++i) { t = v[i]; for (j = i - 1; j > 0 && v[j] + 0 > t + 0; --j) v[j + 1] = v[j]; v[j + 1] = t }
  }
  {
    key = $2 SUBSEP $1
    if (!($2 in seen)) { seen[$2] = 1; order[++names] = $2 }
    ns[key] = ns[key] " " $3; x[key] = x[key] " " $4
  }
  END {
    printf "%-28s", "subject"
    for (b = 0; b < nb; ++b) printf "%20s", "build " b " ns, x fixed"
    printf "\n"
    for (i = 1; i <= names; ++i) {
      printf "%-28s", order[i]
      for (b = 0; b < nb; ++b) {
        key = order[i] SUBSEP b
        if (key in ns) printf "%12.1f %6.2fx", median(ns[key]), median(x[key])
        else printf "%20s", "-"
      }
      printf "\n"
    }
  }' "$samples"
