#!/usr/bin/env bash
# Builds everything and runs the test suite (CPU tests run; GPU tests skip without a GPU).
# Installs Debian dependencies first. Used by the README and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
BUILD=${SPECD_BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
bash tools/check_format.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" "$@"
