#!/usr/bin/env bash
# Packs what the device machine runs, from a CUDA build made here, into .carry/gpu/ (git-ignored):
#   payload.tar.xz  tests/  every gpu-labelled ctest binary
#                   bin/    kernel_check, specd, and attention_bench, gemm_bench, decode_bench
#                           where built
#                   lib/    the shared libraries they load (ldd), except glibc and the CUDA driver
#                           and toolkit libraries (libcuda, libcudart, libcublas*, ...), which the
#                           device provides
#                   Debug info stripped, then xz: OpenBLAS and ICU alone are ~65 MiB unpacked.
#   models/         what the GPU tests and benches read, in ../shared/models' layout: shapes/*
#                   (config.json only) and tiny-random/*, and codepair-long (25 MiB) when
#                   cuda_vegas_test is packed; models/codepair travels in the tree
#   MANIFEST        commit, build dir, packed file sizes
# The device tool carries at most 64 MiB, working tree included: this prints both sizes and fails
# when together they would not fit. Then the device tool runs
#   bash tools/gpu/run_all.sh .carry/gpu      with carry [".carry/gpu"]
# usage: tools/gpu/package.sh [BUILD_DIR]   (default build-cuda; build it first, see README.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-cuda}
DEST=.carry/gpu
CARRY_LIMIT_MIB=64  # the device tool's limit on the working tree plus carried paths
MARGIN_MIB=2        # files that appear before the run (logs, notes) need room too
# $SPECD_GPU_BENCHES (space-separated) packs fewer benchmarks when the carry limit is tight.
read -r -a BENCHES <<<"${SPECD_GPU_BENCHES:-attention_bench gemm_bench decode_bench verify_bench spec_bench vegas_bench specd_profile}"

die() { echo "package.sh: $*" >&2; exit 1; }
[[ -f "$BUILD/CTestTestfile.cmake" ]] || die "no ctest build in $BUILD"
grep -q '^SPECD_ENABLE_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" || die "$BUILD is not a CUDA build"
SHARED=$(grep -m1 '^SPECD_SHARED_DIR:' "$BUILD/CMakeCache.txt" | cut -d= -f2- || true)
SHARED=${SHARED:-../shared}
[[ -d "$SHARED/models" ]] || die "no $SHARED/models (SPECD_SHARED_DIR of $BUILD)"

# The newest executable called NAME under the build dir, or nothing.
find_binary() {
  find "$BUILD" -name "$1" -type f -perm -u+x -printf '%T@ %p\n' | sort -rn | head -n 1 | cut -d' ' -f2-
}

# gpu-labelled tests as ctest lists them (command[0] is the binary).
mapfile -t tests < <(ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 |
  python3 -c 'import json,sys; [print(t["command"][0]) for t in json.load(sys.stdin).get("tests",[]) if t.get("command")]')
build_abs=$(cd "$BUILD" && pwd)
for i in "${!tests[@]}"; do  # a script run by an interpreter is not ours to pack
  if [[ "$(realpath -m "${tests[$i]}")" != "$build_abs"/* ]]; then
    echo "package.sh: warning: skipping gpu test command ${tests[$i]} (not a binary of $BUILD)" >&2
    unset 'tests[i]'
  fi
done
tests=("${tests[@]}")
# $SPECD_GPU_SKIP_TESTS (an extended regex of test names) leaves tests out when the carry is tight.
if [[ -n "${SPECD_GPU_SKIP_TESTS:-}" ]]; then
  for i in "${!tests[@]}"; do
    [[ "$(basename "${tests[$i]}")" =~ ^(${SPECD_GPU_SKIP_TESTS})$ ]] && unset 'tests[i]'
  done
  tests=("${tests[@]}")
fi
[[ ${#tests[@]} -gt 0 ]] || die "ctest lists no gpu-labelled test in $BUILD"
for t in "${tests[@]}"; do [[ -x "$t" ]] || die "$t not built"; done
bins=()
# $SPECD_GPU_PROGRAMS: the programs packed besides the benchmarks (default kernel_check specd).
read -r -a PROGRAMS <<<"${SPECD_GPU_PROGRAMS-kernel_check specd}"
for name in "${PROGRAMS[@]}" "${BENCHES[@]}"; do
  path=$(find_binary "$name")
  if [[ -n "$path" ]]; then
    bins+=("$path")
  elif [[ "$name" == kernel_check ]]; then
    die "no kernel_check in $BUILD (build it: cmake --build $BUILD --target kernel_check)"
  else
    echo "package.sh: warning: no $name in $BUILD; run_all.sh will report its step as not packed" >&2
  fi
done

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/tests" "$STAGE/bin" "$STAGE/lib"
for t in "${tests[@]}"; do objcopy --strip-debug "$t" "$STAGE/tests/$(basename "$t")"; done
for b in "${bins[@]}"; do objcopy --strip-debug "$b" "$STAGE/bin/$(basename "$b")"; done

# Libraries the device has itself: glibc's (ours must not shadow its loader's), the CUDA driver,
# and CUDA 13 toolkit libraries.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)\.'
missing=0
for f in "$STAGE"/tests/* "$STAGE"/bin/*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$name" =~ $skip ]] && continue
    if [[ "$path" == "not" ]]; then echo "package.sh: $f needs $name, not found" >&2; missing=1; continue; fi
    [[ -e "$STAGE/lib/$name" ]] || cp -L "$path" "$STAGE/lib/$name"
  done < <(ldd "$f")
done
[[ $missing -eq 0 ]] || exit 1

rm -rf "$DEST"
mkdir -p "$DEST/models/shapes" "$DEST/models/tiny-random"
tar -C "$STAGE" -cf - tests bin lib | xz -T0 -9e >"$DEST/payload.tar.xz"  # -9e: ~15% smaller than -6
for d in "$SHARED"/models/shapes/*/; do
  mkdir -p "$DEST/models/shapes/$(basename "$d")"
  cp "$d/config.json" "$DEST/models/shapes/$(basename "$d")/"
done
cp -r "$SHARED"/models/tiny-random/. "$DEST/models/tiny-random/"
# The long-context model of the Vegas test and vegas_bench (SPECD_GPU_SKIP_TESTS=cuda_vegas_test
# leaves both out when the carry is tight).
if printf '%s\n' "${tests[@]}" | grep -q '/cuda_vegas_test$'; then
  cp -r "$SHARED/models/codepair-long" "$DEST/models/"
fi
chmod -R u+w "$DEST"  # ../shared is read-only; the next package.sh must be able to delete this

{
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' +local changes')"
  echo "build: $BUILD ($(grep -m1 '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" | cut -d= -f2)," \
       "$(grep -o -m1 'arch=compute_[0-9a-z]*' "$BUILD/compile_commands.json" 2>/dev/null || echo 'arch unknown'))"
  echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$STAGE" && find tests bin lib -type f -printf '%10s  %p\n' | sort -k2)
  (cd "$DEST" && find models -type f -printf '%10s  %p\n' | sort -k2)
} >"$DEST/MANIFEST"

# What the device tool would carry: the working tree (tracked and untracked-not-ignored files)
# plus this folder.
carry_kib=$(du -sk "$DEST" | cut -f1)
# (Files moved aside for a run are listed but absent: du skips them, and its status is ignored.)
tree_bytes=$( (git ls-files -z --cached --others --exclude-standard |
  du -cb --files0-from=- 2>/dev/null || true) | tail -n 1 | cut -f1)
tree_kib=$(( ${tree_bytes:-0} / 1024 ))
unpacked_kib=$(du -sk "$STAGE" | cut -f1)
echo "package.sh: $DEST: ${#tests[@]} gpu test(s), ${#bins[@]} program(s)," \
     "$(find "$STAGE/lib" -type f | wc -l) libraries ($((unpacked_kib / 1024)) MiB unpacked)"
echo "package.sh: carry $((carry_kib / 1024)) MiB + working tree $((tree_kib / 1024)) MiB" \
     "= $(((carry_kib + tree_kib) / 1024)) MiB of the device tool's ${CARRY_LIMIT_MIB} MiB"
if (( carry_kib + tree_kib > (CARRY_LIMIT_MIB - MARGIN_MIB) * 1024 )); then
  die "over $((CARRY_LIMIT_MIB - MARGIN_MIB)) MiB: the device tool will refuse it"
fi
