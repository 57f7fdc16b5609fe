#!/usr/bin/env python3
"""Smoke test of tools/bench/bench.py against a live `specd serve` (ctest bench_smoke_test).

Usage: bench_smoke_test.py SPECD_BINARY SOURCE_DIR SHARED_DIR

Short runs (completions with Poisson arrivals, chat with a concurrency cap, random token
prompts); asserts zero errors, every request counted, and sane numbers: positive
throughputs, p50 <= p99, TTFT <= E2E, output tokens equal to what --ignore-eos asked for,
the server's own counters agreeing with the bench's, and the exit status.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__

SPECD, SOURCE, SHARED = sys.argv[1:4]
sys.path.insert(0, os.path.join(SOURCE, "tests"))
import daemon  # noqa: E402

BENCH = os.path.join(SOURCE, "tools", "bench", "bench.py")
PROMPTS = os.path.join(SHARED, "models", "codepair", "prompts.jsonl")


class BenchSmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = daemon.Daemon(SPECD, "--served-model-name", "codepair", source_dir=SOURCE,
                              name="bench_smoke").start()

    @classmethod
    def tearDownClass(cls):
        assert cls.d.stop() == 0, cls.d.output()

    def bench(self, *args, expect_code=0):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            p = subprocess.run([sys.executable, BENCH, "--base-url", self.d.base_url,
                                "--dataset-path", PROMPTS, "--json", out.name, *args],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, expect_code, p.stdout + p.stderr)
            self.assertIn("Serving Benchmark Result", p.stdout)
            with open(out.name, encoding="utf-8") as f:
                return json.load(f)

    def assert_sane(self, m, num_prompts, output_len):
        self.assertEqual(m["failed"], 0, m["errors"])
        self.assertEqual(m["completed"], num_prompts)
        self.assertEqual(m["total_output_tokens"], num_prompts * output_len)
        self.assertGreater(m["total_input_tokens"], num_prompts)
        for key in ("request_throughput", "output_throughput", "duration_s"):
            self.assertGreater(m[key], 0, key)
        self.assertAlmostEqual(m["output_throughput"],
                               m["total_output_tokens"] / m["duration_s"], places=6)
        for name in ("ttft", "tpot", "itl", "e2el"):
            mean, p50, p99 = (m[f"{s}_{name}_ms"] for s in ("mean", "median", "p99"))
            self.assertGreater(p50, 0, name)
            self.assertLessEqual(p50, p99, name)
            self.assertLessEqual(mean, p99 + 1e-9, name)
        self.assertLessEqual(m["median_ttft_ms"], m["median_e2el_ms"])
        self.assertLessEqual(m["p99_ttft_ms"], m["p99_e2el_ms"])
        self.assertLess(m["p99_e2el_ms"], 600_000)

    def test_completions_poisson(self):
        before = self.d.metrics()
        m = self.bench("--num-prompts", "12", "--request-rate", "8", "--output-len", "16",
                       "--ignore-eos", "--seed", "1")
        self.assert_sane(m, 12, 16)
        after = self.d.metrics()
        # The server counted the same tokens (+2 for the bench's initial test request).
        generated = (after["specd_generation_tokens_total"]
                     - before["specd_generation_tokens_total"])
        self.assertEqual(generated, 12 * 16 + 2)

    def test_chat_with_concurrency_cap(self):
        m = self.bench("--endpoint", "chat", "--num-prompts", "8", "--max-concurrency", "3",
                       "--output-len", "12", "--ignore-eos")
        self.assert_sane(m, 8, 12)
        self.assertEqual(m["max_concurrency"], 3)

    def test_random_token_prompts(self):
        m = self.bench("--dataset", "random", "--prompt-len", "64", "--num-prompts", "6",
                       "--output-len", "8", "--ignore-eos", "--max-concurrency", "6")
        self.assert_sane(m, 6, 8)
        self.assertEqual(m["total_input_tokens"], 6 * 64)

    def test_a_refused_set_up_fails_loudly(self):
        p = subprocess.run([sys.executable, BENCH, "--base-url", self.d.base_url,
                            "--num-prompts", "2", "--model", "no-such-model"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("HTTP 404", p.stdout + p.stderr)


class StatisticsTest(unittest.TestCase):
    """bench.py's arithmetic on made-up results (no server)."""

    def test_percentiles_and_failures(self):
        sys.path.insert(0, os.path.dirname(BENCH))
        import bench
        self.assertEqual(bench.percentile([1, 2, 3, 4], 50), 2.5)
        self.assertAlmostEqual(bench.percentile(list(range(1, 101)), 99), 99.01)
        results = []
        for i in range(4):
            r = bench.RequestResult()
            r.ok = i < 3
            r.error = "" if r.ok else "HTTP 500: boom"
            r.output_tokens, r.prompt_tokens = 11, 5
            r.ttft, r.e2e, r.itl = 0.1 * (i + 1), 1.1 * (i + 1), [0.1 * (i + 1)] * 10
            results.append(r)
        args = bench.parse_args(["--num-prompts", "4"])
        m = bench.compute_metrics(results, 2.0, args)
        self.assertEqual((m["completed"], m["failed"]), (3, 1))
        self.assertEqual(m["errors"], ["HTTP 500: boom"])
        self.assertEqual(m["total_output_tokens"], 33)
        self.assertAlmostEqual(m["output_throughput"], 16.5)
        self.assertAlmostEqual(m["median_ttft_ms"], 200.0)
        self.assertAlmostEqual(m["mean_tpot_ms"], 200.0)  # (e2e - ttft) / 10


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
