#!/usr/bin/env bash
# Builds specd and starts it on the bundled codepair model. Extra arguments go to specd.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
BUILD=${SPECD_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECD_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target specd
if [ $# -eq 0 ]; then
  set -- generate --model models/codepair/target --prompt "def fibonacci(n):" --max-tokens 64
fi
exec "$BUILD/server/specd" "$@"
