#!/usr/bin/env python3
"""Finds GoogleTest tests that cannot fail: TEST bodies that reach no assertion.

A TEST / TEST_F / TEST_P / TYPED_TEST body in a *_test.cc passes if it uses an EXPECT_* /
ASSERT_* / FAIL / ADD_FAILURE / GTEST_SKIP macro, or calls a function or macro (defined in the
same file or in a test header it includes: a name containing "test") that does, directly or
through further helpers. Anything else is reported: such a test passes whatever the code does.
Exits 1 listing each one.

Usage: check_asserts.py [REPO_ROOT]
"""
import os
import re
import sys

CHECK = re.compile(r"\b(EXPECT_\w+|ASSERT_\w+|FAIL\(\)|ADD_FAILURE\w*|GTEST_FAIL|GTEST_SKIP)")
TEST_HEAD = re.compile(r"^\s*(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(([^)]*)\)\s*\{",
                       re.M)
# A function definition: name(params) [const] [override] [-> type] {
FUNC_HEAD = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[^;{}()]|\([^()]*\))*\)\s*(?:const\s*)?"
                       r"(?:noexcept\s*)?(?:override\s*)?(?:->\s*[\w:<>,\s*&]+)?\{")
MACRO = re.compile(r"^\s*#\s*define\s+(\w+)\s*\(((?:[^\n]*\\\n)*[^\n]*)", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof"} | {
    "TEST", "TEST_F", "TEST_P", "TYPED_TEST", "TYPED_TEST_P"}
SKIP_DIRS = {".git", "build", "__pycache__"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def block(text, start):
    """The text from start (just after an opening brace) to its matching closing brace."""
    depth, i = 1, start
    while depth and i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
        i += 1
    return text[start:i]


def with_test_headers(root, path, seen):
    """The file's text plus that of the test headers it includes (recursively)."""
    if path in seen or not os.path.isfile(path):
        return ""
    seen.add(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    out = text
    for inc in INCLUDE.findall(text):
        if "test" in os.path.basename(inc):
            out += "\n" + with_test_headers(root, os.path.join(root, inc), seen)
    return out


def asserting_helpers(text):
    """Names of functions and macros in text that reach an assertion."""
    bodies = {}
    for m in FUNC_HEAD.finditer(text):
        if m.group(1) not in KEYWORDS:
            bodies.setdefault(m.group(1), []).append(block(text, m.end()))
    for m in MACRO.finditer(text):
        bodies.setdefault(m.group(1), []).append(m.group(2))
    good = {name for name, bs in bodies.items() if any(CHECK.search(b) for b in bs)}
    changed = True
    while changed:  # helpers calling helpers that assert
        changed = False
        calls = re.compile(r"\b(" + "|".join(map(re.escape, good)) + r")\s*\(") if good else None
        for name, bs in bodies.items():
            if name not in good and calls and any(calls.search(b) for b in bs):
                good.add(name)
                changed = True
    return good


def unchecked_tests(root, path):
    """(line, 'TEST(...)') of each test in path whose body reaches no assertion."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    good = asserting_helpers(with_test_headers(root, path, set()))
    calls = re.compile(r"\b(" + "|".join(map(re.escape, good)) + r")\s*\(") if good else None
    out = []
    for m in TEST_HEAD.finditer(text):
        body = block(text, m.end())
        if CHECK.search(body) or (calls and calls.search(body)):
            continue
        out.append((text[:m.start()].count("\n") + 1, f"{m.group(1)}({m.group(2).strip()})"))
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    bad, tests = [], 0
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build"))
        for name in sorted(files):
            if name.endswith("_test.cc"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    tests += len(TEST_HEAD.findall(strip_comments(f.read())))
                for line, test in unchecked_tests(root, path):
                    bad.append(f"{os.path.relpath(path, root)}:{line}: {test} has no assertion")
    for line in bad:
        print(line)
    print(f"check_asserts: {tests} tests checked, {len(bad)} without an assertion")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
