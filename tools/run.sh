#!/usr/bin/env bash
# Builds specd and starts the server (`specd serve`) on the bundled codepair model: the
# OpenAI HTTP API on port 8000, gRPC on 50051. Arguments replace `serve`
# (e.g. `tools/run.sh serve --port 9000`, `tools/run.sh generate --prompt "def f("`).
# Uses tools/test.sh's build folder and configuration (build/, RelWithDebInfo: -O2 with debug
# info) and builds only the specd target, so running one script after the other compiles
# nothing twice; the binary is build/server/specd either way.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
BUILD=${SPECD_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECD_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target specd
if [ $# -eq 0 ]; then
  set -- serve
fi
exec "$BUILD/server/specd" "$@"
