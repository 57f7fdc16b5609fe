#!/usr/bin/env python3
"""Checks that modules include only what docs/architecture.md's arrows allow.

Every project header a source file includes (`#include "dir/file.h"`) must belong to a module
its own module may depend on (or be a file it is allowed by name). Modules are folders; the
table below is DESIGN.md's layer arrows and docs/architecture.md's rules written out, so the
graph has no cycles by construction. Exits 1 listing each violation.

Usage: check_deps.py [REPO_ROOT]
"""
import os
import re
import sys

# Inside engine/ a module includes only modules before it in this order. The scheduler plans
# steps without knowing how they run, so it comes before model/ and runner/ and may include
# base/ and kv/ alone; parallel/ (the tensor-parallel group) joins runner/ and distributed/.
# A subfolder listed here is a module of its own (a library of its own); one that is not belongs
# to its parent's module.
ENGINE_ORDER = ["engine/base", "engine/base/cuda", "engine/kv", "engine/sched", "engine/tokenizer",
                "engine/sample", "engine/model", "engine/runner", "engine/runner/cuda",
                "engine/distributed", "engine/policy", "engine/parallel",
                "engine/speculation/saguaro", "engine/speculation", "engine/speculation/ssd",
                "engine/verification", "engine/step"]
# Modules that depend on fewer modules than the order allows: tokenizer/, distributed/ (the SSD
# channel, the tensor-parallel communicators) and policy/ know base/ alone, distributed/ also
# base/cuda (its NCCL code's CUDA checks); saguaro/ (the SSD math) is pure, and its test checks
# Saguaro sampling against engine/sample's acceptance.
NARROW = {
    "engine/tokenizer": ["engine/base"],
    "engine/distributed": ["engine/base", "engine/base/cuda"],
    "engine/policy": ["engine/base"],
    "engine/speculation/saguaro": ["engine/base", "engine/sample"],
}
# Built only with CUDA, so of the engine modules only those named may include them (tests and
# tools may too): base/cuda (CUDA checks, device and pinned memory) serves the CUDA runner and
# distributed/'s NCCL code; runner/cuda is included by nobody but runner/'s CreateModelRunner,
# by name (ALLOWED_FILES below).
CUDA_MODULES = {
    "engine/base/cuda": ["engine/runner/cuda", "engine/distributed"],
    "engine/runner/cuda": [],
}
# kernels/ may be included only by the engine modules listed here, and only the parts named:
# bf16 conversion (base), the CPU references (model's RoPE, spec's Philox sampling), and the
# CUDA kernels themselves by the CUDA runner that launches them (and distributed/'s one-shot
# all-reduce kernel).
ENGINE_KERNELS = {
    "engine/base": ["kernels/ref"],
    "engine/model": ["kernels/ref"],
    "engine/runner": ["kernels/ref"],
    "engine/runner/cuda": ["kernels/ref", "kernels/cuda"],
    # The NCCL communicator's one-shot all-reduce launches its kernel (oneshot_allreduce.h);
    # its test compares with the reference.
    "engine/distributed": ["kernels/ref", "kernels/cuda"],
    "engine/speculation/saguaro": ["kernels/ref"],
    "engine/speculation": ["kernels/ref"],
}
# "engine/ -> proto config" (DESIGN.md): the config schema, never the gRPC API.
ENGINE_PROTO_FILES = ["proto/config.pb.h"]


def without_cuda(mods, user):
    """mods less the CUDA-only modules that `user` may not include."""
    return [m for m in mods if m not in CUDA_MODULES or user in CUDA_MODULES[m]]


RULES = {
    "proto": [],
    "kernels/ref": [],
    "kernels/cuda": ["kernels/ref"],
    "kernels/check": ["kernels/ref", "kernels/cuda"],
    # engine.h and the engine_*.cc behind it: the facade over every engine module.
    "engine": without_cuda(ENGINE_ORDER, "engine"),
    # The engine tests' fixtures (test code: see TESTING below).
    "engine/testing": ["engine", *ENGINE_ORDER],
    "tools": ["kernels/ref", "kernels/cuda", "kernels/check", "engine", *ENGINE_ORDER,
              "proto"],
    "tests": ["kernels/ref", "kernels/cuda", "kernels/check", "engine", *ENGINE_ORDER, "proto",
              "server"],
}
for i, mod in enumerate(ENGINE_ORDER):
    RULES[mod] = without_cuda(NARROW.get(mod, ENGINE_ORDER[:i]), mod)
    RULES[mod] = RULES[mod] + ENGINE_KERNELS.get(mod, [])

# Files (not whole modules) a module may include.
ALLOWED_FILES = {mod: ENGINE_PROTO_FILES for mod in ["engine", *ENGINE_ORDER]}
# CreateModelRunner constructs the CUDA runner (with SPECD_HAS_CUDA).
ALLOWED_FILES["engine/runner"] = ENGINE_PROTO_FILES + ["engine/runner/cuda/cuda_runner.h"]
# server/ sees the engine only through engine.h and the types its API hands out (Status
# macros and logging from base/, the Tokenizer and its ChatTemplate), plus the generated proto.
ALLOWED_FILES["server"] = ["engine/engine.h", "engine/tokenizer/tokenizer.h",
                           "engine/tokenizer/jinja/chat_template.h"]
RULES["server"] = ["engine/base", "proto"]

# Tests and test harnesses anywhere may use the op-table harness of kernels/check.
TEST_EXTRA = ["kernels/check"]
# The engine tests' fixtures: only test files (`*_test.cc`, `*_test_util.h`, tests/) of the
# modules that may use the engine facade include them.
TESTING = "engine/testing"
TESTING_USERS = ["engine", "tools", "tests"]
# The process-wide switches that break a verifier on purpose (the statistical tests' negative
# controls) are declared for tests only, in this header, which the test files of any module may
# include (engine/sample's acceptance_test among them); no production header declares them.
TEST_FLAGS_HEADER = "engine/testing/test_flags.h"

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


def is_test(src_mod, src_path):
    return (src_path.endswith(("_test.cc", "_test_util.h")) or "/check/" in src_path
            or src_mod in ("tools", "tests"))


def is_test_file(src_mod, src_path):
    return src_path.endswith(("_test.cc", "_test_util.h")) or src_mod == "tests"


def allowed(src_mod, src_path, inc, known):
    if inc.split("/")[0] not in TOP:
        return True  # a third-party header (absl/, gtest/, ...) or a generated one
    inc_mod = module_of(inc, known)
    if inc_mod == src_mod or inc in ALLOWED_FILES.get(src_mod, []):
        return True  # same module (subfolders that are no module of their own included)
    if inc == TEST_FLAGS_HEADER:
        return is_test_file(src_mod, src_path)
    if inc_mod == TESTING:
        return src_mod in TESTING_USERS and is_test_file(src_mod, src_path)
    targets = list(RULES.get(src_mod, []))
    if is_test(src_mod, src_path):
        targets += TEST_EXTRA
    return inc_mod in targets


def violations(root):
    """(number of includes checked, list of violation lines) for the tree at root."""
    known = set(RULES)
    bad = []
    checked = 0
    for top in TOP:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
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
                    if not allowed(mod, path, inc, known):
                        bad.append(f'{path}: includes "{inc}", but {mod}/ may not depend on it')
    return checked, bad


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    checked, bad = violations(root)
    for line in bad:
        print(line)
    print(f"check_deps: {checked} includes checked, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
