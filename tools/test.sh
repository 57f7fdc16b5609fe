#!/usr/bin/env bash
# Builds everything and runs the test suite (CPU tests run; GPU tests skip without a GPU).
# Installs Debian dependencies first. Used by the README and .ci/run.
#   tools/test.sh [ctest args]        the main suite in build/ (what a developer runs)
#   tools/test.sh --all [ctest args]  also the sanitizer and fuzzing stages
#                                     (tools/ci/sanitizers.sh: ASan + UBSan suite, fuzz, TSan)
# CI=true implies --all. build/ is shared with tools/run.sh (same build type), so running one
# after the other rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=0
if [ "${1:-}" = "--all" ]; then
  ALL=1
  shift
fi
[ "${CI:-}" = "true" ] && ALL=1
bash tools/install_deps.sh
BUILD=${SPECD_BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
bash tools/check_format.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECD_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"
# A fresh build has no test timings, so ctest -j would start tests in declaration order and a
# long one could start last; seeded with measured costs it starts the longest first.
bash tools/ci/seed_ctest_costs.sh "$BUILD"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" "$@"
if [ "$ALL" = 1 ]; then
  JOBS=$JOBS bash tools/ci/sanitizers.sh
fi
