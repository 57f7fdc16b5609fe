#!/usr/bin/env python3
"""Soak test of `specd serve`: many concurrent clients with random parameters, aborts and
disconnects, for a bounded time; then checks that nothing was lost, leaked or miscounted.

Usage:
  soak.py --specd BUILD/specd [--source SRC] [--duration 1800] [--http 64] [--grpc 16]
  soak.py --attach-http HOST:PORT [--attach-grpc HOST:PORT] --pid PID ...   (a running server)

Started by this tool, the server is `specd serve` on the bundled codepair model (served as
`codepair`) with the codepair draft loaded (--speculative-config, default method
draft_model), on free loopback ports (tests/daemon.py). Clients (tools/soak/soak_clients.py):
--http threads send completions and chat requests, streamed and not; --grpc threads send
Generate streams. Parameters are random (temperature, top_p, top_k, n, seed, max_tokens,
logprobs / top_logprobs, token ids, stop, speculation none/ngram/draft_model/server default,
include_usage). About 1 in 8 streams is cut short (socket closed after a few events, gRPC
cancel, gRPC Abort), some non-streamed requests are closed before the answer, some bodies
are half sent, 1-2% of requests are invalid on purpose (4xx / INVALID_ARGUMENT expected).

Checks (any violation: exit 1, each printed):
- every answer (soak_requests.check_output): tokens counted in the stream (logprobs entries,
  gRPC token ids) equal usage.completion_tokens; finish "length" after exactly max_tokens;
  one finish per choice, nothing after it, [DONE] last; no stop string in the text;
- greedy requests (any speculation method): every answer equal (text, finish, token ids,
  usage) whether streamed or not, over HTTP or gRPC, and an answer cut short is a prefix of
  the complete one (soak_checks.References; why not seeded sampling:
  soak_requests.comparable);
- /metrics: specd_requests_total by outcome and specd_generation_tokens_total against what
  the clients saw, 4xx counts equal, no 5xx; running and waiting back to 0 and KV blocks
  used back to the idle level after the load (soak_checks.check_metrics);
- RSS and open fds of the server (/proc/PID), sampled every 2 s: see soak_checks.Limits.
A summary table is printed at the end (and written as JSON with --json).
"""
import argparse
import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests"))
sys.path.insert(0, HERE)
import daemon  # noqa: E402  tests/daemon.py
import soak_checks  # noqa: E402
import soak_clients  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--specd", help="the specd binary to start")
    p.add_argument("--source", default=SOURCE, help="source tree (models/codepair)")
    p.add_argument("--attach-http", help="HOST:PORT of a running server instead")
    p.add_argument("--attach-grpc", help="HOST:PORT of its gRPC front end")
    p.add_argument("--pid", type=int, help="the running server's pid (RSS and fds)")
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of load")
    p.add_argument("--warmup", type=float, help="seconds (default 20%% of the load, 15-120)")
    p.add_argument("--http", type=int, default=64, help="concurrent HTTP clients")
    p.add_argument("--grpc", type=int, default=16, help="concurrent gRPC clients")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rss-growth-mib", type=float, default=64.0)
    p.add_argument("--rss-growth-frac", type=float, default=0.10)
    p.add_argument("--fd-slack", type=int, default=2)
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra `specd serve` argument (repeatable)")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    if bool(args.specd) == bool(args.attach_http):
        p.error("give --specd or --attach-http")
    if args.attach_http and not args.pid:
        p.error("--attach-http needs --pid (RSS and fds are read from /proc/PID)")
    if args.grpc and importlib.util.find_spec("grpc") is None:
        p.error(f"--grpc {args.grpc} needs python3-grpcio and python3-protobuf for "
                f"{sys.executable} (or pass --grpc 0)")
    if args.warmup is None:
        args.warmup = min(120.0, max(15.0, 0.2 * args.duration))
    return args


class Server:
    """The server under test: started here (daemon.Daemon) or attached to."""

    def __init__(self, args):
        self.daemon = None
        if args.specd:
            draft = os.path.join(args.source, "models", "codepair", "draft")
            spec = json.dumps({"model": draft, "method": "draft_model",
                               "num_speculative_tokens": 4})
            self.daemon = daemon.Daemon(args.specd, "--served-model-name", "codepair",
                                        "--speculative-config", spec, *args.server_arg,
                                        source_dir=args.source, name="soak").start()
            self.host, self.http_port = "127.0.0.1", self.daemon.http_port
            self.grpc_target = self.daemon.grpc_target if self.daemon.grpc_port else None
            self.pid = self.daemon.proc.pid
        else:
            self.host, port = args.attach_http.rsplit(":", 1)
            self.http_port = int(port)
            self.grpc_target = args.attach_grpc
            self.pid = args.pid

    def get(self, path, timeout=30):
        url = f"http://{self.host}:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read()

    def metrics(self):
        return daemon.parse_metrics(self.get("/metrics").decode())

    def model(self):
        return json.loads(self.get("/v1/models"))["data"][0]["id"]

    def wait_idle(self, kv_idle, timeout):
        """/metrics once running, waiting and paused are 0 and KV blocks used is kv_idle (None:
        whatever it is); None past the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.metrics()
            if (m.get("specd_num_requests_running", 0) == 0
                    and m.get("specd_num_requests_waiting", 0) == 0
                    and m.get("specd_num_requests_paused", 0) == 0
                    and (kv_idle is None or m.get("specd_kv_cache_blocks_used", 0) == kv_idle)):
                return m
            time.sleep(0.5)
        return None


def probe_health(server, stop, worst):
    """Times GET /health once a second; keeps the slowest in worst[0]."""
    while not stop.wait(1.0):
        t0 = time.monotonic()
        try:
            server.get("/health", timeout=60)
            worst[0] = max(worst[0], time.monotonic() - t0)
        except OSError:
            worst[0] = float("inf")


def start_clients(args, server, run):
    threads = [threading.Thread(target=soak_clients.http_worker, daemon=True,
                                args=(run, w, args.seed * 100003 + w))
               for w in range(args.http)]
    if args.grpc:
        stubs = tempfile.mkdtemp(prefix="soak_stubs_")
        atexit.register(shutil.rmtree, stubs, True)
        pb, pb_grpc = daemon.grpc_modules(args.source, stubs)
        threads += [threading.Thread(target=soak_clients.grpc_worker, daemon=True,
                                     args=(run, server.grpc_target, pb, pb_grpc, w,
                                           args.seed * 200003 + w))
                    for w in range(args.grpc)]
    for t in threads:
        t.start()
    return threads


def settle_fds(pid, start_fds, slack, timeout=30):
    """Idle (rss, fds) once the fds are back within slack of the start (or past timeout):
    the server closes a connection only when it notices the client left."""
    deadline = time.monotonic() + timeout
    while True:
        rss, fds = soak_checks.read_proc(pid)
        if fds <= start_fds + slack or time.monotonic() > deadline:
            return rss, fds
        time.sleep(0.5)


def load(args, server, refs, ledger):
    """Runs the clients for args.duration; returns (run, times, health worst)."""
    with open(os.path.join(args.source, "models", "codepair", "prompts.jsonl"),
              encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    t0 = time.monotonic()
    run = soak_clients.Run(server.host, server.http_port, server.model(), prompts,
                           t0 + args.duration, refs, ledger)
    stop, worst = threading.Event(), [0.0]
    prober = threading.Thread(target=probe_health, args=(server, stop, worst), daemon=True)
    prober.start()
    threads = start_clients(args, server, run)
    for t in threads:
        t.join(max(1.0, run.deadline + 900 - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    if hung:
        run.violation(f"{hung} clients still waiting 900 s after the deadline")
    stop.set()
    prober.join(70)
    return run, (t0, t0 + args.warmup, time.monotonic()), worst[0]


def soak(args):
    server = Server(args)
    if args.grpc and not server.grpc_target:
        sys.exit("soak: the server has no gRPC front end; pass --grpc 0")
    idle = server.wait_idle(None, 60)
    if idle is None:
        sys.exit("soak: the server is not idle; a soak needs it to itself")
    kv_idle = idle.get("specd_kv_cache_blocks_used", 0)
    before = server.metrics()
    sampler = soak_checks.ProcSampler(server.pid)
    start = sampler.sample()
    sampler.start()
    refs, ledger = soak_checks.References(), soak_checks.Ledger()
    run, times, health_worst = load(args, server, refs, ledger)
    if server.daemon and not server.daemon.running():
        sys.exit(f"soak: FAILED: specd exited with {server.daemon.proc.returncode} under "
                 f"load:\n{server.daemon.output()[-4000:]}")
    after = server.wait_idle(kv_idle, 120)
    if after is None:
        after = server.metrics()
        paused = after.get("specd_num_requests_paused")
        run.violation(f"not idle 120 s after the load: {daemon.gauges(after)}, paused "
                      f"{paused} (KV blocks used when idle before: {kv_idle:.0f})")
    limits = soak_checks.Limits(args.rss_growth_mib, args.rss_growth_frac, args.fd_slack)
    end = settle_fds(server.pid, start[1], limits.fd_slack)
    sampler.stop()
    metric_rows, bad = soak_checks.check_metrics(before, after, ledger)
    compared, ref_bad = refs.verify()
    proc, proc_bad = soak_checks.check_proc(sampler.samples, start, end, times[0], times[1],
                                            times[2], args.http + args.grpc, limits)
    for v in bad + ref_bad + proc_bad:
        run.violation(v)
    exit_code = server.daemon.stop(timeout=120) if server.daemon else 0
    if exit_code != 0:
        run.violation(f"specd exited with {exit_code} after SIGTERM")
    summary = make_summary(args, run, ledger, compared, proc, metric_rows, times, health_worst)
    return summary, metric_rows, run


def make_summary(args, run, ledger, compared, proc, metric_rows, times, health_worst):
    counts = dict(sorted(ledger.counts.items()))
    return {
        "duration_s": round(times[2] - times[0], 1), "warmup_s": args.warmup,
        "clients": {"http": args.http, "grpc": args.grpc}, "seed": args.seed,
        "events": counts, "finished_choices": dict(ledger.finished),
        "completion_tokens_checked": ledger.tokens_done,
        "answers_compared_with_reference": compared,
        "http_4xx": {str(k): v for k, v in sorted(ledger.codes.items())},
        "proc": {k: round(v, 1) if isinstance(v, float) else v for k, v in proc.items()},
        "metrics": [list(r) for r in metric_rows],
        "health_worst_s": round(health_worst, 3),
        "violations": run.num_violations, "first_violations": run.violations[:50],
    }


def print_table(s, metric_rows):
    p = s["proc"]
    rows = [("duration", f"{s['duration_s']} s (warm-up {s['warmup_s']:.0f} s), clients "
                         f"{s['clients']['http']} HTTP + {s['clients']['grpc']} gRPC")]
    rows += [(k, str(v)) for k, v in s["events"].items()]
    rows += [("choices finished", json.dumps(s["finished_choices"])),
             ("completion tokens (complete answers)", str(s["completion_tokens_checked"])),
             ("answers compared with a reference", str(s["answers_compared_with_reference"])),
             ("HTTP 4xx received", json.dumps(s["http_4xx"])),
             ("RSS MiB start / warm-up peak / end / max",
              f"{p['rss_start_mib']} / {p['rss_warm_peak_mib']} / {p['rss_end_mib']} / "
              f"{p['rss_max_mib']}"),
             ("RSS MiB median after warm-up / at the end",
              f"{p['rss_early_median_mib']} / {p['rss_late_median_mib']} "
              f"(allowed growth {p['rss_allowance_mib']})"),
             ("open fds start / end / max",
              f"{p['fds_start']} / {p['fds_end']} / {p['fds_max']} (limits end "
              f"{p['fds_end_limit']}, load {p['fds_load_limit']})"),
             ("slowest GET /health", f"{s['health_worst_s']} s")]
    rows += [(f"/metrics {name}", f"{got} (clients: {want})") for name, got, want in metric_rows]
    rows.append(("violations", str(s["violations"])))
    width = max(len(r[0]) for r in rows)
    print("soak summary")
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")
    sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    summary, metric_rows, run = soak(args)
    print_table(summary, metric_rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    if run.num_violations:
        print(f"soak: FAILED, {run.num_violations} violations; the first ones:")
        for v in run.violations[:50]:
            print(f"  - {v}")
        return 1
    print("soak: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
