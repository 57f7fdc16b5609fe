#!/usr/bin/env bash
# seed_ctest_costs.sh BUILD_DIR: gives a build without test timings ctest's cost file from
# tools/ci/ctest_costs.txt (seconds per test measured on a 2-core machine, RelWithDebInfo,
# 2026-11-28), so that `ctest -j` starts the longest tests first instead of in declaration order
# (a fresh CI clone otherwise risks a long test starting last on one core). A build that has run
# its tests keeps its own timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="$1/Testing/Temporary/CTestCostData.txt"
[[ -f "$dest" ]] && exit 0
mkdir -p "$(dirname "$dest")"
cp tools/ci/ctest_costs.txt "$dest"
