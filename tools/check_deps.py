#!/usr/bin/env python3
"""Checks that modules include only what docs/architecture.md's arrows allow.

Every project header a source file includes (`#include "dir/file.h"`) must belong to a module
its own module may depend on. Modules are folders; the rules below are DESIGN.md's layer
arrows written out, plus the order inside engine/ (a module only depends on ones listed
before it), so the graph has no cycles by construction. Exits 1 listing each violation.

Usage: check_deps.py [REPO_ROOT]
"""
import os
import re
import sys

# module -> modules it may include from. A module is the longest matching folder prefix.
# Order inside engine/ (lower may not include higher): base, kv, tokenizer, sample, model,
# runner, sched, dist, spec, then engine/ itself (engine.h, the facade). dist/ (the SSD channel)
# knows only base/; spec/ builds the SSD speculator on it.
ENGINE_ORDER = ["engine/base", "engine/kv", "engine/tokenizer", "engine/sample",
                "engine/model", "engine/runner", "engine/sched", "engine/dist", "engine/spec"]
KERNELS = ["kernels/ref", "kernels/cuda"]

RULES = {
    "proto": [],
    "kernels/ref": [],
    "kernels/cuda": ["kernels/ref"],
    "kernels/check": ["kernels/ref", "kernels/cuda"],
    "engine": ENGINE_ORDER + KERNELS + ["proto"],
    "tools": ["kernels", "engine", "proto"],
    "tests": ["kernels", "engine", "proto", "server"],
}
for i, mod in enumerate(ENGINE_ORDER):
    RULES[mod] = ENGINE_ORDER[:i] + KERNELS + ["proto"]
RULES["engine/tokenizer"] = ["engine/base"]  # tokenizers know nothing of models or kernels
RULES["engine/kv"] = ["engine/base"] + KERNELS
RULES["engine/dist"] = ["engine/base"]
RULES["engine/base"] = ["kernels/ref"]  # bf16 conversion is defined once, in kernels/ref

# server/ sees the engine only through engine.h and the types its API hands out (Status
# macros and logging from base/, the Tokenizer and its ChatTemplate), plus the generated proto.
SERVER_ALLOWED_FILES = {"engine/engine.h", "engine/tokenizer/tokenizer.h",
                        "engine/tokenizer/jinja/chat_template.h"}
SERVER_ALLOWED_MODULES = ["engine/base", "proto", "server"]

# Tests and test harnesses may use the op-table harness of kernels/check.
TEST_EXTRA = ["kernels/check"]

SOURCE_EXT = (".h", ".cc", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
TOP = ("engine", "kernels", "server", "proto", "tools", "tests")


def module_of(path, known):
    """Longest known folder prefix of path (a repo-relative file path)."""
    parts = path.split("/")[:-1]
    while parts:
        cand = "/".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def allowed(src_mod, src_path, inc):
    inc_parts = inc.split("/")
    if inc_parts[0] not in TOP:
        return True  # a third-party header (absl/, gtest/, ...) or a generated one
    if inc.startswith(src_mod + "/") and "/" not in inc[len(src_mod) + 1:]:
        return True  # same module
    if src_mod == "server":
        return inc in SERVER_ALLOWED_FILES or any(
            inc.startswith(m + "/") for m in SERVER_ALLOWED_MODULES)
    targets = list(RULES.get(src_mod, []))
    if src_path.endswith("_test.cc") or "/check/" in src_path or src_mod in ("tools", "tests"):
        targets += TEST_EXTRA
    # A module also owns its subfolders (engine/tokenizer/jinja belongs to engine/tokenizer).
    targets.append(src_mod)
    return any(inc == t or inc.startswith(t + "/") for t in targets)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    known = set(RULES) | {"server"}
    bad = []
    checked = 0
    for top in TOP:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                mod = module_of(path, known)
                if mod is None:
                    bad.append(f"{path}: folder belongs to no module in tools/check_deps.py")
                    continue
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for inc in INCLUDE_RE.findall(text):
                    checked += 1
                    if not allowed(mod, path, inc):
                        bad.append(f'{path}: includes "{inc}", but {mod}/ may not depend on it')
    for line in bad:
        print(line)
    print(f"check_deps: {checked} includes checked, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
