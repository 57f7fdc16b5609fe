#!/usr/bin/env python3
"""serve_eval: tokens per verification round of an EAGLE-3 head (and of a draft model) in the
serving regime, counted as specd's spec_bench counts them.

Why: train_eagle3.py's window evaluation drafts from anchors 64..240 of windows cut from the
concatenated held-out stream, which seldom start at a file's BOS. specd's benchmark drafts right
after a prompt that is the first 200-500 characters of a held-out file, BOS at position 0, and
the two disagree (stage 4: the script put the head ahead of the draft model, specd behind). This
module measures what specd measures: per prompt, the target's greedy continuation of
`max_tokens` tokens, then greedy verification rounds as the engine's step pipeline runs them (the
prefill commits the first token; a round drafts min(K, max_tokens - generated - 1) tokens and
commits the accepted prefix plus the target's bonus token; with no useful draft a plain decode
step), reported as spec_bench does: 1 + accepted / rounds, and acceptance by draft position.

An EAGLE-3 head's round after `last` (the index of the last committed token) is the chain
train_eagle3.draft_chains drafts from anchor last - 1 (the step-1 pass over positions 0..last-1
with the target's features, then its own hidden states), which is what the engine's catch-up
pass plus draft steps compute. A draft model drafts greedily on the committed tokens.

Used by train_eagle3.py (held-out files, before and after training) and on its own:
    serve_eval.py --head models/codepair/eagle3 --draft models/codepair/draft \
        --prompts models/codepair/prompts.jsonl [--ids models/codepair/tokenizer_vectors.jsonl]
(--ids: token ids of the prompts from the tokenizer vectors, for a machine without `tokenizers`.)
"""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_eagle3 as te  # noqa: E402

PROMPT_CHARS = (200, 500)  # prompts.jsonl: the first 200-500 characters of a held-out file
MIN_FILE_CHARS = 600  # ... of a file longer than this


# ----------------------------------------------------------------------------------------------
# Pure Python: prompts and the round simulation.

def serve_prompt_texts(texts, exclude, n, seed):
    """Serving-regime prompts from held-out file texts, made as prompts.jsonl was: the first
    200-500 characters (a random cut, random.Random(seed)) of files longer than 600 characters.
    A text starting with one of `exclude` (the benchmark's own prompts) is skipped. Returns
    (prompts, number of texts skipped that way)."""
    rng, out, skipped = random.Random(seed), [], 0
    for text in texts:
        if len(out) >= n:
            break
        if len(text) <= MIN_FILE_CHARS:
            continue
        if any(text.startswith(e) for e in exclude):
            skipped += 1
            continue
        out.append(text[:rng.randint(*PROMPT_CHARS)])
    return out, skipped


class RoundSim:
    """Greedy verification rounds of a batch of requests, in lockstep.

    truth[r]: request r's prompt ids followed by the target's greedy tokens (at least
    max_tokens of them); prompt_lens[r]: its prompt's length. The prefill commits the first
    token; then each step a request drafts min(k, max_tokens - generated - 1) tokens after its
    last committed one (pending) and commits the drafts' longest prefix equal to the target's
    tokens plus one (apply), or, with nothing useful to draft, takes a plain decode step."""

    def __init__(self, truth, prompt_lens, max_tokens, k):
        self.truth, self.max_tokens, self.k = truth, max_tokens, k
        self.known = [p + 1 for p in prompt_lens]  # committed tokens: prompt + prefill's token
        self.generated = [1] * len(truth)
        self.rounds = self.accepted = 0
        self.drafted_at, self.accepted_at = [0] * k, [0] * k

    def pending(self):
        """[(request, index of its last committed token, drafts wanted)] for this step."""
        out = []
        for r in range(len(self.truth)):
            while self.generated[r] < self.max_tokens:
                k = min(self.k, self.max_tokens - self.generated[r] - 1)
                if k > 0:
                    out.append((r, self.known[r] - 1, k))
                    break
                self.generated[r] += 1  # a plain decode step
                self.known[r] += 1
        return out

    def apply(self, r, drafts):
        """Verifies request r's drafts (target ids) against its target tokens."""
        start = self.known[r]
        want = self.truth[r][start:start + len(drafts)]
        a = 0
        while a < len(drafts) and drafts[a] == want[a]:
            a += 1
        self.rounds += 1
        self.accepted += a
        for j in range(len(drafts)):
            self.drafted_at[j] += 1
        for j in range(a):
            self.accepted_at[j] += 1
        self.known[r] += a + 1
        self.generated[r] += a + 1

    def summary(self):
        return rate_summary(self.rounds, self.accepted, self.drafted_at, self.accepted_at)


def rate_summary(rounds, accepted, drafted_at, accepted_at):
    """spec_bench's numbers: 1 + accepted / rounds, and accepted / drafted at each position."""
    return {"rounds": rounds, "accepted": accepted,
            "tokens_per_round": round(1.0 + accepted / max(1, rounds), 4),
            "accept_rate_by_position": [round(a / max(1, d), 4) for a, d in
                                        zip(accepted_at, drafted_at)],
            "drafted_at": list(drafted_at), "accepted_at": list(accepted_at)}


def pool(parts):
    """RoundSim summaries of several batches as one (spec_bench pools all its requests)."""
    k = len(parts[0]["drafted_at"])
    return rate_summary(sum(p["rounds"] for p in parts), sum(p["accepted"] for p in parts),
                        [sum(p["drafted_at"][j] for p in parts) for j in range(k)],
                        [sum(p["accepted_at"][j] for p in parts) for j in range(k)])


def run_rounds(truth, prompt_lens, max_tokens, k, drafter):
    """Runs RoundSim to the end; drafter(requests, lasts, k) returns each request's k drafts."""
    sim = RoundSim(truth, prompt_lens, max_tokens, k)
    while True:
        todo = sim.pending()
        if not todo:
            return sim.summary()
        drafts = drafter([r for r, _, _ in todo], [last for _, last, _ in todo],
                         max(n for _, _, n in todo))
        for (r, _, n), d in zip(todo, drafts):
            sim.apply(r, list(d[:n]))


# ----------------------------------------------------------------------------------------------
# torch: the target's continuation, the drafters.

def greedy_extend(model, buf, last, n):
    """buf [B, L] ids, right-padded (L > max(last) + n); last [B]: each row's last known index.
    Writes the model's n greedy tokens at last+1 .. last+n, recomputed without a cache (what
    follows a row's last token never matters to a causal model). Returns them, [B, n]."""
    torch = te.torch
    rows = torch.arange(buf.shape[0], device=buf.device)
    cur, out = last.clone(), []
    with torch.no_grad():
        for _ in range(n):
            _, h = model.forward(buf[:, :int(cur.max()) + 1])
            nxt = model.logits(h[rows, cur]).argmax(-1)
            buf[rows, cur + 1] = nxt
            out.append(nxt)
            cur = cur + 1
    return torch.stack(out, dim=-1)


def continue_prompts(tg, prompts, max_tokens, k_max, device):
    """The target's greedy continuation of each prompt (ids with BOS). Returns (truth lists:
    prompt + max_tokens tokens, the padded buffer [B, L] on device)."""
    torch = te.torch
    longest = max(len(p) for p in prompts)
    buf = torch.zeros(len(prompts), longest + max_tokens + k_max + 2, dtype=torch.long,
                      device=device)
    for i, p in enumerate(prompts):
        buf[i, :len(p)] = torch.tensor(p, dtype=torch.long)
    last = torch.tensor([len(p) - 1 for p in prompts], device=device)
    gen = greedy_extend(tg, buf, last, max_tokens).tolist()
    return [p + g for p, g in zip(prompts, gen)], buf


def head_drafter(tg, head, vm, buf, aux_ids, k_max):
    """Every anchor's greedy chain of the head on the target's sequences (draft_chains), looked
    up per round: a round after index `last` is anchor last - 1's chain."""
    with te.torch.no_grad():
        aux, _ = tg.forward(buf, aux_ids)
    feats = te.torch.cat(aux, dim=-1).float()
    chains = te.draft_chains(head, buf, feats, k_max, te.pick_draft_vocab, vm).tolist()
    return lambda rows, lasts, k: [chains[r][last - 1][:k] for r, last in zip(rows, lasts)]


def model_drafter(draft, buf):
    """A draft model drafting greedily after each request's committed tokens."""
    torch = te.torch

    def drafter(rows, lasts, k):
        idx = torch.tensor(rows, device=buf.device)
        return greedy_extend(draft, buf[idx].clone(), torch.tensor(lasts, device=buf.device),
                             k).tolist()
    return drafter


def serve_eval(tg, prompts, ks, max_tokens, aux_ids, head=None, vm=None, draft=None,
               batch=64):
    """Tokens per round at each K for the head and/or the draft model on prompts (lists of ids,
    BOS first), batch prompts at a time; the rounds of all batches are pooled, as spec_bench
    pools its requests."""
    t0, k_max = time.time(), max(ks)
    sims = {}
    for i in range(0, len(prompts), batch):
        part = prompts[i:i + batch]
        truth, buf = continue_prompts(tg, part, max_tokens, k_max, tg.embed.device)
        lens = [len(p) for p in part]
        drafters = {}
        if head is not None:
            drafters["eagle3_head"] = head_drafter(tg, head, vm, buf, aux_ids, k_max)
        if draft is not None:
            drafters["draft_model"] = model_drafter(draft, buf)
        for name, drafter in drafters.items():
            for k in ks:
                sims.setdefault((name, k), []).append(
                    run_rounds(truth, lens, max_tokens, k, drafter))
    res = {"prompts": len(prompts), "max_tokens": max_tokens,
           "mean_prompt_tokens": sum(len(p) for p in prompts) / max(1, len(prompts))}
    for (name, k), parts in sims.items():
        res.setdefault(name, {})[f"k{k}"] = pool(parts)
    res["seconds"] = round(time.time() - t0, 1)
    return res


def format_table(res):
    """One line per drafter and K: tokens per round and acceptance by position."""
    lines = []
    for name in ("draft_model", "eagle3_head"):
        for k, r in sorted(res.get(name, {}).items(), key=lambda kv: int(kv[0][1:])):
            rates = " ".join(f"{x:.2f}" for x in r.get("accept_rate_by_position") or [])
            lines.append(f"  {name:12s} {k:3s} {r['tokens_per_round']:.2f} tokens/round  {rates}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Self-test (run by train_eagle3.py --self-test).

def self_test():
    """Pure Python: prompts from held-out texts, and RoundSim against hand-counted rounds."""
    check = te.check
    texts = ["short", "a" * 700, "PROMPT" + "b" * 700, "c" * 900, "d" * 601]
    got, skipped = serve_prompt_texts(texts, ["PROMPT"], 10, 0)
    check(skipped == 1 and [p[0] for p in got] == ["a", "c", "d"]
          and all(200 <= len(p) <= 500 for p in got)
          and serve_prompt_texts(texts, [], 2, 0)[0] == got[:1] + [texts[2][:len(got[1])]],
          "serve_eval: prompts = the first 200-500 chars of files > 600 chars, benchmark's out")
    truth, n = [list(range(100, 180))], 64
    perfect = run_rounds(truth, [10], n, 4, lambda rows, lasts, k: [
        truth[r][last + 1:last + 1 + k] for r, last in zip(rows, lasts)])
    # generated 1, 6, ..., 61 (12 full rounds), then min(4, 64 - 61 - 1) = 2 drafts: 64.
    check(perfect["rounds"] == 13 and perfect["accepted"] == 50
          and perfect["drafted_at"] == [13, 13, 12, 12]
          and abs(perfect["tokens_per_round"] - (1 + 50 / 13)) < 1e-4,
          "serve_eval: a perfect drafter, K 4, 64 tokens: 13 rounds, 50 accepted")
    wrong = run_rounds(truth, [10], n, 7, lambda rows, lasts, k: [[0] * k for _ in rows])
    check(wrong["rounds"] == 62 and wrong["accepted"] == 0 and wrong["tokens_per_round"] == 1.0
          and wrong["drafted_at"] == [62, 61, 60, 59, 58, 57, 56],
          "serve_eval: a drafter never right: 62 rounds of 1 token, the last a plain step")
    seen, pair = [], truth * 2

    def two_right(rows, lasts, k):  # first two drafts right, the third wrong
        seen.extend(lasts)
        return [pair[r][last + 1:last + 3] + [0] * (k - 2) for r, last in zip(rows, lasts)]
    res = run_rounds(pair, [10, 20], 10, 4, two_right)
    # per request: generated 1 -> 4 -> 7 (k = min(4, 10 - 7 - 1) = 2, both right) -> 10.
    check(res["rounds"] == 6 and res["accepted"] == 12 and seen[:2] == [10, 20]
          and seen[2:4] == [13, 23] and res["accept_rate_by_position"][:3] == [1.0, 1.0, 0.0]
          and res["drafted_at"] == [6, 6, 4, 4],
          "serve_eval: rounds start after the prefill's token; K capped near max_tokens")
    check(pool([res, res])["rounds"] == 12 and pool([res, res])["accepted"] == 24
          and pool([res, res])["accept_rate_by_position"] == res["accept_rate_by_position"],
          "serve_eval: batches pool as one")


def torch_self_test(head, vm, tg):
    """greedy_extend against a one-row-at-a-time loop; the head's round drafts against the
    engine-style one-anchor decoding (train_eagle3.reference_chain)."""
    torch, check = te.torch, te.check
    prompts = [[0, 5, 7, 9, 3], [0, 11, 2], [0, 4, 4, 8, 1, 6, 3]]
    truth, buf = continue_prompts(tg, prompts, 6, 3, torch.device("cpu"))
    ok = True
    for p, t in zip(prompts, truth):
        seq = list(p)
        with torch.no_grad():
            for _ in range(6):
                _, h = tg.forward(torch.tensor([seq]))
                seq.append(int(tg.logits(h[0, -1]).argmax()))
        ok = ok and seq == t and buf[prompts.index(p), :len(t)].tolist() == t
    check(ok, "serve_eval: batched greedy continuation = one prompt at a time")
    drafter = head_drafter(tg, head, vm, buf, [1, 3, 5], 4)
    with torch.no_grad():
        aux, _ = tg.forward(buf, [1, 3, 5])
    feats = torch.cat(aux, dim=-1).float()
    lasts = [len(p) for p in prompts]
    want = [te.reference_chain(head, buf[r], feats[r], last - 1, 4, vm)
            for r, last in enumerate(lasts)]
    check(drafter([0, 1, 2], lasts, 4) == want,
          "serve_eval: a round's head drafts = the engine's chain after the last committed token")
    md = model_drafter(tg, buf)(
        [2, 0], [len(prompts[2]), len(prompts[0])], 3)
    check(md == [truth[2][len(prompts[2]) + 1:][:3], truth[0][len(prompts[0]) + 1:][:3]],
          "serve_eval: the target as its own draft model drafts its greedy tokens")


# ----------------------------------------------------------------------------------------------
# On its own: a saved head and a draft model on a prompts file.

def load_head(head_dir, tg):
    """A head this script family saved (config.json, model.safetensors) on the target's device,
    float32, and its VocabMap."""
    torch = te.torch
    hcfg = te.read_head_config(head_dir)
    w = te.load_weights(head_dir)
    d2t = w["d2t"].long()
    params = {n: w[n].float().to(tg.embed.device) for n in te.HEAD_WEIGHTS}
    vm = te.VocabMap((torch.arange(d2t.numel()) + d2t).tolist(), tg.vocab, tg.embed.device)
    return te.Head(hcfg, params, tg.embed.float(), tg.cos, tg.sin), hcfg, vm


def read_prompts(path):
    with open(path) as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def encode_prompts(texts, target_dir, ids_path):
    """BOS + the tokenizer's ids of each text; with ids_path, the ids recorded there (a
    tokenizer_vectors.jsonl: {"text", "ids"} without BOS) instead of tokenizers."""
    if ids_path:
        known = {}
        with open(ids_path) as f:
            for line in f:
                v = json.loads(line)
                known[v["text"]] = v["ids"]
        missing = [t for t in texts if t not in known]
        if missing:
            raise SystemExit(f"{ids_path}: no ids for {len(missing)} prompts")
        return [[te.BOS_ID] + known[t] for t in texts]
    tok = te.load_tokenizer(target_dir)
    return [[te.BOS_ID] + e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="models/codepair/target")
    ap.add_argument("--head", default="", help="EAGLE-3 head folder")
    ap.add_argument("--draft", default="", help="draft model folder")
    ap.add_argument("--prompts", default="models/codepair/prompts.jsonl")
    ap.add_argument("--ids", default="", help="tokenizer_vectors.jsonl with the prompts' ids")
    ap.add_argument("--limit", type=int, default=0, help="the first N prompts only")
    ap.add_argument("--ks", type=te.parse_int_list, default=[4, 7])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target-dtype", choices=["bf16", "fp32"], default="fp32")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default="", help="write the result as JSON here")
    args = ap.parse_args(argv)
    te.import_torch()
    torch = te.torch
    device = torch.device(args.device if args.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if args.target_dtype == "bf16" else torch.float32
    tg = te.Target(args.target, dtype, device)
    texts = read_prompts(args.prompts)[:args.limit or None]
    prompts = encode_prompts(texts, args.target, args.ids)
    head = vm = draft = None
    aux_ids = [1, 3, 5]
    if args.head:
        head, hcfg, vm = load_head(args.head, tg)
        aux_ids = hcfg["eagle_aux_hidden_state_layer_ids"]
    if args.draft:
        draft = te.Target(args.draft, dtype, device)
    res = serve_eval(tg, prompts, args.ks, args.max_tokens, aux_ids, head, vm, draft, args.batch)
    res.update(head=args.head, draft=args.draft, prompts_file=args.prompts, device=str(device),
               target_dtype=args.target_dtype, torch=torch.__version__)
    print(format_table(res))
    if args.out:
        te.write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
