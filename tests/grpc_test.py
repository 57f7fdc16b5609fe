#!/usr/bin/env python3
"""End-to-end tests of the gRPC API (proto/specd.proto) against the real daemon.

Starts `specd serve` on free loopback ports with the bundled codepair model and talks to it
with Debian's python3-grpcio: stubs generated from specd.proto at test time (protoc +
grpc_python_plugin); grpc.health.v1 and server reflection called as generic methods with
message classes built from descriptors (grpc_client.py; Debian ships no Python stubs for
them). SpeculationTest serves with the codepair draft loaded: SpeculationOptions give the
same ids and logprobs as without, and the last message carries speculation_stats.
Usage:
  grpc_test.py SPECD_BINARY SOURCE_DIR PROTOC GRPC_PYTHON_PLUGIN [unittest args]
"""
import json
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import grpc_client  # noqa: E402
from grpc_client import HEALTH, REFLECTION, SERVING

SPECD, SOURCE, PROTOC, PLUGIN = sys.argv[1:5]
del sys.argv[1:5]
MODEL = f"{SOURCE}/models/codepair/target"
LONG = 4000  # tokens: a stream that runs until it is stopped
pb, pb_grpc = grpc_client.build_stubs(SOURCE, PROTOC, PLUGIN)


def Daemon(*extra):
    return grpc_client.Daemon(SPECD, MODEL, *extra)


def cli_generate(*args):
    p = subprocess.run([SPECD, "generate", "--model", MODEL, "--threads", "2", "--json", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def own_channel(address, *options):
    """A channel on a connection of its own: another caller (channels share connections)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1),
                                                   *options])


def collect(responses):
    """Concatenated ids / text of choice 0 and the last message of each choice."""
    ids, text, finals = [], "", {}
    for r in responses:
        if r.index == 0:
            ids += list(r.token_ids)
            text += r.text
        if r.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            finals[r.index] = r
    return ids, text, finals


class GrpcTestCase(unittest.TestCase):
    daemon_args = ()

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(*cls.daemon_args)
        cls.channel = grpc.insecure_channel(cls.daemon.grpc_address)
        cls.stub = pb_grpc.SpecdStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.daemon.stop()
        assert code == 0, f"specd serve exited {code}:\n{cls.daemon.log()}"

    def health(self, service="", metadata=None):
        check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=HEALTH["HealthCheckRequest"].SerializeToString,
            response_deserializer=HEALTH["HealthCheckResponse"].FromString)
        return check(HEALTH["HealthCheckRequest"](service=service), timeout=10,
                     metadata=metadata).status

    def reflection(self, *requests):
        info = self.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=REFLECTION["ServerReflectionRequest"].SerializeToString,
            response_deserializer=REFLECTION["ServerReflectionResponse"].FromString)
        return list(info(iter(requests), timeout=10))

    def wait_idle(self, metadata=None):
        """GetServerInfo until nothing runs or waits and no KV block is used."""
        info = None
        for _ in range(500):
            info = self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10,
                                           metadata=metadata)
            if (info.num_running_requests, info.num_waiting_requests, info.kv_blocks_used) == \
                    (0, 0, 0):
                return info
            time.sleep(0.02)
        self.fail(f"server did not go idle: {info}")

    def assert_rpc_error(self, code, fn, *args, contains=None, **kwargs):
        with self.assertRaises(grpc.RpcError) as ctx:
            r = fn(*args, **kwargs)
            if not hasattr(r, "SerializeToString"):
                list(r)  # a stream: errors surface while reading
        self.assertEqual(ctx.exception.code(), code, ctx.exception.details())
        if contains:
            self.assertIn(contains, ctx.exception.details())
        return ctx.exception


class GenerateTest(GrpcTestCase):
    def test_greedy_stream_equals_cli_generate(self):
        for prompt in ["def main(", "import os\nimport sys\n", "# Compute the sum"]:
            want = cli_generate("--prompt", prompt, "--max-tokens", "40")
            responses = list(self.stub.Generate(
                pb.GenerateRequest(text=prompt, max_tokens=40, temperature=0), timeout=120))
            ids, text, finals = collect(responses)
            self.assertEqual(ids, want["ids"], prompt)
            self.assertEqual(text, want["text"], prompt)
            final = finals[0]
            self.assertEqual(pb.FinishReason.Name(final.finish_reason),
                             "FINISH_REASON_" + want["finish_reason"].upper())
            self.assertEqual(final.usage.prompt_tokens, len(want["prompt_ids"]))
            self.assertEqual(final.usage.completion_tokens, len(want["ids"]))
            self.assertIs(final, responses[-1])
            self.assertEqual(final.speculation_stats.num_drafts, 0)

    def test_token_id_prompt_stop_string_and_seeded_sampling_equal_cli(self):
        want = cli_generate("--prompt", "import os\n", "--max-tokens", "30", "--stop", "\n")
        r = pb.GenerateRequest(token_ids=pb.TokenIds(ids=want["prompt_ids"]), max_tokens=30,
                               temperature=0, stop=["\n"])
        ids, text, finals = collect(self.stub.Generate(r, timeout=120))
        self.assertEqual(text, want["text"])
        self.assertEqual(ids, want["ids"])
        self.assertEqual(finals[0].finish_reason, pb.FINISH_REASON_STOP
                         if want["finish_reason"] == "stop" else pb.FINISH_REASON_LENGTH)

        args = dict(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1,
                    presence_penalty=0.3, seed=11, max_tokens=24, ignore_eos=True)
        want = cli_generate("--prompt", "class Foo", "--temperature", "0.9", "--top-k", "40",
                            "--top-p", "0.95", "--repetition-penalty", "1.1",
                            "--presence-penalty", "0.3", "--seed", "11", "--max-tokens", "24",
                            "--ignore-eos")
        ids, text, _ = collect(self.stub.Generate(pb.GenerateRequest(text="class Foo", **args),
                                                  timeout=120))
        self.assertEqual(ids, want["ids"])
        self.assertEqual(text, want["text"])

    def test_logprobs_and_choices(self):
        r = pb.GenerateRequest(text="def f(x):", max_tokens=5, n=3, seed=1, logprobs=3,
                               ignore_eos=True)
        per_choice = {}
        finals = {}
        for m in self.stub.Generate(r, timeout=120):
            per_choice.setdefault(m.index, []).extend(m.token_ids)
            self.assertEqual(len(m.logprobs), len(m.token_ids))
            for tok, lp in zip(m.token_ids, m.logprobs):
                self.assertEqual(lp.sampled.token_id, tok)
                self.assertLessEqual(lp.sampled.logprob, 0.0)
                self.assertEqual(len(lp.top), 3)
                self.assertGreaterEqual(lp.top[0].logprob, lp.top[2].logprob)
            if m.finish_reason:
                finals[m.index] = m
        self.assertEqual(sorted(per_choice), [0, 1, 2])
        self.assertTrue(all(len(v) == 5 for v in per_choice.values()))
        self.assertEqual(sorted(finals), [0, 1, 2])
        self.assertTrue(all(f.usage.completion_tokens == 5 for f in finals.values()))

    def test_concurrent_streams_equal_streams_run_alone(self):
        prompts = [f"def func_{i}(a, b):" for i in range(8)]
        alone = {}
        for p in prompts:
            alone[p] = collect(self.stub.Generate(
                pb.GenerateRequest(text=p, max_tokens=32, temperature=0, ignore_eos=True),
                timeout=120))[:2]

        def run(p):
            return p, collect(self.stub.Generate(
                pb.GenerateRequest(text=p, max_tokens=32, temperature=0, ignore_eos=True),
                timeout=120))[:2]

        with futures.ThreadPoolExecutor(8) as pool:
            together = dict(pool.map(run, prompts * 2))
        for p in prompts:
            self.assertEqual(together[p], alone[p], p)
        self.wait_idle()

    def test_bad_requests_are_invalid_argument_with_a_clear_message(self):
        cases = [
            (pb.GenerateRequest(), "prompt is required"),
            (pb.GenerateRequest(text=""), "prompt text is empty"),
            (pb.GenerateRequest(token_ids=pb.TokenIds()), "token_ids is empty"),
            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[99999])), "vocabulary"),
            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[-1])), "vocabulary"),
            (pb.GenerateRequest(text="x", max_tokens=0), "max_tokens"),
            (pb.GenerateRequest(text="x", max_tokens=10**9), "context limit"),
            (pb.GenerateRequest(text="x", temperature=-1), "temperature"),
            (pb.GenerateRequest(text="x", temperature=float("nan")), "temperature"),
            (pb.GenerateRequest(text="x", top_p=1.5), "top_p"),
            (pb.GenerateRequest(text="x", top_k=-5), "top_k"),
            (pb.GenerateRequest(text="x", min_p=2), "min_p"),
            (pb.GenerateRequest(text="x", repetition_penalty=0), "repetition_penalty"),
            (pb.GenerateRequest(text="x", frequency_penalty=3), "frequency_penalty"),
            (pb.GenerateRequest(text="x", presence_penalty=float("inf")), "presence_penalty"),
            (pb.GenerateRequest(text="x", min_tokens=50, max_tokens=10), "min_tokens"),
            (pb.GenerateRequest(text="x", logprobs=21), "logprobs"),
            (pb.GenerateRequest(text="x", logprobs=-3), "logprobs"),
            # Caps shared with HTTP (engine/sample/sampling_params.h): 64 strings, 1024 bytes.
            (pb.GenerateRequest(text="x", stop=["s"] * 65), "stop"),
            (pb.GenerateRequest(text="x", stop=["s" * 1025]), "stop"),
            (pb.GenerateRequest(text="x", n=0), "n must be"),
            (pb.GenerateRequest(text="x", n=1000), "n must be"),
            (pb.GenerateRequest(text="x", stop=[""]), "stop"),
            (pb.GenerateRequest(text="x", stop_token_ids=[1 << 20]), "stop_token_ids"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(method="warp")),
             "speculation.method"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                num_speculative_tokens=-1)), "num_speculative_tokens"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                num_speculative_tokens=65)), "num_speculative_tokens"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(method="ssd")),
             "needs a speculator"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(method="ssv")),
             "not a way to draft"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                method="ngram", ssv=pb.SsvOptions(group_size=4))), "NSA"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                ssv=pb.SsvOptions(mode="approximate"))), "speculation.ssv.mode"),
            # This server has no draft model and no EAGLE-3 head.
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                method="draft_model")), "draft model"),
            (pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                method="eagle3")), "EAGLE-3 head"),
            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 9000)), "context limit"),
        ]
        for req, message in cases:
            self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.stub.Generate, req,
                                  timeout=30, contains=message)
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.stub.Generate,
                              pb.GenerateRequest(text="x", model="gpt-4"), timeout=30,
                              contains="gpt-4")
        self.assert_rpc_error(grpc.StatusCode.UNIMPLEMENTED, self.stub.Generate,
                              pb.GenerateRequest(text="x", skip_special_tokens=False), timeout=30)
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.stub.Detokenize,
                              pb.DetokenizeRequest(token_ids=[1 << 30]), timeout=30)
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.stub.Abort,
                              pb.AbortRequest(), timeout=30)
        # Bytes that are no GenerateRequest, and a prompt text that is not UTF-8 (field 1).
        raw = self.channel.unary_stream("/specd.v1.Specd/Generate")
        for junk in (b"\xff\xff\xff", b"\x0a\x02\xff\xfe"):
            self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, raw, junk, timeout=30,
                                  contains="not a valid specd.v1.GenerateRequest")
        raw_tokenize = self.channel.unary_unary("/specd.v1.Specd/Tokenize")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, raw_tokenize, b"\x0a\x01\x80",
                              timeout=30, contains="not a valid specd.v1.TokenizeRequest")
        # Still serving.
        ids, _, _ = collect(self.stub.Generate(pb.GenerateRequest(text="x", max_tokens=2),
                                               timeout=60))
        self.assertEqual(len(ids), 2)
        self.wait_idle()


class SpeculationTest(GrpcTestCase):
    """The draft model and an EAGLE-3 head loaded, speculation only when a request asks (issues
    5, 33)."""
    daemon_args = ("--speculative-config",
                   json.dumps({"model": f"{SOURCE}/models/codepair/draft",
                               "eagle3_model": f"{SOURCE}/models/codepair/eagle3",
                               "method": "none"}))

    def generate(self, prompt, n=1, **speculation):
        r = pb.GenerateRequest(text=prompt, max_tokens=40, temperature=0, n=n, logprobs=2)
        if speculation:
            r.speculation.CopyFrom(pb.SpeculationOptions(**speculation))
        per_choice, finals = {}, {}
        for m in self.stub.Generate(r, timeout=120):
            ids, lps = per_choice.setdefault(m.index, ([], []))
            ids += list(m.token_ids)
            lps += [(lp.sampled.logprob, [t.token_id for t in lp.top]) for lp in m.logprobs]
            if m.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                finals[m.index] = m
        return per_choice, finals

    def test_speculation_options_give_the_same_ids_and_report_stats(self):
        prompts = ["def main(", "import os\nimport sys\n", "class Foo:\n    def __init__("]
        options = [dict(method="draft_model", num_speculative_tokens=4),
                   dict(method="draft", num_speculative_tokens=7),
                   dict(method="ngram"), dict(method="auto"),
                   dict(method="eagle3", num_speculative_tokens=4)]
        accepted = 0
        for prompt in prompts:
            want, want_finals = self.generate(prompt, n=2)
            self.assertEqual(want_finals[0].speculation_stats.num_drafts, 0)
            for opts in options:
                got, finals = self.generate(prompt, n=2, **opts)
                what = f"{prompt!r} {opts}"
                self.assertEqual(sorted(got), [0, 1], what)
                for i in (0, 1):
                    self.assertEqual(got[i][0], want[i][0], what)
                    for (lp, top), (want_lp, want_top) in zip(got[i][1], want[i][1]):
                        self.assertEqual(top, want_top, what)
                        self.assertAlmostEqual(lp, want_lp, delta=1e-4, msg=what)
                    self.assertEqual(finals[i].finish_reason, want_finals[i].finish_reason)
                    s = finals[i].speculation_stats
                    self.assertLessEqual(s.num_accepted_tokens, s.num_draft_tokens, what)
                    self.assertLessEqual(s.num_drafts, finals[i].usage.completion_tokens, what)
                    if s.num_drafts:
                        self.assertAlmostEqual(s.mean_accepted_length,
                                               1 + s.num_accepted_tokens / s.num_drafts)
                    # n-gram may find no match; auto may decide plain (the strategy policy).
                    if opts["method"] not in ("ngram", "auto"):
                        self.assertGreater(s.num_drafts, 0, what)
                        self.assertGreater(s.num_draft_tokens, 0, what)
                    self.assertEqual(sum(m.num_drafts for m in s.by_method), s.num_drafts, what)
                    accepted += s.num_accepted_tokens
        self.assertGreater(accepted, 0)
        self.wait_idle()

    def test_bad_speculation_options_are_invalid_argument(self):
        for opts, message in [(dict(method="vegas", sparsity_ratio=0), "sparsity_ratio"),
                              (dict(method="ssv"), "not a way to draft"),
                              (dict(method="warp"), "speculation.method"),
                              (dict(method="ngram", num_speculative_tokens=100),
                               "num_speculative_tokens"),
                              (dict(method="auto", policy=pb.SpeculationPolicy(max_k=65)),
                               "speculation.policy.max_k"),
                              (dict(method="ngram", policy=pb.SpeculationPolicy(forbid=["ngram"])),
                               "forbid")]:
            self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.stub.Generate,
                                  pb.GenerateRequest(text="x", speculation=pb.SpeculationOptions(
                                      **opts)), timeout=30, contains=message)
        _, finals = self.generate("x", method="none")
        self.assertEqual(finals[0].speculation_stats.num_drafts, 0)


class StopTheWorkTest(GrpcTestCase):
    def long_request(self, **kw):
        return pb.GenerateRequest(text="def main(", max_tokens=LONG, ignore_eos=True,
                                  temperature=0, **kw)

    def test_client_cancel_mid_stream_frees_the_engine(self):
        call = self.stub.Generate(self.long_request(), timeout=120)
        got = 0
        for m in call:
            got += len(m.token_ids)
            if got >= 3:
                break
        call.cancel()
        self.assertEqual(call.code(), grpc.StatusCode.CANCELLED)
        self.wait_idle()

    def test_short_deadline_stops_the_work(self):
        self.assert_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, self.stub.Generate,
                              self.long_request(), timeout=0.4)
        self.wait_idle()

    def test_abort_by_request_id(self):
        call = self.stub.Generate(self.long_request(request_id="job-42"), timeout=120)
        first = next(call)
        self.assertEqual(first.request_id, "job-42")
        self.assert_rpc_error(grpc.StatusCode.ALREADY_EXISTS, self.stub.Generate,
                              self.long_request(request_id="job-42"), timeout=30)
        self.assertTrue(self.stub.Abort(pb.AbortRequest(request_id="job-42"), timeout=10).found)
        with self.assertRaises(grpc.RpcError) as ctx:
            for _ in call:
                pass
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.CANCELLED)
        self.assertIn("job-42", ctx.exception.details())
        self.wait_idle()
        self.assertFalse(self.stub.Abort(pb.AbortRequest(request_id="job-42"), timeout=10).found)

    def assert_aborted(self, call, request_id):
        with self.assertRaises(grpc.RpcError) as ctx:
            for _ in call:
                pass
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.CANCELLED)
        self.assertIn(request_id, ctx.exception.details())

    def test_callers_abort_and_name_only_their_own_requests(self):
        with own_channel(self.daemon.grpc_address) as other:
            bob = pb_grpc.SpecdStub(other)
            call = self.stub.Generate(self.long_request(request_id="job-7"), timeout=120)
            next(call)
            # Bob neither sees nor aborts this caller's job-7, and may name his own job-7.
            self.assertFalse(bob.Abort(pb.AbortRequest(request_id="job-7"), timeout=10).found)
            bob_call = bob.Generate(self.long_request(request_id="job-7"), timeout=120)
            self.assertEqual(next(bob_call).request_id, "job-7")
            self.assertTrue(bob.Abort(pb.AbortRequest(request_id="job-7"), timeout=10).found)
            self.assert_aborted(bob_call, "job-7")
            self.assertTrue(self.stub.Abort(pb.AbortRequest(request_id="job-7"), timeout=10).found)
            self.assert_aborted(call, "job-7")
            # Server-assigned ids: 128 random bits, and just as private.
            calls = [self.stub.Generate(self.long_request(), timeout=120) for _ in range(2)]
            ids = [next(c).request_id for c in calls]
            for request_id in ids:
                self.assertRegex(request_id, r"^grpc-[0-9a-f]{32}$")
                self.assertFalse(bob.Abort(pb.AbortRequest(request_id=request_id),
                                           timeout=10).found)
            self.assertNotEqual(ids[0], ids[1])
            for c, request_id in zip(calls, ids):
                self.assertTrue(self.stub.Abort(pb.AbortRequest(request_id=request_id),
                                                timeout=10).found)
                self.assert_aborted(c, request_id)
        self.wait_idle()


class BackpressureTest(GrpcTestCase):
    """A client that stops reading (issue 15): its stream is paused in the engine instead of
    buffered, then aborted (KV freed) after --write-timeout without a completed write."""
    daemon_args = ("--write-timeout", "3")

    def test_a_stream_nobody_reads_is_paused_then_aborted(self):
        warm = pb.GenerateRequest(text="def main(", max_tokens=300, ignore_eos=True, n=16,
                                  logprobs=20)
        self.assertEqual(len(collect(self.stub.Generate(warm, timeout=300))[2]), 16)
        self.wait_idle()
        before, rss_before = self.daemon.metrics(), self.daemon.rss_bytes()
        aborts = 'specd_requests_total{outcome="abort"}'
        request = pb.GenerateRequest(text="def main(", max_tokens=LONG, ignore_eos=True,
                                     temperature=0, n=16, logprobs=20)
        with own_channel(self.daemon.grpc_address, ("grpc.http2.bdp_probe", 0)) as channel:
            call = pb_grpc.SpecdStub(channel).Generate(request, timeout=600)  # never read
            peak, paused, m = rss_before, False, before
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and m[aborts] - before[aborts] < 16:
                time.sleep(0.1)
                peak = max(peak, self.daemon.rss_bytes())
                m = self.daemon.metrics()
                paused = paused or m["specd_num_requests_paused"] > 0
            generated = m["specd_generation_tokens_total"] - before["specd_generation_tokens_total"]
            growth = (peak - rss_before) / 2**20
            print(f"\nnever-read n=16 logprobs=20 stream: RSS +{growth:.1f} MiB, "
                  f"{generated:.0f} tokens generated before the abort", file=sys.stderr)
            self.assertTrue(paused)
            self.assertEqual(m[aborts] - before[aborts], 16)
            self.assertLess(generated, 16 * LONG / 4)
            self.assertLess(growth, 64)
            call.cancel()
        self.wait_idle()


class InfoTest(GrpcTestCase):
    daemon_args = ("--served-model-name", "codepair-test")

    def test_tokenize_detokenize_round_trip(self):
        text = "for i in range(10):\n    print(i)  # ünïcode ✓"
        t = self.stub.Tokenize(pb.TokenizeRequest(text=text), timeout=10)
        want = cli_generate("--prompt", text, "--max-tokens", "1")["prompt_ids"]
        self.assertEqual(list(t.token_ids), want)
        self.assertEqual(t.count, len(want))
        self.assertGreater(t.max_model_len, 0)
        no_bos = self.stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=False),
                                    timeout=10)
        self.assertEqual(list(no_bos.token_ids), want[1:])
        d = self.stub.Detokenize(pb.DetokenizeRequest(token_ids=t.token_ids), timeout=10)
        self.assertEqual(d.text, text)
        raw = self.stub.Detokenize(pb.DetokenizeRequest(token_ids=t.token_ids,
                                                        skip_special_tokens=False), timeout=10)
        self.assertTrue(raw.text.endswith(text))
        self.assertNotEqual(raw.text, text)  # the BOS is spelled out

    def test_model_and_server_info(self):
        m = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        with open(f"{MODEL}/config.json") as f:
            config = json.load(f)
        self.assertEqual(m.served_model_name, "codepair-test")
        self.assertEqual(m.architecture, config["architectures"][0])
        self.assertEqual(m.vocab_size, config["vocab_size"])
        self.assertEqual(m.max_model_len, config["max_position_embeddings"])
        self.assertEqual(m.bos_token_id, config["bos_token_id"])
        self.assertIn(config["eos_token_id"], list(m.eos_token_ids))
        self.assertTrue(m.has_tokenizer)
        ids, _, _ = collect(self.stub.Generate(
            pb.GenerateRequest(text="x", max_tokens=2, model="codepair-test"), timeout=60))
        self.assertEqual(len(ids), 2)

        s = self.wait_idle()
        self.assertTrue(s.version)
        self.assertGreater(s.uptime_seconds, 0)
        self.assertGreater(s.kv_blocks_total, 0)
        self.assertFalse(s.draining)

    def test_health_is_serving(self):
        self.assertEqual(self.health(""), SERVING)
        self.assertEqual(self.health("specd.v1.Specd"), SERVING)
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.health, "no.such.Service")

    def test_reflection_lists_and_describes_the_service(self):
        Req = REFLECTION["ServerReflectionRequest"]
        listed, described = self.reflection(Req(list_services=""),
                                            Req(file_containing_symbol="specd.v1.Specd"))
        names = [s.name for s in listed.list_services_response.service]
        self.assertIn("specd.v1.Specd", names)
        self.assertIn("grpc.health.v1.Health", names)
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in described.file_descriptor_response.file_descriptor_proto]
        specd = next(f for f in files if f.package == "specd.v1")
        methods = {m.name for s in specd.service for m in s.method}
        self.assertEqual(methods, {"Generate", "Abort", "Tokenize", "Detokenize",
                                   "GetModelInfo", "GetServerInfo"})


class AuthTest(GrpcTestCase):
    daemon_args = ("--api-key", "s3cret-key")
    GOOD = (("authorization", "Bearer s3cret-key"),)

    def test_missing_or_wrong_key_is_unauthenticated(self):
        for metadata in (None, (("authorization", "Bearer nope"),),
                         (("authorization", "s3cret-key"),),
                         (("authorization", "Bearer s3cret-key-and-more"),)):
            self.assert_rpc_error(grpc.StatusCode.UNAUTHENTICATED, self.stub.GetServerInfo,
                                  pb.GetServerInfoRequest(), timeout=10, metadata=metadata)
            self.assert_rpc_error(grpc.StatusCode.UNAUTHENTICATED, self.stub.Generate,
                                  pb.GenerateRequest(text="x"), timeout=10, metadata=metadata,
                                  contains="API key")
            self.assert_rpc_error(grpc.StatusCode.UNAUTHENTICATED, self.stub.Tokenize,
                                  pb.TokenizeRequest(text="x"), timeout=10, metadata=metadata)

    def test_http_and_grpc_parse_authorization_alike(self):
        accepted = {"Bearer s3cret-key", "bearer   s3cret-key", "BEARER s3cret-key  ",
                    "  Bearer s3cret-key"}
        refused = {"Bearer s3cret-key-and-more", "Bearer nope", "Basic s3cret-key",
                   "Bearers3cret-key", "s3cret-key", "Bearer", "Bearer   ", ""}
        for value in sorted(accepted | refused):
            request = urllib.request.Request(f"http://{self.daemon.http_address}/v1/models",
                                             headers={"Authorization": value})
            try:
                with urllib.request.urlopen(request, timeout=30):
                    http_error = None
            except urllib.error.HTTPError as e:
                self.assertEqual(e.code, 401, value)
                http_error = json.load(e)["error"]["message"]
            try:
                self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10,
                                        metadata=(("authorization", value),))
                grpc_error = None
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED, value)
                grpc_error = e.details()
            self.assertEqual(http_error, grpc_error, repr(value))
            self.assertEqual(http_error is None, value in accepted, repr(value))

    def test_right_key_is_served_and_health_and_reflection_need_none(self):
        ids, _, finals = collect(self.stub.Generate(
            pb.GenerateRequest(text="def ", max_tokens=3), timeout=60, metadata=self.GOOD))
        self.assertEqual(len(ids), 3)
        self.assertEqual(finals[0].usage.completion_tokens, 3)
        self.wait_idle(metadata=self.GOOD)
        self.assertEqual(self.health(""), SERVING)
        self.assertEqual(self.health("specd.v1.Specd"), SERVING)
        # Reflection is gRPC's own service and, like health, needs no key.
        (listed,) = self.reflection(REFLECTION["ServerReflectionRequest"](list_services=""))
        self.assertIn("specd.v1.Specd", [s.name for s in listed.list_services_response.service])


class TlsTest(unittest.TestCase):
    def test_tls_serves_and_plaintext_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = f"{tmp}/cert.pem", f"{tmp}/key.pem"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                           check=True, capture_output=True)
            daemon = Daemon("--ssl-certfile", cert, "--ssl-keyfile", key)
            try:
                with open(cert, "rb") as f:
                    creds = grpc.ssl_channel_credentials(root_certificates=f.read())
                with grpc.secure_channel(daemon.grpc_address, creds) as channel:
                    stub = pb_grpc.SpecdStub(channel)
                    ids, _, _ = collect(stub.Generate(pb.GenerateRequest(text="x", max_tokens=2),
                                                      timeout=60))
                    self.assertEqual(len(ids), 2)
                with grpc.insecure_channel(daemon.grpc_address) as channel:
                    with self.assertRaises(grpc.RpcError) as ctx:
                        pb_grpc.SpecdStub(channel).GetServerInfo(pb.GetServerInfoRequest(),
                                                                 timeout=5)
                    self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)
            finally:
                self.assertEqual(daemon.stop(), 0, daemon.log())


class DrainTest(unittest.TestCase):
    def test_sigterm_lets_streams_finish_and_refuses_new_ones(self):
        daemon = Daemon("--drain-timeout", "600")  # the stream must finish even on a busy CI
        try:
            with grpc.insecure_channel(daemon.grpc_address) as channel:
                stub = pb_grpc.SpecdStub(channel)
                # A client that keeps an idle connection open does not hold up the exit.
                stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
                want = 200
                call = stub.Generate(pb.GenerateRequest(text="def main(", max_tokens=want,
                                                        ignore_eos=True, temperature=0),
                                     timeout=300)
                got = len(next(call).token_ids)
                daemon.terminate()
                time.sleep(0.3)
                with self.assertRaises(grpc.RpcError) as ctx:
                    list(stub.Generate(pb.GenerateRequest(text="x", max_tokens=2), timeout=30))
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)
                final = None
                for m in call:
                    got += len(m.token_ids)
                    final = m
                self.assertEqual(got, want)
                self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
                start = time.monotonic()
                self.assertEqual(daemon.stop(), 0, daemon.log())
                self.assertLess(time.monotonic() - start, 3.0)
        finally:
            self.assertEqual(daemon.stop(), 0, daemon.log())


if __name__ == "__main__":
    import requires  # tests/requires.py: a missing tool skips (exit 77), under CI=true fails

    requires.programs("grpc_test", "openssl")  # the TLS test's certificate
    unittest.main(verbosity=2)
