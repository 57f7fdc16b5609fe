#!/usr/bin/env bash
# Runs every libFuzzer target of a SPECD_FUZZ build folder for a bounded time under ASan +
# UBSan, seeded with tests/fuzz/corpus/<target>/. Any crash, sanitizer report, leak, timeout
# or out-of-memory fails the run; the reproducer is left in $FUZZ_OUT/<target>/ (add it to
# the corpus once fixed: every crash becomes a corpus entry).
#   tools/ci/fuzz.sh [BUILD_DIR]     (default build-asan)
# FUZZ_SECONDS (default 30) per target, FUZZ_JOBS (default 2) targets at a time.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-asan}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-30}
JOBS=${FUZZ_JOBS:-2}
OUT=${FUZZ_OUT:-$BUILD/fuzz-out}
LIST="$BUILD/tests/fuzz/fuzz_targets.txt"
[ -f "$LIST" ] || { echo "fuzz.sh: $LIST missing: configure $BUILD with -DSPECD_FUZZ=ON" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

fuzz_one() {
  local target=$1 build=$2 out=$3 secs=$4
  local dir="$out/$target"
  mkdir -p "$dir/corpus"
  # The seeds are read, never written: new inputs go to the scratch corpus in $dir.
  if "$build/tests/fuzz/${target}_fuzzer" "$dir/corpus" "tests/fuzz/corpus/$target" \
      -max_total_time="$secs" -timeout=25 -rss_limit_mb=2560 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$dir/" >"$dir/log" 2>&1; then
    local runs
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$')
    echo "fuzz: $target ok (${runs:-?} runs in ${secs}s)"
  else
    echo "fuzz: $target FAILED; reproducer and log in $dir:" >&2
    ls "$dir" >&2
    tail -n 60 "$dir/log" >&2
    return 1
  fi
}
export -f fuzz_one

status=0
xargs -P "$JOBS" -I{} bash -c 'fuzz_one "$@"' _ {} "$BUILD" "$OUT" "$SECONDS_PER_TARGET" \
  <"$LIST" || status=1
exit $status
