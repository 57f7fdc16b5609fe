#!/usr/bin/env python3
"""Runs tests/openai_node_test.mjs (the official OpenAI Node SDK) against a live daemon.

Usage: openai_node_test.py SPECD_BINARY SOURCE_DIR NODE_DIR

1. Installs the pinned `openai` npm package into NODE_DIR (once; cached in the build tree).
2. Computes the expected outputs with the offline engine (`specd generate --json`), which
   shares no code with the HTTP front end: greedy text, seeded samples for n choices, a
   stop string, logprobs; the chat prompt's ids are built from the model's documented
   template (PROVENANCE.md) with `specd tokenize`, not with the server's template code.
3. Starts `specd serve` on free ports (tests/daemon.py) and runs the Node test with the
   expectations in $SPECD_NODE_EXPECT; stops the daemon with SIGTERM and checks exit 0
   and that the KV cache is empty.
"""
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__

SPECD, SOURCE, NODE_DIR = sys.argv[1:4]
sys.path.insert(0, os.path.join(SOURCE, "tests"))
import daemon  # noqa: E402
import requires  # noqa: E402

OPENAI_VERSION = "4.104.0"  # the official SDK, v4 line
MODEL = daemon.default_model(SOURCE)
PROMPT = "import numpy as np\n\ndef moving_average(x, w):\n"
STOP_PROMPT = "import os\nimport sys\n"
CHAT_USER = "Write a function that reverses a string."


def install_sdk():
    os.makedirs(NODE_DIR, exist_ok=True)
    with open(os.path.join(NODE_DIR, ".install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent ctest runs share the cache
        pkg = os.path.join(NODE_DIR, "node_modules", "openai", "package.json")
        if os.path.exists(pkg) and json.load(open(pkg))["version"] == OPENAI_VERSION:
            return
        requires.programs("openai_node_test", "npm")
        npm = shutil.which("npm")
        p = subprocess.run([npm, "install", "--prefix", NODE_DIR, "--no-audit", "--no-fund",
                            "--no-save", "--loglevel=error", f"openai@{OPENAI_VERSION}"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit(f"openai_node_test: npm install openai@{OPENAI_VERSION} failed:\n"
                     f"{p.stdout}{p.stderr}")


def generate(*args):
    p = subprocess.run([SPECD, "generate", "--model", MODEL, "--json", *args],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"specd generate {args} failed: {p.stderr}")
    return json.loads(p.stdout)


def tokenize(text):
    p = subprocess.run([SPECD, "tokenize", "--model", MODEL], input=json.dumps({"text": text}),
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"specd tokenize failed: {p.stderr}")
    return json.loads(p.stdout)["ids"]


def expectations():
    greedy = generate("--prompt", PROMPT, "--max-tokens", "24", "--ignore-eos")
    samples = [generate("--prompt", PROMPT, "--max-tokens", "16", "--ignore-eos",
                        "--temperature", "0.8", "--seed", str(11 + j))["text"] for j in range(3)]
    stop = generate("--prompt", STOP_PROMPT, "--max-tokens", "40", "--stop", "\n\n")
    logprobs = generate("--prompt", PROMPT, "--max-tokens", "6", "--ignore-eos",
                        "--logprobs", "3")
    # codepair's chat template: BOS, <|user|>content<|end_of_turn|>, then <|assistant|>.
    chat_ids = [0] + tokenize(f"<|user|>{CHAT_USER}<|end_of_turn|><|assistant|>")
    chat = generate("--prompt-ids", ",".join(map(str, chat_ids)), "--max-tokens", "20",
                    "--ignore-eos")
    chat_logprobs = generate("--prompt-ids", ",".join(map(str, chat_ids)), "--max-tokens", "5",
                             "--ignore-eos", "--logprobs", "2")
    assert len(set(samples)) > 1, "seeded samples should differ between seeds"
    assert stop["finish_reason"] == "stop", stop
    return {
        "prompt": PROMPT,
        "prompt_tokens": len(greedy["prompt_ids"]),
        "greedy_text": greedy["text"],
        "greedy_tokens": len(greedy["ids"]),
        "samples": samples,
        "stop_prompt": STOP_PROMPT,
        "stop_text": stop["text"],
        "logprobs": [{"logprob": t["logprob"], "top": sorted(x["logprob"] for x in t["top"])}
                     for t in logprobs["logprobs"]],
        "chat_user": CHAT_USER,
        "chat_prompt_tokens": len(chat_ids),
        "chat_text": chat["text"],
        "chat_tokens": len(chat["ids"]),
        "chat_logprobs": [t["logprob"] for t in chat_logprobs["logprobs"]],
        "chat_top_logprobs": [sorted(x["logprob"] for x in t["top"])
                              for t in chat_logprobs["logprobs"]],
    }


def main():
    requires.programs("openai_node_test", "node")
    node = shutil.which("node")
    install_sdk()
    expect = expectations()
    with tempfile.TemporaryDirectory() as tmp, \
            daemon.Daemon(SPECD, "--served-model-name", "codepair", source_dir=SOURCE,
                          name="openai_node_test") as d:
        expect["base_url"] = d.base_url + "/v1"
        expect["model"] = "codepair"
        path = os.path.join(tmp, "expect.json")
        with open(path, "w") as f:
            json.dump(expect, f)
        env = dict(os.environ, SPECD_NODE_EXPECT=path,
                   NODE_PATH=os.path.join(NODE_DIR, "node_modules"))
        # The .mjs imports "openai" from NODE_DIR (ESM ignores NODE_PATH): run a copy there.
        script = os.path.join(NODE_DIR, "openai_node_test.mjs")
        shutil.copy(os.path.join(SOURCE, "tests", "openai_node_test.mjs"), script)
        p = subprocess.run([node, "--test", "--test-reporter=spec", script], env=env,
                           timeout=600)
        d.wait_metric("specd_kv_cache_blocks_used", 0, timeout=30)
        d.wait_metric("specd_num_requests_running", 0, timeout=30)
        code = d.stop()
        if code != 0:
            print(d.output())
            sys.exit(f"specd serve exited with {code} after SIGTERM")
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
