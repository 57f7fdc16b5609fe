#!/usr/bin/env python3
"""Adapt the codepair draft into a PARD parallel draft model (one forward pass, K drafts).

PARD (Zhang et al., "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
Adaptation", arXiv 2504.18583): a small causal LM that, given a context x_0..x_t followed
by K-1 copies of a mask token m (RoPE positions t+1..t+K-1), predicts x_{t+1} at row t (the
ordinary next-token output) and x_{t+1+j} at the j-th mask row (j = 1..K-1). The engine
appends the K-1 masks, runs one causal pass, reads logits rows t..t+K-1 as drafts 1..K, and
throws the masks' KV away.

    python3 tools/train/train_pard.py --draft models/codepair/draft \
        --target models/codepair/target --out models/codepair/pard [--steps N] \
        [--time-budget-s S] [--quick]
    python3 tools/train/train_pard.py --self-test     # pure python, no torch needed

Data (as models/codepair/PROVENANCE.md): *.py files of 200..300,000 bytes under the
interpreter's sysconfig purelib/platlib/stdlib and site.getsitepackages() (--roots),
sorted, held out when int(sha1(path)[:8], 16) % 100 < 2 (the pair's own rule, so on the
same machine layout the held-out files were never trained on); each file is tokenized
with <draft>/tokenizer.json (raw text, no special tokens) and wrapped as BOS 0 ... EOS 1;
the train files are shuffled (--seed), tokenized until --max-train-tokens, concatenated
and cut into non-overlapping --context windows.

Training row (packs many anchors into one sequence): the window's T tokens (normal part),
then for each of A anchors t (random, distinct, in [--anchor-min, T-K-1]) a block of K-1
mask tokens at positions t+1..t+K-1. Attention (an explicit boolean mask): a normal token
sees the normal tokens at positions <= its own (plain causal); a mask token of anchor t
sees the normal tokens x_0..x_t and the masks of its own block up to itself. Each row's
attended (token, position) set equals that of the literal inference input
x_0..x_t m..m, so every mask row computes exactly what inference computes (checked on the
device before training, and in --self-test). Targets are the data's true tokens (hard
labels): a normal token at position p predicts x_{p+1} (draft offset 1); the j-th mask of
anchor t predicts x_{t+1+j} (offset j+1). Loss: cross-entropy averaged separately per
offset, then (ntp_weight * L_1 + L_2 + ... + L_K) / (ntp_weight + K - 1), i.e. the K
offsets weigh equally whatever their token counts (offset 1 has ~T tokens per row, the
others A each).

Model: plain-torch HF Llama forward (generic over config.json: GQA/MQA, RMSNorm, SiLU MLP,
rotate-half RoPE with float32 frequencies, tied or untied head), explicit position ids and
boolean mask; fp32 master weights, bf16 autocast on CUDA, AdamW (betas 0.9/0.95), linear
warm-up then cosine to --min-lr-ratio * lr; the cosine's progress is the larger of
steps/--steps and elapsed/--time-budget-s, so a run stopped by the time budget still ends
annealed. All weights are fine-tuned.

Checks before training (the run stops if one fails): the plain-torch forward of draft and
target reproduces the HF top-8 logits of ../golden.json (fp32); the vectorized batch
layout equals build_layout(); its mask equals the pure-python rule; and the packed rows'
logits equal those of the literal inference input (fp32). --self-test checks the pure
pieces: the safetensors writer/reader (BF16 bit-exact; the real checkpoints' names and
shapes), file collection, split, tokenization, windows, the layout, the lr schedule.

Output (--out): config.json = the draft's config + "pard_token"; model.safetensors with
the draft's tensor names, order, shapes and dtype (BF16), __metadata__ {"format": "pt"};
tokenizer.json, tokenizer_config.json, generation_config.json copied from the draft; and
train_info.json (arguments, corpus counts, training log, held-out per-offset losses before
and after, evaluation).

Evaluation (fp32, on the saved BF16 weights): on --eval-windows held-out windows, anchors
t = 64, 80, ... (< T); the target's greedy continuation of x_0..x_t (K tokens) is the
truth. PARD: one pass over x_0..x_t + K-1 masks, argmax of rows t..t+K-1. Baseline: the
original draft run autoregressively (K greedy steps). Reported for K in --eval-ks: mean
accepted length (leading drafts equal to the target's tokens) and tokens per round
(accepted + 1), plus each draft position's match rate.
"""
import argparse
import hashlib
import json
import math
import os
import random
import shutil
import site
import struct
import sysconfig
import tempfile
import time
from array import array
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IGNORE = -100
LAYOUT_KEYS = ("ids", "pos", "ctx", "blk", "tgt", "off")
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")

torch = None  # imported lazily by load_torch(): --self-test runs without torch
F = None


def load_torch():
    global torch, F
    import torch as torch_module
    import torch.nn.functional as functional
    torch, F = torch_module, functional


def log(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# safetensors, pure python: tensors are {name: (dtype, shape, raw little-endian bytes)}

DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8}


def write_safetensors(path, tensors, metadata=None):
    """Write tensors in dict order; header JSON padded with spaces to a multiple of 8."""
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        size = DTYPE_SIZES[dtype] * math.prod(shape)
        if len(raw) != size:
            raise ValueError(f"{name}: {len(raw)} bytes, expected {size}")
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for dtype, shape, raw in tensors.values():
            f.write(raw)


def read_safetensors(path):
    """Return ({name: (dtype, shape, raw)} in header order, metadata or None)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), data[8 + n + begin:8 + n + end])
    return out, meta


def read_checkpoint(model_dir):
    """One model.safetensors, or the shards named by model.safetensors.index.json."""
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    if single.exists():
        return read_safetensors(single)[0]
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(read_safetensors(model_dir / shard)[0])
    missing = set(index["weight_map"]) - set(out)
    if missing:
        raise ValueError(f"{model_dir}: tensors missing from shards: {sorted(missing)}")
    return out


def float_to_bf16_bits(x):
    """float -> bf16 bit pattern, round to nearest even (finite values)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def bf16_bits_to_float(b):
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


def weight_shapes(cfg):
    """HF LlamaForCausalLM tensor names -> shapes for this config."""
    d = model_dims(cfg)
    H, I, hd = d["H"], d["I"], d["hd"]
    s = {"model.embed_tokens.weight": (d["V"], H), "model.norm.weight": (H,)}
    for layer in range(d["layers"]):
        p = f"model.layers.{layer}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "self_attn.q_proj.weight"] = (d["nh"] * hd, H)
        s[p + "self_attn.k_proj.weight"] = (d["nkv"] * hd, H)
        s[p + "self_attn.v_proj.weight"] = (d["nkv"] * hd, H)
        s[p + "self_attn.o_proj.weight"] = (H, d["nh"] * hd)
        s[p + "mlp.gate_proj.weight"] = (I, H)
        s[p + "mlp.up_proj.weight"] = (I, H)
        s[p + "mlp.down_proj.weight"] = (H, I)
    if not d["tied"]:
        s["lm_head.weight"] = (d["V"], H)
    return s


def check_checkpoint(raw, cfg, where):
    want = weight_shapes(cfg)
    if set(raw) != set(want):
        raise ValueError(f"{where}: tensor names differ from the config's: "
                         f"extra {sorted(set(raw) - set(want))}, "
                         f"missing {sorted(set(want) - set(raw))}")
    for name, shape in want.items():
        if tuple(raw[name][1]) != shape:
            raise ValueError(f"{where}: {name} has shape {raw[name][1]}, want {shape}")


# ----------------------------------------------------------------------------------------
# data: files, split, tokenization, windows (pure python)

def default_roots():
    """sysconfig purelib/platlib/stdlib, then site.getsitepackages() (what the pair used)."""
    paths = sysconfig.get_paths()
    roots = [paths.get(k) for k in ("purelib", "platlib", "stdlib")] + site.getsitepackages()
    return [r for i, r in enumerate(roots) if r and r not in roots[:i]]


def collect_py_files(roots, min_bytes, max_bytes):
    """Sorted *.py paths of min..max bytes under roots (a file reached twice kept once)."""
    seen, files = set(), []
    for root in roots:
        for dirpath, _, filenames in os.walk(root):
            for fn in filenames:
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fn)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                real = os.path.realpath(path)
                if min_bytes <= size <= max_bytes and real not in seen:
                    seen.add(real)
                    files.append(path)
    return sorted(files)


def is_held_out(path, percent):
    digest = hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()
    return int(digest[:8], 16) % 100 < percent


def split_files(files, percent):
    train = [p for p in files if not is_held_out(p, percent)]
    held = [p for p in files if is_held_out(p, percent)]
    return train, held


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def tokenize_files(files, encode_batch, max_tokens, bos, eos, chunk=128):
    """Concatenate BOS + ids + EOS per file until max_tokens (0: all) -> (array, docs)."""
    stream, docs = array("i"), 0
    for i in range(0, len(files), chunk):
        texts = [t for t in map(read_text, files[i:i + chunk]) if t]
        for ids in encode_batch(texts):
            stream.append(bos)
            stream.extend(ids)
            stream.append(eos)
            docs += 1
        if max_tokens and len(stream) >= max_tokens:
            break
    return stream, docs


def cut_windows(stream, context):
    """Non-overlapping windows of `context` tokens; the remainder is dropped."""
    return [list(stream[s:s + context]) for s in range(0, len(stream) - context + 1, context)]


# ----------------------------------------------------------------------------------------
# the packed PARD training row (pure python)

def sample_anchors(rng, T, K, A, lo):
    """min(A, available) distinct sorted anchors in [lo, T-K-1] (the last needs x_{t+K})."""
    hi = T - K - 1
    if hi < lo:
        raise ValueError(f"context {T} too short for K={K} and anchor-min {lo}")
    return sorted(rng.sample(range(lo, hi + 1), min(A, hi - lo + 1)))


def build_layout(tokens, anchors, K, mask_id):
    """One packed row, as parallel lists:
    ids: token ids; pos: RoPE positions; ctx: the last normal position the token sees;
    blk: -1 for normal tokens, else the anchor's index; tgt: label (IGNORE: none);
    off: the label's draft offset minus one (0 = next token, j = j-th mask; -1 none)."""
    T = len(tokens)
    lay = {"ids": list(tokens), "pos": list(range(T)), "ctx": list(range(T)),
           "blk": [-1] * T, "tgt": list(tokens[1:]) + [IGNORE], "off": [0] * (T - 1) + [-1]}
    for a, t in enumerate(anchors):
        if not 0 <= t <= T - K - 1:
            raise ValueError(f"anchor {t} out of range for T={T}, K={K}")
        for j in range(1, K):
            for key, v in zip(LAYOUT_KEYS, (mask_id, t + j, t, a, tokens[t + 1 + j], j)):
                lay[key].append(v)
    return lay


def may_attend(lay, i, j):
    """Row i attends column j: normal j up to i's context; same-block masks causally."""
    if lay["blk"][j] < 0:
        return lay["pos"][j] <= lay["ctx"][i]
    return lay["blk"][j] == lay["blk"][i] and lay["pos"][j] <= lay["pos"][i]


def attention_mask(lay):
    n = len(lay["ids"])
    return [[may_attend(lay, i, j) for j in range(n)] for i in range(n)]


def check_layout(lay, tokens, anchors, K, mask_id):
    """Assert each row sees exactly what the literal inference input's row sees, and its
    label is the true next token of its position."""
    mask = attention_mask(lay)
    for i in range(len(lay["ids"])):
        p, c = lay["pos"][i], lay["ctx"][i]
        literal = list(tokens[:c + 1]) + [mask_id] * (p - c)  # x_0..x_c, then masks to p
        seen = sorted((lay["ids"][j], lay["pos"][j]) for j in range(len(mask)) if mask[i][j])
        assert seen == sorted((tok, q) for q, tok in enumerate(literal)), (i, seen)
        if lay["tgt"][i] != IGNORE:
            assert lay["tgt"][i] == tokens[p + 1] and lay["off"][i] == p - c, i
    assert len(lay["ids"]) == len(tokens) + len(anchors) * (K - 1)


# ----------------------------------------------------------------------------------------
# small pure helpers

def lr_at(step, elapsed, a):
    if step <= a.warmup:
        return a.lr * step / max(1, a.warmup)
    progress = (step - a.warmup) / max(1, a.steps - a.warmup)
    if a.time_budget_s > 0:
        progress = max(progress, elapsed / a.time_budget_s)
    low = a.lr * a.min_lr_ratio
    return low + (a.lr - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def combine_offsets(per_offset, ntp_weight):
    """(w * L_1 + L_2 + ... + L_K) / (w + K - 1): offsets weighted equally."""
    return (ntp_weight * per_offset[0] + sum(per_offset[1:])) / (ntp_weight + len(per_offset) - 1)


def accepted_length(drafts, truth):
    n = 0
    for d, g in zip(drafts, truth):
        if d != g:
            break
        n += 1
    return n


def acceptance(drafts, truth, K):
    acc = [accepted_length(d[:K], g[:K]) for d, g in zip(drafts, truth)]
    mean = sum(acc) / len(acc)
    match = [sum(d[i] == g[i] for d, g in zip(drafts, truth)) / len(acc) for i in range(K)]
    return {"mean_accepted": mean, "tokens_per_round": mean + 1,
            "position_match": match, "contexts": len(acc)}


def eval_contexts(windows, a):
    return [w[:t + 1] for w in windows for t in range(a.eval_first, len(w), a.eval_stride)]


# ----------------------------------------------------------------------------------------
# the Llama forward in plain torch

def model_dims(cfg):
    nh = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0)}
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise ValueError("only default RoPE is implemented")
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("only bias-free SiLU Llama is implemented")
    return {"H": cfg["hidden_size"], "layers": cfg["num_hidden_layers"], "nh": nh,
            "nkv": cfg.get("num_key_value_heads") or nh,
            "hd": cfg.get("head_dim") or cfg["hidden_size"] // nh,
            "I": cfg["intermediate_size"], "V": cfg["vocab_size"], "eps": cfg["rms_norm_eps"],
            "theta": float(rope["rope_theta"]), "tied": bool(cfg.get("tie_word_embeddings"))}


def rms_norm(x, w, eps):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def sdpa(q, k, v, mask):
    """Scaled dot-product attention; mask: bool, True = attend; None = causal."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    if mask is None:  # torch < 2.0: plain matmul-softmax
        L = q.shape[-2]
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.float().masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


class Llama:
    """HF LlamaForCausalLM over a dict of HF-named fp32 tensors."""

    def __init__(self, cfg, weights):
        self.cfg, self.d, self.w = cfg, model_dims(cfg), weights

    def params(self):
        return list(self.w.values())

    def rope(self, pos):
        hd = self.d["hd"]
        exps = torch.arange(0, hd, 2, device=pos.device, dtype=torch.int64).float() / hd
        inv_freq = 1.0 / (self.d["theta"] ** exps)
        freqs = pos[..., None].float() * inv_freq  # [B, L, hd/2], float32
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, L, hd]
        return emb.cos(), emb.sin()

    def attention(self, p, x, cos, sin, mask):
        B, L, _ = x.shape
        nh, nkv, hd = self.d["nh"], self.d["nkv"], self.d["hd"]
        q = F.linear(x, self.w[p + "q_proj.weight"]).view(B, L, nh, hd).transpose(1, 2)
        k = F.linear(x, self.w[p + "k_proj.weight"]).view(B, L, nkv, hd).transpose(1, 2)
        v = F.linear(x, self.w[p + "v_proj.weight"]).view(B, L, nkv, hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if nkv != nh:  # HF repeat_kv: query head h uses KV head h // (nh / nkv)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
        o = sdpa(q, k, v, mask)
        return F.linear(o.transpose(1, 2).reshape(B, L, nh * hd), self.w[p + "o_proj.weight"])

    def mlp(self, p, x):
        gate = F.silu(F.linear(x, self.w[p + "gate_proj.weight"]))
        up = F.linear(x, self.w[p + "up_proj.weight"])
        return F.linear(gate * up, self.w[p + "down_proj.weight"])

    def hidden(self, ids, pos, mask=None):
        """ids, pos: [B, L] int64; mask: [B, 1, L, L] bool (True = attend) or None (causal).
        Returns the final-norm hidden states [B, L, H]."""
        w, eps = self.w, self.d["eps"]
        h = F.embedding(ids, w["model.embed_tokens.weight"])
        cos, sin = self.rope(pos)
        for layer in range(self.d["layers"]):
            p = f"model.layers.{layer}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
            h = h + self.attention(p + "self_attn.", x, cos, sin, mask)
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            h = h + self.mlp(p + "mlp.", x)
        return rms_norm(h, w["model.norm.weight"], eps)

    def logits(self, h):
        return F.linear(h, self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"]))


def bytes_to_tensor(dtype, shape, raw):
    tdt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
    return torch.frombuffer(bytearray(raw), dtype=tdt).reshape(shape).float()


def tensor_bytes(t, dtype):
    tdt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
    t = t.detach().to("cpu", tdt).contiguous()
    try:
        return t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()
    except (ImportError, RuntimeError):  # torch without numpy
        return bytes(t.flatten().view(torch.uint8).tolist())


def load_llama(model_dir, device):
    """-> (Llama with fp32 weights on device, {name: (dtype, shape)} in file order)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    raw = read_checkpoint(model_dir)
    check_checkpoint(raw, cfg, model_dir)
    weights = {n: bytes_to_tensor(*raw[n]).to(device) for n in raw}
    return Llama(cfg, weights), {n: (e[0], e[1]) for n, e in raw.items()}


# ----------------------------------------------------------------------------------------
# batches and the loss

def autocast(dev):
    return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")


def layouts_to_tensors(lays, dev):
    return {k: torch.tensor([lay[k] for lay in lays], dtype=torch.long).to(dev)
            for k in LAYOUT_KEYS}


def attention_mask_torch(pos, ctx, blk):
    """[B, L] descriptors -> [B, L, L] bool; the same rule as may_attend()."""
    normal_j = (blk < 0)[:, None, :]
    sees_ctx = pos[:, None, :] <= ctx[:, :, None]
    same_blk = (blk[:, :, None] == blk[:, None, :]) & ~normal_j
    causal = pos[:, None, :] <= pos[:, :, None]
    return (normal_j & sees_ctx) | (same_blk & causal)


def layout_tensors(rows, anchors, K, mask_id):
    """build_layout() for a batch, vectorized: rows [B, T], anchors [B, A] (int64, one
    device) -> {key: [B, T + A * (K - 1)]}; equal to the lists (checked in check_packed)."""
    B, T = rows.shape
    A, dev = anchors.shape[1], rows.device
    j = torch.arange(1, K, device=dev).expand(B, A, K - 1)
    t = anchors[:, :, None].expand(B, A, K - 1)
    blk = torch.arange(A, device=dev)[None, :, None].expand(B, A, K - 1)
    ar = torch.arange(T, device=dev).expand(B, T)

    def full(n, v):
        return torch.full((B, n), v, dtype=torch.long, device=dev)

    return {"ids": torch.cat([rows, full(A * (K - 1), mask_id)], 1),
            "pos": torch.cat([ar, (t + j).flatten(1)], 1),
            "ctx": torch.cat([ar, t.flatten(1)], 1),
            "blk": torch.cat([full(T, -1), blk.flatten(1)], 1),
            "tgt": torch.cat([rows[:, 1:], full(1, IGNORE),
                              rows.gather(1, (t + j + 1).flatten(1))], 1),
            "off": torch.cat([full(T - 1, 0), full(1, -1), j.flatten(1)], 1)}


def make_batch(rows, rng, a):
    """rows: int tensor [B, T] on the training device -> the packed batch (random anchors)."""
    B, T = rows.shape
    anchors = [sample_anchors(rng, T, a.k, a.anchors, a.anchor_min) for _ in range(B)]
    anchors = torch.tensor(anchors, dtype=torch.long).to(rows.device)
    return layout_tensors(rows.long(), anchors, a.k, a.pard_token)


def pard_loss(model, b, K):
    """-> (mean CE per offset [K], top-1 accuracy per offset [K], label count per offset [K])."""
    mask = attention_mask_torch(b["pos"], b["ctx"], b["blk"])[:, None]
    logits = model.logits(model.hidden(b["ids"], b["pos"], mask)).float()
    tgt, off = b["tgt"], b["off"]
    ce = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=IGNORE,
                         reduction="none").view_as(tgt)
    correct = (logits.argmax(-1) == tgt).float()
    losses, accs, counts = [], [], []
    for d in range(K):
        sel = (off == d).float()
        n = sel.sum()
        losses.append((ce * sel).sum() / n.clamp_min(1))
        accs.append((correct * sel).sum() / n.clamp_min(1))
        counts.append(n)
    return torch.stack(losses), torch.stack(accs), torch.stack(counts)


def offset_summary(tot, ntp_weight):
    """tot: [3, K] sums of (loss * n, acc * n, n) -> a JSON-able dict."""
    n = tot[2].clamp_min(1)
    loss = (tot[0] / n).tolist()
    return {"loss": combine_offsets(loss, ntp_weight), "loss_per_offset": loss,
            "acc_per_offset": (tot[1] / n).tolist(), "labels_per_offset": tot[2].tolist()}


def heldout_losses(model, windows, a, dev):
    """Teacher-forced per-offset loss on held-out windows (fixed anchors, bf16 autocast)."""
    rng, tot = random.Random(a.seed + 2), torch.zeros(3, a.k, device=dev)
    with torch.no_grad(), autocast(dev):
        for i in range(0, len(windows), a.batch):
            rows = torch.tensor(windows[i:i + a.batch], device=dev)
            loss, acc, n = pard_loss(model, make_batch(rows, rng, a), a.k)
            tot += torch.stack([loss * n, acc * n, n]).float()
    return offset_summary(tot, a.ntp_weight)


def check_goldens(model, name, golden_path, dev, n=2):
    """fp32 top-8 logits at the last prompt position vs models/codepair/golden.json (HF)."""
    if not Path(golden_path).exists():
        return None
    entries = json.loads(Path(golden_path).read_text()).get(name, [])[:n]
    worst, ids_equal = 0.0, True
    with torch.no_grad():
        for e in entries:
            ids = torch.tensor([e["prompt_ids"]], device=dev)
            pos = torch.arange(ids.shape[1], device=dev)[None]
            last = model.logits(model.hidden(ids, pos))[0, -1]
            top = torch.topk(last, 8)
            ids_equal &= top.indices.tolist() == e["last_logits_top8_ids"]
            want = torch.tensor(e["last_logits_top8"], device=dev)
            worst = max(worst, (last[e["last_logits_top8_ids"]] - want).abs().max().item())
    return {"prompts": len(entries), "top8_ids_equal": ids_equal, "max_abs_diff": worst}


def check_packed(model, window, a, dev):
    """The packed layout's rows give the logits of the literal inference input (fp32)."""
    K, m = a.k, a.pard_token
    anchors = sample_anchors(random.Random(a.seed + 3), len(window), K, 4, a.anchor_min)
    lay = build_layout(window, anchors, K, m)
    b = layouts_to_tensors([lay], dev)
    vec = layout_tensors(torch.tensor([window], device=dev),
                         torch.tensor([anchors], device=dev), K, m)
    same_layout = all(torch.equal(vec[key], b[key]) for key in LAYOUT_KEYS)
    mask = attention_mask_torch(b["pos"], b["ctx"], b["blk"])
    same = mask[0].cpu().tolist() == attention_mask(lay)
    worst = 0.0
    with torch.no_grad():
        packed = model.logits(model.hidden(b["ids"], b["pos"], mask[:, None]))[0]
        for i, t in enumerate(anchors):
            rows = [t] + [r for r, blk in enumerate(lay["blk"]) if blk == i]
            seq = window[:t + 1] + [m] * (K - 1)
            pos = torch.arange(len(seq), device=dev)[None]
            lit = model.logits(model.hidden(torch.tensor([seq], device=dev), pos))[0, t:t + K]
            worst = max(worst, (packed[rows] - lit).abs().max().item())
    return {"vectorized_layout_matches_python": same_layout, "mask_matches_python": same,
            "max_abs_logit_diff": worst, "anchors": anchors}


# ----------------------------------------------------------------------------------------
# training

def batch_indices(n, bs, gen, dev):
    while True:
        if n < bs:
            yield torch.randint(n, (bs,), generator=gen).to(dev)
            continue
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n - bs + 1, bs):
            yield perm[i:i + bs].to(dev)


def log_entry(step, elapsed, lr, stats, a):
    e = {"step": step, "elapsed_s": round(elapsed, 1), "lr": lr,
         **offset_summary(stats, a.ntp_weight)}
    log(f"step {step:5d}/{a.steps} {elapsed:7.1f}s lr {lr:.2e} loss {e['loss']:.4f} | loss/off "
        + " ".join(f"{x:.3f}" for x in e["loss_per_offset"]) + " | acc/off "
        + " ".join(f"{x:.3f}" for x in e["acc_per_offset"]))
    return e


def train(model, windows, a, dev):
    params = model.params()
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=a.weight_decay)
    rng, gen = random.Random(a.seed), torch.Generator().manual_seed(a.seed)
    windows = windows.to(dev)
    batches = batch_indices(windows.shape[0], a.batch, gen, dev)
    stats, history = torch.zeros(3, a.k, device=dev), []
    step, stopped, lr, t0 = 0, "steps", 0.0, time.time()
    while step < a.steps:
        elapsed = time.time() - t0
        if a.time_budget_s > 0 and elapsed >= a.time_budget_s:
            stopped = "time_budget"
            break
        step += 1
        lr = lr_at(step, elapsed, a)
        for g in opt.param_groups:
            g["lr"] = lr
        b = make_batch(windows[next(batches)], rng, a)
        with autocast(dev):
            loss_d, acc_d, n_d = pard_loss(model, b, a.k)
        opt.zero_grad(set_to_none=True)
        combine_offsets(loss_d, a.ntp_weight).backward()
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        stats += torch.stack([loss_d.detach() * n_d, acc_d * n_d, n_d])
        if step % a.log_every == 0:
            history.append(log_entry(step, time.time() - t0, lr, stats, a))
            stats.zero_()
    if stats[2].sum() > 0:
        history.append(log_entry(step, time.time() - t0, lr, stats, a))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    for p in params:
        p.requires_grad_(False)
    return {"steps": step, "stopped_by": stopped, "wall_s": time.time() - t0,
            "windows_seen": step * a.batch, "final": history[-1] if history else None,
            "log": history}


def save_model(model, spec, a):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {n: (dt, shape, tensor_bytes(model.w[n], dt)) for n, (dt, shape) in spec.items()}
    write_safetensors(out / "model.safetensors", tensors, {"format": "pt"})
    cfg = dict(model.cfg, pard_token=a.pard_token)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in COPIED_FILES:
        shutil.copyfile(Path(a.draft) / name, out / name)


# ----------------------------------------------------------------------------------------
# inference-style evaluation (fp32, right-padded causal batches)

def argmax_rows(model, seqs, rows, dev, chunk):
    """Causal forward of each token list; the argmax token at each requested row index."""
    out = []
    with torch.no_grad():
        for c in range(0, len(seqs), chunk):
            ss, rr = seqs[c:c + chunk], rows[c:c + chunk]
            L = max(map(len, ss))
            ids = torch.tensor([s + [0] * (L - len(s)) for s in ss], device=dev)
            pos = torch.arange(L, device=dev).expand(len(ss), L)
            h = model.hidden(ids, pos)
            bi = torch.tensor([i for i, r in enumerate(rr) for _ in r], device=dev)
            ri = torch.tensor([x for r in rr for x in r], device=dev)
            pred = model.logits(h[bi, ri]).argmax(-1).tolist()
            for r in rr:
                out.append(pred[:len(r)])
                pred = pred[len(r):]
    return out


def greedy_rollout(model, ctxs, steps, dev, chunk):
    outs = [[] for _ in ctxs]
    for _ in range(steps):
        seqs = [c + o for c, o in zip(ctxs, outs)]
        for o, p in zip(outs, argmax_rows(model, seqs, [[len(s) - 1] for s in seqs], dev, chunk)):
            o.append(p[0])
    return outs


def pard_drafts(model, ctxs, K, mask_id, dev, chunk):
    seqs = [c + [mask_id] * (K - 1) for c in ctxs]
    rows = [list(range(len(c) - 1, len(c) - 1 + K)) for c in ctxs]
    return argmax_rows(model, seqs, rows, dev, chunk)


def print_eval(results):
    log(f"{'K':>3}  {'drafter':<30}{'accepted':>10}{'tokens/round':>14}   match per position")
    for K, r in results.items():
        for name, v in r.items():
            if isinstance(v, dict):
                log(f"{K:>3}  {name:<30}{v['mean_accepted']:>10.3f}"
                    f"{v['tokens_per_round']:>14.3f}   "
                    + " ".join(f"{x:.2f}" for x in v["position_match"]))


# ----------------------------------------------------------------------------------------
# driver

def prepare_data(a, cfg, info):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(Path(a.draft) / "tokenizer.json"))
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def enc(texts):
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    roots = a.roots or default_roots()
    files = collect_py_files(roots, a.min_bytes, a.max_bytes)
    train_f, held_f = split_files(files, a.held_percent)
    random.Random(a.seed).shuffle(train_f)
    random.Random(a.seed).shuffle(held_f)
    bos, eos = cfg["bos_token_id"], cfg["eos_token_id"]
    train_s, train_docs = tokenize_files(train_f, enc, a.max_train_tokens, bos, eos)
    held_s, held_docs = tokenize_files(held_f, enc, a.max_held_tokens, bos, eos)
    n = len(train_s) // a.context
    if n == 0:
        raise SystemExit("no training windows: corpus too small")
    windows = torch.frombuffer(train_s, dtype=torch.int32)[:n * a.context].clone()
    windows = windows.view(n, a.context)
    held_w = cut_windows(held_s, a.context)
    eval_w = random.Random(a.seed + 1).sample(held_w, min(a.eval_windows, len(held_w)))
    if not eval_w:
        raise SystemExit("no held-out windows")
    info["data"] = {"roots": roots, "files": len(files), "train_files": len(train_f),
                    "held_files": len(held_f), "train_docs_tokenized": train_docs,
                    "held_docs_tokenized": held_docs, "train_tokens": len(train_s),
                    "held_tokens": len(held_s), "train_windows": n, "held_windows": len(held_w),
                    "eval_windows": len(eval_w), "pard_token_text": tok.id_to_token(a.pard_token),
                    "pard_token_in_train_windows": int((windows == a.pard_token).sum())}
    log(f"data: {json.dumps(info['data'])}")
    return windows, eval_w


def jsonable(v):
    return str(v) if isinstance(v, Path) else v


def check_forward(draft, target, a, dev, info):
    if draft.d["V"] != target.d["V"] or not 0 <= a.pard_token < draft.d["V"] or a.k < 2:
        raise SystemExit("vocab mismatch, pard token out of range, or K < 2")
    golden = Path(a.draft).resolve().parent / "golden.json"
    info["golden_check"] = {n: check_goldens(m, n, golden, dev)
                            for n, m in (("draft", draft), ("target", target))}
    log(f"forward vs HF goldens: {info['golden_check']}")
    if any(g and g["max_abs_diff"] > 0.1 for g in info["golden_check"].values()):
        raise SystemExit("the plain-torch Llama forward does not reproduce the HF goldens")


def check_layout_on_device(draft, window, a, dev, info):
    pc = info["packed_check"] = check_packed(draft, window, a, dev)
    log(f"packed-vs-literal check: {pc}")
    if not (pc["vectorized_layout_matches_python"] and pc["mask_matches_python"]) \
            or pc["max_abs_logit_diff"] > 0.05:
        raise SystemExit("packed layout does not reproduce the inference input: not training")


def baseline_eval(draft, target, eval_w, a, dev, info):
    """Target greedy truth, the draft's AR drafts and its (untrained) PARD drafts."""
    t0 = time.time()
    ctxs = eval_contexts(eval_w, a)
    base = {"ctxs": ctxs,
            "truth": greedy_rollout(target, ctxs, max(a.eval_ks), dev, a.eval_chunk),
            "ar": greedy_rollout(draft, ctxs, max(a.eval_ks), dev, a.eval_chunk),
            "before": {K: pard_drafts(draft, ctxs, K, a.pard_token, dev, a.eval_chunk)
                       for K in a.eval_ks}}
    info["heldout_before"] = heldout_losses(draft, eval_w, a, dev)
    log(f"baseline eval ({len(ctxs)} contexts) {time.time() - t0:.1f}s; held-out before: "
        f"{json.dumps(info['heldout_before'])}")
    return base


def final_eval(pard, base, eval_w, a, dev, info):
    info["heldout_after"] = heldout_losses(pard, eval_w, a, dev)
    log(f"held-out after: {json.dumps(info['heldout_after'])}")
    ctxs, truth, results = base["ctxs"], base["truth"], {}
    for K in a.eval_ks:
        drafts = pard_drafts(pard, ctxs, K, a.pard_token, dev, a.eval_chunk)
        results[K] = {"draft_autoregressive": acceptance(base["ar"], truth, K),
                      "pard": acceptance(drafts, truth, K),
                      "pard_token_on_untrained_draft": acceptance(base["before"][K], truth, K)}
    info["eval"] = {"contexts": len(ctxs), "windows": len(eval_w), "anchor_first": a.eval_first,
                    "anchor_stride": a.eval_stride, "precision": "float32 (saved bf16 weights)",
                    "truth": "target greedy continuation",
                    **{f"K{K}": r for K, r in results.items()}}
    print_eval(results)


def run(a):
    load_torch()
    t_start = time.time()
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 evaluation stays fp32
    torch.backends.cudnn.allow_tf32 = False
    info = {"args": {k: jsonable(v) for k, v in vars(a).items()}, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}
    draft, spec = load_llama(a.draft, dev)
    target, _ = load_llama(a.target, dev)
    check_forward(draft, target, a, dev, info)
    windows, eval_w = prepare_data(a, draft.cfg, info)
    info["prep_s"] = time.time() - t_start
    log(f"device {info['device']}; data ready in {info['prep_s']:.1f}s")
    check_layout_on_device(draft, eval_w[0], a, dev, info)
    base = baseline_eval(draft, target, eval_w, a, dev, info)
    info["train"] = train(draft, windows, a, dev)
    save_model(draft, spec, a)
    pard, _ = load_llama(a.out, dev)  # evaluate the saved BF16 weights
    final_eval(pard, base, eval_w, a, dev, info)
    info["total_wall_s"] = time.time() - t_start
    (Path(a.out) / "train_info.json").write_text(json.dumps(info, indent=1) + "\n")
    log(f"saved {a.out} in {info['total_wall_s']:.1f}s total")


# ----------------------------------------------------------------------------------------
# self-test (pure python)

def self_test_safetensors():
    vals = [1.0, -2.5, 0.15625, 3.140625, -0.0, 65280.0]
    bits = [float_to_bf16_bits(v) for v in vals]
    raw = struct.pack("<6H", *bits)
    assert float_to_bf16_bits(1.00390625) == 0x3F80  # halfway, rounds to even (down)
    assert float_to_bf16_bits(1.01171875) == 0x3F82  # halfway, rounds to even (up)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.safetensors")
        write_safetensors(path, {"w": ("BF16", (2, 3), raw)}, {"format": "pt"})
        got, meta = read_safetensors(path)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
        assert n % 8 == 0 and os.path.getsize(path) == 8 + n + 12
    assert meta == {"format": "pt"} and list(got) == ["w"]
    assert got["w"] == ("BF16", (2, 3), raw)
    back = struct.unpack("<6H", got["w"][2])
    assert list(back) == bits and [bf16_bits_to_float(b) for b in back] == vals
    assert struct.pack("<f", bf16_bits_to_float(bits[4]))[3] == 0x80  # -0.0 kept its sign
    log("self-test: safetensors BF16 2x3 write/read bit-exact: ok")


def self_test_real_checkpoints():
    """Names/shapes of models/codepair/{draft,target} match weight_shapes(); round trip."""
    for name in ("draft", "target"):
        d = REPO / "models" / "codepair" / name
        if not (d / "config.json").exists():
            log(f"self-test: {d} absent, skipped")
            continue
        cfg = json.loads((d / "config.json").read_text())
        raw = read_checkpoint(d)
        check_checkpoint(raw, cfg, d)
        assert all(e[0] == "BF16" for e in raw.values())
        with tempfile.TemporaryDirectory() as tmp:
            write_safetensors(os.path.join(tmp, "m.safetensors"), raw, {"format": "pt"})
            again, meta = read_safetensors(os.path.join(tmp, "m.safetensors"))
        assert again == raw and list(again) == list(raw) and meta == {"format": "pt"}
        log(f"self-test: {name}: {len(raw)} tensors match the config, round trip ok")


def self_test_data():
    with tempfile.TemporaryDirectory() as d:
        sub = os.path.join(d, "pkg")
        os.makedirs(sub)
        sizes = {"a.py": 300, "small.py": 50, "c.txt": 300, "pkg/d.py": 500, "pkg/big.py": 5000}
        for rel, size in sizes.items():
            with open(os.path.join(d, rel), "w") as f:
                f.write(("x = 1\n" * size)[:size])
        files = collect_py_files([d, sub], 200, 1000)  # overlapping roots: no duplicates
        assert files == sorted([os.path.join(d, "a.py"), os.path.join(sub, "d.py")]), files

        def fake_encode(texts):
            return [[ord(ch) + 10 for ch in t] for t in texts]

        stream, docs = tokenize_files(files, fake_encode, 0, 0, 1)
        assert docs == 2 and len(stream) == 300 + 500 + 4
        assert stream[0] == 0 and stream[301] == 1 and stream[302] == 0 and stream[-1] == 1
        assert stream[1] == ord("x") + 10
        part, docs = tokenize_files(files, fake_encode, 100, 0, 1, chunk=1)
        assert docs == 1 and len(part) == 302
    paths = [f"/usr/lib/python3/site-packages/pkg{i}/mod{i % 7}.py" for i in range(20000)]
    train, held = split_files(paths, 2)
    assert len(train) + len(held) == 20000 and 300 <= len(held) <= 500, len(held)
    assert split_files(paths, 2) == (train, held) and not set(train) & set(held)
    digest = hashlib.sha1(paths[0].encode()).hexdigest()
    assert is_held_out(paths[0], 2) == (int(digest[:8], 16) % 100 < 2)
    assert cut_windows(array("i", range(20)), 8) == [list(range(8)), list(range(8, 16))]
    assert cut_windows(list(range(7)), 8) == []
    log(f"self-test: files, split ({len(held)}/20000 held out), tokenize, windows: ok")


def self_test_layout():
    toks, K, m = [100 + i for i in range(12)], 3, 2
    lay = build_layout(toks, [3, 6], K, m)
    assert lay["ids"] == toks + [m] * 4
    assert lay["pos"] == list(range(12)) + [4, 5, 7, 8]
    assert lay["ctx"] == list(range(12)) + [3, 3, 6, 6]
    assert lay["blk"] == [-1] * 12 + [0, 0, 1, 1]
    assert lay["tgt"] == toks[1:] + [IGNORE] + [toks[5], toks[6], toks[8], toks[9]]
    assert lay["off"] == [0] * 11 + [-1] + [1, 2, 1, 2]
    mask = attention_mask(lay)

    def row(cols):
        return [j in cols for j in range(16)]

    assert mask[5] == row(range(6))  # normal: causal over normal tokens only
    assert mask[11] == row(range(12))
    assert mask[12] == row([0, 1, 2, 3, 12])  # anchor 3, mask 1 (pos 4)
    assert mask[13] == row([0, 1, 2, 3, 12, 13])  # anchor 3, mask 2 (pos 5)
    assert mask[14] == row([0, 1, 2, 3, 4, 5, 6, 14])
    assert mask[15] == row([0, 1, 2, 3, 4, 5, 6, 14, 15])
    check_layout(lay, toks, [3, 6], K, m)
    rng = random.Random(0)
    toks = [rng.randrange(5, 50) for _ in range(64)]
    for K in (2, 4, 8):
        anchors = sample_anchors(rng, 64, K, 10, 16)
        assert len(set(anchors)) == 10 and anchors == sorted(anchors)
        assert 16 <= anchors[0] and anchors[-1] <= 64 - K - 1
        check_layout(build_layout(toks, anchors, K, m), toks, anchors, K, m)
    assert len(sample_anchors(rng, 30, 8, 64, 16)) == 6  # clamped to the 6 legal anchors
    log("self-test: packed layout (positions, mask, targets) == literal inference rows: ok")


def self_test_misc():
    a = argparse.Namespace(lr=1e-3, warmup=10, steps=110, time_budget_s=0, min_lr_ratio=0.1)
    assert lr_at(5, 0, a) == 5e-4 and lr_at(10, 0, a) == 1e-3
    assert abs(lr_at(60, 0, a) - 5.5e-4) < 1e-12 and abs(lr_at(110, 0, a) - 1e-4) < 1e-12
    a.time_budget_s = 100
    assert abs(lr_at(20, 100, a) - 1e-4) < 1e-12  # the time budget ends the cosine too
    assert combine_offsets([2.0, 1.0, 3.0], 1.0) == 2.0
    assert combine_offsets([2.0, 1.0, 3.0], 0.0) == 2.0
    assert accepted_length([1, 2, 3], [1, 2, 4]) == 2 and accepted_length([5], [1]) == 0
    r = acceptance([[1, 2, 3, 4], [1, 9, 3, 4]], [[1, 2, 3, 4], [1, 2, 3, 4]], 4)
    assert r["mean_accepted"] == 2.5 and r["tokens_per_round"] == 3.5
    assert r["position_match"] == [1.0, 0.5, 1.0, 1.0]
    w = [list(range(100, 228))]
    e = eval_contexts(w, argparse.Namespace(eval_first=64, eval_stride=16))
    assert [len(c) for c in e] == [65, 81, 97, 113] and e[0][-1] == 164
    log("self-test: lr schedule, loss weighting, acceptance, eval contexts: ok")


def self_test():
    self_test_safetensors()
    self_test_real_checkpoints()
    self_test_data()
    self_test_layout()
    self_test_misc()
    log("self-test: all ok")


# ----------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--self-test", action="store_true", help="pure-python checks, no torch")
    p.add_argument("--draft", type=Path, default=REPO / "models/codepair/draft")
    p.add_argument("--target", type=Path, default=REPO / "models/codepair/target")
    p.add_argument("--out", type=Path, default=None,
                   help="default models/codepair/pard (with --quick: /tmp/pard_quick)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: ~20 steps, context 128, tiny eval (options left at defaults)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--roots", nargs="*", default=None,
                   help="default: sysconfig purelib/platlib/stdlib + site.getsitepackages()")
    p.add_argument("--min-bytes", type=int, default=200)
    p.add_argument("--max-bytes", type=int, default=300_000)
    p.add_argument("--held-percent", type=int, default=2)
    p.add_argument("--max-train-tokens", type=int, default=50_000_000, help="0: all")
    p.add_argument("--max-held-tokens", type=int, default=0, help="0: all")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--k", type=int, default=8, help="drafts per pass (K-1 mask tokens)")
    p.add_argument("--anchors", type=int, default=64, help="anchors per training row")
    p.add_argument("--anchor-min", type=int, default=16)
    p.add_argument("--pard-token", type=int, default=2)
    p.add_argument("--ntp-weight", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--time-budget-s", type=float, default=400, help="training loop only; 0: none")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--eval-first", type=int, default=64)
    p.add_argument("--eval-stride", type=int, default=16)
    p.add_argument("--eval-ks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8])
    p.add_argument("--eval-chunk", type=int, default=256, help="sequences per eval forward")
    a = p.parse_args(argv)
    if a.quick:  # smoke-test sizes, for the options left at their defaults
        quick = {"steps": 20, "context": 128, "anchors": 8, "batch": 4, "warmup": 5,
                 "log_every": 5, "max_train_tokens": 200_000, "max_held_tokens": 30_000,
                 "eval_windows": 4, "time_budget_s": 60}
        for key, value in quick.items():
            if getattr(a, key) == p.get_default(key):
                setattr(a, key, value)
    if a.out is None:
        a.out = Path("/tmp/pard_quick") if a.quick else REPO / "models/codepair/pard"
    return a


def main():
    a = parse_args()
    if a.self_test:
        self_test()
    else:
        run(a)


if __name__ == "__main__":
    main()
