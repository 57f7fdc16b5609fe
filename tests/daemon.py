"""Test helper: runs `specd serve` on free loopback ports and talks to it.

Shared by the integration, fault and load tests (stdlib only; gRPC stubs on request):

    from daemon import Daemon
    with Daemon(SPECD, "--max-num-seqs", "4", source_dir=SOURCE) as d:
        status, body = d.post_json("/v1/completions", {"prompt": "def f(", "max_tokens": 8})
        for event in d.stream("/v1/completions", {..., "stream": True}): ...
        d.wait_metric("specd_kv_cache_blocks_used", 0)
        assert d.stop() == 0      # SIGTERM, drain, exit status

The daemon is started with --host 127.0.0.1 --port 0 --grpc-port 0; Daemon.start() waits for
the line `specd: listening http=HOST:PORT grpc=HOST:PORT|off ...` that server/serve.cc
prints on stderr once every front end serves, and reads the bound ports from it. Its output
is drained by a thread (kept in .output(), and mirrored to $SPECD_TEST_LOG_DIR/<name>.log
when that variable is set). Every process is killed at exit even if a test forgets.

$SPECD_TEST_DAEMON_ARGS (shell-split) adds flags to every daemon a test starts, after the
defaults above and before the test's own flags, so a test that sets a flag itself still gets
its value. tools/ci/sanitizers.sh's TSan stage sets `--grpc-port -1`: gRPC off, so Debian's
uninstrumented gRPC never runs in the TSan daemon (a test that relies on the default
`--grpc-port 0` then has no gRPC port: Daemon.grpc_port is None).
"""
import atexit
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

LISTENING = re.compile(r"specd: listening http=(\[[^\]]+\]|[^\s:]+):(\d+) "
                       r"grpc=(?:(\[[^\]]+\]|[^\s:]+):(\d+)|off)")
_LIVE = set()


def _kill_leftovers():
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


atexit.register(_kill_leftovers)


def default_model(source_dir):
    return os.path.join(source_dir, "models", "codepair", "target")


class DaemonError(RuntimeError):
    pass


class Daemon:
    """One `specd serve` process. Context manager: start on enter, stop (SIGTERM) on exit."""

    def __init__(self, specd, *args, source_dir=None, model="default", cwd=None, env=None,
                 startup_timeout=180, name="specd"):
        self.specd = specd
        self.args = list(args)
        self.source_dir = source_dir or os.path.dirname(os.path.dirname(os.path.abspath(
            __file__)))
        self.model = default_model(self.source_dir) if model == "default" else model
        self.cwd = cwd
        self.env = env
        self.startup_timeout = startup_timeout
        self.name = name
        self.proc = None
        self.http_port = None
        self.grpc_port = None
        self._lines = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._reader = None
        self._log = None

    # ---- lifecycle ---------------------------------------------------------------------

    def command(self):
        cmd = [self.specd, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0"]
        if self.model:
            cmd += ["--model", self.model]
        cmd += shlex.split(os.environ.get("SPECD_TEST_DAEMON_ARGS", ""))
        return cmd + self.args  # later flags win

    def start(self):
        log_dir = os.environ.get("SPECD_TEST_LOG_DIR")
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            self._log = open(os.path.join(log_dir, f"{self.name}.log"), "a", encoding="utf-8")
        env = dict(os.environ)
        env.pop("SPECD_API_KEY", None)
        env.update(self.env or {})
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     text=True, errors="replace", cwd=self.cwd, env=env)
        _LIVE.add(self.proc)
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise DaemonError(f"specd exited with {self.proc.returncode} before listening:"
                                  f"\n{self.output()}")
            if time.monotonic() > deadline:
                self.kill()
                raise DaemonError(f"specd did not listen within {self.startup_timeout}s:\n"
                                  f"{self.output()}")
        return self

    def _read_output(self):
        for line in self.proc.stdout:
            with self._lock:
                self._lines.append(line)
            if self._log:
                self._log.write(line)
                self._log.flush()
            m = LISTENING.search(line)
            if m and not self._ready.is_set():
                self.http_port = int(m.group(2))
                self.grpc_port = int(m.group(4)) if m.group(4) else None
                self._ready.set()

    def output(self):
        with self._lock:
            return "".join(self._lines)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """Exit status, or None if still running after timeout seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=60):
        """SIGTERM, then the exit status; SIGKILL (status -9) past the timeout."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.kill()
            code = self.proc.returncode
        self._finish()
        return code

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._finish()

    def _finish(self):
        if self._reader:
            self._reader.join(5)
            if not self._reader.is_alive() and self.proc.stdout:
                self.proc.stdout.close()
        _LIVE.discard(self.proc)
        if self._log:
            self._log.close()
            self._log = None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self):
        return f"127.0.0.1:{self.grpc_port}"

    # ---- HTTP ----------------------------------------------------------------------------

    def connection(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict with lower-case names, body bytes)."""
        conn = self.connection(timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            hdrs = {"Content-Type": "application/json"} if data is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
        finally:
            conn.close()

    def get_json(self, path, **kw):
        status, _, payload = self.request("GET", path, **kw)
        return status, _json_or_text(payload)

    def post_json(self, path, body, **kw):
        status, _, payload = self.request("POST", path, body, **kw)
        return status, _json_or_text(payload)

    def stream(self, path, body, timeout=300, headers=None):
        """Yields each SSE `data:` payload (parsed JSON, or the string "[DONE]")."""
        conn = self.connection(timeout)
        try:
            hdrs = {"Content-Type": "application/json"}
            hdrs.update(headers or {})
            conn.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
            resp = conn.getresponse()
            if resp.status != 200:
                raise HttpError(resp.status, _json_or_text(resp.read()))
            yield from sse_events(resp)
        finally:
            conn.close()

    # ---- metrics -------------------------------------------------------------------------

    def metrics(self):
        """{'name' or 'name{label="v",...}': value} from /metrics."""
        status, _, payload = self.request("GET", "/metrics", timeout=30)
        if status != 200:
            raise DaemonError(f"/metrics answered {status}")
        return parse_metrics(payload.decode())

    def metric(self, name, **labels):
        return self.metrics().get(metric_key(name, **labels), 0.0)

    def wait_metric(self, name, value, timeout=30, **labels):
        """Waits until the metric equals value; returns the last value seen."""
        return self.wait_until(lambda m: m.get(metric_key(name, **labels), 0.0) == value,
                               timeout, f"{metric_key(name, **labels)} == {value}")

    def wait_until(self, predicate, timeout=30, what="condition", interval=0.02):
        """Polls /metrics until predicate(metrics) holds; returns those metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if predicate(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                     f"gauges: {gauges(m)}")
            time.sleep(interval)


class HttpError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def _json_or_text(payload):
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return payload.decode(errors="replace")


def sse_events(resp):
    """SSE `data:` payloads of an http.client response, per the event-stream format."""
    data = []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                text = "\n".join(data)
                data = []
                yield text if text == "[DONE]" else json.loads(text)
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        text = "\n".join(data)
        yield text if text == "[DONE]" else json.loads(text)


def metric_key(name, **labels):
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def parse_metrics(text):
    out = {}
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[metric_key(m.group(1), **labels)] = float(m.group(4))
    return out


def gauges(m):
    names = ["specd_num_requests_running", "specd_num_requests_waiting",
             "specd_kv_cache_blocks_used", "specd_kv_cache_blocks_capacity"]
    return {n: m.get(n) for n in names}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- gRPC ------------------------------------------------------------------------------

def grpc_modules(source_dir, out_dir):
    """(specd_pb2, specd_pb2_grpc) generated from proto/specd.proto into out_dir with protoc
    and Debian's grpc_python_plugin (python3-grpcio has no grpc_tools)."""
    plugin = os.environ.get("GRPC_PYTHON_PLUGIN") or "/usr/bin/grpc_python_plugin"
    protoc = os.environ.get("PROTOC") or "protoc"
    subprocess.run([protoc, f"-I{source_dir}/proto", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}", f"--plugin=protoc-gen-grpc_python={plugin}",
                    f"{source_dir}/proto/specd.proto"], check=True, timeout=60)
    sys.path.insert(0, out_dir)
    import specd_pb2
    import specd_pb2_grpc
    return specd_pb2, specd_pb2_grpc
