#!/usr/bin/env bash
# Packs what the device machine runs, from a CUDA build made here, into .carry/gpu/ (git-ignored):
#   tests/  every gpu-labelled ctest binary (debug info stripped)
#   bin/    kernel_check
#   lib/    the shared libraries they load (ldd), except glibc and the CUDA driver and toolkit
#           libraries (libcuda, libcudart, libcublas*, libnccl, ...), which the device provides
#   MANIFEST  commit, build dir, file sizes
# Then: the device tool runs `bash tools/gpu/run_all.sh .carry/gpu` with carry [".carry/gpu"].
# usage: tools/gpu/package.sh [BUILD_DIR]   (default build-cuda; build it first)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-cuda}
DEST=.carry/gpu
LIMIT_MIB=60  # the device tool carries at most 64 MiB with the working tree

[[ -f "$BUILD/CTestTestfile.cmake" ]] || { echo "package.sh: no ctest build in $BUILD" >&2; exit 1; }

# gpu-labelled tests as ctest lists them (command[0] is the binary).
mapfile -t tests < <(ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 |
  python3 -c 'import json,sys; [print(t["command"][0]) for t in json.load(sys.stdin).get("tests",[]) if t.get("command")]')
kernel_check=$(find "$BUILD" -name kernel_check -type f -perm -u+x | head -n 1)
[[ ${#tests[@]} -gt 0 ]] || { echo "package.sh: ctest lists no gpu-labelled test in $BUILD" >&2; exit 1; }
if [[ -z "$kernel_check" ]]; then
  echo "package.sh: no kernel_check in $BUILD (tools/CMakeLists.txt needs add_subdirectory(kernel_check))" >&2
  exit 1
fi
for t in "${tests[@]}"; do [[ -x "$t" ]] || { echo "package.sh: $t not built" >&2; exit 1; }; done

rm -rf "$DEST"
mkdir -p "$DEST/tests" "$DEST/bin" "$DEST/lib"
for t in "${tests[@]}"; do objcopy --strip-debug "$t" "$DEST/tests/$(basename "$t")"; done
objcopy --strip-debug "$kernel_check" "$DEST/bin/kernel_check"

# Libraries the device has itself: glibc's (ours must not shadow its loader's), the CUDA driver,
# and CUDA 13 toolkit libraries.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)\.'
missing=0
for f in "$DEST"/tests/* "$DEST"/bin/*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$name" =~ $skip ]] && continue
    if [[ "$path" == "not" ]]; then echo "package.sh: $f needs $name, not found" >&2; missing=1; continue; fi
    [[ -e "$DEST/lib/$name" ]] || cp -L "$path" "$DEST/lib/$name"
  done < <(ldd "$f")
done
[[ $missing -eq 0 ]] || exit 1

{
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' +local changes')"
  echo "build: $BUILD ($(grep -m1 '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" | cut -d= -f2)," \
       "$(grep -o -m1 'arch=compute_[0-9a-z]*' "$BUILD/compile_commands.json" 2>/dev/null || echo 'arch unknown'))"
  echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$DEST" && find tests bin lib -type f -printf '%10s  %p\n' | sort -k2)
} >"$DEST/MANIFEST"

size_kib=$(du -sk "$DEST" | cut -f1)
echo "package.sh: $DEST holds ${#tests[@]} gpu test(s), kernel_check and $(find "$DEST/lib" -type f | wc -l) libraries, $((size_kib / 1024)) MiB"
if (( size_kib > LIMIT_MIB * 1024 )); then
  echo "package.sh: over ${LIMIT_MIB} MiB: the device tool will refuse it with the working tree" >&2
  exit 1
fi
