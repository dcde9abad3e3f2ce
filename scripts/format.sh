#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Formats the tracked C++ sources with clang-format 16, or with --check lists the files that differ.
#
# Usage: scripts/format.sh [--check]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
clang_format="${CLANG_FORMAT:-clang-format-16}"
if ! command -v "$clang_format" >/dev/null; then
  echo "format.sh: $clang_format not found (scripts/deps.sh installs it)" >&2
  exit 1
fi

mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.h' '*.cc')
if [ "${#files[@]}" -eq 0 ]; then
  echo "format.sh: no tracked C++ files"
  exit 0
fi

if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    if ! "$clang_format" --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
  done
  if [ "${#bad[@]}" -ne 0 ]; then
    echo "format.sh: ${#bad[@]} file(s) differ from clang-format; run scripts/format.sh:" >&2
    for f in "${bad[@]}"; do
      echo "--- $f" >&2
      "$clang_format" --style=file "$f" | diff -u "$f" - | head -40 >&2 || true
    done
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted"
else
  "$clang_format" --style=file -i "${files[@]}"
fi
