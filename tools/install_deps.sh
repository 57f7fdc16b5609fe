#!/usr/bin/env bash
# Installs every build and test dependency of specd from Debian packages (Debian 12).
# Used by tools/run.sh, tools/test.sh and .ci/run; safe to run repeatedly.
# `install_deps.sh --build` installs only what compiling specd needs (deploy/Dockerfile's builder).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git python3
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libopenblas-dev libpcre2-dev libicu-dev
  # serving: HTTP (Boost.Beast), TLS, gRPC + protobuf, Prometheus metrics
  libboost-dev libssl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev
)
DEV_PKGS=(
  clang-format
  # serving tests: promtool, a Python gRPC client, curl, YAML lint, Node for the OpenAI SDK
  prometheus python3-grpcio python3-protobuf curl yamllint nodejs
  # container test (tests/container_test.py): rootful podman on runc, a Debian base image
  # made with debootstrap
  podman runc debootstrap
  # sanitizer and fuzzing builds (tools/ci/sanitizers.sh): clang 14 with its ASan, UBSan,
  # TSan and libFuzzer runtimes
  clang libclang-rt-14-dev
)
[ "${1:-}" = "--build" ] || PKGS+=("${DEV_PKGS[@]}")
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Debian's nodejs ships without npm (the OpenAI Node SDK test installs the SDK with it); a
# nodesource nodejs brings its own npm and conflicts with Debian's, so add npm only if absent.
[ "${1:-}" = "--build" ] || command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
