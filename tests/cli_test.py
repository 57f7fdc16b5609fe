#!/usr/bin/env python3
"""End-to-end tests of the `specd generate` / `specd tokenize` CLI contracts.

Runs the real binary on the bundled codepair model and compares with goldens we did not
write (HF transformers greedy ids, HF tokenizers vectors). Usage:
  cli_test.py SPECD_BINARY SOURCE_DIR SHARED_DIR
"""
import json
import subprocess
import sys
import unittest

SPECD, SOURCE, SHARED = sys.argv[1:4]
MODEL = f"{SOURCE}/models/codepair/target"
GOLDEN = json.load(open(f"{SHARED}/models/codepair/golden.json"))


def run(*args, stdin=None):
    return subprocess.run([SPECD, *args], input=stdin, capture_output=True, text=True, timeout=300)


def generate_json(*args):
    p = run("generate", "--model", MODEL, "--json", *args)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().split("\n")
    assert len(lines) == 1, p.stdout
    return json.loads(lines[0])


class GenerateTest(unittest.TestCase):
    def test_greedy_ids_match_hf_golden(self):
        for g in GOLDEN["target"][:2]:
            ids = ",".join(map(str, g["prompt_ids"]))
            out = generate_json("--prompt-ids", ids, "--max-tokens", "48", "--ignore-eos")
            self.assertEqual(out["prompt_ids"], g["prompt_ids"])
            self.assertEqual(out["ids"], g["greedy_ids"])
            self.assertEqual(out["text"], g["greedy_text"])
            self.assertEqual(out["finish_reason"], "length")

    def test_prompt_text_is_tokenized_with_bos(self):
        g = GOLDEN["target"][0]
        out = generate_json("--prompt", g["prompt"], "--max-tokens", "4")
        self.assertEqual(out["prompt_ids"], g["prompt_ids"])
        self.assertEqual(out["ids"], g["greedy_ids"][:4])

    def test_no_prompt_means_bos(self):
        out = generate_json("--max-tokens", "3")
        self.assertEqual(out["prompt_ids"], [0])
        self.assertEqual(len(out["ids"]), 3)

    def test_seed_repeats_and_differs(self):
        args = ("--prompt", "def main(", "--temperature", "1", "--max-tokens", "24", "--ignore-eos")
        a = generate_json(*args, "--seed", "5")
        b = generate_json(*args, "--seed", "5")
        c = generate_json(*args, "--seed", "6")
        self.assertEqual(a["ids"], b["ids"])
        self.assertNotEqual(a["ids"], c["ids"])

    def test_stop_string_ends_text(self):
        g = GOLDEN["target"][0]
        # The golden continuation " names\n# to be used ..." contains "\n".
        out = generate_json("--prompt", g["prompt"], "--max-tokens", "20", "--stop", "\n")
        self.assertEqual(out["text"], " names")
        self.assertEqual(out["finish_reason"], "stop")

    def test_streaming_text_equals_json_text(self):
        p = run("generate", "--model", MODEL, "--prompt", "import os\n", "--max-tokens", "30",
                "--ignore-eos")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = generate_json("--prompt", "import os\n", "--max-tokens", "30", "--ignore-eos")
        self.assertEqual(p.stdout, out["text"] + "\n")

    def test_bad_input_is_a_clear_error(self):
        cases = [
            ("--max-tokens", "zero"),
            ("--temperature", "-1"),
            ("--prompt-ids", "1,x"),
            ("--prompt-ids", "99999"),
            ("--no-such-flag",),
            ("--prompt", "a", "--prompt-ids", "1"),
        ]
        for args in cases:
            p = run("generate", "--model", MODEL, *args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("error", p.stderr, args)
        p = run("generate", "--model", "/nonexistent/model")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("/nonexistent/model", p.stderr)


class SpeculationTest(unittest.TestCase):
    DRAFT = f"{SOURCE}/models/codepair/draft"

    def test_speculation_gives_the_hf_golden_and_reports_stats(self):
        config = json.dumps({"model": self.DRAFT, "num_speculative_tokens": 4})
        for g in GOLDEN["target"][:2]:
            ids = ",".join(map(str, g["prompt_ids"]))
            plain = generate_json("--prompt-ids", ids, "--max-tokens", "48", "--ignore-eos",
                                  "--logprobs", "2")
            self.assertNotIn("speculation", plain)  # the CLI contract's keys only
            for extra in (["--speculative-config", config],
                          ["--speculative-config", config, "--num-speculative-tokens", "7"],
                          ["--speculation-method", "ngram"]):
                out = generate_json("--prompt-ids", ids, "--max-tokens", "48", "--ignore-eos",
                                    "--logprobs", "2", *extra)
                self.assertEqual(out["ids"], g["greedy_ids"], extra)
                self.assertEqual(out["text"], g["greedy_text"], extra)
                for a, b in zip(out["logprobs"], plain["logprobs"]):
                    self.assertEqual([t["id"] for t in a["top"]], [t["id"] for t in b["top"]])
                    self.assertAlmostEqual(a["logprob"], b["logprob"], delta=1e-4)
                s = out["speculation"]
                self.assertGreater(s["num_drafts"], 0, extra)
                self.assertLessEqual(s["num_accepted_tokens"], s["num_draft_tokens"])

    def test_bad_speculation_flags_exit_2_naming_the_flag(self):
        cases = [
            (("--speculative-config", "{"), "--speculative-config"),
            (("--speculative-config", '{"method": "ssd"}'), "is required for method ssd"),
            (("--speculative-config", '{"method": "ssv"}'), "not a way to draft"),
            (("--speculative-config", '{"method": "vegas", "sparsity_ratio": 2}'),
             "sparsity_ratio"),
            (("--speculative-config", '{"method": "draft_model"}'), "--speculative-config"),
            (("--speculation-method", "warp"), "--speculation-method"),
            (("--num-speculative-tokens", "65"), "--num-speculative-tokens"),
            (("--speculation-method", "draft_model"), "draft model"),  # none loaded
        ]
        for args, message in cases:
            p = run("generate", "--model", MODEL, "--max-tokens", "2", *args)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(message, p.stderr, args)


class TokenizeTest(unittest.TestCase):
    def test_vectors_match_hf_tokenizers(self):
        vectors = [json.loads(l) for l in open(f"{SHARED}/models/codepair/tokenizer_vectors.jsonl")]
        stdin = "".join(json.dumps({"text": v["text"]}) + "\n" for v in vectors)
        p = run("tokenize", "--model", MODEL, stdin=stdin)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = [json.loads(l)["ids"] for l in p.stdout.splitlines()]
        self.assertEqual(len(got), len(vectors))
        for v, ids in zip(vectors, got):
            self.assertEqual(ids, v["ids"], v["text"])

    def test_add_special_adds_bos(self):
        p = run("tokenize", "--model", MODEL, "--add-special", stdin='{"text": "Hello world"}\n')
        self.assertEqual(json.loads(p.stdout)["ids"], [0, 6398, 312, 331, 4590])

    def test_bad_line_reports_error_and_keeps_going(self):
        p = run("tokenize", "--model", MODEL, stdin='not json\n{"text": "Hello world"}\n')
        self.assertNotEqual(p.returncode, 0)
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        self.assertIn("error", lines[0])
        self.assertEqual(lines[1]["ids"], [6398, 312, 331, 4590])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
