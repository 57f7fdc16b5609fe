"""The soak's cross-answer checks (tools/soak/soak.py): answers to the same deterministic
request agree, the server's /metrics agree with what the clients saw, and the server's RSS
and open file descriptors stay bounded.

References and Ledger are filled from many client threads (each method takes a lock);
ProcSampler runs its own thread; the check functions run on the main thread at the end.
"""
import collections
import os
import statistics
import threading
import time

OUTCOMES = ("stop", "length", "abort", "deadline", "error")


class References:
    """Every answer to a deterministic request (soak_requests.comparable), by output key."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_key = collections.defaultdict(list)

    def add(self, key, out, label):
        with self._lock:
            self._by_key[key].append((out, label))

    def verify(self):
        """(number of answers compared with a reference, violations). The reference of a key
        is its first complete answer; complete answers must equal it, answers cut short by an
        abort must be a prefix of it."""
        compared, bad = 0, []
        with self._lock:
            groups = list(self._by_key.values())
        for answers in groups:
            ref = next(((o, lab) for o, lab in answers if o.complete), None)
            if ref is None:
                continue
            for out, label in answers:
                if out is ref[0]:
                    continue
                compared += 1
                bad += [f"{label} vs {ref[1]}: {d}" for d in differences(ref[0], out)]
        return compared, bad


def differences(ref, out):
    """How `out` departs from the complete answer `ref` to the same request."""
    diffs = []
    for i, (r, c) in enumerate(zip(ref.choices, out.choices)):
        if out.complete:
            if c.text != r.text:
                diffs.append(f"choice {i} text {c.text[:80]!r}... != {r.text[:80]!r}...")
            if c.finish != r.finish:
                diffs.append(f"choice {i} finish {c.finish} != {r.finish}")
            if c.num_tokens is not None and r.num_tokens is not None \
                    and c.num_tokens != r.num_tokens:
                diffs.append(f"choice {i}: {c.num_tokens} tokens != {r.num_tokens}")
            if c.ids is not None and r.ids is not None and c.ids != r.ids:
                diffs.append(f"choice {i} token ids differ at {_first_diff(c.ids, r.ids)}")
        else:
            if not r.text.startswith(c.text):
                diffs.append(f"choice {i} partial text {c.text[:80]!r} is not a prefix")
            if c.ids is not None and r.ids is not None and r.ids[:len(c.ids)] != c.ids:
                diffs.append(f"choice {i} partial token ids differ at "
                             f"{_first_diff(c.ids, r.ids)}")
    if out.complete and out.usage is not None and ref.usage is not None \
            and out.usage != ref.usage:
        diffs.append(f"usage.completion_tokens {out.usage} != {ref.usage}")
    return diffs


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class Ledger:
    """What the clients saw, in engine requests (one per choice) and HTTP statuses."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts = collections.Counter()  # free-form event counts for the summary
        self.finished = collections.Counter()  # choices of complete answers, by finish reason
        self.tokens_done = 0       # completion tokens of complete answers that show them
        self.tokens_unknown = 0    # most tokens the complete answers that don't can have
        self.sure_aborted = 0      # choices surely submitted, cut short by the client
        self.maybe_submitted = 0   # choices that may or may not have reached the engine
        self.abort_token_bound = 0  # most tokens those two kinds can have generated
        self.codes = collections.Counter()  # HTTP error statuses received

    def count(self, what, k=1):
        with self._lock:
            self.counts[what] += k

    def complete(self, p, out):
        """A complete answer. A stream without include_usage or logprobs does not show its
        token count: it adds what it may have generated to the upper bound."""
        known = out.usage if out.usage is not None else out.total_tokens()
        with self._lock:
            for c in out.choices:
                self.finished[c.finish] += 1
            if known is not None:
                self.tokens_done += known
            else:
                self.tokens_unknown += p["n"] * p["max_tokens"]

    def aborted(self, p, sure):
        with self._lock:
            if sure:
                self.sure_aborted += p["n"]
            else:
                self.maybe_submitted += p["n"]
            self.abort_token_bound += p["n"] * p["max_tokens"]

    def status(self, code, p=None):
        """An error status; p: the request, when part of it may have reached the engine
        (a queue-full 429 after its first choices were submitted)."""
        with self._lock:
            self.codes[code] += 1
            if p is not None and p["n"] > 1:
                self.maybe_submitted += p["n"] - 1
                self.abort_token_bound += (p["n"] - 1) * p["max_tokens"]


def metric_delta(before, after, name, **labels):
    key = name if not labels else name + "{" + ",".join(
        f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return after.get(key, 0.0) - before.get(key, 0.0)


def check_metrics(before, after, ledger):
    """(rows for the summary, violations): /metrics deltas over the run against the ledger.
    Bounds are exact where the client knows: a client's close may race the last token, so an
    abort it caused may be counted as stop/length; a non-streamed request closed before its
    answer may not have reached the engine at all."""
    d = {o: metric_delta(before, after, "specd_requests_total", outcome=o) for o in OUTCOMES}
    done = sum(ledger.finished.values())
    total = sum(d.values())
    low, high = done + ledger.sure_aborted, done + ledger.sure_aborted + ledger.maybe_submitted
    bad = []
    if not low <= total <= high:
        bad.append(f"specd_requests_total grew by {total:.0f}; clients saw {low} to {high} "
                   "engine requests end")
    for o in ("stop", "length"):
        if d[o] < ledger.finished[o]:
            bad.append(f'specd_requests_total{{outcome="{o}"}} grew by {d[o]:.0f} < '
                       f"{ledger.finished[o]} choices the clients saw finish so")
    if d["abort"] > ledger.sure_aborted + ledger.maybe_submitted:
        bad.append(f"{d['abort']:.0f} aborts counted, clients cut at most "
                   f"{ledger.sure_aborted + ledger.maybe_submitted} choices short")
    for o in ("deadline", "error"):
        if d[o]:
            bad.append(f'specd_requests_total{{outcome="{o}"}} grew by {d[o]:.0f}')
    tokens = metric_delta(before, after, "specd_generation_tokens_total")
    tokens_high = ledger.tokens_done + ledger.tokens_unknown + ledger.abort_token_bound
    if not ledger.tokens_done <= tokens <= tokens_high:
        bad.append(f"specd_generation_tokens_total grew by {tokens:.0f}; clients saw "
                   f"{ledger.tokens_done} to {tokens_high}")
    bad += _check_codes(before, after, ledger)
    rows = [(f"requests_total{{{o}}}", f"{d[o]:.0f}", _client_side(o, ledger)) for o in OUTCOMES]
    rows.append(("requests_total (all)", f"{total:.0f}", f"{low}..{high}"))
    rows.append(("generation_tokens_total", f"{tokens:.0f}",
                 f"{ledger.tokens_done}..{tokens_high}"))
    return rows, bad


def _client_side(outcome, ledger):
    if outcome in ("stop", "length"):
        return f">= {ledger.finished[outcome]}"
    if outcome == "abort":
        return f"<= {ledger.sure_aborted + ledger.maybe_submitted}"
    return "0"


def _check_codes(before, after, ledger):
    """4xx statuses the server counted equal those the clients received (429 may also have
    gone to a client that had already closed); no 5xx at all."""
    prefix = 'specd_http_responses_total{code="'
    counted = {int(k[len(prefix):-2]): after[k] - before.get(k, 0.0)
               for k in after if k.startswith(prefix)}
    bad = []
    for code in sorted(set(counted) | set(ledger.codes)):
        got, seen = counted.get(code, 0.0), ledger.codes.get(code, 0)
        if code >= 500 and got:
            bad.append(f"the server answered {got:.0f} x HTTP {code}")
        elif code == 429 and not seen <= got <= seen + ledger.maybe_submitted + ledger.counts[
                "http closed before the answer"]:
            bad.append(f"HTTP 429 counted {got:.0f} times, clients got {seen}")
        elif 400 <= code < 500 and code != 429 and got != seen:
            bad.append(f"HTTP {code} counted {got:.0f} times, clients got {seen}")
    return bad


def read_proc(pid):
    """(VmRSS in KiB, number of open file descriptors) of a live process."""
    rss = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class ProcSampler:
    """Samples the server's RSS and fds every `interval` seconds on a thread."""

    def __init__(self, pid, interval=2.0):
        self.pid = pid
        self.interval = interval
        self.samples = []  # (monotonic seconds, rss KiB, fds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        rss, fds = read_proc(self.pid)
        self.samples.append((time.monotonic(), rss, fds))
        return rss, fds

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except OSError:
                return  # the process is gone; the caller notices


class Limits:
    """Stability thresholds. RSS: after warm-up, the median of the last quarter of the load
    may exceed the median of the quarter after warm-up by at most `rss_growth`, and RSS when
    idle at the end may exceed the warm-up peak by at most the same; rss_growth =
    max(rss_growth_mib, rss_growth_frac x the warm-up peak). FDs: idle at the end, at most
    `fd_slack` more than idle at the start; under load, at most one per client plus
    `fd_load_slack` more."""

    def __init__(self, rss_growth_mib=64, rss_growth_frac=0.10, fd_slack=2, fd_load_slack=64):
        self.rss_growth_mib = rss_growth_mib
        self.rss_growth_frac = rss_growth_frac
        self.fd_slack = fd_slack
        self.fd_load_slack = fd_load_slack


def check_proc(samples, start, end, load_start, warm_end, load_end, num_clients, limits):
    """(summary dict, violations). start/end: idle (rss KiB, fds) before and after the load;
    samples: ProcSampler.samples; the times are monotonic seconds."""
    load = [s for s in samples if load_start <= s[0] <= load_end]
    warm = [s for s in load if s[0] <= warm_end] or load[:1]
    after = [s for s in load if s[0] > warm_end]
    warm_peak = max(s[1] for s in warm)
    allowance = max(limits.rss_growth_mib * 1024, limits.rss_growth_frac * warm_peak)
    quarter = max(1, len(after) // 4)
    early = statistics.median(s[1] for s in after[:quarter]) if after else warm_peak
    late = statistics.median(s[1] for s in after[-quarter:]) if after else warm_peak
    summary = {
        "rss_start_mib": start[0] / 1024, "rss_warm_peak_mib": warm_peak / 1024,
        "rss_early_median_mib": early / 1024, "rss_late_median_mib": late / 1024,
        "rss_end_mib": end[0] / 1024, "rss_max_mib": max(s[1] for s in load) / 1024,
        "rss_allowance_mib": allowance / 1024,
        "fds_start": start[1], "fds_end": end[1], "fds_max": max(s[2] for s in load),
        "fds_load_limit": start[1] + num_clients + limits.fd_load_slack,
        "fds_end_limit": start[1] + limits.fd_slack, "samples": len(load)}
    bad = []
    if late - early > allowance:
        bad.append(f"RSS grew under steady load: median {early / 1024:.1f} MiB after warm-up, "
                   f"{late / 1024:.1f} MiB at the end (allowance {allowance / 1024:.1f} MiB)")
    if end[0] > warm_peak + allowance:
        bad.append(f"idle RSS at the end {end[0] / 1024:.1f} MiB > warm-up peak "
                   f"{warm_peak / 1024:.1f} MiB + {allowance / 1024:.1f} MiB")
    if end[1] > summary["fds_end_limit"]:
        bad.append(f"open fds idle: {start[1]} at the start, {end[1]} at the end "
                   f"(limit {summary['fds_end_limit']})")
    if summary["fds_max"] > summary["fds_load_limit"]:
        bad.append(f"open fds under load reached {summary['fds_max']} "
                   f"(limit {summary['fds_load_limit']})")
    return summary, bad
