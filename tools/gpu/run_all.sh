#!/usr/bin/env bash
# The one script the device machine runs; it builds nothing. Given a directory packed by
# tools/gpu/package.sh, runs every gpu-labelled test binary in DIR/tests, then
# `kernel_check --mode check` and `--mode perf`, with DIR/lib first on LD_LIBRARY_PATH. The whole
# log goes to LOG_DIR/run_all.log (LOG_DIR: $OUT when set, so it comes back with the device
# tool); the perf table and a short summary table are printed last. On this machine a test that
# exits 77 (no GPU visible) counts as a failure. Exit status 0 only when every step passed.
# usage: tools/gpu/run_all.sh DIR [--sanitize]
#   --sanitize  also run each test binary under compute-sanitizer memcheck
#   STEP_TIMEOUT (seconds, default 240) bounds each step.
set -uo pipefail
DIR=$(cd "${1:?usage: run_all.sh DIR [--sanitize]}" && pwd) || exit 2
SANITIZE=0
[[ "${2:-}" == "--sanitize" ]] && SANITIZE=1
LOG_DIR=${OUT:-$DIR/logs}
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/run_all.log"
: >"$LOG"
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
# Our libraries first; the CUDA runtime from the system, or the toolkit as a fallback.
export LD_LIBRARY_PATH="$DIR/lib:${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64:/usr/local/cuda/lib"

summary=()
failed=0

# run_step NAME COMMAND...: runs with a timeout, appends output to the log, records a summary row.
run_step() {
  local name=$1; shift
  local start=$SECONDS rc result
  echo "===== $name: $*" >>"$LOG"
  timeout "$STEP_TIMEOUT" "$@" >"$LOG_DIR/step.out" 2>&1
  rc=$?
  cat "$LOG_DIR/step.out" >>"$LOG"
  case $rc in
    0) result=PASS ;;
    77) result="FAIL (exit 77: no GPU visible)" ;;
    124) result="FAIL (timeout ${STEP_TIMEOUT}s)" ;;
    *) result="FAIL (exit $rc)" ;;
  esac
  if [[ $rc -ne 0 ]]; then
    failed=1
    echo "----- $name failed; last lines:"
    tail -n 25 "$LOG_DIR/step.out"
  fi
  summary+=("$(printf '%-44s %-32s %5ds' "$name" "$result" $((SECONDS - start)))")
  return $rc
}

{
  echo "run_all: $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [[ -f "$DIR/MANIFEST" ]] && head -n 3 "$DIR/MANIFEST"
} | tee -a "$LOG"

for t in "$DIR"/tests/*; do
  [[ -x "$t" ]] || continue
  run_step "$(basename "$t")" "$t" --gtest_brief=1
  if [[ $SANITIZE -eq 1 ]] && command -v compute-sanitizer >/dev/null; then
    run_step "$(basename "$t") (memcheck)" compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$t" --gtest_brief=1
  fi
done

if run_step "kernel_check --mode check" "$DIR/bin/kernel_check" --mode check; then
  check_line=$(grep -m1 '^check:' "$LOG_DIR/step.out")
else
  grep -E 'FAIL' "$LOG_DIR/step.out" | head -n 20
fi
run_step "kernel_check --mode perf" "$DIR/bin/kernel_check" --mode perf && cat "$LOG_DIR/step.out"
rm -f "$LOG_DIR/step.out"

echo
printf '%-44s %-32s %6s\n' step result time
printf '%s\n' "${summary[@]}"
[[ -n "${check_line:-}" ]] && echo "$check_line"
echo "log: $LOG"
exit $failed
