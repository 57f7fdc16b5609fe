#!/usr/bin/env python3
"""Tests tools/check_deps.py: the real tree passes, and each kind of bad arrow is caught."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_deps.py")


def run(root):
    return subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)


class CheckDepsTest(unittest.TestCase):
    def make_tree(self, files):
        root = tempfile.mkdtemp()
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        return root

    def test_repository_has_no_violations(self):
        result = run(os.path.dirname(HERE))
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("0 violations", result.stdout)

    def test_allowed_arrows_pass(self):
        root = self.make_tree({
            "engine/model/a.cc": '#include "engine/base/status.h"\n#include "engine/kv/kv.h"\n'
                                 '#include "kernels/ref/bf16.h"\n#include "absl/status/status.h"\n',
            "engine/engine.cc": '#include "engine/model/model.h"\n',
            "server/main.cc": '#include "engine/engine.h"\n#include "engine/base/log.h"\n',
        })
        self.assertEqual(run(root).returncode, 0, run(root).stdout)

    def test_each_forbidden_arrow_is_reported(self):
        cases = {
            "kernels/ref/a.cc": '#include "engine/base/status.h"\n',   # kernels -> engine
            "engine/base/a.cc": '#include "engine/model/model.h"\n',    # upward in engine/
            "engine/kv/a.cc": '#include "engine/model/model.h"\n',      # cycle model <-> kv
            "engine/tokenizer/a.cc": '#include "engine/kv/kv.h"\n',     # tokenizer -> kv
            "server/a.cc": '#include "engine/model/model.h"\n',         # server past engine.h
            "engine/model/a.cc": '#include "server/flags.h"\n',         # engine -> server
        }
        for path, text in cases.items():
            with self.subTest(path=path):
                result = run(self.make_tree({path: text}))
                self.assertEqual(result.returncode, 1, result.stdout)
                self.assertIn(path, result.stdout)

    def test_unknown_folder_is_reported(self):
        result = run(self.make_tree({"engine/../misc/a.cc": "", "tools/x/y.cc": "",
                                     "proto/z/w.h": '#include "engine/engine.h"\n'}))
        self.assertEqual(result.returncode, 1)
        self.assertIn("proto/z/w.h", result.stdout)


if __name__ == "__main__":
    unittest.main()
