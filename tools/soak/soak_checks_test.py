#!/usr/bin/env python3
"""Unit tests of the soak's checks (tools/soak): each rule flags the defect it is for and
passes a correct answer, so a soak that reports no violation has looked.

Usage: soak_checks_test.py [unittest args]
"""
import os
import random
import sys
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak_checks  # noqa: E402
import soak_requests as rq  # noqa: E402


def params(**kw):
    p = {"front": "completions", "prompt": "def f(", "n": 1, "max_tokens": 4,
         "temperature": 0.0, "top_p": None, "top_k": None, "seed": None, "stop": None,
         "spec": None, "ignore_eos": False, "presence_penalty": None, "logprobs": 0,
         "token_ids": True, "stream": True, "include_usage": True}
    p.update(kw)
    return p


def chunk(text, ids, finish=None, index=0):
    lp = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-1.0] * len(ids),
          "top_logprobs": [{}] * len(ids), "text_offset": [0] * len(ids)}
    return {"choices": [{"index": index, "text": text, "logprobs": lp if ids else None,
                         "finish_reason": finish}], "usage": None}


def stream(p, events):
    out, state = rq.new_http_output(p), {"done": False}
    for e in events:
        rq.http_stream_event(p, out, e, state)
    return out


def good_events(usage=4):
    return [chunk("a", [5, 6]), chunk("bc", [7]), chunk("d", [8], "length"),
            {"choices": [], "usage": {"completion_tokens": usage}}, "[DONE]"]


class OutputRulesTest(unittest.TestCase):
    def test_a_whole_stream_passes(self):
        out = stream(params(), good_events())
        self.assertTrue(out.complete)
        self.assertEqual(rq.check_output(params(), out), [])

    def test_a_lost_token_is_flagged(self):
        events = good_events()
        events[1] = chunk("bc", [])  # the event for token 7 lost its token
        bad = rq.check_output(params(), stream(params(), events))
        self.assertTrue(any("usage.completion_tokens 4" in b for b in bad), bad)

    def test_length_before_max_tokens_is_flagged(self):
        events = [chunk("a", [5, 6]), chunk("d", [8], "length"),
                  {"choices": [], "usage": {"completion_tokens": 3}}, "[DONE]"]
        bad = rq.check_output(params(), stream(params(), events))
        self.assertTrue(any("finish length after 3 tokens" in b for b in bad), bad)

    def test_content_after_finish_and_after_done_are_flagged(self):
        events = good_events()
        out = stream(params(), events[:3] + [chunk("x", [9])] + events[3:] + [chunk("y", [1])])
        bad = rq.check_output(params(), out)
        self.assertTrue(any("content after its finish_reason" in b for b in bad), bad)
        self.assertTrue(any("event after [DONE]" in b for b in bad), bad)

    def test_missing_done_and_missing_usage_are_flagged(self):
        out = stream(params(), good_events()[:3] + ["[DONE]"])
        self.assertTrue(any("no usage chunk" in b for b in rq.check_output(params(), out)))

    def test_stop_string_in_text_is_flagged(self):
        p = params(stop=["b"])
        bad = rq.check_output(p, stream(p, good_events()))
        self.assertTrue(any("stop string" in b for b in bad), bad)

    def test_grpc_ids_must_match_usage(self):
        class Msg:
            def __init__(self, ids, finish=0, usage=0):
                self.request_id, self.index, self.token_ids = "r", 0, ids
                self.text, self.logprobs, self.finish_reason = "t", [None] * len(ids), finish
                self.usage = type("U", (), {"completion_tokens": usage})()
        p = params(front="grpc")
        out = rq.new_grpc_output(p)
        for m in (Msg([1, 2]), Msg([3], finish=2, usage=4)):
            rq.grpc_message(p, out, m, "r")
        rq.grpc_finished_ok(out)
        self.assertTrue(any("3 token ids streamed, usage says 4" in b
                            for b in rq.check_output(p, out)))


class ReferencesTest(unittest.TestCase):
    def add(self, refs, p, events, label):
        refs.add(rq.output_key(p), stream(p, events), label)

    def test_equal_answers_and_prefixes_pass(self):
        refs, p = soak_checks.References(), params()
        self.add(refs, p, good_events(), "a")
        self.add(refs, dict(p, spec={"method": "ngram"}), good_events(), "b")
        self.add(refs, p, good_events()[:2], "partial")
        self.assertEqual(refs.verify(), (2, []))

    def test_a_duplicated_delta_is_flagged(self):
        refs, p = soak_checks.References(), params()
        self.add(refs, p, good_events(), "a")
        events = good_events()
        events[1] = chunk("bcbc", [7])
        self.add(refs, p, events, "b")
        compared, bad = refs.verify()
        self.assertEqual(compared, 1)
        self.assertTrue(any("choice 0 text" in b for b in bad), bad)

    def test_a_partial_answer_that_is_no_prefix_is_flagged(self):
        refs, p = soak_checks.References(), params()
        self.add(refs, p, good_events(), "a")
        self.add(refs, p, [chunk("x", [4])], "cut")
        self.assertTrue(any("not a prefix" in b for b in refs.verify()[1]))

    def test_what_counts_as_deterministic(self):
        sampled = params(temperature=0.7, seed=3)
        self.assertTrue(rq.comparable(params(spec={"method": "draft_model"})))
        self.assertTrue(rq.comparable(params(seed=5, top_k=3)))
        self.assertFalse(rq.comparable(dict(sampled, spec={"method": "none"})))
        self.assertFalse(rq.comparable(dict(sampled, spec={"method": "ngram"})))
        self.assertFalse(rq.comparable(dict(sampled, spec=None)))
        self.assertFalse(rq.comparable(params(temperature=0.7)))
        self.assertNotEqual(rq.output_key(dict(sampled, spec={"method": "none"})),
                            rq.output_key(dict(sampled, seed=4, spec={"method": "none"})))

    def test_random_params_are_valid_shapes(self):
        rng = random.Random(7)
        for front in ("completions", "chat", "grpc"):
            for _ in range(200):
                p = rq.random_params(rng, ["def f(x):\n    return x"], front)
                body = rq.http_body(p, "codepair")
                self.assertLessEqual(p["n"] * p["max_tokens"], 4 * 96)
                self.assertEqual("stream_options" in body, p["include_usage"])
                self.assertTrue(front != "grpc" or p["stream"])


def metrics(stop=0, length=0, abort=0, tokens=0, codes=None):
    m = {f'specd_requests_total{{outcome="{o}"}}': v
         for o, v in (("stop", stop), ("length", length), ("abort", abort))}
    m["specd_generation_tokens_total"] = tokens
    for code, v in (codes or {}).items():
        m[f'specd_http_responses_total{{code="{code}"}}'] = v
    return m


class MetricsTest(unittest.TestCase):
    def ledger(self):
        led = soak_checks.Ledger()
        out = stream(params(), good_events())
        led.complete(params(), out)  # one choice, length, 4 tokens
        led.aborted(params(n=2, max_tokens=8), sure=True)
        led.status(400)
        return led

    def test_consistent_counters_pass(self):
        _, bad = soak_checks.check_metrics(
            metrics(), metrics(length=1, abort=2, tokens=9, codes={200: 5, 400: 1}),
            self.ledger())
        self.assertEqual(bad, [])

    def test_a_race_that_finished_an_aborted_choice_passes(self):
        _, bad = soak_checks.check_metrics(
            metrics(), metrics(length=1, stop=1, abort=1, tokens=9, codes={400: 1}),
            self.ledger())
        self.assertEqual(bad, [])

    def test_uncounted_requests_and_tokens_are_flagged(self):
        _, bad = soak_checks.check_metrics(metrics(), metrics(length=1, tokens=3,
                                                              codes={400: 1}), self.ledger())
        self.assertTrue(any("specd_requests_total grew by 1" in b for b in bad), bad)
        self.assertTrue(any("specd_generation_tokens_total" in b for b in bad), bad)

    def test_a_stream_that_hides_its_count_widens_the_token_bound(self):
        led = self.ledger()
        p = params(logprobs=None, token_ids=False, include_usage=False, max_tokens=5)
        led.complete(p, stream(p, [chunk("a", []), chunk("b", [], "stop"), "[DONE]"]))
        after = metrics(length=1, stop=1, abort=2, tokens=9 + 5, codes={400: 1})
        self.assertEqual(soak_checks.check_metrics(metrics(), after, led)[1], [])
        after = metrics(length=1, stop=1, abort=2, tokens=9 + 16 + 6, codes={400: 1})
        self.assertEqual(len(soak_checks.check_metrics(metrics(), after, led)[1]), 1)

    def test_5xx_and_miscounted_4xx_are_flagged(self):
        _, bad = soak_checks.check_metrics(
            metrics(), metrics(length=1, abort=2, tokens=9, codes={400: 2, 500: 1}),
            self.ledger())
        self.assertTrue(any("HTTP 500" in b for b in bad), bad)
        self.assertTrue(any("HTTP 400 counted 2" in b for b in bad), bad)


class ProcTest(unittest.TestCase):
    MIB = 1024

    def check(self, rss_of_t, end_rss=100, end_fds=10):
        samples = [(t, rss_of_t(t) * self.MIB, 50) for t in range(0, 101, 2)]
        return soak_checks.check_proc(samples, (90 * self.MIB, 10),
                                      (end_rss * self.MIB, end_fds), 0, 20, 100, 80,
                                      soak_checks.Limits(rss_growth_mib=16, fd_slack=2))

    def test_flat_rss_and_closed_fds_pass(self):
        summary, bad = self.check(lambda t: 100 + (t % 3))
        self.assertEqual(bad, [])
        self.assertEqual(summary["rss_allowance_mib"], 16)

    def test_steady_growth_is_flagged(self):
        _, bad = self.check(lambda t: 100 + t, end_rss=200)
        self.assertTrue(any("RSS grew under steady load" in b for b in bad), bad)
        self.assertTrue(any("idle RSS at the end" in b for b in bad), bad)

    def test_leaked_fds_are_flagged(self):
        _, bad = self.check(lambda t: 100, end_fds=13)
        self.assertTrue(any("open fds idle" in b for b in bad), bad)


if __name__ == "__main__":
    unittest.main()
