#!/usr/bin/env python3
"""Tests tests/requires.py: a missing dependency skips (exit 77) outside CI and fails under
CI=true; what is present lets the script run on; unittest skips turn into exit 77."""
import os
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def script(body, ci=None):
    """Runs body as a script that imports requires; (exit status, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    code = (f"import sys\nsys.dont_write_bytecode = True\nsys.path.insert(0, {HERE!r})\n"
            "import requires\n" + textwrap.dedent(body))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    return p.returncode, p.stderr


class RequiresTest(unittest.TestCase):
    MISSING_PROGRAM = 'requires.programs("t", "sh", "specd-no-such-tool")\nprint("ran")'
    MISSING_MODULE = 'requires.modules("t", "json", "specd_no_such.module")\nprint("ran")'

    def test_missing_program_skips_outside_ci(self):
        for ci in (None, "", "false", "0"):
            with self.subTest(ci=ci):
                code, err = script(self.MISSING_PROGRAM, ci)
                self.assertEqual(code, 77, err)
                self.assertIn("specd-no-such-tool", err)
                self.assertIn("SKIPPED", err)

    def test_missing_program_fails_under_ci(self):
        for ci in ("true", "1", "yes"):
            with self.subTest(ci=ci):
                code, err = script(self.MISSING_PROGRAM, ci)
                self.assertEqual(code, 1, err)
                self.assertIn("specd-no-such-tool", err)
                self.assertIn("FAILS", err)

    def test_missing_module_skips_or_fails(self):
        self.assertEqual(script(self.MISSING_MODULE)[0], 77)
        code, err = script(self.MISSING_MODULE, "true")
        self.assertEqual(code, 1)
        self.assertIn("specd_no_such.module", err)

    def test_present_dependencies_let_the_script_run(self):
        code, err = script('requires.programs("t", "sh")\nrequires.modules("t", "json")\n'
                           'sys.exit(5)', "true")
        self.assertEqual(code, 5, err)

    def test_configure_time_stand_in(self):
        # What CMake registers for a test whose dependency it did not find.
        for ci, want in ((None, 77), ("true", 1)):
            env = {k: v for k, v in os.environ.items() if k != "CI"}
            if ci:
                env["CI"] = ci
            p = subprocess.run([sys.executable, os.path.join(HERE, "requires.py"), "grpc_test",
                                "python3-grpcio"], capture_output=True, text=True, env=env)
            self.assertEqual(p.returncode, want, p.stderr)
            self.assertIn("grpc_test: python3-grpcio missing", p.stderr)

    UNITTEST = '''
        import unittest
        class T(unittest.TestCase):
            def test_a(self):
                pass
            def test_b(self):
                requires.skip_or_fail(self, "no gRPC")
        sys.exit(requires.exit_status(unittest.main(argv=["t"], exit=False).result))
    '''

    def test_skip_inside_unittest_is_exit_77_outside_ci(self):
        code, err = script(self.UNITTEST)
        self.assertEqual(code, 77, err)
        self.assertIn("SKIPPED", err)
        self.assertIn("no gRPC", err)

    def test_skip_inside_unittest_fails_under_ci(self):
        code, err = script(self.UNITTEST, "true")
        self.assertEqual(code, 1, err)
        self.assertIn("no gRPC; CI=true", err)

    def test_all_passing_unittest_exits_zero(self):
        code, err = script(self.UNITTEST.replace('requires.skip_or_fail(self, "no gRPC")',
                                                 "pass"), "true")
        self.assertEqual(code, 0, err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
