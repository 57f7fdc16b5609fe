"""Random valid generation requests for the soak (tools/soak/soak.py) and what came back.

A request is a plain dict of normalized parameters (`random_params`); `http_body` and
`grpc_request` render it for the OpenAI HTTP API or specd.v1.Specd/Generate. Whatever the
front end, an answer is an `Output`: per choice the text, the token ids and the number of
tokens when the answer shows them, and the finish reason; plus usage.completion_tokens.
`check_output` holds the per-answer rules that need no other answer (no lost or duplicated
tokens within one answer); soak_checks.References compares answers with each other.
Used from many client threads at once: nothing here is shared or mutable.
"""
import json

CHAT_QUESTIONS = ["Write a quicksort.", "Explain decorators.", "def main():",
                  "Parse a CSV file.", "What does this do?\nimport os\nos.walk('.')",
                  "Write a binary search in Python."]
TEMPERATURES = [0.4, 0.7, 1.0, 1.3]
MAX_TOKENS = [1, 2, 8, 16, 32, 48, 64, 96]
STOPS = [None, None, None, ["\n\n"], ["def ", "return"], ["):"]]
GRPC_FINISH = {1: "stop", 2: "length", 3: "abort"}


def random_params(rng, prompts, front):
    """One valid request for front "completions", "chat" or "grpc" (always streamed)."""
    p = {"front": front}
    if front == "chat":
        p["messages"] = [{"role": "user", "content": rng.choice(CHAT_QUESTIONS)}]
    else:
        p["prompt"] = rng.choice(prompts)[-rng.choice([60, 150, 300]):]
    p["n"] = rng.choices([1, 2, 3, 4], [70, 15, 10, 5])[0]
    p["max_tokens"] = rng.choice(MAX_TOKENS)
    p["temperature"] = 0.0 if rng.random() < 0.4 else rng.choice(TEMPERATURES)
    p["top_p"] = rng.choice([None, None, 0.9, 0.5])
    p["top_k"] = rng.choice([None, -1, 1, 5, 20, 50])
    p["seed"] = rng.randrange(16) if rng.random() < 0.7 else None
    p["stop"] = rng.choice(STOPS)
    p["spec"] = rng.choice([None, {"method": "none"}, {"method": "ngram"},
                            {"method": "draft_model",
                             "num_speculative_tokens": rng.randint(1, 8)}])
    p["ignore_eos"] = rng.random() < 0.15
    p["presence_penalty"] = 0.5 if rng.random() < 0.1 else None
    p["logprobs"] = rng.randint(0, 5) if rng.random() < 0.5 else None
    p["token_ids"] = p["logprobs"] is not None and rng.random() < 0.5
    p["stream"] = front == "grpc" or rng.random() < 0.6
    p["include_usage"] = front != "grpc" and p["stream"] and rng.random() < 0.7
    return p


def comparable(p):
    """Whether every answer to p must be the same: greedy requests, whatever the speculation
    method (speculation is lossless). Not seeded sampling: the CPU backend's logits move by
    ~3e-6 with the batch they are computed in, enough to flip a draw near a CDF boundary now
    and then (a 30-minute soak saw 2 such answers), and with drafts the random numbers a
    round uses depend on the step's token budget. Greedy output is exact unless two logits
    tie within that noise, which tests/load_test.py relies on too."""
    return p["temperature"] == 0


def output_key(p):
    """What determines the output: answers with the same key must agree. Completions and
    gRPC text prompts share keys (both tokenize the text the same way)."""
    greedy = p["temperature"] == 0
    k = {"prompt": p.get("prompt"), "messages": p.get("messages"), "n": p["n"],
         "max_tokens": p["max_tokens"], "stop": p["stop"], "ignore_eos": p["ignore_eos"],
         "presence_penalty": p["presence_penalty"] or 0.0, "greedy": greedy}
    if not greedy:  # no such answers are compared (see comparable); kept apart all the same
        k.update(temperature=p["temperature"], top_p=p["top_p"] or 1.0,
                 top_k=p["top_k"] if p["top_k"] not in (None, -1) else 0, seed=p["seed"],
                 spec=p["spec"])
    return json.dumps(k, sort_keys=True)


def http_body(p, model):
    body = {"model": model, "n": p["n"], "max_tokens": p["max_tokens"],
            "temperature": p["temperature"]}
    if p["front"] == "chat":
        body["messages"] = p["messages"]
    else:
        body["prompt"] = p["prompt"]
    for name in ("top_p", "top_k", "seed", "stop", "presence_penalty"):
        if p[name] is not None:
            body[name] = p[name]
    if p["spec"] is not None:
        body["speculation"] = p["spec"]
    if p["ignore_eos"]:
        body["ignore_eos"] = True
    if p["logprobs"] is not None:
        if p["front"] == "chat":
            body.update(logprobs=True, top_logprobs=p["logprobs"])
        else:
            body["logprobs"] = p["logprobs"]
        if p["token_ids"]:
            body["return_tokens_as_token_ids"] = True
    if p["stream"]:
        body["stream"] = True
        if p["include_usage"]:
            body["stream_options"] = {"include_usage": True}
    return body


def grpc_request(pb, p, request_id):
    r = pb.GenerateRequest(text=p["prompt"], request_id=request_id, max_tokens=p["max_tokens"],
                           temperature=p["temperature"], n=p["n"], ignore_eos=p["ignore_eos"])
    if p["top_p"] is not None:
        r.top_p = p["top_p"]
    if p["top_k"] is not None:
        r.top_k = p["top_k"]
    if p["seed"] is not None:
        r.seed = p["seed"]
    if p["stop"]:
        r.stop.extend(p["stop"])
    if p["presence_penalty"] is not None:
        r.presence_penalty = p["presence_penalty"]
    if p["logprobs"] is not None:
        r.logprobs = p["logprobs"]
    if p["spec"] is not None:
        r.speculation.method = p["spec"]["method"]
        r.speculation.num_speculative_tokens = p["spec"].get("num_speculative_tokens", 0)
    return r


class Choice:
    def __init__(self, with_ids, with_count):
        self.text = ""
        self.ids = [] if with_ids else None        # token ids, when the answer shows them
        self.num_tokens = 0 if with_count else None  # tokens, when the answer shows them
        self.finish = None
        self.usage = None  # gRPC: the choice's own completion_tokens


class Output:
    """One answer. complete: it ended normally (not aborted, no error)."""

    def __init__(self, p, with_ids, with_count):
        self.choices = [Choice(with_ids, with_count) for _ in range(p["n"])]
        self.usage = None  # usage.completion_tokens (all choices)
        self.complete = False
        self.problems = []  # malformed answer, found while reading it

    def total_tokens(self):
        counts = [c.num_tokens for c in self.choices]
        return None if None in counts else sum(counts)


def _logprob_tokens(p, logprobs):
    """The tokens a logprobs object lists: strings (completions) or entries (chat)."""
    if p["front"] == "chat":
        return [e["token"] for e in logprobs["content"]]
    return list(logprobs["tokens"])


def _token_id(token, out):
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    out.problems.append(f"token {token!r} is not 'token_id:N' with return_tokens_as_token_ids")
    return -1


def add_http_choice(p, out, choice, delta):
    """Adds one OpenAI choice object (a stream chunk's or a whole response's) to out."""
    index = choice.get("index")
    if not isinstance(index, int) or not 0 <= index < len(out.choices):
        out.problems.append(f"choice index {index!r} outside [0, {len(out.choices)})")
        return
    c = out.choices[index]
    if c.finish is not None:
        out.problems.append(f"choice {index}: content after its finish_reason")
    if p["front"] == "chat":
        text = (choice.get("delta" if delta else "message") or {}).get("content")
    else:
        text = choice.get("text")
    c.text += text or ""
    if choice.get("logprobs") is not None:
        tokens = _logprob_tokens(p, choice["logprobs"])
        if c.num_tokens is None:
            out.problems.append(f"choice {index}: logprobs that were not asked for")
        else:
            c.num_tokens += len(tokens)
        if c.ids is not None:
            c.ids += [_token_id(t, out) for t in tokens]
    if choice.get("finish_reason") is not None:
        c.finish = choice["finish_reason"]


def new_http_output(p):
    return Output(p, with_ids=p["token_ids"], with_count=p["logprobs"] is not None)


def http_stream_event(p, out, event, state):
    """Adds one SSE data payload (parsed JSON or "[DONE]"); state: {"done": bool}."""
    if state["done"]:
        out.problems.append(f"event after [DONE]: {str(event)[:120]}")
        return
    if event == "[DONE]":
        state["done"] = True
        out.complete = all(c.finish in ("stop", "length") for c in out.choices)
        if not out.complete:
            out.problems.append("[DONE] before every choice finished: "
                                f"{[c.finish for c in out.choices]}")
        if p["include_usage"] and out.usage is None:
            out.problems.append("include_usage but no usage chunk before [DONE]")
        return
    if "error" in event:
        out.problems.append(f"error event: {json.dumps(event)[:300]}")
        return
    if event.get("usage"):
        if out.usage is not None or not p["include_usage"] or event.get("choices"):
            out.problems.append(f"unexpected usage chunk: {json.dumps(event)[:200]}")
        if any(c.finish is None for c in out.choices):
            out.problems.append("usage chunk before every choice finished")
        out.usage = event["usage"]["completion_tokens"]
    for choice in event.get("choices", []):
        add_http_choice(p, out, choice, delta=True)


def http_response(p, body):
    """The Output of a non-streamed 200 response body."""
    out = new_http_output(p)
    choices = body.get("choices", [])
    if len(choices) != p["n"]:
        out.problems.append(f"{len(choices)} choices, n = {p['n']}")
    for choice in choices:
        add_http_choice(p, out, choice, delta=False)
    out.usage = body.get("usage", {}).get("completion_tokens")
    out.complete = all(c.finish in ("stop", "length") for c in out.choices)
    if not out.complete or out.usage is None:
        out.problems.append(f"finish reasons {[c.finish for c in out.choices]}, usage "
                            f"{body.get('usage')}")
    return out


def new_grpc_output(p):
    return Output(p, with_ids=True, with_count=True)


def grpc_message(p, out, msg, request_id):
    """Adds one GenerateResponse."""
    if msg.request_id != request_id:
        out.problems.append(f"request_id {msg.request_id!r}, sent {request_id!r}")
    if msg.index >= len(out.choices):
        out.problems.append(f"choice index {msg.index} outside [0, {len(out.choices)})")
        return
    c = out.choices[msg.index]
    if c.finish is not None:
        out.problems.append(f"choice {msg.index}: message after its finish_reason")
    if p["logprobs"] is not None and len(msg.logprobs) != len(msg.token_ids):
        out.problems.append(f"{len(msg.logprobs)} logprobs for {len(msg.token_ids)} tokens")
    c.ids += list(msg.token_ids)
    c.num_tokens += len(msg.token_ids)
    c.text += msg.text
    if msg.finish_reason:
        c.finish = GRPC_FINISH.get(msg.finish_reason, str(msg.finish_reason))
        c.usage = msg.usage.completion_tokens


def grpc_finished_ok(out):
    """The stream ended with status OK."""
    out.complete = all(c.finish in ("stop", "length") for c in out.choices)
    if not out.complete:
        out.problems.append(f"status OK with finish reasons {[c.finish for c in out.choices]}")
    usages = [c.usage for c in out.choices]
    out.usage = None if None in usages else sum(usages)
    for i, c in enumerate(out.choices):
        if c.usage is not None and c.usage != c.num_tokens:
            out.problems.append(f"choice {i}: {c.num_tokens} token ids streamed, usage says "
                                f"{c.usage}")


def check_output(p, out):
    """Violations within one answer (complete or cut short by an abort)."""
    bad = list(out.problems)
    for i, c in enumerate(out.choices):
        for s in p["stop"] or []:
            if s in c.text:
                bad.append(f"choice {i}: text contains stop string {s!r}")
        if c.ids is not None and c.num_tokens is not None and len(c.ids) != c.num_tokens:
            bad.append(f"choice {i}: {len(c.ids)} ids for {c.num_tokens} tokens")
        if c.num_tokens is not None and c.num_tokens > p["max_tokens"]:
            bad.append(f"choice {i}: {c.num_tokens} tokens > max_tokens {p['max_tokens']}")
        if (out.complete and c.finish == "length" and c.num_tokens is not None
                and c.num_tokens != p["max_tokens"]):
            bad.append(f"choice {i}: finish length after {c.num_tokens} tokens, max_tokens "
                       f"{p['max_tokens']}")
    if out.complete and out.usage is not None:
        total = out.total_tokens()
        if total is not None and total != out.usage:
            bad.append(f"{total} tokens streamed/returned, usage.completion_tokens {out.usage}")
        if out.usage > p["n"] * p["max_tokens"]:
            bad.append(f"usage.completion_tokens {out.usage} > n * max_tokens")
        if (all(c.finish == "length" for c in out.choices)
                and out.usage != p["n"] * p["max_tokens"]):
            bad.append(f"every choice hit length but usage.completion_tokens {out.usage} != "
                       f"{p['n']} * {p['max_tokens']}")
    return bad
