#!/usr/bin/env python3
"""Tests tools/check_asserts.py: the real tree passes; a test that cannot fail is reported."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_asserts.py")


def run(root):
    return subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)


class CheckAssertsTest(unittest.TestCase):
    def tree(self, files):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        return root

    def test_repository_has_no_test_without_an_assertion(self):
        result = run(os.path.dirname(HERE))
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("0 without an assertion", result.stdout)

    def test_tests_that_cannot_fail_are_reported(self):
        root = self.tree({"engine/x/a_test.cc": """
void Quiet(int x) { (void)x; }
TEST(A, NoCheck) {
  int x = 1;
  Quiet(x);  // EXPECT_EQ(x, 1) in a comment does not count
}
/* TEST(A, Commented) { } */
TEST_F(Fixture, AlsoNoCheck) { Quiet(2); }
"""})
        result = run(root)
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("engine/x/a_test.cc:3: TEST(A, NoCheck) has no assertion", result.stdout)
        self.assertIn("TEST_F(Fixture, AlsoNoCheck) has no assertion", result.stdout)
        self.assertNotIn("Commented", result.stdout)

    def test_assertions_direct_through_helpers_headers_and_macros_pass(self):
        root = self.tree({
            "tests/util_test_helpers.h": "inline void Check(int x) { EXPECT_GT(x, 0); }\n",
            "engine/x/b_test.cc": """
#include "tests/util_test_helpers.h"
#define EXPECT_OK(s) ASSERT_TRUE((s).ok())
void ExpectTwice(int x) { Check(x); Check(x + 1); }
TEST(B, Direct) { EXPECT_EQ(1, 1); }
TEST(B, Helper) { ExpectTwice(3); }
TEST(B, Header) { Check(1); }
TEST(B, Macro) { EXPECT_OK(Foo()); }
TEST_P(B, Fatal) { if (false) FAIL() << "x"; }
"""})
        result = run(root)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("5 tests checked, 0 without", result.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
