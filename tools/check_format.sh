#!/usr/bin/env bash
# Fails when a tracked C++/CUDA file differs from clang-format's output (.clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || true)
[ -z "$files" ] && exit 0
# shellcheck disable=SC2086
if ! clang-format --dry-run --Werror $files; then
  echo "check_format: run 'clang-format -i' on the files above" >&2
  exit 1
fi
