#!/usr/bin/env python3
"""`specd serve --tensor-parallel-size 2` on CPU ranks (issue 17), the real daemon on free ports.

Usage: tp_serve_test.py SPECD_BINARY SOURCE_DIR [unittest args]

- Greedy completions over HTTP at TP 2 equal TP 1's text; /v1/models answers; the worker rank
  is a `specd worker` child of the daemon.
- A worker killed (SIGKILL) or stopped (SIGSTOP) while a long stream runs: the stream ends with
  an OpenAI error event naming the tensor-parallel rank (never a hang), /ready fails (or the
  process is already gone), and specd exits with status 1 within the --tp-timeout plus the
  shutdown grace; nothing is left running.
"""
import os
import signal
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True

SPECD, SOURCE = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE, "tests"))
import daemon  # noqa: E402

PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "for i in range(10):"]


def children(pid):
    """Pids of `specd worker` processes whose parent is pid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == pid and b"worker" in cmd:
            out.append(int(entry))
    return out


def greedy_texts(d):
    texts = []
    for p in PROMPTS:
        status, body = d.post_json("/v1/completions",
                                   {"prompt": p, "max_tokens": 24, "temperature": 0})
        assert status == 200, body
        texts.append(body["choices"][0]["text"])
    return texts


class TpServeTest(unittest.TestCase):
    def test_tp2_greedy_text_equals_tp1(self):
        with daemon.Daemon(SPECD, "--device", "cpu", source_dir=SOURCE) as d:
            want = greedy_texts(d)
            self.assertEqual(d.stop(), 0)
        with daemon.Daemon(SPECD, "--device", "cpu", "--tensor-parallel-size", "2",
                           source_dir=SOURCE) as d:
            self.assertEqual(len(children(d.proc.pid)), 1)
            status, body = d.get_json("/v1/models")
            self.assertEqual(status, 200, body)
            self.assertEqual(greedy_texts(d), want)
            self.assertEqual(d.stop(), 0)  # SIGTERM: drain, workers told to stop, exit 0
            self.assertEqual(children(d.proc.pid), [])

    def fault(self, sig):
        with daemon.Daemon(SPECD, "--device", "cpu", "--tensor-parallel-size", "2",
                           "--tp-timeout", "3", source_dir=SOURCE) as d:
            workers = children(d.proc.pid)
            self.assertEqual(len(workers), 1)
            events, errors = [], []

            def consume():
                try:
                    for e in d.stream("/v1/completions",
                                      {"prompt": "def f(", "max_tokens": 4000, "stream": True,
                                       "ignore_eos": True, "temperature": 0}, timeout=60):
                        events.append(e)
                except Exception as exc:  # a reset connection is an error too, recorded
                    errors.append(exc)

            t = threading.Thread(target=consume)
            t.start()
            d.wait_until(lambda _: len(events) >= 5, timeout=60, what="tokens streaming")
            killed = time.monotonic()
            os.kill(workers[0], sig)
            code = d.wait(30)
            took = time.monotonic() - killed
            t.join(30)
            if sig == signal.SIGSTOP:
                os.kill(workers[0], signal.SIGKILL)
            self.assertEqual(code, 1, d.output()[-3000:])
            self.assertLess(took, 25 if sig == signal.SIGSTOP else 20)
            self.assertFalse(t.is_alive(), "the stream hung")
            errs = [e for e in events if isinstance(e, dict) and "error" in e]
            self.assertTrue(errs or errors, f"no error after the fault: {events[-3:]}")
            if errs:
                self.assertIn("tensor-parallel rank", errs[0]["error"]["message"])
            self.assertIn("tensor-parallel group failed", d.output())
            time.sleep(3)  # the worker side notices rank 0 is gone
            self.assertEqual(children(d.proc.pid), [])

    def test_killed_worker_fails_the_group_and_specd_exits_1(self):
        self.fault(signal.SIGKILL)

    def test_stopped_worker_fails_the_group_within_the_timeout(self):
        self.fault(signal.SIGSTOP)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
