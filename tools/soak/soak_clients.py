"""The soak's client workers (tools/soak/soak.py): HTTP and gRPC loops that send random valid
requests (soak_requests), cut some short (socket closed mid-stream or before the answer, a
half-sent body, gRPC cancel, the gRPC Abort RPC), send a few deliberately invalid ones, and
record every answer in the shared References / Ledger / violation list.

Each worker runs on its own thread with its own random generator; what they share (Run)
takes a lock or is itself thread-safe.
"""
import http.client
import json
import random
import socket
import threading
import time
import uuid

import daemon  # tests/daemon.py (soak.py puts tests/ on sys.path): the SSE reader
import soak_requests as rq

HTTP_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Deliberately invalid requests: (path, body); each must get a 4xx.
INVALID = [
    ("/v1/completions", {"prompt": "def f(", "max_tokens": 4, "temperature": -1}),
    ("/v1/completions", {"prompt": "def f(", "max_tokens": 4, "n": 0}),
    ("/v1/completions", {"prompt": "def f(", "max_tokens": 4, "model": "no-such-model"}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}),
    ("/v1/completions", b'{"prompt": "def f(", "max_tokens": 4'),  # truncated JSON
]


class Run:
    """What every worker shares: where the server is, the deadline, and the results."""

    def __init__(self, host, http_port, model, prompts, deadline, refs, ledger, timeout=600):
        self.host = host
        self.http_port = http_port
        self.model = model
        self.prompts = prompts
        self.deadline = deadline
        self.refs = refs
        self.ledger = ledger
        self.timeout = timeout
        self._lock = threading.Lock()
        self.violations = []
        self.num_violations = 0

    def violation(self, message):
        with self._lock:
            self.num_violations += 1
            if len(self.violations) < 200:
                self.violations.append(message)

    def finish(self, p, out, label):
        """Checks one answer (complete or partial) and records it."""
        for v in rq.check_output(p, out):
            self.violation(f"{label}: {v}")
        if out.complete:
            self.ledger.complete(p, out)
            self.ledger.count(f"{label.split()[0]} complete")
        if rq.comparable(p) and (out.complete or any(c.text for c in out.choices)):
            self.refs.add(rq.output_key(p), out, label)


def _label(p, worker, what):
    mode = "stream" if p["stream"] else "whole"
    return f"{p['front']} {mode} w{worker} {what} {json.dumps(rq.http_body(p, ''))[:300]}"


def http_connect(run):
    return http.client.HTTPConnection(run.host, run.http_port, timeout=run.timeout)


def http_send(conn, path, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})


def http_exchange(run, p, worker, cut_after):
    """One request; cut_after: close the socket after that many SSE events (stream) or
    seconds (non-stream), None to read the whole answer."""
    label = _label(p, worker, "cut" if cut_after is not None else "")
    conn = http_connect(run)
    try:
        http_send(conn, HTTP_PATHS[p["front"]], rq.http_body(p, run.model))
        if cut_after is not None and not p["stream"]:
            conn.sock.settimeout(cut_after)
        try:
            resp = conn.getresponse()
        except socket.timeout:
            if cut_after is None:
                raise
            run.ledger.aborted(p, sure=False)
            run.ledger.count("http closed before the answer")
            return None
        conn.sock.settimeout(run.timeout)
        if resp.status != 200:
            return _http_refused(run, p, resp, label)
        if not p["stream"]:
            out = rq.http_response(p, json.loads(resp.read()))
            run.finish(p, out, label)
            return out
        return _http_read_stream(run, p, resp, cut_after, label)
    finally:
        conn.close()


def _http_refused(run, p, resp, label):
    body = resp.read()[:300]
    if resp.status == 429:
        run.ledger.status(429, p)
        run.ledger.count("http 429 (queue full)")
    else:
        run.ledger.status(resp.status)
        run.violation(f"{label}: HTTP {resp.status} for a valid request: {body!r}")
    return None


def _http_read_stream(run, p, resp, cut_after, label):
    out, state, events = rq.new_http_output(p), {"done": False}, 0
    for event in daemon.sse_events(resp):
        rq.http_stream_event(p, out, event, state)
        events += 1
        if cut_after is not None and events >= cut_after and not state["done"]:
            run.ledger.aborted(p, sure=True)  # an event came: the request was submitted
            run.ledger.count("http stream closed mid-stream")
            run.finish(p, out, label)
            return None
    if not state["done"]:
        out.problems.append(f"the stream ended without [DONE] after {events} events")
        run.ledger.aborted(p, sure=True)
    run.finish(p, out, label)
    return out if out.complete else None


def http_invalid(run, rng, worker):
    path, body = rng.choice(INVALID)
    conn = http_connect(run)
    try:
        http_send(conn, path, body)
        resp = conn.getresponse()
        resp.read()
        run.ledger.status(resp.status)
        run.ledger.count("http invalid request (4xx expected)")
        if not 400 <= resp.status < 500 or resp.status == 429:
            run.violation(f"http w{worker}: invalid request {body!r} got HTTP {resp.status}")
    finally:
        conn.close()


def http_half_body(run, rng):
    """Headers announce a body; half of it comes, then the socket closes."""
    data = json.dumps({"model": run.model, "prompt": rng.choice(run.prompts)[-200:],
                       "max_tokens": 8}).encode()
    with socket.create_connection((run.host, run.http_port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\n"
                  b"Content-Type: application/json\r\n"
                  + f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:len(data) // 2])
        time.sleep(rng.uniform(0.0, 0.5))
    run.ledger.count("http half-sent body")


def http_worker(run, worker, seed):
    rng = random.Random(seed)
    while time.monotonic() < run.deadline:
        try:
            _http_iteration(run, rng, worker)
        except Exception as e:  # noqa: BLE001 - any client-side failure is a finding
            run.violation(f"http w{worker}: {type(e).__name__}: {e}")
            time.sleep(1)


def _http_iteration(run, rng, worker):
    roll = rng.random()
    if roll < 0.02:
        return http_invalid(run, rng, worker)
    if roll < 0.03:
        return http_half_body(run, rng)
    p = rq.random_params(rng, run.prompts, rng.choice(["completions", "chat"]))
    cut = None
    if p["stream"] and rng.random() < 0.12:
        cut = rng.randint(1, 8)
    elif not p["stream"] and rng.random() < 0.06:
        cut = rng.uniform(0.05, 1.5)
    out = http_exchange(run, p, worker, cut)
    if out is not None and rq.comparable(p) and rng.random() < 0.5:
        # The same request in the other mode: streamed and whole answers must agree.
        other = dict(p, stream=not p["stream"])
        other["include_usage"] = other["stream"] and rng.random() < 0.7
        http_exchange(run, other, worker, None)


# ---- gRPC --------------------------------------------------------------------------------

def grpc_exchange(run, stub, pb, p, worker, cut):
    """One Generate stream; cut: None, ("cancel", k) or ("abort", k) after k messages."""
    import grpc
    request_id = f"soak-{uuid.uuid4().hex}"
    label = _label(p, worker, f"grpc {cut[0] if cut else ''}")
    out = rq.new_grpc_output(p)
    call = stub.Generate(rq.grpc_request(pb, p, request_id), timeout=run.timeout)
    received = 0
    try:
        for msg in call:
            rq.grpc_message(p, out, msg, request_id)
            received += 1
            if cut and received == cut[1]:
                _grpc_cut(run, stub, pb, p, call, cut[0], request_id)
                if cut[0] == "cancel":
                    break
        else:
            rq.grpc_finished_ok(out)
    except grpc.RpcError as e:
        _grpc_error(run, p, e, cut, received, label)
    run.finish(p, out, label)
    return out if out.complete else None


def _grpc_cut(run, stub, pb, p, call, how, request_id):
    if how == "cancel":
        call.cancel()
        run.ledger.aborted(p, sure=True)
        run.ledger.count("grpc cancelled")
        return
    found = stub.Abort(pb.AbortRequest(request_id=request_id), timeout=60).found
    run.ledger.count(f"grpc Abort (found={found})")


def _grpc_error(run, p, e, cut, received, label):
    import grpc
    code = e.code()
    if code == grpc.StatusCode.CANCELLED and cut and received >= cut[1]:
        if cut[0] == "abort":
            run.ledger.aborted(p, sure=True)
        return
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        run.ledger.aborted(p, sure=False)  # its first choices may have been submitted
        run.ledger.count("grpc RESOURCE_EXHAUSTED (queue full)")
        return
    run.ledger.aborted(p, sure=received > 0)
    run.violation(f"{label}: status {code} after {received} messages: {e.details()}")


def grpc_invalid(run, stub, pb, worker):
    import grpc
    try:
        for _ in stub.Generate(pb.GenerateRequest(text="def f(", max_tokens=4,
                                                  temperature=-1.0), timeout=60):
            pass
        run.violation(f"grpc w{worker}: temperature -1 was accepted")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            run.violation(f"grpc w{worker}: temperature -1 gave {e.code()}, not INVALID_ARGUMENT")
    run.ledger.count("grpc invalid request")


def grpc_worker(run, target, pb, pb_grpc, worker, seed):
    """One channel per worker: its Abort calls come from the caller that started the call."""
    import grpc
    rng = random.Random(seed)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.SpecdStub(channel)
        while time.monotonic() < run.deadline:
            try:
                _grpc_iteration(run, rng, stub, pb, worker)
            except Exception as e:  # noqa: BLE001 - any client-side failure is a finding
                run.violation(f"grpc w{worker}: {type(e).__name__}: {e}")
                time.sleep(1)


def _grpc_iteration(run, rng, stub, pb, worker):
    if rng.random() < 0.01:
        return grpc_invalid(run, stub, pb, worker)
    p = rq.random_params(rng, run.prompts, "grpc")
    roll = rng.random()
    cut = None
    if roll < 0.08:
        cut = ("cancel", rng.randint(1, 6))
    elif roll < 0.16:
        cut = ("abort", rng.randint(1, 6))
    out = grpc_exchange(run, stub, pb, p, worker, cut)
    if out is not None and rq.comparable(p) and rng.random() < 0.3:
        # The same request over HTTP: both front ends must give the same answer.
        http_exchange(run, dict(p, front="completions", stream=False, include_usage=False),
                      worker, None)
