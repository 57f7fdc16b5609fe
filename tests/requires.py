"""What a test script does when a tool or module it needs is missing.

Outside CI a missing dependency is a visible skip: the script prints what is missing and how to
get it, and exits 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE 77 in
tests/CMakeLists.txt). Under CI=true (any value but "", "0", "false", "no") it is a failure:
CI installs everything with tools/install_deps.sh, so a missing dependency there is a broken
set-up that must not pass as green.

    import requires
    requires.programs("http_test", "curl", "promtool", "openssl")
    requires.modules("grpc_test", "grpc", "google.protobuf")

programs / modules / missing: called from a test script's main thread before its tests start.
Inside a unittest test, skip_or_fail(self, reason) does the same for one test, and the script
ends with sys.exit(requires.exit_status(unittest.main(exit=False).result)) so that a skip shows
in ctest as "Skipped", not "Passed". `python3 requires.py TEST WHAT` is the command CMake
registers in place of a test whose dependency it did not find at configure time.
"""
import importlib.util
import os
import shutil
import sys

SKIP_EXIT = 77
HINT = "tools/install_deps.sh installs it"


def in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(test, what, hint=HINT):
    """Ends the script: exit 77 (skipped) outside CI, exit 1 (failed) under CI=true."""
    message = f"{test}: {what} missing ({hint})"
    if in_ci():
        print(f"{message}; CI=true, so this FAILS", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"{message}: SKIPPED (exit {SKIP_EXIT}; under CI=true this fails)", file=sys.stderr,
          flush=True)
    sys.exit(SKIP_EXIT)


def programs(test, *names, hint=HINT):
    """Every program in names is on PATH, or missing() ends the script."""
    absent = [n for n in names if shutil.which(n) is None]
    if absent:
        missing(test, "program(s) " + ", ".join(absent), hint)


def modules(test, *names, hint=HINT):
    """Every Python module in names imports, or missing() ends the script."""
    absent = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            absent.append(name)
    if absent:
        missing(test, f"Python module(s) {', '.join(absent)} for {sys.executable}", hint)


def skip_or_fail(test_case, reason):
    """Inside a unittest test: a skip outside CI (see exit_status), a failure under CI=true."""
    if in_ci():
        test_case.fail(f"{reason}; CI=true, so this fails")
    test_case.skipTest(reason)


def exit_status(result):
    """The exit status of a script whose unittest run gave `result`: 1 if anything failed, 77
    (ctest's "Skipped") if every test passed but some were skipped, else 0."""
    if not result.wasSuccessful():
        return 1
    if result.skipped:
        for test, reason in result.skipped:
            print(f"SKIPPED {test.id()}: {reason}", file=sys.stderr)
        return SKIP_EXIT
    return 0


def main():
    """`requires.py TEST WHAT [HINT]`: reports a dependency CMake found missing at configure
    time (the test is registered anyway, so it shows up as skipped or, under CI, failed)."""
    if len(sys.argv) < 3:
        sys.exit("usage: requires.py TEST WHAT [HINT]")
    missing(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else HINT)


if __name__ == "__main__":
    main()
