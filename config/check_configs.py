#!/usr/bin/env python3
"""Checks the example configs in config/ against proto/config.proto (and the real binary).

Usage:
  check_configs.py SOURCE_DIR                  # schema checks only (ctest label unit)
  check_configs.py SOURCE_DIR --specd BINARY   # + `specd serve` on each example (integration)

Schema checks: every example parses as specd.config.ServeConfig (text format or JSON, as
`specd serve` decides) with a Python module that protoc generates from proto/config.proto
at test time, unknown fields rejected; every schema field is mentioned in each .textproto
and in config/README.md's table; every flag in that table exists in `specd serve`.
With --specd: cpu-demo.* start on free ports and their settings take effect; the GPU
examples pass the real parser with only CPU-incompatible fields overridden.
"""
import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__

HERE = os.path.dirname(os.path.abspath(__file__))


def load_config_module(source_dir, out_dir):
    """Generates config_pb2 from proto/config.proto into out_dir and imports it."""
    protoc = os.environ.get("PROTOC") or "protoc"
    subprocess.run([protoc, f"--python_out={out_dir}", f"-I{source_dir}/proto",
                    f"{source_dir}/proto/config.proto"], check=True, timeout=60)
    sys.path.insert(0, out_dir)
    try:
        return importlib.import_module("config_pb2")
    finally:
        sys.path.remove(out_dir)


def is_json(path, text):
    """The rule of server/serve_options.cc (LooksLikeJson)."""
    lower = path.lower()
    if lower.endswith(".json"):
        return True
    if lower.endswith((".textproto", ".txtpb", ".pbtxt", ".prototxt")):
        return False
    return text.lstrip().startswith("{")


def parse_config(config_pb2, path, text=None):
    """Parses a ServeConfig file as `specd serve --config` would; raises on errors."""
    from google.protobuf import json_format, text_format
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    message = config_pb2.ServeConfig()
    if is_json(path, text):
        json_format.Parse(text, message, ignore_unknown_fields=False)
    else:
        text_format.Parse(text, message)
    return message


def field_paths(descriptor, prefix=""):
    """Every field as 'name' or 'parent.name' (nested messages expanded)."""
    out = []
    for field in descriptor.fields:
        out.append(prefix + field.name)
        if field.message_type is not None:
            out += field_paths(field.message_type, prefix + field.name + ".")
    return out


def example_files():
    names = sorted(os.listdir(HERE))
    return [os.path.join(HERE, n) for n in names
            if n.endswith((".textproto", ".txtpb", ".pbtxt", ".json"))]


def readme_flags():
    """(field, flags) rows of the README's field table (its "## Fields" section; other
    tables, such as the speculative_config keys, are not ServeConfig fields)."""
    rows = []
    section = None
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                section = line[3:].strip()
            m = re.match(r"\| `([a-z_.]+)` \| (.*?) \|", line)
            if m and section == "Fields":
                rows.append((m.group(1), re.findall(r"`(--[a-z-]+)`", m.group(2))))
    return rows


def serve_flags_from_source(source_dir):
    # serve_options.cc registers its flags; option_flags.cc those of the option structs it shares.
    text = ""
    for name in ("serve_options.cc", "flags.cc", "option_flags.cc"):
        with open(os.path.join(source_dir, "server", name), encoding="utf-8") as f:
            text += f.read()
    return {"--" + n for n in re.findall(r'p\.Add\("([a-z0-9-]+)"', text)}


class SchemaTest(unittest.TestCase):
    """Needs only protoc and python3-protobuf."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.pb = load_config_module(ARGS.source, cls.tmp.name)
        cls.fields = field_paths(cls.pb.ServeConfig.DESCRIPTOR)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_there_are_examples_of_each_kind(self):
        names = [os.path.basename(p) for p in example_files()]
        for expected in ["cpu-demo.textproto", "cpu-demo.json", "gpu-1.textproto",
                         "gpu-tp-speculator.textproto"]:
            self.assertIn(expected, names)

    def test_every_example_parses(self):
        for path in example_files():
            with self.subTest(path=os.path.basename(path)):
                config = parse_config(self.pb, path)
                self.assertTrue(config.model, "examples name their model")
                self.assertTrue(config.served_model_name)

    def test_a_typo_is_caught(self):
        # The check above must be able to fail: misspelled fields and bad types are errors.
        from google.protobuf import json_format, text_format
        with self.assertRaises(text_format.ParseError):
            parse_config(self.pb, "x.textproto", 'modle: "x"\n')
        with self.assertRaises(text_format.ParseError):
            parse_config(self.pb, "x.textproto", "max_num_seqs: \"many\"\n")
        with self.assertRaises(json_format.ParseError):
            parse_config(self.pb, "x.json", '{"max_num_seq": 4}')

    def test_json_twin_equals_textproto(self):
        text = parse_config(self.pb, os.path.join(HERE, "cpu-demo.textproto"))
        js = parse_config(self.pb, os.path.join(HERE, "cpu-demo.json"))
        self.assertEqual(text, js)

    def test_textproto_examples_mention_every_field(self):
        for path in example_files():
            if path.endswith(".json"):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for field in self.fields:
                leaf = field.split(".")[-1]
                with self.subTest(path=os.path.basename(path), field=field):
                    self.assertTrue(re.search(rf"\b{re.escape(leaf)}\b", text),
                                    f"{leaf} is not mentioned")

    def test_cpu_demo_sets_or_comments_every_field_with_an_explanation(self):
        # cpu-demo.textproto is the documented one: each field line (set or commented out)
        # follows a comment line or carries one.
        with open(os.path.join(HERE, "cpu-demo.textproto"), encoding="utf-8") as f:
            lines = f.read().split("\n")
        for field in self.fields:
            leaf = field.split(".")[-1]
            idx = [i for i, l in enumerate(lines) if re.match(rf"^#?\s*{leaf}\s*[:{{]", l)]
            with self.subTest(field=field):
                self.assertTrue(idx, f"{field} missing from cpu-demo.textproto")
                i = idx[0]
                self.assertTrue(lines[i - 1].startswith("#") or "#" in lines[i].lstrip("# "),
                                f"{field} has no explanation")

    def test_readme_table_covers_the_schema(self):
        rows = dict(readme_flags())
        # Message fields (tls) are documented through their leaves (tls.cert_file, ...).
        leaves = [f for f in self.fields if not any(g.startswith(f + ".") for g in self.fields)]
        self.assertEqual(sorted(rows), sorted(leaves))

    def test_readme_flags_exist(self):
        known = serve_flags_from_source(ARGS.source)
        if ARGS.specd:
            out = run_specd("serve", "--help")
            known |= set(re.findall(r"--[a-z0-9-]+", out.stdout + out.stderr))
        for field, flags in readme_flags():
            with self.subTest(field=field):
                self.assertTrue(flags, f"{field}: no flag in the README table")
                for flag in flags:
                    self.assertIn(flag, known)


def run_specd(*args, timeout=60):
    return subprocess.run([ARGS.specd, *args], capture_output=True, text=True, timeout=timeout)


class ServeTest(unittest.TestCase):
    """Needs the built binary: the real parser and validator decide."""

    def setUp(self):
        if not ARGS.specd:
            self.skipTest("no --specd")
        sys.path.insert(0, os.path.join(ARGS.source, "tests"))
        import daemon  # tests/daemon.py
        self.daemon = daemon

    def serve_example(self, name, *flags):
        d = self.daemon.Daemon(ARGS.specd, "--config", os.path.join(HERE, name),
                               *flags, source_dir=ARGS.source, cwd=ARGS.source, model=None)
        with d:
            status, body = d.get_json("/v1/models")
            self.assertEqual(status, 200, body)
            self.assertEqual([m["id"] for m in body["data"]], ["codepair"])
            self.assertEqual(body["data"][0]["max_model_len"], 2048)
            # max_model_len 2048 from the file: a 2049-token request is refused.
            status, body = d.post_json("/v1/completions", {
                "model": "codepair", "prompt": [7] * 2040, "max_tokens": 9})
            self.assertEqual(status, 400, body)
            status, body = d.post_json("/v1/completions", {
                "model": "codepair", "prompt": [7] * 2040, "max_tokens": 8})
            self.assertEqual(status, 200, body)
            # speculative_config: the draft model drafts by default; output as without.
            request = {"model": "codepair", "prompt": "def fibonacci(n):", "max_tokens": 32,
                       "temperature": 0}
            status, body = d.post_json("/v1/completions", request)
            self.assertEqual(status, 200, body)
            self.assertGreater(body["usage"]["speculation"]["num_drafts"], 0, body)
            status, plain = d.post_json("/v1/completions",
                                        dict(request, speculation={"method": "none"}))
            self.assertEqual(status, 200, plain)
            self.assertEqual(plain["usage"]["speculation"]["num_drafts"], 0, plain)
            self.assertEqual(body["choices"][0]["text"], plain["choices"][0]["text"])
            self.assertEqual(d.stop(), 0)

    def test_cpu_demo_textproto_serves(self):
        self.serve_example("cpu-demo.textproto")

    def test_cpu_demo_json_serves(self):
        self.serve_example("cpu-demo.json")

    def test_gpu_examples_pass_the_real_parser(self):
        model = os.path.join(ARGS.source, "models", "codepair", "target")
        for name in ["gpu-1.textproto", "gpu-tp-speculator.textproto"]:
            with self.subTest(name=name):
                path = os.path.join(HERE, name)
                # As written, the only complaint may be the device (or the absent model).
                p = run_specd("serve", "--config", path, "--port", "-5")
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertNotIn("--config", p.stderr)
                self.assertRegex(p.stderr, r"--(model|device)")
                # With CPU-only overrides it must start (speculative_config: see the file's
                # comments; the runnable alternative it shows is checked below). A
                # tensor-parallel example runs with 2 CPU ranks (codepair has 6 heads).
                tp = ["--tensor-parallel-size", "2"] if "tp" in name else []
                d = self.daemon.Daemon(ARGS.specd, "--config", path, "--device", "cpu", *tp,
                                       "--speculative-config=", "--max-model-len", "2048",
                                       "--kv-cache-memory-bytes", str(64 << 20),
                                       "--threads", "0", source_dir=ARGS.source,
                                       cwd=ARGS.source, model=model)
                with d:
                    status, body = d.get_json("/v1/models")
                    self.assertEqual(status, 200, body)
                    self.assertEqual(d.stop(), 0)

    def test_speculative_configs_shown_in_comments_start(self):
        # The speculative_config lines the GPU examples show as runnable today start the
        # real server (on the codepair pair: the draft path swapped for the bundled draft).
        model = os.path.join(ARGS.source, "models", "codepair", "target")
        draft = os.path.join(ARGS.source, "models", "codepair", "draft")
        shown = []
        for name in ["gpu-1.textproto", "gpu-tp-speculator.textproto"]:
            with open(os.path.join(HERE, name), encoding="utf-8") as f:
                shown += re.findall(r"^#\s*(?:speculative_config:)?\s*'(\{.*\})'\s*$", f.read(),
                                    re.M)
        self.assertGreaterEqual(len(shown), 3, shown)
        for config in shown:
            config = re.sub(r'"model": "[^"]*"', f'"model": "{draft}"', config)
            with self.subTest(config=config):
                d = self.daemon.Daemon(ARGS.specd, "--device", "cpu", "--speculative-config",
                                       config, source_dir=ARGS.source, model=model)
                with d:
                    status, body = d.post_json("/v1/completions", {
                        "prompt": "def f(", "max_tokens": 8, "temperature": 0})
                    self.assertEqual(status, 200, body)
                    self.assertIn("speculation", body["usage"])
                    self.assertEqual(d.stop(), 0)
        p = run_specd("serve", "--model", model, "--speculative-config", '{"method": "ssd"}')
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--speculative-config", p.stderr)
        self.assertIn("is required for method ssd", p.stderr)
        p = run_specd("serve", "--model", model, "--speculative-config", '{"method": "ssv"}')
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("not a way to draft", p.stderr)

    def test_a_typo_fails_startup(self):
        with tempfile.NamedTemporaryFile("w", suffix=".textproto") as f:
            f.write('max_num_seqs: 4\nmax_num_seq: 4\n')
            f.flush()
            p = run_specd("serve", "--config", f.name)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("max_num_seq", p.stderr)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("--specd")
    ARGS, rest = parser.parse_known_args()
    ARGS.source = os.path.abspath(ARGS.source)
    tests = ServeTest if ARGS.specd else SchemaTest
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(tests)
    if rest:
        suite = unittest.defaultTestLoader.loadTestsFromNames(rest, sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


ARGS = None
if __name__ == "__main__":
    main()
