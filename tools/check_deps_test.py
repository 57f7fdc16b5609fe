#!/usr/bin/env python3
"""Tests tools/check_deps.py: the real tree passes, and each kind of bad arrow is caught."""
import os
import shutil
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
        cases = [
            ("kernels/ref/a.cc", "engine/base/status.h"),         # kernels -> engine
            ("kernels/ref/a.cc", "kernels/cuda/gemm.h"),          # reference -> CUDA
            ("engine/base/a.cc", "engine/model/model.h"),         # upward in engine/
            ("engine/kv/a.cc", "engine/model/model.h"),           # cycle model <-> kv
            ("engine/tokenizer/a.cc", "engine/kv/kv.h"),          # tokenizer -> kv
            ("engine/distributed/a.cc", "engine/kv/kv.h"),               # dist knows base alone
            ("engine/sched/a.cc", "engine/runner/model_runner.h"),  # scheduler -> runner
            ("engine/sched/a.cc", "engine/model/model.h"),        # scheduler -> model
            ("engine/sched/a.cc", "engine/sample/sampler.h"),     # scheduler -> sample
            ("engine/sched/a.cc", "kernels/ref/bf16.h"),          # only some modules: kernels
            ("engine/kv/a.cc", "kernels/cuda/attention.h"),
            ("engine/tokenizer/a.cc", "kernels/ref/bf16.h"),
            ("engine/sample/a.cc", "kernels/ref/sampling.h"),
            ("engine/model/a.cc", "kernels/cuda/gemm.h"),         # CUDA kernels: runner only
            ("engine/engine.cc", "kernels/ref/bf16.h"),           # the facade: no kernels
            ("engine/engine.cc", "proto/specd.pb.h"),             # engine: config schema only
            ("server/a.cc", "engine/model/model.h"),              # server past engine.h
            ("server/http/a.cc", "engine/tokenizer/utf8.h"),      # only the Tokenizer type
            ("server/a.cc", "kernels/ref/bf16.h"),
            ("engine/model/a.cc", "server/flags.h"),              # engine -> server
            ("engine/model/a_test.cc", "server/flags.h"),         # tests keep their module's
            ("engine/base/cuda/a.cc", "engine/runner/model_runner.h"),  # base/cuda -> runner
            ("engine/base/cuda/a.cc", "kernels/cuda/gemm.h"),
            ("engine/runner/a.cc", "kernels/cuda/gemm.h"),        # CUDA kernels: runner/cuda
            ("engine/runner/a.cc", "engine/runner/cuda/cuda_forward.h"),  # cuda_runner.h alone
            ("engine/model/a.cc", "engine/base/cuda/cuda_util.h"),  # CUDA helpers: CUDA code
            ("engine/sched/a.cc", "engine/base/cuda/cuda_util.h"),
            ("engine/speculation/a.cc", "engine/runner/cuda/cuda_runner.h"),  # behind runner/
            ("engine/engine.cc", "engine/runner/cuda/cuda_runner.h"),
            ("engine/distributed/a.cc", "engine/runner/cuda/cuda_forward.h"),
            ("engine/speculation/a.cc", "engine/speculation/ssd/ssd_worker.h"),  # cycle with ssd/
            ("engine/speculation/saguaro/a.cc", "engine/speculation/draft_model.h"),  # pure math
            ("engine/speculation/saguaro/a.cc", "engine/runner/model_runner.h"),
            ("engine/runner/a.cc", "engine/speculation/saguaro/saguaro.h"),
            ("engine/engine.cc", "engine/testing/engine_test_util.h"),  # fixtures: tests only
            ("engine/speculation/ssd/a.cc", "engine/testing/engine_spec_test_util.h"),
            ("engine/kv/a_test.cc", "engine/testing/engine_test_util.h"),  # below the facade
            ("tools/bench/a.cc", "engine/testing/engine_spec_test_util.h"),
        ]
        for path, inc in cases:
            with self.subTest(path=path, include=inc):
                result = run(self.make_tree({path: f'#include "{inc}"\n'}))
                self.assertEqual(result.returncode, 1, result.stdout)
                self.assertIn(f'{path}: includes "{inc}"', result.stdout)

    def test_allowed_by_name_and_by_module(self):
        root = self.make_tree({
            "engine/runner/cuda/a.cc": '#include "kernels/cuda/gemm.h"\n#include "engine/model/m.h"\n'
                                       '#include "engine/runner/model_runner.h"\n'
                                       '#include "engine/base/cuda/cuda_util.h"\n',
            "engine/runner/a.cc": '#include "engine/runner/cuda/cuda_runner.h"\n',
            "engine/distributed/a.cc": '#include "engine/base/cuda/cuda_util.h"\n',
            "engine/speculation/b.cc": '#include "engine/speculation/saguaro/saguaro.h"\n',
            "engine/speculation/saguaro/a_test.cc": '#include "engine/sample/acceptance.h"\n',
            "engine/speculation/ssd/a.cc": '#include "engine/speculation/draft_model.h"\n'
                                           '#include "engine/speculation/saguaro/saguaro.h"\n'
                                           '#include "engine/distributed/channel.h"\n',
            "engine/engine_ssd.cc": '#include "engine/speculation/ssd/ssd_worker.h"\n',
            "engine/engine_test.cc": '#include "engine/testing/engine_test_util.h"\n',
            "engine/testing/a_test_util.h": '#include "engine/engine.h"\n'
                                            '#include "engine/runner/model_runner.h"\n',
            "tests/a.cc": '#include "engine/testing/engine_spec_test_util.h"\n'
                          '#include "engine/runner/cuda/cuda_runner.h"\n',
            "tools/bench/a_test.cc": '#include "engine/testing/engine_spec_test_util.h"\n',
            "engine/speculation/a.cc": '#include "kernels/ref/sampling.h"\n#include "engine/distributed/w.h"\n',
            "engine/sched/a.cc": '#include "engine/kv/block_manager.h"\n',
            "engine/engine.cc": '#include "engine/sched/scheduler.h"\n#include "proto/config.pb.h"\n',
            "engine/tokenizer/jinja/a.cc": '#include "engine/tokenizer/utf8.h"\n',
            "engine/tokenizer/b.cc": '#include "engine/tokenizer/jinja/value.h"\n',
            "server/http/a.cc": '#include "engine/tokenizer/jinja/chat_template.h"\n'
                                '#include "proto/specd.pb.h"\n#include "server/grpc/x.h"\n',
            "engine/kv/a_test.cc": '#include "kernels/check/op_table.h"\n',
            "tests/fuzz/a.cc": '#include "server/http/openai_api.h"\n',
        })
        result = run(root)
        self.assertEqual(result.returncode, 0, result.stdout)

    def copy_of_the_tree(self):
        src = os.path.dirname(HERE)
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        for top in ("engine", "kernels", "server", "proto", "tools", "tests"):
            if os.path.isdir(os.path.join(src, top)):
                shutil.copytree(os.path.join(src, top), os.path.join(root, top),
                                ignore=shutil.ignore_patterns("__pycache__", "testdata"))
        return root

    def plant(self, root, folder, inc):
        """Appends `#include "inc"` to folder's first .cc file; returns that file's path."""
        victim = sorted(n for n in os.listdir(os.path.join(root, folder)) if n.endswith(".cc"))[0]
        with open(os.path.join(root, folder, victim), "a") as f:
            f.write(f'#include "{inc}"\n')
        return f"{folder}/{victim}"

    def test_forbidden_include_planted_in_a_copy_of_the_tree_fails(self):
        # The real tree passes; the same tree with one forbidden arrow planted in a real file
        # fails and names that file: the scheduler reaching into the runner; the CUDA helpers
        # (base/cuda) reaching up into the runner; the draft model's folder reaching into ssd/,
        # which builds on it.
        cases = [("engine/sched", "engine/runner/model_runner.h"),
                 ("engine/base/cuda", "engine/runner/model_runner.h"),
                 ("engine/speculation", "engine/speculation/ssd/ssd_worker.h")]
        for folder, inc in cases:
            with self.subTest(folder=folder, include=inc):
                root = self.copy_of_the_tree()
                self.assertEqual(run(root).returncode, 0, run(root).stdout)
                path = self.plant(root, folder, inc)
                result = run(root)
                self.assertEqual(result.returncode, 1, result.stdout)
                self.assertIn(f'{path}: includes "{inc}"', result.stdout)
                self.assertIn("1 violations", result.stdout)

    def test_unknown_folder_is_reported(self):
        result = run(self.make_tree({"engine/../misc/a.cc": "", "tools/x/y.cc": "",
                                     "proto/z/w.h": '#include "engine/engine.h"\n'}))
        self.assertEqual(result.returncode, 1)
        self.assertIn("proto/z/w.h", result.stdout)


if __name__ == "__main__":
    unittest.main()
