#!/usr/bin/env python3
"""Serving benchmark for specd (or any OpenAI-compatible server), stdlib only.

In the spirit of vLLM's benchmark_serving: sends --num-prompts requests to /v1/completions
or /v1/chat/completions, arriving as a Poisson process at --request-rate (or all at once),
optionally capped at --max-concurrency in flight, streams the answers (SSE) and reports
request and token throughput, time to first token (TTFT), inter-token latency (ITL, the gap
between consecutive streamed chunks), time per output token (TPOT, per request: (E2E -
TTFT) / (output tokens - 1)) and end-to-end latency (E2E): mean, p50 (median) and p99.

    tools/bench/bench.py --base-url http://127.0.0.1:8000 --num-prompts 200 \
        --max-concurrency 32 --output-len 128 --ignore-eos
    tools/bench/bench.py --dataset random --prompt-len 512 --output-len 64 \
        --request-rate 4 --json results.json

Prompts: --dataset codepair (default; the prompts of models/codepair/prompts.jsonl, or any
JSONL file with a "prompt" field via --dataset-path), or --dataset random: token-id prompts
of exactly --prompt-len ids drawn from [--random-min-id, --random-max-id) (completions
only; the defaults fit codepair's vocabulary). --seed fixes prompt order, random prompts
and arrival times. Output tokens are counted from the server's usage
(stream_options.include_usage); without it, one per streamed chunk.

The client is asyncio over raw HTTP/1.1 (chunked transfer coding and SSE parsed here), so
hundreds of concurrent streams cost one thread. Exit status: 0 when every request
succeeded, 1 when any failed, 2 on bad arguments. Importable: run_benchmark(args) returns
the results dict; stream_request() is reused by tests/load_test.py.
"""
import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROMPTS = os.path.normpath(os.path.join(
    HERE, "..", "..", "..", "shared", "models", "codepair", "prompts.jsonl"))


# ---- HTTP/1.1 client over asyncio streams ------------------------------------------------

class HttpResponse:
    def __init__(self, status, reason, headers, reader, writer):
        self.status = status
        self.reason = reason
        self.headers = headers  # lower-case name -> value
        self._reader = reader
        self._writer = writer

    async def chunks(self):
        """Yields the body's bytes as they arrive (chunked or Content-Length or to EOF)."""
        r = self._reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await r.readline()
                if not size_line:
                    raise ConnectionError("connection closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 65536))
                if not data:
                    raise ConnectionError("connection closed inside the body")
                left -= len(data)
                yield data
        else:
            while True:
                data = await r.read(65536)
                if not data:
                    return
                yield data

    async def read(self):
        return b"".join([c async for c in self.chunks()])

    def close(self):
        self._writer.close()


async def http_request(url, method="GET", body=None, headers=None):
    """Sends one request on a fresh connection (Connection: close); returns HttpResponse."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http":
        raise ValueError(f"only http:// URLs are supported: {url}")
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80, limit=1 << 22)
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    data = b"" if body is None else (body if isinstance(body, bytes) else
                                     json.dumps(body).encode())
    lines = [f"{method} {path} HTTP/1.1", f"Host: {u.netloc}", "Connection: close",
             "Accept: */*"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        writer.close()
        raise ConnectionError("connection closed before the status line")
    parts = status_line.decode("latin-1").split(" ", 2)
    status = int(parts[1])
    hdrs = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        hdrs[name.strip().lower()] = value.strip()
    return HttpResponse(status, parts[2].strip() if len(parts) > 2 else "", hdrs, reader,
                        writer)


async def sse_data(response):
    """Yields each SSE event's data (str) from a streaming response."""
    buf = b""
    async for chunk in response.chunks():
        buf += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = [line[5:].lstrip(b" ") if line.startswith(b"data:") else None
                    for line in event.split(b"\n")]
            data = [d for d in data if d is not None]
            if data:
                yield b"\n".join(data).decode("utf-8")


# ---- one request -------------------------------------------------------------------------

class RequestResult:
    __slots__ = ("ok", "error", "status", "prompt_tokens", "output_tokens", "ttft", "itl",
                 "e2e", "text", "finish_reason", "start")

    def __init__(self):
        self.ok = False
        self.error = ""
        self.status = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.ttft = None
        self.itl = []
        self.e2e = None
        self.text = ""
        self.finish_reason = None
        self.start = 0.0


def chunk_text(endpoint, choice):
    if endpoint == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def stream_request(base_url, endpoint, payload, headers=None, timeout=None):
    """Runs one streaming request; returns a RequestResult (never raises for server or
    network errors: they land in .error). payload gets stream and include_usage set."""
    result = RequestResult()
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    body = dict(payload, stream=True, stream_options={"include_usage": True})
    result.start = time.perf_counter()
    response = None
    try:
        async def run():
            nonlocal response
            response = await http_request(base_url + path, "POST", body, headers)
            result.status = response.status
            if response.status != 200:
                text = (await response.read()).decode("utf-8", "replace")
                result.error = f"HTTP {response.status}: {text[:300]}"
                return
            last = None
            done = False
            async for data in sse_data(response):
                now = time.perf_counter()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = f"stream error: {json.dumps(event['error'])[:300]}"
                    return
                if event.get("usage"):
                    result.prompt_tokens = event["usage"].get("prompt_tokens", 0)
                    result.output_tokens = event["usage"].get("completion_tokens", 0)
                for choice in event.get("choices", []):
                    text = chunk_text(endpoint, choice)
                    if text:
                        if last is None:
                            result.ttft = now - result.start
                        else:
                            result.itl.append(now - last)
                        last = now
                        result.text += text
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
            result.e2e = time.perf_counter() - result.start
            if not done:
                result.error = "stream ended without data: [DONE]"
            elif result.finish_reason is None:
                result.error = "no finish_reason"
            else:
                if not result.output_tokens:
                    result.output_tokens = len(result.itl) + (result.ttft is not None)
                result.ok = True
        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        result.error = f"timeout after {timeout}s"
    except (OSError, ConnectionError, ValueError, asyncio.IncompleteReadError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if response is not None:
            response.close()
    return result


# ---- prompts -----------------------------------------------------------------------------

def load_prompts(args, rng):
    """[(payload fields, prompt description)] of length num_prompts."""
    if args.dataset == "random":
        if args.endpoint == "chat":
            raise SystemExit("bench: --dataset random sends token ids: use --endpoint completions")
        prompts = [[rng.randrange(args.random_min_id, args.random_max_id)
                    for _ in range(args.prompt_len)] for _ in range(args.num_prompts)]
        return [{"prompt": p} for p in prompts]
    path = args.dataset_path or DEFAULT_PROMPTS
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()]
    if not texts:
        raise SystemExit(f"bench: no prompts in {path}")
    order = list(range(len(texts)))
    rng.shuffle(order)
    out = []
    for i in range(args.num_prompts):
        text = texts[order[i % len(texts)]]
        if args.prompt_len:
            text = text[:args.prompt_len]  # characters: datasets keep their natural lengths
        if args.endpoint == "chat":
            out.append({"messages": [{"role": "user", "content": text}]})
        else:
            out.append({"prompt": text})
    return out


# ---- statistics --------------------------------------------------------------------------

def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(name, seconds):
    ms = [v * 1000.0 for v in seconds]
    return {
        f"mean_{name}_ms": sum(ms) / len(ms) if ms else None,
        f"median_{name}_ms": percentile(ms, 50),
        f"p99_{name}_ms": percentile(ms, 99),
    }


def compute_metrics(results, duration, args):
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.ttft is not None and r.output_tokens > 1]
    m = {
        "endpoint": args.endpoint,
        "base_url": args.base_url,
        "num_prompts": len(results),
        # JSON has no Infinity: all-at-once arrivals are reported as null.
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else None,
        "max_concurrency": args.max_concurrency,
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({r.error for r in failed})[:10],
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
    }
    m.update(summarize("ttft", [r.ttft for r in ok if r.ttft is not None]))
    m.update(summarize("tpot", tpot))
    m.update(summarize("itl", [x for r in ok for x in r.itl]))
    m.update(summarize("e2el", [r.e2e for r in ok]))
    return m


def print_report(m, out=sys.stdout):
    def fmt(v):
        return "n/a" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    rows = [
        ("Successful requests", m["completed"]),
        ("Failed requests", m["failed"]),
        ("Benchmark duration (s)", m["duration_s"]),
        ("Total input tokens", m["total_input_tokens"]),
        ("Total generated tokens", m["total_output_tokens"]),
        ("Request throughput (req/s)", m["request_throughput"]),
        ("Output token throughput (tok/s)", m["output_throughput"]),
        ("Total token throughput (tok/s)", m["total_token_throughput"]),
    ]
    for name, label in [("ttft", "Time to First Token"), ("tpot", "Time per Output Token"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")]:
        rows.append((f"-- {label} --", None))
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms)",
                         m[f"{stat}_{name}_ms"]))
    print("=" * 50, file=out)
    print(f"{'Serving Benchmark Result':^50}", file=out)
    print("=" * 50, file=out)
    for label, value in rows:
        if value is None and label.startswith("--"):
            print(f"{label:-^50}", file=out)
        else:
            print(f"{label:<38}{fmt(value):>12}", file=out)
    print("=" * 50, file=out)
    for e in m["errors"]:
        print(f"error: {e}", file=out)


# ---- driver ------------------------------------------------------------------------------

async def fetch_model(base_url, headers):
    response = await http_request(base_url + "/v1/models", headers=headers)
    try:
        body = json.loads(await response.read())
    finally:
        response.close()
    if response.status != 200 or not body.get("data"):
        raise SystemExit(f"bench: GET /v1/models answered {response.status}: {body}")
    return body["data"][0]["id"]


async def benchmark(args):
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or await fetch_model(args.base_url, headers)
    prompts = load_prompts(args, rng)
    sampling = {"model": model, "max_tokens": args.output_len, "temperature": args.temperature}
    if args.ignore_eos:
        sampling["ignore_eos"] = True
    payloads = [dict(p, **sampling) for p in prompts]

    # A first request checks the set-up, as benchmark_serving does.
    probe = await stream_request(args.base_url, args.endpoint, dict(payloads[0], max_tokens=2),
                                 headers, args.timeout)
    if not probe.ok:
        raise SystemExit(f"bench: the initial test request failed: {probe.error}")

    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def limited(payload):
        if semaphore is None:
            return await stream_request(args.base_url, args.endpoint, payload, headers,
                                        args.timeout)
        async with semaphore:
            return await stream_request(args.base_url, args.endpoint, payload, headers,
                                        args.timeout)

    tasks = []
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        if i > 0 and math.isfinite(args.request_rate):
            await asyncio.sleep(rng.expovariate(args.request_rate))
        tasks.append(asyncio.create_task(limited(payload)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    metrics = compute_metrics(results, duration, args)
    metrics["model"] = model
    metrics["output_len"] = args.output_len
    metrics["dataset"] = args.dataset
    return metrics


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("SPECD_API_KEY"))
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (default inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="most requests in flight (default: unlimited)")
    p.add_argument("--dataset", choices=["codepair", "random"], default="codepair")
    p.add_argument("--dataset-path", help="JSONL with a 'prompt' field (default: codepair's)")
    p.add_argument("--prompt-len", type=int, default=0,
                   help="random: prompt tokens; codepair: truncate prompts to this many chars")
    p.add_argument("--random-min-id", type=int, default=5)
    p.add_argument("--random-max-id", type=int, default=8192)
    p.add_argument("--output-len", type=int, default=128, help="max_tokens per request")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --output-len")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-': stdout)")
    args = p.parse_args(argv)
    if args.num_prompts < 1 or args.output_len < 1:
        p.error("--num-prompts and --output-len must be >= 1")
    if args.request_rate <= 0:
        p.error("--request-rate must be > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    if args.dataset == "random" and args.prompt_len < 1:
        p.error("--dataset random needs --prompt-len >= 1")
    args.base_url = args.base_url.rstrip("/")
    return args


def run_benchmark(args):
    return asyncio.run(benchmark(args))


def main(argv=None):
    args = parse_args(argv)
    metrics = run_benchmark(args)
    print_report(metrics, sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        json.dump(metrics, sys.stdout, indent=2)
        print()
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
    return 0 if metrics["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
