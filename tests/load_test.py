#!/usr/bin/env python3
"""Load test: >= 64 concurrent streaming HTTP requests + 16 gRPC streams for >= 2 minutes.

Usage: load_test.py SPECD_BINARY SOURCE_DIR SHARED_DIR [--duration S] [--http N] [--grpc N]
                    [--allow-no-grpc] [--json FILE]

1. Starts `specd serve` (codepair, CPU) on free ports.
2. Runs every request of a fixed pool alone, one at a time (completions with text and
   token-id prompts, chat, stop strings, varied lengths; gRPC Generate): the reference.
3. Keeps --http SSE streams (asyncio, tools/bench/bench.py's client) and --grpc gRPC
   Generate streams (threads) in flight for --duration seconds, each worker issuing the
   pool's requests in turn, and checks every response against its reference: the same
   text, the same number of tokens (gRPC: the same token ids, so none lost or
   duplicated), the same finish reason, a [DONE] / OK end, no error status or event.
4. After the load: KV, running and waiting gauges back to 0, no request ended in error or
   abort, every HTTP response was a 200; SIGTERM exits 0.
Greedy decoding makes "equal to the request run alone" exact: batching must not change
the output.
"""
import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__

ARGS = None


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("specd")
    p.add_argument("source")
    p.add_argument("shared")
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--http", type=int, default=64, help="concurrent SSE streams")
    p.add_argument("--grpc", type=int, default=16, help="concurrent gRPC streams")
    p.add_argument("--allow-no-grpc", action="store_true",
                   help="run HTTP only when the binary has no gRPC front end")
    p.add_argument("--json", help="write the summary here")
    return p.parse_args()


def build_pool(shared):
    """The request pool: (kind, payload). kind: completions | chat | grpc."""
    with open(os.path.join(shared, "models", "codepair", "prompts.jsonl"),
              encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    pool = []
    for i, text in enumerate(prompts[:20]):
        payload = {"prompt": text[:400], "max_tokens": 24 + (i * 7) % 72, "temperature": 0}
        if i % 5 == 1:
            payload["stop"] = ["\n\n"]
        if i % 5 == 3:
            payload["ignore_eos"] = True
        pool.append(("completions", payload))
    # Token-id prompts (no tokenizer on the way in), sharing a prefix with each other.
    for i in range(4):
        pool.append(("completions", {"prompt": [0] + [301 + j for j in range(40)] + [500 + i],
                                     "max_tokens": 40, "temperature": 0}))
    for i, q in enumerate(["Write a quicksort.", "Explain decorators.", "def main():",
                           "Parse a CSV file."]):
        pool.append(("chat", {"messages": [{"role": "user", "content": q}],
                              "max_tokens": 32 + 8 * i, "temperature": 0}))
    for i, text in enumerate(prompts[20:32]):
        pool.append(("grpc", {"text": text[:300], "max_tokens": 32 + (i * 11) % 48}))
    return pool


# ---- reference: each request alone -------------------------------------------------------

def http_alone(d, kind, payload):
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    status, body = d.post_json(path, payload, timeout=300)
    assert status == 200, (status, body)
    choice = body["choices"][0]
    text = choice["message"]["content"] if kind == "chat" else choice["text"]
    return {"text": text, "tokens": body["usage"]["completion_tokens"],
            "finish": choice["finish_reason"]}


def grpc_generate(stub, pb, payload, timeout=600):
    ids, text, finish, usage = [], "", None, None
    for r in stub.Generate(pb.GenerateRequest(text=payload["text"],
                                              max_tokens=payload["max_tokens"],
                                              temperature=0.0), timeout=timeout):
        ids += list(r.token_ids)
        text += r.text
        if r.finish_reason:
            finish = r.finish_reason
            usage = r.usage.completion_tokens
    return {"ids": ids, "text": text, "finish": finish, "tokens": usage}


# ---- load --------------------------------------------------------------------------------

class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {"http": 0, "grpc": 0}
        self.tokens = 0
        self.failures = []

    def ok(self, kind, tokens):
        with self.lock:
            self.requests[kind] += 1
            self.tokens += tokens

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(what)


def compare(tally, label, got, want, kind):
    diffs = [k for k in want if got.get(k) != want[k]]
    if diffs:
        tally.fail(f"{label}: {', '.join(diffs)} differ: got "
                   f"{ {k: got.get(k) for k in diffs} } want { {k: want[k] for k in diffs} }")
    else:
        tally.ok(kind, want["tokens"])


async def http_worker(bench, base_url, worker, pool, refs, deadline, tally):
    i = worker
    while time.monotonic() < deadline:
        idx = i % len(pool)
        i += 7  # walk the pool in a worker-specific order
        kind, payload = pool[idx]
        r = await bench.stream_request(base_url, kind, payload, timeout=600)
        if not r.ok:
            tally.fail(f"http worker {worker} request {idx}: {r.error}")
            continue
        got = {"text": r.text, "tokens": r.output_tokens, "finish": r.finish_reason}
        compare(tally, f"http request {idx}", got, refs[idx], "http")


async def http_load(bench, base_url, pool, refs, n, deadline, tally):
    idx = [i for i, (k, _) in enumerate(pool) if k != "grpc"]
    sub = [pool[i] for i in idx]
    sub_refs = [refs[i] for i in idx]
    await asyncio.gather(*[http_worker(bench, base_url, w, sub, sub_refs, deadline, tally)
                           for w in range(n)])


def grpc_worker(stub, pb, worker, pool, refs, deadline, tally):
    i = worker
    while time.monotonic() < deadline:
        idx = i % len(pool)
        i += 3
        try:
            got = grpc_generate(stub, pb, pool[idx][1])
        except Exception as e:  # noqa: BLE001 - every failure is a test failure
            tally.fail(f"grpc worker {worker} request {idx}: {e!r}")
            continue
        compare(tally, f"grpc request {idx}", got, refs[idx], "grpc")


def sample_gauges(d, stop, peaks):
    while not stop.wait(1.0):
        try:
            m = d.metrics()
        except Exception:  # noqa: BLE001 - a missed sample is fine
            continue
        peaks["running"] = max(peaks["running"], m.get("specd_num_requests_running", 0))
        peaks["kv"] = max(peaks["kv"], m.get("specd_kv_cache_blocks_used", 0))


def main():
    global ARGS
    ARGS = parse_args()
    sys.path.insert(0, os.path.join(ARGS.source, "tests"))
    sys.path.insert(0, os.path.join(ARGS.source, "tools", "bench"))
    import bench
    import daemon

    pool = build_pool(ARGS.shared)
    tmp = tempfile.TemporaryDirectory()
    with daemon.Daemon(ARGS.specd, source_dir=ARGS.source, name="load_test") as d:
        use_grpc = d.grpc_port is not None and ARGS.grpc > 0
        if d.grpc_port is None and not ARGS.allow_no_grpc:
            sys.exit("load_test: the daemon has no gRPC front end (grpc=off); "
                     "pass --allow-no-grpc to run the HTTP half alone")
        if not use_grpc:
            pool = [p for p in pool if p[0] != "grpc"]
        stub = pb = channel = None
        if use_grpc:
            import grpc
            pb, pb_grpc = daemon.grpc_modules(ARGS.source, tmp.name)
            channel = grpc.insecure_channel(d.grpc_target)
            stub = pb_grpc.SpecdStub(channel)

        t0 = time.monotonic()
        refs = []
        for kind, payload in pool:
            if kind == "grpc":
                ref = grpc_generate(stub, pb, payload)
                assert ref["finish"] and len(ref["ids"]) == ref["tokens"], ref
            else:
                ref = http_alone(d, kind, payload)
            refs.append(ref)
        if use_grpc:
            # The two front ends agree: the first gRPC prompt over HTTP gives the same text.
            g = next(i for i, (k, _) in enumerate(pool) if k == "grpc")
            h = http_alone(d, "completions", {"prompt": pool[g][1]["text"], "temperature": 0,
                                              "max_tokens": pool[g][1]["max_tokens"]})
            assert h["text"] == refs[g]["text"] and h["tokens"] == refs[g]["tokens"], (h, refs[g])
        reference_s = time.monotonic() - t0
        print(f"load_test: {len(pool)} reference requests alone in {reference_s:.1f}s",
              flush=True)

        tally = Tally()
        peaks = {"running": 0, "kv": 0}
        stop_sampling = threading.Event()
        sampler = threading.Thread(target=sample_gauges, args=(d, stop_sampling, peaks),
                                   daemon=True)
        sampler.start()
        start = time.monotonic()
        deadline = start + ARGS.duration
        grpc_idx = [i for i, (k, _) in enumerate(pool) if k == "grpc"]
        threads = [threading.Thread(target=grpc_worker, daemon=True, args=(
            stub, pb, w, [pool[i] for i in grpc_idx], [refs[i] for i in grpc_idx], deadline,
            tally)) for w in range(ARGS.grpc if use_grpc else 0)]
        for t in threads:
            t.start()
        asyncio.run(http_load(bench, d.base_url, pool, refs, ARGS.http, deadline, tally))
        for t in threads:
            t.join(900)
        elapsed = time.monotonic() - start
        stop_sampling.set()
        sampler.join(5)

        m = d.wait_until(lambda m: m.get("specd_kv_cache_blocks_used") == 0
                         and m.get("specd_num_requests_running") == 0
                         and m.get("specd_num_requests_waiting") == 0, 60, "KV back to zero")
        codes = {k: v for k, v in m.items() if k.startswith("specd_http_responses_total")}
        outcomes = {k: v for k, v in m.items() if k.startswith("specd_requests_total")}
        summary = {
            "duration_s": round(elapsed, 1),
            "http_streams": ARGS.http,
            "grpc_streams": ARGS.grpc if use_grpc else 0,
            "requests_ok": tally.requests,
            "generated_tokens_checked": tally.tokens,
            "tokens_per_s": round(tally.tokens / elapsed, 1),
            "peak_running": peaks["running"],
            "peak_kv_blocks": peaks["kv"],
            "kv_blocks_capacity": m.get("specd_kv_cache_blocks_capacity"),
            "failures": len(tally.failures),
            "http_responses": codes,
            "outcomes": outcomes,
        }
        print("load_test: " + json.dumps(summary, indent=1), flush=True)
        if ARGS.json:
            with open(ARGS.json, "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=1)
        if channel is not None:
            channel.close()
        code = d.stop(timeout=120)

    errors = list(tally.failures)
    if elapsed < ARGS.duration:
        errors.append(f"ran {elapsed:.0f}s < {ARGS.duration}s")
    if tally.requests["http"] < ARGS.http:
        errors.append(f"only {tally.requests['http']} HTTP requests completed")
    if use_grpc and tally.requests["grpc"] < ARGS.grpc:
        errors.append(f"only {tally.requests['grpc']} gRPC requests completed")
    want_peak = 0.75 * (ARGS.http + (ARGS.grpc if use_grpc else 0))
    if peaks["running"] < want_peak:
        errors.append(f"peak running {peaks['running']} < {want_peak}: the load was not "
                      "concurrent")
    for key, value in outcomes.items():
        if ('outcome="error"' in key or 'outcome="abort"' in key) and value:
            errors.append(f"{key} = {value}")
    for key, value in codes.items():
        if 'code="200"' not in key and value:
            errors.append(f"{key} = {value}")
    if code != 0:
        errors.append(f"specd exited with {code} after SIGTERM")
    tmp.cleanup()
    if errors:
        print("load_test: FAILED\n  " + "\n  ".join(errors))
        sys.exit(1)
    print("load_test: OK")


if __name__ == "__main__":
    main()
