#!/usr/bin/env python3
"""Speculative decoding through the OpenAI HTTP API of `specd serve` (issue 5, points 3-5).

Starts the real daemon (tests/daemon.py) with the bundled codepair target, its draft and its
EAGLE-3 head loaded (`--speculative-config '{"model": ".../draft", "eagle3_model": ".../eagle3",
"method": "none"}'`: no speculation unless a request asks) and checks:
- lossless: greedy completions with `speculation` {draft_model, K = 1, 4, 8}, {ngram}, {auto}
  and {eagle3} return exactly the text, token ids and finish reasons of the same request without
  speculation, for codepair prompts, streamed and not, with several prompts and n = 2, with
  stop strings, with logprobs (same top ids, logprobs within 1e-4), on both endpoints;
- usage.speculation (drafts, draft tokens, accepted tokens, mean accepted length) when the
  request has a `speculation` object, and no such key (OpenAI's usage) when it has none;
- bad `speculation` values: the right status (422 wrong type, 400 bad value), OpenAI error
  JSON naming the param, and the server keeps serving;
- /metrics: the specd_spec_decode_* families count the rounds and `promtool check metrics`
  passes;
- a server whose default method is ngram speculates for requests that say nothing (and
  reports it in usage), and refuses draft_model and eagle3 (neither loaded);
- an SSD server (the real `specd speculator` process it launches): greedy output equals its
  own output without speculation, usage.speculation.ssd reports cache hits, the specd_ssd_*
  families count them and pass promtool, and a bad saguaro_c is a 400.

Usage: spec_http_test.py SPECD_BINARY SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SPECD, SOURCE = sys.argv[1:3]
del sys.argv[1:3]
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Daemon, DaemonError, metric_key  # noqa: E402

DRAFT = os.path.join(SOURCE, "models", "codepair", "draft")
HEAD = os.path.join(SOURCE, "models", "codepair", "eagle3")  # an EAGLE-3 head (issue 33)
PROMPTS_FILE = os.path.join(SOURCE, "models", "codepair", "prompts.jsonl")
DAEMON = None
LOGPROB_TOLERANCE = 1e-4

# What a request may ask for; each must give the output of no speculation at all.
STRATEGIES = [
    {"method": "draft_model", "num_speculative_tokens": 4},
    {"method": "draft", "num_speculative_tokens": 1},
    {"method": "draft_model", "num_speculative_tokens": 8},
    {"method": "ngram"},
    {"method": "auto", "num_speculative_tokens": 3},
    {"method": "eagle3", "num_speculative_tokens": 4},
]


def codepair_prompts(count, max_chars=400):
    """The first `count` codepair prompts, their tails cut to max_chars (prompt + output
    must fit the context; the tail is what the continuation depends on most)."""
    with open(PROMPTS_FILE, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return [p[-max_chars:] for p in prompts[:count]]


def setUpModule():
    global DAEMON
    config = json.dumps({"model": DRAFT, "eagle3_model": HEAD, "method": "none",
                         "num_speculative_tokens": 4})
    DAEMON = Daemon(SPECD, "--grpc-port", "-1", "--threads", "2", "--served-model-name",
                    "codepair", "--speculative-config", config, source_dir=SOURCE,
                    name="spec_http_test").start()


def tearDownModule():
    if DAEMON:
        code = DAEMON.stop()
        assert code == 0, f"specd exited with {code}:\n{DAEMON.output()[-3000:]}"


def post(path, body, daemon=None):
    status, payload = (daemon or DAEMON).post_json(path, body)
    return status, payload


def completion(body, daemon=None):
    status, payload = post("/v1/completions", body, daemon)
    assert status == 200, f"{status}: {payload}"
    return payload


def streamed(path, body, daemon=None):
    """(per-choice text, per-choice logprob entries, finish reasons, usage) of an SSE stream."""
    text, logprobs, finish, usage = {}, {}, {}, None
    events = list((daemon or DAEMON).stream(path, dict(body, stream=True)))
    assert events[-1] == "[DONE]", events[-1]
    for e in events[:-1]:
        assert "error" not in e, e
        if e.get("usage"):
            usage = e["usage"]
        for c in e["choices"]:
            i = c["index"]
            delta = c.get("delta", {}).get("content") if "delta" in c else c.get("text")
            text[i] = text.get(i, "") + (delta or "")
            lp = c.get("logprobs")
            if lp:
                entries = logprobs.setdefault(i, [])
                if "content" in lp:  # chat
                    entries += [(t["token"], t["logprob"],
                                 [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
                                for t in lp["content"]]
                else:
                    entries += list(zip(lp["tokens"], lp["token_logprobs"],
                                        [list(d.items()) for d in lp["top_logprobs"]]))
            if c.get("finish_reason"):
                finish[i] = c["finish_reason"]
    return text, logprobs, finish, usage


def completion_entries(choice):
    """[(token, logprob, [(alt, logprob)])] of a non-streamed completion choice."""
    lp = choice["logprobs"]
    return list(zip(lp["tokens"], lp["token_logprobs"],
                    [list(d.items()) for d in lp["top_logprobs"]]))


class SpecTestCase(unittest.TestCase):
    def assert_same_logprobs(self, got, want, what):
        """Same tokens and top alternatives; logprob values within the tolerance."""
        self.assertEqual([t for t, _, _ in got], [t for t, _, _ in want], what)
        for k, ((_, lp, top), (_, want_lp, want_top)) in enumerate(zip(got, want)):
            self.assertAlmostEqual(lp, want_lp, delta=LOGPROB_TOLERANCE, msg=f"{what} #{k}")
            self.assertEqual([a for a, _ in top], [a for a, _ in want_top], f"{what} #{k}")
            for (_, a_lp), (_, w_lp) in zip(top, want_top):
                self.assertAlmostEqual(a_lp, w_lp, delta=LOGPROB_TOLERANCE, msg=f"{what} #{k}")

    def same_as_plain(self, body, daemon):
        """The server's default speculation gives the text of speculation none: both bodies."""
        got = completion(body, daemon)
        plain = completion(dict(body, speculation={"method": "none"}), daemon)
        for g, w in zip(got["choices"], plain["choices"]):
            self.assertEqual(g["text"], w["text"])
        return got, plain

    def assert_promtool_clean(self, daemon):
        """/metrics passes `promtool check metrics` without a word."""
        status, _, payload = daemon.request("GET", "/metrics")
        self.assertEqual(status, 200)
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool is needed (tools/install_deps.sh)")
        p = subprocess.run([promtool, "check", "metrics"], input=payload, capture_output=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual((p.stdout + p.stderr).strip(), b"", p.stdout + p.stderr)

    def assert_spec_usage(self, usage, what, speculated=True):
        s = usage["speculation"]
        keys = {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "mean_accepted_length"}
        # by_method: the same counts per method that drafted (only when some did).
        self.assertEqual(set(s), keys | {"by_method"} if s["num_drafts"] else keys, what)
        for field in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            self.assertEqual(sum(m[field] for m in s.get("by_method", {}).values()), s[field],
                             what)
        if speculated:
            self.assertGreater(s["num_drafts"], 0, what)
            self.assertGreaterEqual(s["num_draft_tokens"], s["num_drafts"], what)
        self.assertLessEqual(s["num_accepted_tokens"], s["num_draft_tokens"], what)
        self.assertLessEqual(s["num_drafts"], usage["completion_tokens"], what)
        want_mean = 1 + s["num_accepted_tokens"] / s["num_drafts"] if s["num_drafts"] else 0
        self.assertAlmostEqual(s["mean_accepted_length"], want_mean, places=9, msg=what)
        return s


class LosslessTest(SpecTestCase):
    def test_greedy_completions_equal_no_speculation(self):
        prompts = codepair_prompts(6)
        base_body = {"prompt": prompts, "max_tokens": 40, "temperature": 0, "logprobs": 3,
                     "return_tokens_as_token_ids": True}
        base = completion(base_body)
        self.assertNotIn("speculation", base["usage"])  # OpenAI's usage when not asked
        accepted = 0
        for strategy in STRATEGIES:
            got = completion(dict(base_body, speculation=strategy))
            what = json.dumps(strategy)
            self.assertEqual(len(got["choices"]), len(prompts))
            for g, w in zip(got["choices"], base["choices"]):
                self.assertEqual(g["text"], w["text"], what)
                self.assertEqual(g["finish_reason"], w["finish_reason"], what)
                self.assert_same_logprobs(completion_entries(g), completion_entries(w), what)
            self.assertEqual(got["usage"]["completion_tokens"], base["usage"]["completion_tokens"])
            s = self.assert_spec_usage(got["usage"], what)
            accepted += s["num_accepted_tokens"]
        self.assertGreater(accepted, 0)  # the draft model agrees with its target often

    def test_n_and_stop_strings_equal_no_speculation(self):
        prompts = codepair_prompts(4, 300)
        for stop in (["\n\n"], [")", ":"], ["return"]):
            body = {"prompt": prompts, "max_tokens": 48, "temperature": 0, "n": 2, "stop": stop,
                    "logprobs": 0, "return_tokens_as_token_ids": True}
            base = completion(body)
            for strategy in STRATEGIES[:1] + STRATEGIES[3:4]:
                got = completion(dict(body, speculation=strategy))
                what = f"{strategy} stop={stop}"
                self.assertEqual(len(got["choices"]), 2 * len(prompts))
                for g, w in zip(got["choices"], base["choices"]):
                    self.assertEqual(g["text"], w["text"], what)
                    self.assertEqual(g["finish_reason"], w["finish_reason"], what)
                    self.assertEqual(g["logprobs"]["tokens"], w["logprobs"]["tokens"], what)
                    for s in stop:
                        self.assertNotIn(s, g["text"], what)
                self.assert_spec_usage(got["usage"], what)

    def test_streams_equal_no_speculation(self):
        prompts = codepair_prompts(3, 300)
        body = {"prompt": prompts, "max_tokens": 32, "temperature": 0, "n": 2, "logprobs": 2,
                "return_tokens_as_token_ids": True, "stream_options": {"include_usage": True}}
        text, lps, finish, usage = streamed("/v1/completions", body)
        self.assertNotIn("speculation", usage)
        self.assertEqual(len(text), 2 * len(prompts))
        for strategy in (STRATEGIES[0], STRATEGIES[3]):
            what = json.dumps(strategy)
            g_text, g_lps, g_finish, g_usage = streamed(
                "/v1/completions", dict(body, speculation=strategy))
            self.assertEqual(g_text, text, what)
            self.assertEqual(g_finish, finish, what)
            for i in lps:
                self.assert_same_logprobs(g_lps[i], lps[i], f"{what} choice {i}")
            self.assertEqual(g_usage["completion_tokens"], usage["completion_tokens"], what)
            self.assert_spec_usage(g_usage, what)

    def test_chat_equals_no_speculation(self):
        body = {"messages": [{"role": "user", "content": "Write a function that adds two "
                              "numbers."}], "max_tokens": 40, "temperature": 0,
                "logprobs": True, "top_logprobs": 3}
        status, base = post("/v1/chat/completions", body)
        self.assertEqual(status, 200, base)
        base_entries = [(t["token"], t["logprob"],
                         [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
                        for t in base["choices"][0]["logprobs"]["content"]]
        for strategy in (STRATEGIES[0], STRATEGIES[3], STRATEGIES[4]):
            what = json.dumps(strategy)
            status, got = post("/v1/chat/completions", dict(body, speculation=strategy))
            self.assertEqual(status, 200, got)
            self.assertEqual(got["choices"][0]["message"]["content"],
                             base["choices"][0]["message"]["content"], what)
            entries = [(t["token"], t["logprob"],
                        [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
                       for t in got["choices"][0]["logprobs"]["content"]]
            self.assert_same_logprobs(entries, base_entries, what)
            self.assert_spec_usage(got["usage"], what)
            s_text, _, _, s_usage = streamed(
                "/v1/chat/completions",
                dict(body, speculation=strategy, stream_options={"include_usage": True}))
            self.assertEqual(s_text[0], base["choices"][0]["message"]["content"], what)
            self.assert_spec_usage(s_usage, what)

    def test_method_none_reports_zero_speculation(self):
        got = completion({"prompt": "def main(", "max_tokens": 8, "temperature": 0,
                          "speculation": {"method": "none"}})
        self.assertEqual(got["usage"]["speculation"],
                         {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                          "mean_accepted_length": 0})
        # The server's default (none, with a draft model loaded) applies to {} too.
        got = completion({"prompt": "def main(", "max_tokens": 8, "temperature": 0,
                          "speculation": {}})
        self.assertEqual(got["usage"]["speculation"]["num_drafts"], 0)


class BadSpeculationTest(SpecTestCase):
    def test_bad_speculation_is_refused_and_the_server_keeps_serving(self):
        cases = [
            ("x", 422, "speculation", None),
            ([], 422, "speculation", None),
            (4, 422, "speculation", None),
            ({"method": 1}, 422, "speculation.method", None),
            ({"method": ["ngram"]}, 422, "speculation.method", None),
            ({"num_speculative_tokens": "4"}, 422, "speculation.num_speculative_tokens", None),
            ({"num_speculative_tokens": 2.0}, 422, "speculation.num_speculative_tokens", None),
            ({"num_speculative_tokens": 65}, 400, "speculation.num_speculative_tokens", None),
            ({"num_speculative_tokens": -1}, 400, "speculation.num_speculative_tokens", None),
            ({"method": "warp"}, 400, "speculation.method", "unknown"),
            ({"method": "DRAFT"}, 400, "speculation.method", "unknown"),
            ({"method": "ssd"}, 400, "speculation.method", "needs a speculator"),
            ({"saguaro_c": 1.5}, 400, "speculation.saguaro_c", None),
            ({"method": "vegas", "sparsity_ratio": 0}, 400, "speculation.sparsity_ratio", None),
            ({"method": "streaming", "min_tokens": -2}, 400, "speculation.min_tokens", None),
            ({"method": "ssv", "num_speculative_tokens": 4}, 400, "speculation.method",
             "not a way to draft"),
            ({"method": "ngram", "k": 4}, 400, "speculation.k", "unknown"),
            # speculation.ssv: NSA targets only (codepair is dense); types 422, values 400.
            ({"method": "ngram", "ssv": {"group_size": 4}}, 400, "speculation.ssv", "NSA"),
            ({"ssv": {"mode": "approximate"}}, 400, "speculation.ssv.mode", None),
            ({"ssv": {"group_size": 17}}, 400, "speculation.ssv.group_size", None),
            ({"ssv": {"group_size": "4"}}, 422, "speculation.ssv.group_size", None),
            ({"ssv": {"strict": 1}}, 422, "speculation.ssv.strict", None),
            ({"ssv": {"c": 4}}, 400, "speculation.ssv.c", "unknown"),
        ]
        for path in ("/v1/completions", "/v1/chat/completions"):
            for value, want_status, param, message in cases:
                body = {"max_tokens": 4, "speculation": value}
                if path == "/v1/completions":
                    body["prompt"] = "def f("
                else:
                    body["messages"] = [{"role": "user", "content": "hi"}]
                for stream in (False, True):
                    what = f"{path} stream={stream} speculation={value!r}"
                    status, payload = post(path, dict(body, stream=stream))
                    self.assertEqual(status, want_status, f"{what}: {payload}")
                    self.assertEqual(set(payload), {"error"}, what)
                    e = payload["error"]
                    self.assertEqual(set(e), {"message", "type", "param", "code"}, what)
                    self.assertEqual(e["type"], "invalid_request_error", what)
                    self.assertEqual(e["param"], param, what)
                    if message:
                        self.assertIn(message, e["message"], what)
        got = completion({"prompt": "def f(", "max_tokens": 4,
                          "speculation": {"method": "ngram"}})
        self.assertEqual(got["usage"]["completion_tokens"], 4)


class MetricsTest(SpecTestCase):
    def test_spec_decode_metrics_count_rounds_and_pass_promtool(self):
        before = DAEMON.metrics()
        got = completion({"prompt": codepair_prompts(2), "max_tokens": 32, "temperature": 0,
                          "speculation": {"method": "draft_model", "num_speculative_tokens": 4}})
        s = self.assert_spec_usage(got["usage"], "metrics request")
        after = DAEMON.metrics()

        def delta(key):
            return after.get(key, 0.0) - before.get(key, 0.0)

        self.assertEqual(delta("specd_spec_decode_num_drafts_total"), s["num_drafts"])
        self.assertEqual(delta("specd_spec_decode_num_draft_tokens_total"),
                         s["num_draft_tokens"])
        self.assertEqual(delta("specd_spec_decode_num_accepted_tokens_total"),
                         s["num_accepted_tokens"])
        per_pos = sum(delta(f'specd_spec_decode_num_accepted_tokens_per_pos_total'
                            f'{{position="{p}"}}') for p in range(64))
        self.assertEqual(per_pos, s["num_accepted_tokens"])
        if s["num_accepted_tokens"]:
            self.assertGreater(after['specd_spec_decode_num_accepted_tokens_per_pos_total'
                                    '{position="0"}'], 0)
        self.assertEqual(delta("specd_spec_decode_accepted_length_count"), s["num_drafts"])
        self.assertGreater(after["specd_spec_decode_verify_seconds_count"], 0)
        self.assertGreater(after["specd_spec_decode_draft_seconds_count"], 0)
        # Time by method and phase: this request's method drafted, verified and committed.
        for phase in ("draft", "verify", "other"):
            self.assertGreater(delta(metric_key("specd_spec_decode_seconds_total",
                                                method="draft_model", phase=phase)), 0, phase)
        for p in range(4, 64):  # K = 4: positions 0..3 only
            self.assertEqual(delta('specd_spec_decode_num_accepted_tokens_per_pos_total'
                                   f'{{position="{p}"}}'), 0)
        self.assert_promtool_clean(DAEMON)


class ServerDefaultTest(SpecTestCase):
    """A server whose --speculative-config default is ngram, without a draft model."""

    def test_default_method_speculates_and_is_reported(self):
        config = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
        with Daemon(SPECD, "--grpc-port", "-1", "--threads", "2", "--speculative-config",
                    config, source_dir=SOURCE, name="spec_http_default") as d:
            body = {"prompt": codepair_prompts(3, 300), "max_tokens": 40, "temperature": 0}
            got, plain = self.same_as_plain(body, d)
            self.assert_spec_usage(got["usage"], "server default ngram")
            self.assertEqual(plain["usage"]["speculation"]["num_drafts"], 0)
            for value, what in (({"method": "draft_model"}, "draft model"),
                                ({"method": "draft"}, "draft model"),
                                ({"method": "eagle3"}, "EAGLE-3 head")):
                status, payload = post("/v1/completions", dict(body, speculation=value), d)
                self.assertEqual(status, 400, payload)
                self.assertEqual(payload["error"]["param"], "speculation.method")
                self.assertIn(what, payload["error"]["message"])
            # auto: n-gram or plain, as the policy's default CPU profile prices a batch of 3.
            got = completion(dict(body, speculation={"method": "auto"}), d)
            s = self.assert_spec_usage(got["usage"], "auto without a draft model",
                                       speculated=False)
            self.assertLessEqual(set(s.get("by_method", {})), {"ngram"})
            self.assertGreater(d.metric("specd_spec_decode_num_drafts_total"), 0)


# Step times (ms) in which the draft model pays for a lone request and loses from batch 4 on.
LOSES_AT_FOUR_PROFILE = {
    "version": 1, "device": "synthetic", "models": "codepair",
    "plain": {"batch": [1, 4, 16], "context": [1], "ms": [[[10]], [[11]], [[14]]]},
    "verify": {"batch": [1, 2, 4, 16], "tokens": [1, 5], "context": [1],
               "ms": [[[10], [11]], [[10.5], [14]], [[11], [60]], [[14], [240]]]},
    "methods": {"draft_model": {"draft": {"batch": [1, 16], "tokens": [1, 4], "context": [1],
                                          "ms": [[[1], [4]], [[2], [8]]]}}},
}


class PolicyServerTest(SpecTestCase):
    """`auto` as the server's default, with a --cost-profile file."""

    def test_auto_follows_the_profile_reports_per_method_and_shows_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = os.path.join(tmp, "profile.json")
            with open(profile, "w", encoding="utf-8") as f:
                json.dump(LOSES_AT_FOUR_PROFILE, f)
            config = json.dumps({"method": "auto", "model": DRAFT, "num_speculative_tokens": 4})
            with Daemon(SPECD, "--grpc-port", "-1", "--threads", "2", "--speculative-config",
                        config, "--cost-profile", profile, source_dir=SOURCE,
                        name="spec_http_policy") as d:
                # A lone request: the profile says the draft model pays.
                body = {"prompt": codepair_prompts(1, 300), "max_tokens": 40, "temperature": 0}
                got, _ = self.same_as_plain(body, d)
                s = self.assert_spec_usage(got["usage"], "auto alone")
                self.assertEqual(set(s["by_method"]), {"draft_model"})
                # Its own policy: no draft model, so nothing the profile knows is left.
                refused = completion(dict(body, speculation={
                    "method": "auto", "policy": {"forbid": ["draft_model"]}}), d)
                self.assertEqual(refused["usage"]["speculation"]["num_drafts"], 0)
                self.assertEqual(refused["choices"][0]["text"], got["choices"][0]["text"])
                status, payload = post("/v1/completions", dict(body, speculation={
                    "method": "draft_model", "policy": {"forbid": ["draft_model"]}}), d)
                self.assertEqual(status, 400, payload)
                self.assertEqual(payload["error"]["param"], "speculation.policy.forbid")
                self.assertGreater(d.metric("specd_policy_request_steps_total",
                                            method="draft_model"), 0)
                self.assertGreater(d.metric("specd_policy_request_steps_total", method="none"),
                                   0)
                self.assertGreater(d.metric("specd_policy_estimated_tokens_per_second"), 0)
                status, shown = d.get_json("/v1/debug/policy")
                self.assertEqual(status, 200, shown)
                self.assertEqual(shown["cost_profile_source"], f"file {profile}")
                self.assertEqual(shown["cost_profile"]["device"], "synthetic")
                self.assert_promtool_clean(d)

    def test_a_bad_cost_profile_stops_startup_naming_the_field(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = os.path.join(tmp, "bad.json")
            with open(profile, "w", encoding="utf-8") as f:
                json.dump(dict(LOSES_AT_FOUR_PROFILE, plain={"batch": [1], "context": [1],
                                                             "ms": [[[0]]]}), f)
            d = Daemon(SPECD, "--grpc-port", "-1", "--threads", "2", "--speculative-config",
                       json.dumps({"method": "auto"}), "--cost-profile", profile,
                       source_dir=SOURCE, name="spec_http_bad_profile")
            with self.assertRaises(DaemonError) as e:
                d.start()
            self.assertIn("--cost-profile", str(e.exception))
            self.assertIn("plain.ms[0][0][0]", str(e.exception))


class SsdServerTest(SpecTestCase):
    """A server whose default method is ssd (issue 6): the speculator is its own process."""

    def test_ssd_is_lossless_reports_cache_hits_and_exports_metrics(self):
        config = json.dumps({"method": "ssd", "model": DRAFT, "num_speculative_tokens": 4,
                             "fan_out": 3, "cache_build": "complete"})
        with Daemon(SPECD, "--grpc-port", "-1", "--threads", "2", "--speculative-config",
                    config, source_dir=SOURCE, name="spec_http_ssd") as d:
            # At start, before any request speculated, the link shows (issue 15). Polled: the TP 2
            # variant once read 0 here on a 2-core machine under load 7 (the daemon's log was not
            # kept; a link that times out under load is dropped and the speculator relaunched,
            # which rejoins within a second or two).
            d.wait_metric("specd_ssd_speculator_connected", 1, timeout=20)
            self.assertEqual(d.metric("specd_ssd_speculator_connects_total"), 1)
            body = {"prompt": codepair_prompts(4, 300), "max_tokens": 48, "temperature": 0}
            got, plain = self.same_as_plain(body, d)
            s = got["usage"]["speculation"]
            self.assertGreater(s["num_drafts"], 0)
            ssd = s["ssd"]
            self.assertEqual(set(ssd), {"cache_hit_drafts", "cache_hit_rate",
                                        "cache_hit_draft_tokens", "cache_hit_accepted_tokens",
                                        "cache_miss_drafts", "wait_seconds"})
            self.assertEqual(ssd["cache_hit_drafts"] + ssd["cache_miss_drafts"], s["num_drafts"])
            self.assertGreaterEqual(ssd["wait_seconds"], 0)
            self.assertGreater(ssd["cache_hit_drafts"], 0, s)
            self.assertLessEqual(ssd["cache_hit_drafts"], s["num_drafts"])
            self.assertAlmostEqual(ssd["cache_hit_rate"],
                                   ssd["cache_hit_drafts"] / s["num_drafts"], places=9)
            self.assertLessEqual(ssd["cache_hit_accepted_tokens"], ssd["cache_hit_draft_tokens"])
            self.assertNotIn("ssd", plain["usage"]["speculation"])
            # Sampled with Saguaro down-weighting: served (its distribution is ssd_test's job).
            got = completion(dict(body, temperature=1.0, seed=3,
                                  speculation={"method": "ssd", "saguaro_c": 0.5}), d)
            self.assertGreater(got["usage"]["speculation"]["num_drafts"], 0)
            status, payload = post("/v1/completions",
                                   dict(body, speculation={"saguaro_c": -0.5}), d)
            self.assertEqual(status, 400, payload)
            self.assertEqual(payload["error"]["param"], "speculation.saguaro_c")
            self.assertGreater(d.metric('specd_ssd_drafts_total{status="hit"}'), 0)
            self.assertEqual(d.metric("specd_ssd_speculator_connected"), 1)
            self.assertGreater(d.metric('specd_ssd_draft_tokens_total{draft="hit"}'), 0)
            self.assertEqual(d.metric("specd_ssd_link_failures_total"), 0)
            self.assertGreater(d.metric('specd_ssd_bytes_total{direction="sent"}'), 0)
            self.assertGreater(d.metric('specd_ssd_bytes_total{direction="received"}'), 0)
            # The round's timeline: rounds on both sides, and the stages every round has.
            for side in ("verifier", "speculator"):
                self.assertGreater(d.metric("specd_ssd_timeline_rounds_total", side=side), 0)
            for side, stage in (("verifier", "wait"), ("verifier", "verify"),
                                ("speculator", "triage"), ("speculator", "build")):
                self.assertGreater(
                    d.metric("specd_ssd_round_stage_seconds_total", side=side, stage=stage), 0)
            self.assert_promtool_clean(d)


if __name__ == "__main__":
    unittest.main(verbosity=2)
