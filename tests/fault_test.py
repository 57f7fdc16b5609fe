#!/usr/bin/env python3
"""Fault tests of `specd serve` on the codepair model (CPU), real daemon on free ports.

Usage: fault_test.py SPECD_BINARY SOURCE_DIR [unittest args]

- Client disconnect while queued, while prefilling and while decoding, streaming and not:
  the request is aborted (specd_requests_total{outcome="abort"} +1, it never finishes
  normally), the KV gauge returns to zero and the server keeps serving. The stage is made
  observable with --max-num-seqs 1 (a blocker keeps the queue non-empty) and a tiny
  --max-num-batched-tokens (a long prompt prefills over hundreds of steps); "was in
  prefill" is proven by the TTFT histogram's count not moving.
- SIGTERM with streams in flight (HTTP SSE and gRPC, running and queued): /ready turns
  503, /health stays 200, new requests get 503 (HTTP) / UNAVAILABLE (gRPC), every
  in-flight stream completes with the text it has when run alone, and the process exits 0. Past --drain-timeout the
  rest are cut off and it still exits 0.
- Queue overflow: with --max-num-seqs 1 --max-waiting-requests 2, the next request gets
  429 with Retry-After and OpenAI error JSON (gRPC: RESOURCE_EXHAUSTED), streaming or not.
"""
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__

SPECD, SOURCE = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE, "tests"))
import daemon  # noqa: E402
import requires  # noqa: E402

KV = "specd_kv_cache_blocks_used"
RUNNING = "specd_num_requests_running"
WAITING = "specd_num_requests_waiting"
TTFT_COUNT = "specd_time_to_first_token_seconds_count"  # observed at finish
ITL_COUNT = "specd_inter_token_latency_seconds_count"  # observed per token, live
# Sanitizer builds run the daemon several times slower: tools/ci/sanitizers.sh sets
# SPECD_TEST_TIME_SCALE, which stretches the waits and the drain budget (never the checks).
TIME_SCALE = float(os.environ.get("SPECD_TEST_TIME_SCALE", "1"))
STAGE_TIMEOUT = 60 * TIME_SCALE  # seconds to reach a stage / to clean up after one


_STUBS = []
_STUB_DIR = tempfile.TemporaryDirectory()


def grpc_stubs():
    """(specd_pb2, specd_pb2_grpc), generated once per run."""
    if not _STUBS:
        _STUBS.extend(daemon.grpc_modules(SOURCE, _STUB_DIR.name))
    return _STUBS


def outcome(m, name):
    return m.get(daemon.metric_key("specd_requests_total", outcome=name), 0.0)


def random_prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(300, 8000) for _ in range(n)]


class RawRequest:
    """One HTTP request on its own socket, so a test can drop the connection at any moment."""

    def __init__(self, d, body, path="/v1/completions"):
        self.conn = d.connection(timeout=STAGE_TIMEOUT * 2)
        self.conn.request("POST", path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
        self.resp = None
        self.events = None

    def read_events(self, n):
        """Reads until n content events arrived; returns them."""
        if self.resp is None:
            self.resp = self.conn.getresponse()
            assert self.resp.status == 200, (self.resp.status, self.resp.read())
            self.events = daemon.sse_events(self.resp)
        out = []
        for event in self.events:
            if event == "[DONE]":
                raise AssertionError("stream ended early")
            if event.get("choices") and event["choices"][0].get("text"):
                out.append(event)
                if len(out) >= n:
                    return out
        raise AssertionError("stream ended early")

    def disconnect(self):
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):  # already closed
            pass
        if self.resp is not None:
            self.resp.close()
        self.conn.close()


class OpenRequests:
    def open(self, body):
        """A RawRequest that is dropped at the end of the test whatever happens."""
        r = RawRequest(self.d, body)
        self.addCleanup(r.disconnect)
        return r


class DisconnectTest(OpenRequests, unittest.TestCase):
    """One slot (--max-num-seqs 1), prefill in 8-token chunks, prefix caching off (each
    prompt must really be prefilled)."""

    @classmethod
    def setUpClass(cls):
        cls.d = daemon.Daemon(SPECD, "--max-num-seqs", "1", "--max-num-batched-tokens", "8",
                              "--max-waiting-requests", "8", "--disable-prefix-caching",
                              source_dir=SOURCE, name="fault_disconnect").start()
        cls.seed = 0

    @classmethod
    def tearDownClass(cls):
        code = cls.d.stop()
        assert code == 0, f"exit {code}\n{cls.d.output()}"

    def setUp(self):
        self.d.wait_until(lambda m: m.get(KV) == 0 and m.get(RUNNING) == 0
                          and m.get(WAITING) == 0, STAGE_TIMEOUT, "an idle server")
        self.before = self.d.metrics()
        # Runs after the cleanups that drop this test's connections (cleanups are LIFO).
        self.addCleanup(self.check_idle_and_serving)

    def check_idle_and_serving(self):
        # Whatever happened, the server still serves and holds no KV.
        self.d.wait_until(lambda m: m.get(KV) == 0 and m.get(RUNNING) == 0
                          and m.get(WAITING) == 0, STAGE_TIMEOUT, "KV back to zero")
        status, body = self.d.post_json("/v1/completions",
                                        {"prompt": "def f(x):", "max_tokens": 3})
        self.assertEqual(status, 200, body)

    def long_request(self, stream, prompt_len=16, max_tokens=4000):
        DisconnectTest.seed += 1
        return {"prompt": random_prompt(prompt_len, self.seed), "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": stream}

    def blocker(self):
        """A streaming request decoding in the only slot."""
        b = self.open(self.long_request(True))
        b.read_events(2)
        return b

    def assert_aborted(self, num_aborted, produced_tokens=None):
        aborted = outcome(self.before, "abort") + num_aborted
        m = self.d.wait_until(lambda m: m.get(KV) == 0 and m.get(RUNNING) == 0
                              and m.get(WAITING) == 0 and outcome(m, "abort") >= aborted,
                              STAGE_TIMEOUT, f"KV back to zero and {num_aborted} aborted")
        self.assertEqual(outcome(m, "abort"), aborted)
        for normal in ("stop", "length"):
            self.assertEqual(outcome(m, normal), outcome(self.before, normal),
                             f"a request finished with {normal} instead of being aborted")
        if produced_tokens is not None:
            # The TTFT histogram counts finished requests that had produced a first token.
            self.assertEqual(m.get(TTFT_COUNT, 0) - self.before.get(TTFT_COUNT, 0),
                             produced_tokens)

    def disconnect_while_queued(self, stream):
        b = self.blocker()
        victim = self.open(self.long_request(stream))
        self.d.wait_until(lambda m: m.get(WAITING) == 1 and m.get(RUNNING) == 1,
                          STAGE_TIMEOUT, "the victim waiting behind the blocker")
        victim.disconnect()
        # Only an abort can take it out of the queue: the blocker still holds the slot.
        self.d.wait_until(lambda m: m.get(WAITING) == 0, STAGE_TIMEOUT, "the queue to empty")
        m = self.d.metrics()
        self.assertEqual(m.get(RUNNING), 1, "the blocker still runs")
        self.assertEqual(outcome(m, "abort") - outcome(self.before, "abort"), 1)
        b.read_events(1)  # and still streams
        b.disconnect()
        self.assert_aborted(2, produced_tokens=1)  # only the blocker produced tokens

    def test_disconnect_while_queued_streaming(self):
        self.disconnect_while_queued(stream=True)

    def test_disconnect_while_queued_not_streaming(self):
        self.disconnect_while_queued(stream=False)

    def disconnect_while_prefilling(self, stream):
        # 8000 prompt tokens in chunks of 8: a thousand engine steps before the first token.
        victim = self.open(self.long_request(stream, prompt_len=8000, max_tokens=64))
        m = self.d.wait_until(lambda m: m.get(RUNNING) == 1 and m.get(KV, 0) > 0,
                              STAGE_TIMEOUT, "the victim prefilling")
        victim.disconnect()
        self.assertEqual(m.get(ITL_COUNT, 0), self.before.get(ITL_COUNT, 0),
                         "decoding began before the disconnect: the prompt is too short "
                         "for this machine")
        # TTFT is observed when a request finishes: no sample means no token was produced.
        self.assert_aborted(1, produced_tokens=0)

    def test_disconnect_while_prefilling_streaming(self):
        self.disconnect_while_prefilling(stream=True)

    def test_disconnect_while_prefilling_not_streaming(self):
        self.disconnect_while_prefilling(stream=False)

    def test_disconnect_while_decoding_streaming(self):
        victim = self.open(self.long_request(True))
        victim.read_events(5)
        victim.disconnect()
        self.assert_aborted(1, produced_tokens=1)

    def test_disconnect_while_decoding_not_streaming(self):
        victim = self.open(self.long_request(False))
        # Decoding: inter-token gaps are being observed (live, per token) and the KV grows
        # past the prompt's block.
        self.d.wait_until(lambda m: m.get(ITL_COUNT, 0) > self.before.get(ITL_COUNT, 0) + 8
                          and m.get(KV, 0) >= 3, STAGE_TIMEOUT, "the victim decoding")
        victim.disconnect()
        self.assert_aborted(1, produced_tokens=1)

    def test_disconnect_of_one_choice_request_with_n(self):
        # n=3 streams three engine requests on one connection: all are aborted.
        body = self.long_request(True)
        body.update(n=3, temperature=1.0, seed=5)
        victim = self.open(body)
        victim.read_events(3)
        victim.disconnect()
        self.assert_aborted(3)


class OverflowTest(OpenRequests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = daemon.Daemon(SPECD, "--max-num-seqs", "1", "--max-waiting-requests", "2",
                              source_dir=SOURCE, name="fault_overflow").start()

    @classmethod
    def tearDownClass(cls):
        code = cls.d.stop()
        assert code == 0, f"exit {code}\n{cls.d.output()}"

    def fill(self):
        body = {"prompt": random_prompt(16, 99), "max_tokens": 4000, "ignore_eos": True,
                "stream": True}
        blocker = self.open(body)
        blocker.read_events(1)
        waiting = [self.open(dict(body, stream=s)) for s in (True, False)]
        self.d.wait_until(lambda m: m.get(WAITING) == 2 and m.get(RUNNING) == 1,
                          STAGE_TIMEOUT, "a full queue")
        return [blocker] + waiting

    def drain(self, held):
        for r in held:
            r.disconnect()
        self.d.wait_until(lambda m: m.get(KV) == 0 and m.get(RUNNING) == 0
                          and m.get(WAITING) == 0, STAGE_TIMEOUT, "KV back to zero")

    def assert_429(self, status, headers, payload):
        self.assertEqual(status, 429, payload)
        self.assertIn("retry-after", headers)
        self.assertGreaterEqual(int(headers["retry-after"]), 1)
        error = json.loads(payload)["error"]
        self.assertEqual(set(error), {"message", "type", "param", "code"})
        self.assertTrue(error["message"])
        self.assertIsInstance(error["type"], str)

    def test_queue_overflow_gets_429_with_retry_after(self):
        held = self.fill()
        try:
            for stream in (False, True):
                with self.subTest(stream=stream):
                    status, headers, payload = self.d.request("POST", "/v1/completions", {
                        "prompt": "x", "max_tokens": 2, "stream": stream})
                    self.assert_429(status, headers, payload)
            status, headers, payload = self.d.request("POST", "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            self.assert_429(status, headers, payload)
            before = self.d.metrics()
            self.assertGreaterEqual(before.get(daemon.metric_key(
                "specd_http_responses_total", code="429"), 0), 3)
            # Overflow rejects; it does not disturb what is admitted.
            self.assertEqual(before.get(WAITING), 2)
            self.assertEqual(before.get(RUNNING), 1)
        finally:
            self.drain(held)
        status, body = self.d.post_json("/v1/completions", {"prompt": "x", "max_tokens": 2})
        self.assertEqual(status, 200, body)

    def test_queue_overflow_grpc_resource_exhausted(self):
        if self.d.grpc_port is None:  # also leaves out DrainTest's gRPC half
            requires.skip_or_fail(self, "specd was built without gRPC (libgrpc++-dev)")
        import grpc
        pb, pb_grpc = grpc_stubs()
        held = self.fill()
        try:
            with grpc.insecure_channel(self.d.grpc_target) as channel:
                stub = pb_grpc.SpecdStub(channel)
                call = stub.Generate(pb.GenerateRequest(text="x", max_tokens=2), timeout=30)
                with self.assertRaises(grpc.RpcError) as e:
                    list(call)
                self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        finally:
            self.drain(held)


class StreamCollector(threading.Thread):
    """Streams one request to its end in a thread: text, finish reason, [DONE], errors."""

    def __init__(self, d, body):
        super().__init__(daemon=True)
        self.d = d
        self.body = body
        self.text = ""
        self.finish = None
        self.done = False
        self.error = None
        self.first = threading.Event()

    def run(self):
        try:
            for event in self.d.stream("/v1/completions", dict(self.body, stream=True)):
                if event == "[DONE]":
                    self.done = True
                    continue
                if "error" in event:
                    self.error = event["error"]
                    continue
                for c in event["choices"]:
                    self.text += c["text"]
                    self.finish = c.get("finish_reason") or self.finish
                    if c["text"]:
                        self.first.set()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)
        finally:
            self.first.set()


class GrpcStreamCollector(threading.Thread):
    """A gRPC Generate stream to its end in a thread: text, finish reason, status."""

    def __init__(self, d, prompt, max_tokens):
        super().__init__(daemon=True)
        self.d, self.prompt, self.max_tokens = d, prompt, max_tokens
        self.text = ""
        self.finish = None
        self.error = None
        self.first = threading.Event()

    def run(self):
        import grpc
        pb, pb_grpc = grpc_stubs()
        try:
            with grpc.insecure_channel(self.d.grpc_target) as channel:
                stub = pb_grpc.SpecdStub(channel)
                request = pb.GenerateRequest(text=self.prompt, max_tokens=self.max_tokens,
                                             temperature=0.0, ignore_eos=True)
                for r in stub.Generate(request, timeout=STAGE_TIMEOUT * 4):
                    self.text += r.text
                    if r.token_ids:
                        self.first.set()
                    if r.finish_reason:
                        self.finish = pb.FinishReason.Name(r.finish_reason)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)
        finally:
            self.first.set()


DRAIN_REQUEST = {"max_tokens": 800, "temperature": 0, "ignore_eos": True}


class DrainTest(unittest.TestCase):
    def start(self, *flags):
        return daemon.Daemon(SPECD, *flags, source_dir=SOURCE, name="fault_drain").start()

    def test_sigterm_drains_in_flight_streams_and_rejects_new_ones(self):
        d = self.start("--max-num-seqs", "2", "--drain-timeout", str(int(120 * TIME_SCALE)))
        try:
            # Two prompts, each streamed twice over HTTP and once more over gRPC: five
            # streams, two slots (--max-num-seqs 2), three rounds of 800 decode steps, so
            # streams run and wait for seconds after SIGTERM.
            prompts = ["import os\n", "def main():\n"]
            alone = {}
            for p in prompts:
                status, body = d.post_json("/v1/completions", dict(DRAIN_REQUEST, prompt=p))
                self.assertEqual(status, 200, body)
                alone[p] = body["choices"][0]["text"]
            streams = [StreamCollector(d, dict(DRAIN_REQUEST, prompt=p)) for p in prompts * 2]
            if d.grpc_port is not None:
                grpc_stubs()  # before the clock starts
                streams.append(GrpcStreamCollector(d, prompts[1], DRAIN_REQUEST["max_tokens"]))
            for s in streams:
                s.start()
            # Two run, the rest wait: both kinds are in flight at SIGTERM.
            d.wait_until(lambda m: m.get(RUNNING) == 2 and m.get(WAITING) == len(streams) - 2,
                         STAGE_TIMEOUT, f"2 running + {len(streams) - 2} waiting")
            d.signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while d.request("GET", "/ready")[0] != 503:
                self.assertLess(time.monotonic(), deadline, "/ready still 200 after SIGTERM")
                time.sleep(0.02)
            self.assertEqual(d.request("GET", "/health")[0], 200, "liveness holds while draining")
            status, headers, payload = d.request("POST", "/v1/completions",
                                                 {"prompt": "x", "max_tokens": 2})
            self.assertEqual(status, 503, payload)
            self.assertIn("error", json.loads(payload))
            status, _, payload = d.request("POST", "/v1/completions",
                                           {"prompt": "x", "max_tokens": 2, "stream": True})
            self.assertEqual(status, 503, payload)
            if d.grpc_port is not None:
                self.check_grpc_unavailable(d)
            self.assertTrue(any(s.is_alive() for s in streams),
                            "streams finished before the checks: make them longer")
            for s in streams:
                s.join(STAGE_TIMEOUT * 2)
            for s in streams:
                want = alone[s.prompt if isinstance(s, GrpcStreamCollector) else s.body["prompt"]]
                self.assertIsNone(s.error)
                if isinstance(s, StreamCollector):
                    self.assertTrue(s.done, "no data: [DONE]")
                    self.assertEqual(s.finish, "length")
                else:
                    self.assertEqual(s.finish, "FINISH_REASON_LENGTH")
                self.assertEqual(s.text, want)
            self.assertEqual(d.wait(STAGE_TIMEOUT), 0, d.output())
        finally:
            d.kill()

    def check_grpc_unavailable(self, d):
        import grpc
        pb, pb_grpc = grpc_stubs()
        with grpc.insecure_channel(d.grpc_target) as channel:
            stub = pb_grpc.SpecdStub(channel)
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(pb.GenerateRequest(text="x", max_tokens=2), timeout=30))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_drain_timeout_cuts_off_the_rest_and_exits_zero(self):
        d = self.start("--drain-timeout", "1")
        try:
            s = StreamCollector(d, {"prompt": "import os\n", "max_tokens": 6000,
                                    "ignore_eos": True})
            s.start()
            s.first.wait(STAGE_TIMEOUT)
            start = time.monotonic()
            d.signal(signal.SIGTERM)
            self.assertEqual(d.wait(STAGE_TIMEOUT), 0, d.output())
            self.assertLess(time.monotonic() - start, 15, "drain took far past its timeout")
            s.join(STAGE_TIMEOUT)
            self.assertFalse(s.is_alive())
            # Cut off: either an SSE error event or an abort finish, never a silent success.
            self.assertTrue(s.error is not None or s.finish not in ("length", "stop"),
                            (s.error, s.finish, len(s.text)))
        finally:
            d.kill()


if __name__ == "__main__":
    sys.exit(requires.exit_status(
        unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2, exit=False).result))
