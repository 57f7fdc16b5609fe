#!/usr/bin/env bash
# The one script the device machine runs; it builds nothing. Given the folder tools/gpu/package.sh
# packed (.carry/gpu), it unpacks payload.tar.xz into WORK and runs, each step under a timeout and
# all within one overall budget:
#   every gpu-labelled test (SPECD_SHARED_DIR names a folder whose models/ holds the packed models
#     and the working tree's models/codepair; SPECD_SOURCE_DIR names the working tree)
#   kernel_check --mode check; a `specd serve --load-format dummy` smoke (Llama-3.1-8B shapes,
#     three completions, one streamed, then SIGTERM and exit 0); attention_bench;
#     tools/gpu/sdpa_bench.py (PyTorch SDPA, the baseline); gemm_bench; kernel_check --mode perf;
#     spec_bench (codepair end to end: plain, draft model and n-gram speculation, batch 1 and 16;
#     greedy, temperature 1, temperature 0.7 with top_p 0.95);
#     vegas_bench (codepair-long at 8K context: plain vs Vegas vs streaming at K 4 / 6 / 8 and
#     ratio 0.05 / 0.07 / 0.1, batch 1 and 8);
#     `auto` speculation (steps named "auto: ..."): specd_profile for the 8B / 1B shapes and the
#     codepair pair (cost profiles into LOG_DIR), then spec_bench --auto against the best fixed
#     choice over K 1-8 at batch 1, 4, 16, 64 (codepair; 8B / 1B at alpha 0.6 and 0.8);
#     with two GPUs, ssd_bench (the same plus SSD, speculator on the second GPU, batch 1, 4, 16),
#     ssd_saguaro_bench (temperature 1, Saguaro's C swept), ssd_cache_sampling_cuda (when packed:
#     the chi-square tests of sampled SSD cache hits, verifier and speculator on the GPUs)
#     and ssd_replay_bench (8B / 1B shapes, random weights, controlled acceptance alpha 0.8;
#     the time budget and "fixed" F side by side; ssd_replay_bench 32b: Qwen3-32B + 0.6B shapes;
#     ssd_parallel_replay_bench: the parallel 1B draft in the speculator; ssd_eagle3_replay_bench
#     and ssd_eagle3_bench codepair: the EAGLE-3 head in the speculator; with three or more
#     GPUs, ssd_tp_replay_bench: a TP 2 verifier and the speculator on a third GPU)
#     decode_bench (decode, throughput, TTFT and prefill against the roofline)
# Our binaries get WORK/lib first on LD_LIBRARY_PATH; python3 keeps the machine's own libraries.
# The whole log goes to LOG_DIR/run_all.log (LOG_DIR: $OUT when set, so it comes back with the
# device tool). Printed last: the benchmarks' key lines and a summary table (step, result,
# seconds). A test that exits 77 (no GPU visible) counts as a failure here. Exit status 0 only
# when every step ran and passed (benchmarks pass when they ran; their targets are in their table).
# usage: tools/gpu/run_all.sh DIR [--quick] [--only REGEX] [--sanitize]
#   --quick     shorter benchmarks (decode_bench --quick): ~3 minutes in all
#   --only RE   only the steps whose names match the extended regex RE (e.g. 'bench|serve')
#   --sanitize  also run each test binary under compute-sanitizer memcheck
#   BUDGET (seconds, default 540) bounds the whole run; STEP_TIMEOUT (default 240) each step;
#   WORK (default /tmp/specd-gpu) is where the payload is unpacked.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$(cd "${1:?usage: run_all.sh DIR [--quick] [--only REGEX] [--sanitize]}" && pwd) || exit 2
shift
QUICK=0 SANITIZE=0 ONLY=.
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --sanitize) SANITIZE=1 ;;
    --only) ONLY=${2:?--only needs a regex}; shift ;;
    *) echo "run_all.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
BUDGET=${BUDGET:-540}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
WORK=${WORK:-/tmp/specd-gpu}
LOG_DIR=${OUT:-$WORK/logs}
mkdir -p "$LOG_DIR" "$WORK/steps"
LOG="$LOG_DIR/run_all.log"
: >"$LOG"
cd "$REPO" || exit 2

summary=()
key_lines=()
declare -A passed=()
failed=0

# run_step NAME TIMEOUT COMMAND...: runs COMMAND under min(TIMEOUT, what is left of the budget),
# output to WORK/steps/NAME.out and the log; records a summary row. Returns COMMAND's status.
run_step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc result out="$WORK/steps/${name//[^A-Za-z0-9_.-]/_}.out"
  local left=$((BUDGET - SECONDS))
  [[ "$name" =~ $ONLY ]] || return 0
  if (( left < 15 )); then
    summary+=("$(printf '%-36s %-30s %5ds' "$name" "SKIPPED (budget ${BUDGET}s spent)" 0)")
    failed=1
    return 1
  fi
  (( limit > left )) && limit=$left
  echo "===== $name: $*" >>"$LOG"
  timeout -k 10 "$limit" "$@" >"$out" 2>&1
  rc=$?
  cat "$out" >>"$LOG"
  case $rc in
    0) result=PASS; passed[$name]=1 ;;
    77) result="FAIL (exit 77: no GPU visible)" ;;
    124 | 137) result="FAIL (timeout ${limit}s)" ;;
    127) result="FAIL (not packed)" ;;
    *) result="FAIL (exit $rc)" ;;
  esac
  if [[ $rc -ne 0 ]]; then
    failed=1
    echo "----- $name failed; last lines:"
    tail -n 25 "$out"
  fi
  summary+=("$(printf '%-36s %-30s %5ds' "$name" "$result" $((SECONDS - start)))")
  return $rc
}

# Our programs run as "${OURS[@]}" PROGRAM: packed libraries first, then the CUDA toolkit's.
export OUR_LIBRARY_PATH="$WORK/lib:${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
OURS=(env "LD_LIBRARY_PATH=$OUR_LIBRARY_PATH")
# Tests that launch specd processes (tensor-parallel workers) find the packed one here.
export SPECD_BINARY="$WORK/bin/specd"
export WORK DIR REPO

# Unpacks the payload and lays out the shared folder the tests read.
# shellcheck disable=SC2317  # run through `bash -c` (under timeout)
prepare() {
  rm -rf "${WORK:?}/tests" "${WORK:?}/bin" "${WORK:?}/lib" "${WORK:?}/shared"
  if command -v xz >/dev/null; then
    tar -C "$WORK" -xJf "$DIR/payload.tar.xz" || return 1
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$DIR/payload.tar.xz" "$WORK" || return 1
  fi
  mkdir -p "$WORK/shared/models"
  for m in "$DIR"/models/*; do ln -s "$m" "$WORK/shared/models/$(basename "$m")"; done
  ln -sfn "$REPO/models/codepair" "$WORK/shared/models/codepair"
  ls "$WORK/tests" "$WORK/bin"
}
export -f prepare

# specd serve on a dummy Llama-3.1-8B: waits for "specd: listening", sends three completions (one
# streamed) and checks each is a 200 with the tokens asked for, then SIGTERM and exit status 0.
# shellcheck disable=SC2317  # run through `bash -c` (under timeout)
serve_smoke() {
  local log="$WORK/steps/specd_serve.log" pid port rc
  env LD_LIBRARY_PATH="$OUR_LIBRARY_PATH" "$WORK/bin/specd" serve --model "$DIR/models/shapes/llama-3.1-8b" --load-format dummy \
    --device cuda --port 0 --grpc-port 0 --max-model-len 8192 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    grep -q 'specd: listening' "$log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "serve_smoke: specd exited before listening"; return 1; }
    sleep 0.5
  done
  port=$(grep -m1 -o 'specd: listening http=[^ ]*' "$log" | sed 's/.*://')
  [[ -n "$port" ]] || { kill -TERM "$pid"; cat "$log"; echo "serve_smoke: not listening"; return 1; }
  echo "serve_smoke: listening on port $port after ${SECONDS}s"
  python3 - "$port" <<'PY'
import http.client, json, sys
port = int(sys.argv[1])
def post(body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()
prompt = [(i * 7919) % 1000 + 3 for i in range(300)]  # ids valid in any vocabulary of >= 1003
cases = [dict(prompt=prompt[:12], max_tokens=16, temperature=0),
         dict(prompt=prompt, max_tokens=32, temperature=0.8, top_p=0.9, seed=7)]
for body in cases:
    r = post(dict(body, ignore_eos=True))
    data = json.loads(r.read())
    got = data.get("usage", {}).get("completion_tokens")
    print(f"completion: HTTP {r.status}, {got} tokens: {data.get('choices', [{}])[0].get('text', '')[:60]!r}")
    assert r.status == 200 and got == body["max_tokens"], data
r = post(dict(prompt=prompt[:40], max_tokens=24, temperature=0, ignore_eos=True, stream=True,
              stream_options={"include_usage": True}))
events = [l[6:] for l in r.read().decode().splitlines() if l.startswith("data: ")]
usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
print(f"stream: HTTP {r.status}, {len(events)} events, last {events[-1] if events else None!r}, usage {usage[-1] if usage else None}")
assert r.status == 200 and events[-1] == "[DONE]" and usage and usage[-1]["completion_tokens"] == 24
PY
  rc=$?
  kill -TERM "$pid"
  wait "$pid"
  local exit_status=$?
  tail -n 5 "$log"
  echo "serve_smoke: client status $rc, specd exit status $exit_status after SIGTERM"
  [[ $rc -eq 0 && $exit_status -eq 0 ]]
}
export -f serve_smoke

# Tensor parallelism (issues 17 and 21), two GPUs: `specd serve -tp 2` on a dummy Llama-3.1-8B
# answers a greedy completion identical to TP 1's; then a worker rank is killed: specd must fail
# /ready and exit non-zero within its --tp-timeout, and a request in flight must end with an error.
# shellcheck disable=SC2317  # run through `bash -c` (under timeout)
tp_serve_fault() {
  local tp=$1 log="$WORK/steps/specd_tp_serve_$1.log" pid port rc
  env LD_LIBRARY_PATH="$OUR_LIBRARY_PATH" "$WORK/bin/specd" serve --model "$DIR/models/shapes/llama-3.1-8b" \
    --load-format dummy --device cuda --port 0 --grpc-port -1 --max-model-len 4096 \
    --tensor-parallel-size "$tp" --tp-timeout 10 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    grep -q 'specd: listening' "$log" && break
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$log"; echo "tp_serve: specd exited early"; return 1; }
    sleep 0.5
  done
  port=$(grep -m1 -o 'specd: listening http=[^ ]*' "$log" | sed 's/.*://')
  [[ -n "$port" ]] || { kill -9 "$pid"; tail -n 30 "$log"; return 1; }
  python3 - "$port" "$WORK/steps/tp_greedy_$tp.txt" <<'PY'
import http.client, json, sys
port, out = int(sys.argv[1]), sys.argv[2]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
prompt = [(i * 7919) % 1000 + 3 for i in range(64)]
conn.request("POST", "/v1/completions", json.dumps(dict(prompt=prompt, max_tokens=32,
             temperature=0, ignore_eos=True, logprobs=0)), {"Content-Type": "application/json"})
data = json.loads(conn.getresponse().read())
text = data["choices"][0]["text"]
open(out, "w").write(text)
print(f"tp_serve: greedy completion {data['usage']['completion_tokens']} tokens: {text[:60]!r}")
PY
  rc=$?
  if [[ "$tp" == 1 ]]; then
    kill -TERM "$pid"; wait "$pid"; return $rc
  fi
  # A long request in flight, then a worker killed.
  python3 - "$port" >"$WORK/steps/tp_inflight.out" 2>&1 <<'PY' &
import http.client, json, sys
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=120)
conn.request("POST", "/v1/completions", json.dumps(dict(prompt=[5, 6, 7], max_tokens=3000,
             temperature=0, ignore_eos=True, stream=True)), {"Content-Type": "application/json"})
r = conn.getresponse()
body = r.read().decode(errors="replace")
print("in-flight:", r.status, body[-300:].replace("\n", " "))
PY
  local client=$!
  sleep 3
  local worker
  worker=$(pgrep -f "specd worker" | head -n 1)
  local killed=$SECONDS
  kill -9 "$worker"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then  # still there after 30 s: where are its threads?
    echo "tp_serve: specd still running 30 s after the kill; thread states:"
    for t in /proc/"$pid"/task/*; do echo "$(cat "$t/comm") $(cat "$t/wchan" 2>/dev/null)"; done
    kill -9 "$pid"
  fi
  wait "$pid"
  local exit_status=$?
  wait "$client"
  cp "$log" "$LOG_DIR/" 2>/dev/null
  echo "tp_serve: worker $worker killed; specd exit status $exit_status after $((SECONDS - killed))s"
  cat "$WORK/steps/tp_inflight.out"
  grep -E 'tensor-parallel group failed|engine failed' "$log" | head -n 3
  [[ $rc -eq 0 && $exit_status -ne 0 && $((SECONDS - killed)) -lt 30 ]] &&
    grep -q 'error' "$WORK/steps/tp_inflight.out"
}
export -f tp_serve_fault

# Two "nodes" on one host (issue 17's multi-node path): node 0 is `specd serve -tp 2 --nnodes 2`
# on GPU 0, node 1 a `specd worker --nnodes 2 --node-rank 1` that sees only GPU 1
# (CUDA_VISIBLE_DEVICES), both with the same secret file; a greedy completion, then SIGTERM.
# shellcheck disable=SC2317  # run through `bash -c` (under timeout)
tp_two_nodes() {
  local log="$WORK/steps/specd_two_nodes.log" secret="$WORK/tp.secret" pid wpid port
  python3 -c 'import secrets; print(secrets.token_hex(32))' >"$secret"; chmod 600 "$secret"
  env LD_LIBRARY_PATH="$OUR_LIBRARY_PATH" CUDA_VISIBLE_DEVICES=0 "$WORK/bin/specd" serve \
    --model "$DIR/models/shapes/llama-3.1-8b" --load-format dummy --device cuda --port 0 \
    --grpc-port -1 --max-model-len 4096 -tp 2 --nnodes 2 --node-rank 0 \
    --master-addr 127.0.0.1 --master-port 29517 --tp-secret-file "$secret" >"$log" 2>&1 &
  pid=$!
  env LD_LIBRARY_PATH="$OUR_LIBRARY_PATH" CUDA_VISIBLE_DEVICES=1 "$WORK/bin/specd" worker \
    -tp 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29517 \
    --secret-file "$secret" --health-port 0 >"$log.worker" 2>&1 &
  wpid=$!
  for _ in $(seq 1 240); do
    grep -q 'specd: listening' "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  port=$(grep -m1 -o 'specd: listening http=[^ ]*' "$log" | sed 's/.*://')
  cp "$log" "$log.worker" "$LOG_DIR/" 2>/dev/null
  [[ -n "$port" ]] || { kill -9 "$pid" "$wpid"; tail -n 20 "$log" "$log.worker"; return 1; }
  grep -m1 'engine: model' "$log"
  curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": [5, 6, 7, 8], "max_tokens": 16, "temperature": 0, "ignore_eos": true}' |
    tee "$WORK/steps/two_nodes_reply.json"; echo
  kill -TERM "$pid"; wait "$pid"; local rc=$?
  for _ in $(seq 1 20); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$wpid" 2>/dev/null && { echo "two_nodes: the worker node outlived rank 0"; kill -9 "$wpid"; rc=1; }
  wait "$wpid"; echo "two_nodes: specd exit $rc, worker node exit $?"
  grep -q '"completion_tokens":16' "$WORK/steps/two_nodes_reply.json" && [[ $rc -eq 0 ]]
}
export -f tp_two_nodes

{
  echo "run_all: $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET}s"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [[ -f "$DIR/MANIFEST" ]] && head -n 3 "$DIR/MANIFEST"
} | tee -a "$LOG"

ONLY_ASKED=$ONLY ONLY=.  # unpacking always runs
run_step "unpack" 120 bash -c prepare || { printf '%s\n' "${summary[@]}"; exit 1; }
ONLY=$ONLY_ASKED
export SPECD_SHARED_DIR="$WORK/shared" SPECD_SOURCE_DIR="$REPO"

for t in "$WORK"/tests/*; do
  [[ -x "$t" ]] || continue
  run_step "$(basename "$t")" "$STEP_TIMEOUT" "${OURS[@]}" "$t" --gtest_brief=1
  if [[ $SANITIZE -eq 1 ]] && command -v compute-sanitizer >/dev/null; then
    run_step "$(basename "$t") (memcheck)" "$STEP_TIMEOUT" "${OURS[@]}" compute-sanitizer --tool memcheck \
      --error-exitcode 1 "$t" --gtest_brief=1
  fi
done

steps_out() { cat "$WORK/steps/${1//[^A-Za-z0-9_.-]/_}.out" 2>/dev/null; }
run_step "kernel_check check" 120 "${OURS[@]}" "$WORK/bin/kernel_check" --mode check ||
  steps_out "kernel_check check" | grep -E 'FAIL' | head -n 20
key_lines+=("$(steps_out "kernel_check check" | grep -m1 '^check:')")
run_step "specd serve smoke" 150 bash -c serve_smoke
run_step "attention_bench" 90 "${OURS[@]}" "$WORK/bin/attention_bench"
run_step "sdpa_bench.py" 90 env PYTHONUNBUFFERED=1 python3 tools/gpu/sdpa_bench.py
run_step "gemm_bench" 60 "${OURS[@]}" "$WORK/bin/gemm_bench"
run_step "verify_bench" 90 "${OURS[@]}" "$WORK/bin/verify_bench"
run_step "verify_torch_bench.py" 90 env PYTHONUNBUFFERED=1 python3 tools/gpu/verify_torch_bench.py \
  --compare "$WORK/steps/verify_bench.out"
run_step "spec_bench" 150 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda --batches 1,16 \
  --k 4 --max-tokens 128
# Sampled requests (issue 16): speculation verified on the device (StepSampledVerify).
run_step "spec_bench t=1" 150 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda --batches 1,16 \
  --k 4 --max-tokens 128 --temperature 1
run_step "spec_bench t=0.7 p=0.95" 150 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
  --batches 1,16 --k 4 --max-tokens 128 --temperature 0.7 --top-p 0.95
# Vegas and streaming self-speculation at long context (issue 18): codepair-long, 8K-token
# prompts, plain vs both methods over K and sparsity ratio, batch 1 and 8.
run_step "vegas_bench" 240 "${OURS[@]}" "$WORK/bin/vegas_bench" --device cuda \
  --model "$DIR/models/codepair-long" --context 8192 --batches 1,8 --ks 4,6,8 \
  --ratios 0.05,0.07,0.1 --max-tokens 128 --repeats 2
# The sampled verification step against the greedy one (issue 16): Llama-3.1-8B / 3.2-1B shapes,
# random weights, draft model on the same GPU; spec_bench's "per step: verify" column.
for k in 4 8; do
  for t in 0 1; do
    run_step "verify_step 8b k=$k t=$t" 120 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
      --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
      --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 16 \
      --batches 1,16 --k "$k" --max-tokens 32 --repeats 1 --temperature "$t"
  done
done
# `auto` speculation (issue 20); `--only auto` runs exactly these five steps. First the cost
# profiles: plain, greedy verification and draft-model step times of Llama-3.1-8B / 3.2-1B shapes
# (random weights) over batch x context x tokens, and of the codepair pair (a small grid: its
# prompts are a few hundred tokens), written to LOG_DIR (they come back with $OUT).
PROFILE_8B="$LOG_DIR/cost_profile_8b_1b.json" PROFILE_CODEPAIR="$LOG_DIR/cost_profile_codepair.json"
run_step "auto: specd_profile 8b/1b" 240 "${OURS[@]}" "$WORK/bin/specd_profile" --device cuda \
  --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
  --load-format dummy --batch 1,4,16,64 --context 512,4096,16384 --tokens 1,2,5,9 \
  --budget-seconds 150 --output "$PROFILE_8B"
run_step "auto: specd_profile codepair" 90 "${OURS[@]}" "$WORK/bin/specd_profile" --device cuda \
  --model models/codepair/target --draft models/codepair/draft --batch 1,4,16,64 \
  --context 128,512 --tokens 1,2,5,9 --budget-seconds 45 --output "$PROFILE_CODEPAIR"
# Then `auto` against the best fixed choice (plain, or the draft model / n-gram at K 1-8) at
# batch 1, 4, 16 and 64, each under its pair's profile; spec_bench ends with the summary table
# (PASS: auto >= 0.95x the best fixed choice and >= plain). codepair: natural acceptance, best
# of 5 (a batch-1 run is ~15 ms, a batch-64 one ~20 ms); 8B / 1B shapes: controlled acceptance alpha 0.6 and 0.8.
run_step "auto: spec_bench codepair" 150 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
  --batches 1,4,16,64 --ks 1,2,3,4,5,6,7,8 --auto --cost-profile "$PROFILE_CODEPAIR" \
  --max-tokens 64 --repeats 5 --max-num-seqs 64
for alpha in 0.6 0.8; do
  run_step "auto: spec_bench 8b/1b alpha=$alpha" 240 "${OURS[@]}" "$WORK/bin/spec_bench" \
    --device cuda --model "$DIR/models/shapes/llama-3.1-8b" \
    --draft "$DIR/models/shapes/llama-3.2-1b" --load-format dummy --random-prompts 128 \
    --replay-alpha "$alpha" --auto --cost-profile "$PROFILE_8B" --batches 1,4,16,64 \
    --ks 1,2,3,4,5,6,7,8 --max-tokens 64 --repeats 1 --max-model-len 1024 --max-num-seqs 64
done
# SSD on two GPUs (verifier cuda:0, speculator cuda:1) beside plain decoding and draft-model
# speculation on cuda:0, codepair pair (real acceptance), greedy, batch 1, 4 and 16.
if (( $(nvidia-smi -L 2>/dev/null | wc -l) >= 2 )); then
  for k in 4 7; do
    for build in interruptible complete; do
      run_step "ssd_bench k=$k $build" 200 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
        --batches 1,4,16 --k "$k" --max-tokens 128 --ssd --specd "$WORK/bin/specd" \
        --speculator-device cuda:1 --fan-out 3 --cache-build "$build"
    done
  done
  # Temperature 1 with Saguaro sampling, C swept (issue 34): codepair real acceptance, K 4, the
  # speculator's hit rate and tokens per round against greedy (ssd_bench k=4 above).
  for c in 0 0.25 0.5 1; do
    run_step "ssd_saguaro_bench c=$c" 200 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
      --batches 1,16 --k 4 --max-tokens 128 --temperature 1 --saguaro-c "$c" --ssd \
      --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3
  done
  # The device data path against the host one (issue 34 point 2): sampled SSD at 8B / 1B shapes
  # (random weights: the acceptance means nothing, but with b* out of the way every miss is
  # re-drafted and its q rows travel: K 7 rows of 128K f32 per sequence, 3.6 MB), q rows GPU to
  # GPU on NCCL or inline over TCP; and codepair at temperature 1 (real acceptance, C 0.5).
  for path in device host; do
    run_step "ssd_sampled_shapes_bench path=$path" 300 "${OURS[@]}" "$WORK/bin/spec_bench" \
      --device cuda:0 --model "$DIR/models/shapes/llama-3.1-8b" \
      --draft "$DIR/models/shapes/llama-3.2-1b" --load-format dummy --random-prompts 128 \
      --max-model-len 1024 --max-num-seqs 64 --batches 1,16 --k 7 --max-tokens 64 --repeats 1 \
      --temperature 1 --ssd --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3 \
      --critical-batch-size 1024 --data-path "$path"
    run_step "ssd_saguaro_bench c=0.5 path=$path" 200 "${OURS[@]}" "$WORK/bin/spec_bench" \
      --device cuda:0 --batches 1,16 --k 4 --max-tokens 128 --temperature 1 --saguaro-c 0.5 \
      --ssd --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3 --data-path "$path"
  done
  # Sampled SSD's cache on two GPUs (issue 34): ssd_cache_sampling_test's chi-square tests with
  # the verifier on cuda:0 and the speculator on cuda:1, whose sampled draws (candidates and
  # Saguaro down-weighting) run on its device. Packed only on request:
  # SPECD_GPU_PROGRAMS="... ssd_cache_sampling_test" tools/gpu/package.sh.
  if [[ -x "$WORK/bin/ssd_cache_sampling_test" ]]; then
    run_step "ssd_cache_sampling_cuda" 600 "${OURS[@]}" SPECD_SSD_TEST_DEVICE=cuda:0 \
      SPECD_SSD_TEST_SPECULATOR_DEVICE=cuda:1 SPECD_BINARY="$WORK/bin/specd" \
      "$WORK/bin/ssd_cache_sampling_test" --gtest_filter='*FollowTheTarget*'
    # The same, the q rows inline over TCP ("data_path": "host"): the path without NCCL.
    run_step "ssd_cache_sampling_cuda host" 600 "${OURS[@]}" SPECD_SSD_TEST_DEVICE=cuda:0 \
      SPECD_SSD_TEST_SPECULATOR_DEVICE=cuda:1 SPECD_BINARY="$WORK/bin/specd" \
      SPECD_SSD_TEST_DATA_PATH=host "$WORK/bin/ssd_cache_sampling_test" \
      --gtest_filter='*CachedDraftsFollowTheTarget*'
  fi
  # Controlled acceptance (issue 6 (b)): Llama-3.1-8B-shaped target and Llama-3.2-1B-shaped draft
  # with random weights; the drafts replay the target's recorded greedy output with alpha 0.8
  # (the draft still runs every pass); K 7, fan-out 3; plain, draft model and SSD side by side.
  run_step "ssd_replay_bench" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
    --batches 1,4,16 --k 7 \
    --max-tokens 128 --repeats 2 --replay-alpha 0.8 --replay-hit 0.9 --ssd \
    --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3
  # The same with the fixed budget (F 3 at every acceptance length), the time budget's A/B.
  run_step "ssd_replay_bench fixed" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
    --batches 1,4,16 --k 7 \
    --max-tokens 128 --repeats 1 --replay-alpha 0.8 --replay-hit 0.9 --ssd \
    --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3 --cache-budget fixed
  # Qwen3-32B + Qwen3-0.6B shapes (issue 34's third target): plain, the draft model and SSD (the
  # 0.6B draft model in the speculator) at K 4 and 7, batch 1 and 16.
  run_step "ssd_replay_bench 32b" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/qwen3-32b" --draft "$DIR/models/shapes/qwen3-0.6b" \
    --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
    --batches 1,16 --ks 4,7 --max-tokens 64 --repeats 1 --replay-alpha 0.8 --replay-hit 0.9 \
    --ssd --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3
  # Issue 34 point 1: the PARD-style Llama-3.2-1B-shaped parallel draft in the speculator (one
  # pass per round and per cache wave), beside plain decoding and in-process parallel drafting.
  run_step "ssd_parallel_replay_bench" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "models/shapes/pard-llama-3.2-1b" \
    --parallel --load-format dummy --random-prompts 128 --max-model-len 1024 \
    --max-num-seqs 64 --batches 1,4,16 --k 7 --max-tokens 128 --repeats 1 --replay-alpha 0.8 \
    --replay-hit 0.9 --ssd --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3
  # Issue 34 point 1: the EAGLE-3 head in the speculator on cuda:1 against the same head in
  # process, 8B shapes, controlled acceptance (every output checked against plain decoding's);
  # the verifier sends the target's hidden states with each outcome. Then codepair's trained
  # head, real acceptance.
  run_step "ssd_eagle3_replay_bench" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --eagle3 "models/shapes/eagle3-llama-3.1-8b" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1,4,16 --k 7 --max-tokens 128 --repeats 1 \
    --replay-alpha 0.8 --replay-hit 0.9 --ssd --ssd-drafter eagle3 --specd "$WORK/bin/specd" \
    --speculator-device cuda:1 --fan-out 3
  # Issue 34's head target is at batch 1: a longer run (512 tokens, 128 rounds), twice, so the
  # first rounds (before the window and the waves are measured) weigh little.
  run_step "ssd_eagle3_replay_bench b1" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --eagle3 "models/shapes/eagle3-llama-3.1-8b" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1 --k 7 --max-tokens 512 --repeats 2 \
    --replay-alpha 0.8 --replay-hit 0.9 --ssd --ssd-drafter eagle3 --specd "$WORK/bin/specd" \
    --speculator-device cuda:1 --fan-out 3
  # The same with the hidden rows inline over TCP ("data_path": "host"), the device path's A/B.
  run_step "ssd_eagle3_replay_bench host" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --eagle3 "models/shapes/eagle3-llama-3.1-8b" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1,16 --k 7 --max-tokens 128 --repeats 1 \
    --replay-alpha 0.8 --replay-hit 0.9 --ssd --ssd-drafter eagle3 --specd "$WORK/bin/specd" \
    --speculator-device cuda:1 --fan-out 3 --data-path host
  # The same without cache offers (every round asks and waits for its response): their A/B.
  run_step "ssd_eagle3_replay_bench offers off" 300 "${OURS[@]}" "$WORK/bin/spec_bench" \
    --device cuda:0 --model "$DIR/models/shapes/llama-3.1-8b" \
    --draft "$DIR/models/shapes/llama-3.2-1b" --eagle3 "models/shapes/eagle3-llama-3.1-8b" \
    --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
    --batches 1,4,16 --k 7 --max-tokens 128 --repeats 1 --replay-alpha 0.8 --replay-hit 0.9 \
    --ssd --ssd-drafter eagle3 --specd "$WORK/bin/specd" --speculator-device cuda:1 \
    --fan-out 3 --cache-offers 0
  run_step "ssd_eagle3_bench codepair" 200 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --eagle3 models/codepair/eagle3 --batches 1,16 --k 4 --max-tokens 128 --ssd \
    --ssd-drafter eagle3 --specd "$WORK/bin/specd" --speculator-device cuda:1 --fan-out 3
  # Issue 34 point 4: a tensor-parallel verifier (TP 2 on GPUs 0-1, rank 0 talks to the
  # speculator) and the speculator on a third GPU, beside plain decoding and draft-model
  # speculation at TP 2; where three or more GPUs are visible.
  if (( $(nvidia-smi -L 2>/dev/null | wc -l) >= 3 )); then
    run_step "ssd_tp_replay_bench" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
      --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
      --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
      --batches 1,4,16 --k 7 --max-tokens 128 --repeats 1 --replay-alpha 0.8 --replay-hit 0.9 \
      -tp 2 --ssd --specd "$WORK/bin/specd" --speculator-device cuda:2 --fan-out 3
  fi
else
  # One GPU: the same with the speculator process on the verifier's GPU (a functional run and a
  # look at the speculator's costs; the two processes time-share the GPU, so no SSD speedup).
  run_step "ssd_replay_bench (1 gpu)" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda:0 \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
    --batches 1,16 --k 7 \
    --max-tokens 64 --repeats 1 --replay-alpha 0.8 --replay-hit 0.9 --ssd \
    --specd "$WORK/bin/specd" --speculator-device cuda:0 --fan-out 3 --gpu-memory-utilization 0.45 \
    --speculator-gpu-memory-utilization 0.9
fi
# EAGLE-3 (issue 33): an EAGLE3-LLaMA3.1-8B-shaped head (models/shapes, random weights) on the
# Llama-3.1-8B-shaped target's GPU, beside plain decoding and the Llama-3.2-1B-shaped draft model;
# controlled acceptance alpha 0.8 (both drafters replay the same trajectories), K 7, greedy.
for shapes in "llama-3.1-8b eagle3-llama-3.1-8b llama-3.2-1b" "qwen3-8b eagle3-qwen3-8b qwen3-0.6b" \
  "qwen3-32b eagle3-qwen3-32b qwen3-0.6b"; do
  read -r target head draft <<<"$shapes"
  run_step "eagle3_replay_bench $target" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
    --model "$DIR/models/shapes/$target" --draft "$DIR/models/shapes/$draft" \
    --eagle3 "models/shapes/$head" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1,16 --k 7 --max-tokens 128 --repeats 2 \
    --replay-alpha 0.8
done
# Sampled EAGLE-3 rounds (issue 33): temperature 1, the sampled chain and round graphs against a
# pass and a draw per step (SPECD_EAGLE3_SAMPLED_GRAPHS=0), side by side; random weights accept
# little, so the per-round draft time is what compares.
for graphs in 1 0; do
  run_step "eagle3_sampled_bench graphs=$graphs" 300 "${OURS[@]}" \
    "SPECD_EAGLE3_SAMPLED_GRAPHS=$graphs" "$WORK/bin/spec_bench" --device cuda \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --eagle3 "models/shapes/eagle3-llama-3.1-8b" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1,16 --k 7 --max-tokens 128 --repeats 2 \
    --temperature 1
done
# Token trees (issue 33 point 2): the same shapes and replay (each recorded token among a node's
# children with probability alpha), the head's chain K 7 beside its trees and the draft model's.
for shapes in "llama-3.1-8b eagle3-llama-3.1-8b llama-3.2-1b" "qwen3-8b eagle3-qwen3-8b qwen3-0.6b"; do
  read -r target head draft <<<"$shapes"
  run_step "tree_replay_bench $target" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
    --model "$DIR/models/shapes/$target" --draft "$DIR/models/shapes/$draft" \
    --eagle3 "models/shapes/$head" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1,16 --ks 7 --trees 4/2/8,7/2/14,8/4/24 \
    --max-tokens 128 --repeats 1 --replay-alpha 0.8
done
# Parallel drafting (issue 33): a PARD-style Llama-3.2-1B-shaped draft (models/shapes, random
# weights, its pard_token) drafts K 7 in one pass for the 8B-shaped target; same replay.
run_step "pard_replay_bench llama-3.1-8b" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
  --model "$DIR/models/shapes/llama-3.1-8b" --draft "models/shapes/pard-llama-3.2-1b" --parallel \
  --load-format dummy --random-prompts 128 --max-model-len 1024 --max-num-seqs 64 \
  --batches 1,16 --k 7 --max-tokens 128 --repeats 2 --replay-alpha 0.8
decode_args=(--model-dir "$DIR/models/shapes/llama-3.1-8b")
[[ $QUICK -eq 1 ]] && decode_args+=(--quick)
run_step "decode_bench" 300 "${OURS[@]}" "$WORK/bin/decode_bench" "${decode_args[@]}"
# Programmatic dependent launch on and off (SPECD_PDL=0), side by side: the Llama-3.2-1B shapes
# (the draft model of issue 16, whose small kernels gain the most) and the 8B shapes.
for pdl in 1 0; do
  run_step "decode_bench 1b pdl=$pdl" 120 env SPECD_PDL=$pdl "${OURS[@]}" "$WORK/bin/decode_bench" \
    --model-dir "$DIR/models/shapes/llama-3.2-1b" --quick
done
if [[ $(nvidia-smi -L 2>/dev/null | wc -l) -ge 2 ]]; then
  run_step "tp_serve tp=1" 150 bash -c "tp_serve_fault 1"
  run_step "tp_serve tp=2 + fault" 200 bash -c "tp_serve_fault 2"
  # Side by side: TP 1 then TP 2, the same shapes and sizes (issue 21, point 2).
  tp_args=(--model-dir "$DIR/models/shapes/llama-3.1-8b" --contexts 512,32768 --batches 1,8,32,64
           --ttft 1024 --prefill-tokens 4096 --decode-steps 32 --repeats 2)
  run_step "decode_bench tp=1 (tp shapes)" 200 "${OURS[@]}" "$WORK/bin/decode_bench" "${tp_args[@]}"
  run_step "decode_bench tp=2" 200 "${OURS[@]}" "$WORK/bin/decode_bench" "${tp_args[@]}" \
    --tensor-parallel-size 2 --specd "$WORK/bin/specd"
  # The same with NCCL for every all-reduce (the one-shot kernel off): the A/B of issue 17 point 7.
  run_step "decode_bench tp=2 nccl only" 200 env SPECD_ONESHOT_ALLREDUCE_MAX_BYTES=0 "${OURS[@]}" \
    "$WORK/bin/decode_bench" "${tp_args[@]}" --tensor-parallel-size 2 --specd "$WORK/bin/specd"
  # TP 1 and TP 2 without programmatic dependent launch (SPECD_PDL=0): what it saves at each.
  run_step "decode_bench tp=1 pdl=0" 200 env SPECD_PDL=0 "${OURS[@]}" "$WORK/bin/decode_bench" \
    "${tp_args[@]}"
  run_step "decode_bench tp=2 pdl=0" 200 env SPECD_PDL=0 "${OURS[@]}" "$WORK/bin/decode_bench" \
    "${tp_args[@]}" --tensor-parallel-size 2 --specd "$WORK/bin/specd"
  run_step "tp two nodes" 150 bash -c tp_two_nodes
  # Speculation at TP 2 (codepair, greedy and temperature 1), and Llama-3.1-70B shapes at TP 2
  # against the two GPUs' roofline (issue 21, point 4; 141 GB of bf16 weights: H200s only).
  run_step "spec_bench tp=2" 150 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda --batches 1,16 \
    --k 4 --max-tokens 128 -tp 2 --specd "$WORK/bin/specd"
  # EAGLE-3 under tensor parallelism (issue 33): the head on rank 0 reads the all-reduced
  # residual stream; 8B shapes at TP 2, controlled acceptance as eagle3_replay_bench.
  run_step "eagle3_replay_bench tp=2" 300 "${OURS[@]}" "$WORK/bin/spec_bench" --device cuda \
    --model "$DIR/models/shapes/llama-3.1-8b" --draft "$DIR/models/shapes/llama-3.2-1b" \
    --eagle3 "models/shapes/eagle3-llama-3.1-8b" --load-format dummy --random-prompts 128 \
    --max-model-len 1024 --max-num-seqs 64 --batches 1,16 --k 7 --max-tokens 128 --repeats 2 \
    --replay-alpha 0.8 -tp 2 --specd "$WORK/bin/specd"
  run_step "decode_bench 70b tp=2" 300 "${OURS[@]}" "$WORK/bin/decode_bench" \
    --model-dir "$DIR/models/shapes/llama-3.1-70b" --contexts 512 --batches 1,16 --ttft 1024 \
    --prefill-tokens 4096 --decode-steps 16 --repeats 1 --max-model-len 8192 \
    --tensor-parallel-size 2 --specd "$WORK/bin/specd"
fi
run_step "kernel_check perf" 90 "${OURS[@]}" "$WORK/bin/kernel_check" --mode perf

echo
echo "== key results (full output in $LOG)"
for s in "attention_bench" "sdpa_bench.py" "gemm_bench" "verify_torch_bench.py" "spec_bench" \
  "spec_bench t=1" "spec_bench t=0.7 p=0.95" "vegas_bench" "verify_step 8b k=4 t=0" \
  "verify_step 8b k=4 t=1" \
  "verify_step 8b k=8 t=0" "verify_step 8b k=8 t=1" \
  "ssd_bench k=4 interruptible" "ssd_bench k=4 complete" "ssd_bench k=7 interruptible" \
  "ssd_bench k=7 complete" "ssd_replay_bench" "ssd_replay_bench fixed" "ssd_replay_bench 32b" \
  "ssd_parallel_replay_bench" "ssd_eagle3_replay_bench" "ssd_eagle3_replay_bench host" \
  "ssd_eagle3_bench codepair" \
  "ssd_tp_replay_bench" "ssd_replay_bench (1 gpu)"; do
  [[ -n "${passed[$s]:-}" ]] || continue
  echo "-- $s"
  tail -n 12 "$WORK/steps/${s//[^A-Za-z0-9_.-]/_}.out"
done
for s in "auto: specd_profile 8b/1b" "auto: specd_profile codepair"; do
  [[ -n "${passed[$s]:-}" ]] || continue
  echo "-- $s"
  sed -n '/^specd_profile: /,$p' "$WORK/steps/${s//[^A-Za-z0-9_.-]/_}.out"
done
for s in "auto: spec_bench codepair" "auto: spec_bench 8b/1b alpha=0.6" \
  "auto: spec_bench 8b/1b alpha=0.8"; do
  [[ -n "${passed[$s]:-}" ]] || continue
  echo "-- $s"
  sed -n '/^spec_bench: /p; /^summary: /,$p' "$WORK/steps/${s//[^A-Za-z0-9_.-]/_}.out"
done
if grep -q '^decode_bench summary' "$WORK/steps/decode_bench.out" 2>/dev/null; then
  echo "-- decode_bench"
  sed -n '/^decode_bench: /p; /^decode_bench summary/,$p' "$WORK/steps/decode_bench.out"
fi
for f in decode_bench_1b_pdl_1 decode_bench_1b_pdl_0 decode_bench_tp_1__tp_shapes_ \
  decode_bench_tp_2 decode_bench_tp_2_nccl_only decode_bench_tp_1_pdl_0 decode_bench_tp_2_pdl_0 \
  decode_bench_70b_tp_2; do
  grep -q '^decode_bench summary' "$WORK/steps/$f.out" 2>/dev/null || continue
  echo "-- $f"
  sed -n '/^decode_bench: /p; /^runner: /p; /^decode_bench summary/,$p' "$WORK/steps/$f.out"
done
printf '%s\n' "${key_lines[@]}" | grep . || true
echo
printf '%-36s %-30s %6s\n' step result time
printf '%s\n' "${summary[@]}"
echo "total: ${SECONDS}s; log: $LOG"
exit $failed
