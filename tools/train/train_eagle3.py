#!/usr/bin/env python3
"""train_eagle3: trains an EAGLE-3 draft head for the codepair target model.

Why: the engine's EAGLE-3 speculation needs a real head whose acceptance is not trivial, in the
checkpoint format vLLM and SGLang load as `LlamaForCausalLMEagle3`. The target is
models/codepair/target (a 6-layer Llama, tied embeddings, see models/codepair/PROVENANCE.md);
like that pair, the head learns from the Python source files of the interpreter's installed
packages and standard library.

What: the frozen target (plain torch, no `transformers`) gives, for each window of tokens, the
residual stream at the INPUT of its layers 1, 3 and 5 (vLLM's aux-layer-id convention: id j is
the input of layer j, id 0 the embedding output) and its logits. The head (vLLM's
llama_eagle3.py with one decoder layer) is trained with EAGLE-3's training-time test: step 1
sees the target's features, steps 2..S its own previous output (`prenorm`), with the diagonal
attention mask of a chain drafted from every anchor at once. The loss is the soft cross entropy
against the target's distribution restricted to the draft vocabulary (the most frequent
training tokens), weighted 0.8^(s-1) per step.

Output in --out: config.json, model.safetensors (fc, midlayer.*, norm, lm_head in BF16, d2t
int64, t2d bool; no embed_tokens: the head shares the target's) and train_info.json (every
hyperparameter, token counts, losses, and a held-out greedy chain-drafting evaluation: mean
accepted length for K = 4 and 7).

--doc-windows FRAC draws that fraction of each batch from windows that start at a training file's
BOS, as every served prompt does (windows cut at multiples of --context almost never do). The
serving-regime evaluation (serve_eval.py: tokens per verification round counted as specd's
spec_bench counts them, on prompts cut from held-out files and on the benchmark's prompts, for the
head and the draft model) runs after training, and with --init before it too.

--init HEAD continues from a head this script wrote, and can grow it on the way: a larger draft
vocabulary that contains the saved one (e.g. --draft-vocab-size 0, the target's whole vocabulary)
and a wider FFN (--intermediate-size), both function-preserving (load_init).

Usage:
  train_eagle3.py --target models/codepair/target --out models/codepair/eagle3
                  [--steps N] [--time-budget-s S] [--max-train-tokens N] [--quick]
  train_eagle3.py --init models/codepair/eagle3 --draft-vocab-size 8192 --intermediate-size 3072
                  --lr 2e-4 --steps 100000 --time-budget-s 500 --out OUT
  train_eagle3.py --self-test   (no torch needed; with torch also checks the model math)

torch, tokenizers (and safetensors, when installed) are imported only when training.
"""
import argparse
import array
import contextlib
import hashlib
import json
import math
import os
import random
import struct
import sys
import sysconfig
import tempfile
import time
import traceback

torch = None  # imported by import_torch(), only when the torch code paths run
F = None

BOS_ID, EOS_ID = 0, 1
DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}
# The head's tensors (vLLM / SGLang names), in forward order; the norms start at 1.
HEAD_WEIGHTS = ("fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
                "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
                "midlayer.post_attention_layernorm.weight", "midlayer.mlp.gate_proj.weight",
                "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight",
                "lm_head.weight")
# The FFN tensors an --init head may be narrower in (gate / up rows, down_proj columns).
FFN_IN_WEIGHTS = ("midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight")
FFN_OUT_WEIGHT = "midlayer.mlp.down_proj.weight"
TARGET_LAYER_WEIGHTS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                        "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
DEFAULT_DRAFT_VOCAB = 4096
QUICK = dict(steps=20, time_budget_s=60.0, max_train_tokens=300_000, context=256, batch_size=8,
             warmup_steps=5, eval_windows=4, log_every=5, serve_eval_files=4)


# ----------------------------------------------------------------------------------------------
# Pure Python (no torch): bf16 packing, safetensors, draft vocabulary, head config, corpus files.

def f32_to_bf16_bits(x):
    """Rounds a float to bfloat16 (nearest, ties to even) and returns its 16 bits."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return 0x7FC0  # NaN
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def bf16_bits_to_f32(b):
    return struct.unpack("<f", struct.pack("<I", (b & 0xFFFF) << 16))[0]


def pack_bf16(values):
    return struct.pack(f"<{len(values)}H", *[f32_to_bf16_bits(v) for v in values])


def unpack_bf16(raw):
    return [bf16_bits_to_f32(b) for b in struct.unpack(f"<{len(raw) // 2}H", raw)]


def pack_i64(values):
    return struct.pack(f"<{len(values)}q", *values)


def unpack_i64(raw):
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))


def pack_bool(values):
    return bytes(1 if v else 0 for v in values)


def unpack_bool(raw):
    return [b != 0 for b in raw]


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_safetensors(path, entries, metadata=None):
    """Writes [(name, dtype, shape, raw little-endian bytes)] as a safetensors file.

    Tensors are laid out by decreasing item size (then name), back to back after a header padded
    with spaces to a multiple of 8, so every tensor is aligned to its item size, as the
    safetensors library writes them. Written to a temporary name, then renamed.
    """
    entries = sorted(entries, key=lambda e: (-DTYPE_SIZES[e[1]], e[0]))
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, dtype, shape, raw in entries:
        size = DTYPE_SIZES[dtype] * _numel(shape)
        if len(raw) != size:
            raise ValueError(f"{name}: {len(raw)} bytes for {dtype} {list(shape)}")
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for entry in entries:
            f.write(entry[3])
    os.replace(tmp, path)


def read_safetensors(path):
    """Returns ({name: (dtype, shape, raw bytes)}, metadata); checks the layout is contiguous."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", None) or {}
    base, tensors, spans = 8 + n, {}, []
    for name, info in header.items():
        dtype, shape = info["dtype"], list(info["shape"])
        start, end = info["data_offsets"]
        if end - start != DTYPE_SIZES[dtype] * _numel(shape):
            raise ValueError(f"{path}: {name} has {end - start} bytes for {dtype} {shape}")
        spans.append((start, end))
        tensors[name] = (dtype, shape, data[base + start:base + end])
    pos = 0
    for start, end in sorted(spans):
        if start != pos:
            raise ValueError(f"{path}: tensor data not contiguous at byte {start}")
        pos = end
    if base + pos != len(data):
        raise ValueError(f"{path}: {len(data) - base - pos} bytes after the last tensor")
    return tensors, metadata


def build_draft_vocab(counts, size, required=(BOS_ID, EOS_ID)):
    """The `size` most frequent ids of `counts` (ties: lower id first), `required` always in,
    sorted ascending."""
    if size > len(counts):
        raise ValueError(f"draft vocab {size} > vocab {len(counts)}")
    required = [r for r in required if r < len(counts)]
    ranked = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    taken = set(required)
    chosen = list(required)
    for i in ranked:
        if len(chosen) >= size:
            break
        if i not in taken:
            chosen.append(i)
            taken.add(i)
    return sorted(chosen)


def make_d2t_t2d(draft_ids, vocab):
    """EAGLE-3 / vLLM maps: target id of draft index i = i + d2t[i]; t2d[v] = v is drafted."""
    d2t = [tid - i for i, tid in enumerate(draft_ids)]
    t2d = [False] * vocab
    for tid in draft_ids:
        t2d[tid] = True
    return d2t, t2d


def draft_index_map(old_ids, new_ids):
    """For each id of old_ids, its index in new_ids (both draft vocabularies as ascending target
    ids): where an --init head's lm_head rows go in this run's. None when old_ids is not a subset
    of new_ids."""
    where = {tid: i for i, tid in enumerate(new_ids)}
    if any(tid not in where for tid in old_ids):
        return None
    return [where[tid] for tid in old_ids]


def rope_theta_of(cfg):
    """RoPE theta from a transformers-5 (`rope_parameters`) or -4 (`rope_theta`) config."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ValueError(f"only default RoPE is supported, not {rope_type!r}")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def head_config(tcfg, draft_vocab_size, aux_ids, intermediate_size=None):
    """config.json of the head (transformers-4 form, as vLLM / SGLang read EAGLE-3 heads). The
    FFN width is the target's unless `intermediate_size` is given."""
    heads = tcfg["num_attention_heads"]
    aux = [int(j) for j in aux_ids]
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": tcfg["hidden_size"],
        "intermediate_size": int(intermediate_size or tcfg["intermediate_size"]),
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": tcfg.get("num_key_value_heads", heads),
        "head_dim": tcfg.get("head_dim", tcfg["hidden_size"] // heads),
        "hidden_act": "silu",
        "rms_norm_eps": tcfg["rms_norm_eps"],
        "rope_theta": rope_theta_of(tcfg),
        "max_position_embeddings": tcfg.get("max_position_embeddings", 8192),
        "vocab_size": tcfg["vocab_size"],
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": tcfg["hidden_size"],
        "bos_token_id": tcfg.get("bos_token_id", BOS_ID),
        "eos_token_id": tcfg.get("eos_token_id", EOS_ID),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "eagle_aux_hidden_state_layer_ids": aux,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
    }


def default_roots():
    """The interpreter's purelib, platlib and stdlib directories (duplicates dropped)."""
    paths, roots = sysconfig.get_paths(), []
    for key in ("purelib", "platlib", "stdlib"):
        p = paths.get(key)
        if p and os.path.isdir(p) and p not in roots:
            roots.append(p)
    return roots


def collect_py_files(roots, min_bytes, max_bytes):
    """Every *.py file under roots with min_bytes <= size <= max_bytes: real paths, sorted,
    each once (a root inside another, or a symlink, does not count twice)."""
    seen, files = set(), []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in filenames:
                if not name.endswith(".py"):
                    continue
                path = os.path.realpath(os.path.join(dirpath, name))
                if path in seen:
                    continue
                seen.add(path)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                if min_bytes <= size <= max_bytes:
                    files.append(path)
    files.sort()
    return files


def is_held_out(path, pct):
    """The codepair split: int(sha1(path)[:8], 16) % 100 < pct."""
    digest = hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()
    return int(digest[:8], 16) % 100 < pct


def read_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def tokenize_files(paths, tokenizer, cap, chunk):
    """BOS + ids + EOS per file, concatenated, until `cap` tokens (the last file cut there).

    Returns (array('i') of ids, number of files used)."""
    out, used = array.array("i"), 0
    for i in range(0, len(paths), chunk):
        texts = [read_text(p) for p in paths[i:i + chunk]]
        for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
            out.append(BOS_ID)
            out.extend(enc.ids)
            out.append(EOS_ID)
            used += 1
            if len(out) >= cap:
                del out[cap:]
                return out, used
    return out, used


def doc_window_starts(bos_positions, n_tokens, context):
    """Starts of the training windows that begin at a file's BOS: every BOS position whose
    window of `context` tokens fits in the stream (the rest of such a window is the following
    files' tokens, as in any window of the concatenated stream)."""
    return [p for p in bos_positions if p + context <= n_tokens]


def doc_batch_size(batch_size, frac):
    """How many windows of a batch start at a file's BOS (--doc-windows): round(frac * batch)."""
    return max(0, min(batch_size, int(round(frac * batch_size))))


def load_tokenizer(target_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))


# ----------------------------------------------------------------------------------------------
# torch: loading and the target model.

def import_torch():
    global torch, F
    import torch as torch_module
    import torch.nn.functional as functional
    torch, F = torch_module, functional


def torch_dtype(code):
    return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
            "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
            "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}[code]


def bytes_to_tensor(dtype, shape, raw):
    dt = torch_dtype(dtype)
    if not raw:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(raw), dtype=dt).reshape(shape)


def tensor_bytes(t):
    """Raw little-endian bytes of a tensor (its dtype as it is)."""
    flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    try:
        return flat.numpy().tobytes()
    except Exception:  # torch without numpy
        return bytes(flat.tolist())


def load_shard(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        tensors, _ = read_safetensors(path)
        return {name: bytes_to_tensor(*t) for name, t in tensors.items()}
    return load_file(path)


def load_weights(model_dir):
    """All tensors of a HF checkpoint: sharded (through the index) or one model.safetensors."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    weights = {}
    for shard in shards:
        weights.update(load_shard(os.path.join(model_dir, shard)))
    return weights


def rope_tables(theta, head_dim, n_positions, device):
    """cos, sin [n_positions, head_dim] in float32, HF layout (frequencies repeated twice)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    freqs = torch.outer(torch.arange(n_positions, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


def apply_rope(x, cos, sin):
    """x [B, H, T, D]; cos, sin [T, D]. HF rotate_half."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rms_norm(x, weight, eps):
    """HF LlamaRMSNorm: normalise in float32, back to x's dtype, times the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def split_heads(x, n_heads, head_dim):
    b, t, _ = x.shape
    return x.view(b, t, n_heads, head_dim).transpose(1, 2)


def causal_attention(q, k, v):
    """q [B, Hq, T, D], k, v [B, Hkv, T, D] (GQA: query head h uses kv head h // (Hq/Hkv))."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[2]
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).float().softmax(-1).to(v.dtype)
    return probs @ v


class Target:
    """The frozen target LlamaForCausalLM: weights as plain tensors, forward in plain torch."""

    def __init__(self, model_dir, dtype, device):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError("the target must use SiLU")
        self.cfg, self.device = cfg, device
        self.hidden, self.vocab = cfg["hidden_size"], cfg["vocab_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim", self.hidden // self.heads)
        self.n_layers, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        w = {k: v.to(device=device, dtype=dtype) for k, v in load_weights(model_dir).items()}
        self.embed = w["model.embed_tokens.weight"]
        tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in w
        self.lm_head_f32 = (self.embed if tied else w["lm_head.weight"]).float()
        self.norm = w["model.norm.weight"]
        self.layers = [{n: w[f"model.layers.{i}.{n}.weight"] for n in TARGET_LAYER_WEIGHTS}
                       for i in range(self.n_layers)]
        self.max_positions = cfg.get("max_position_embeddings", 8192)
        self.cos, self.sin = rope_tables(rope_theta_of(cfg), self.head_dim, self.max_positions,
                                         device)

    def attention(self, x, lw, cos, sin):
        b, t, _ = x.shape
        q = apply_rope(split_heads(F.linear(x, lw["self_attn.q_proj"]), self.heads,
                                   self.head_dim), cos, sin)
        k = apply_rope(split_heads(F.linear(x, lw["self_attn.k_proj"]), self.kv_heads,
                                   self.head_dim), cos, sin)
        v = split_heads(F.linear(x, lw["self_attn.v_proj"]), self.kv_heads, self.head_dim)
        o = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        return F.linear(o, lw["self_attn.o_proj"])

    def forward(self, ids, aux_ids=()):
        """ids [B, T] from position 0. Returns ([residual stream at the input of layer j for j
        in aux_ids] (j = n_layers: after the last layer), final normed hidden [B, T, H])."""
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x, aux = F.embedding(ids, self.embed), {}
        for j, lw in enumerate(self.layers):
            if j in aux_ids:
                aux[j] = x
            x = x + self.attention(rms_norm(x, lw["input_layernorm"], self.eps), lw, cos, sin)
            h = rms_norm(x, lw["post_attention_layernorm"], self.eps)
            gate_up = F.silu(F.linear(h, lw["mlp.gate_proj"])) * F.linear(h, lw["mlp.up_proj"])
            x = x + F.linear(gate_up, lw["mlp.down_proj"])
        if self.n_layers in aux_ids:
            aux[self.n_layers] = x
        return [aux[j] for j in aux_ids], rms_norm(x, self.norm, self.eps)

    def logits(self, h):
        """float32 logits (h @ embed_tokens.T for the tied codepair target)."""
        return F.linear(h.float(), self.lm_head_f32)


class VocabMap:
    """The draft vocabulary on the device: draft index i <-> target id i + d2t[i]."""

    def __init__(self, draft_ids, vocab, device):
        self.size, self.vocab = len(draft_ids), vocab
        self.d2t_list, self.t2d_list = make_d2t_t2d(draft_ids, vocab)
        self.d2t = torch.tensor(self.d2t_list, dtype=torch.long, device=device)
        self.t2d = torch.tensor(self.t2d_list, dtype=torch.bool, device=device)
        self.target_ids = torch.arange(self.size, device=device) + self.d2t  # as vLLM maps
        self.full = self.size == vocab  # every id drafted: d2t all 0, t2d all true
        index = torch.full((vocab,), -1, dtype=torch.long, device=device)
        index[self.target_ids] = torch.arange(self.size, device=device)
        self.t2d_index = index  # target id -> draft index, -1 when not drafted


def target_batch(tg, tokens, aux_ids, vm):
    """Features (cat of the aux hidden states, float32), the target's distribution restricted
    to the draft vocab and renormalised, and its argmax as a draft index (-1: not drafted).
    Like every target call, it runs outside the head's autocast region."""
    with torch.no_grad():
        aux, h = tg.forward(tokens, aux_ids)
        feats = torch.cat(aux, dim=-1).float()
        logits = tg.logits(h)
        if vm.full:  # target_ids = arange(vocab): the same values without the gathers
            probs, top = logits.softmax(-1), logits.argmax(-1)
        else:
            probs = logits[..., vm.target_ids].softmax(-1)
            top = vm.t2d_index[logits.argmax(-1)]
    return feats, probs, top


# ----------------------------------------------------------------------------------------------
# torch: the EAGLE-3 head.

class Head:
    """vLLM llama_eagle3 with one decoder layer ("midlayer"); params are the checkpoint tensors
    (float32 master copies). The token embedding is the target's, frozen (float32 copy)."""

    def __init__(self, hcfg, params, embed, cos, sin):
        self.p = params
        self.heads, self.kv_heads = hcfg["num_attention_heads"], hcfg["num_key_value_heads"]
        self.head_dim, self.eps = hcfg["head_dim"], hcfg["rms_norm_eps"]
        self.embed, self.cos, self.sin = embed, cos, sin

    def step(self, emb, hid, cos, sin, cache, mask):
        """One pass of the midlayer over rows [B, T]: emb, hid [B, T, H]; cos, sin [T, D] at the
        rows' positions. Appends this step's (k, v) to cache. Returns (draft logits, prenorm)."""
        p, b, t = self.p, emb.shape[0], emb.shape[1]
        x = torch.cat([rms_norm(emb, p["midlayer.input_layernorm.weight"], self.eps),
                       rms_norm(hid, p["midlayer.hidden_norm.weight"], self.eps)], dim=-1)
        q = split_heads(F.linear(x, p["midlayer.self_attn.q_proj.weight"]), self.heads,
                        self.head_dim)
        k = split_heads(F.linear(x, p["midlayer.self_attn.k_proj.weight"]), self.kv_heads,
                        self.head_dim)
        v = split_heads(F.linear(x, p["midlayer.self_attn.v_proj.weight"]), self.kv_heads,
                        self.head_dim)
        cache.append((apply_rope(k, cos, sin), v))
        attn = ttt_attention(apply_rope(q, cos, sin), cache, mask)
        residual = F.linear(attn.transpose(1, 2).reshape(b, t, -1),
                            p["midlayer.self_attn.o_proj.weight"]) + hid
        h = rms_norm(residual, p["midlayer.post_attention_layernorm.weight"], self.eps)
        mlp = F.silu(F.linear(h, p["midlayer.mlp.gate_proj.weight"])) * F.linear(
            h, p["midlayer.mlp.up_proj.weight"])
        prenorm = F.linear(mlp, p["midlayer.mlp.down_proj.weight"]) + residual
        logits = F.linear(rms_norm(prenorm, p["norm.weight"], self.eps), p["lm_head.weight"])
        return logits, prenorm


def ttt_attention(q, cache, mask):
    """Training-time-test attention of draft step s = len(cache) for every anchor t at once.

    q [B, Hq, T, D]: row t is anchor t's step-s query. cache[0] = step-1 (k, v) [B, Hkv, T, D]
    by position; cache[i] (i >= 1) = step-(i+1) (k, v) by anchor. Row t attends the step-1 keys
    at positions 0..t (mask [T, T], lower triangle) and its own anchor's keys of steps 2..s
    (the diagonal extension), under one softmax: exactly a chain drafted from anchor t."""
    t, rep = q.shape[2], q.shape[1] // cache[0][0].shape[1]
    q = q * q.shape[-1] ** -0.5
    k1, v1 = cache[0][0].repeat_interleave(rep, 1), cache[0][1].repeat_interleave(rep, 1)
    main = torch.matmul(q, k1.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    diag = [(q * k.repeat_interleave(rep, 1)).sum(-1, keepdim=True) for k, _ in cache[1:]]
    probs = torch.cat([main] + diag, dim=-1).float().softmax(-1).to(v1.dtype)
    out = torch.matmul(probs[..., :t], v1)
    for i, (_, v) in enumerate(cache[1:]):
        out = out + probs[..., t + i:t + i + 1] * v.repeat_interleave(rep, 1)
    return out


class DraftRows:
    """Draft steps for every anchor of a batch of windows at once (EAGLE-3 training-time test).

    Step s row t sits at position t+s-1 and takes (embed(ids[t]), hidden) where the hidden is
    fc(target features at t) for s = 1 and the step s-1 prenorm of row t after that."""

    def __init__(self, head, feats):
        self.head, self.cache = head, []
        self.hid = F.linear(feats, head.p["fc.weight"])
        t = feats.shape[1]
        self.mask = torch.ones(t, t, dtype=torch.bool, device=feats.device).tril()

    def step(self, ids):
        s, t = len(self.cache) + 1, ids.shape[1]
        if t + s - 1 > self.head.cos.shape[0]:
            raise ValueError("positions past the RoPE table")
        cos, sin = self.head.cos[s - 1:s - 1 + t], self.head.sin[s - 1:s - 1 + t]
        emb = F.embedding(ids, self.head.embed)
        logits, self.hid = self.head.step(emb, self.hid, cos, sin, self.cache, self.mask)
        return logits


def shift_left(tokens, s):
    """ids[:, t] = tokens[:, t + s], 0 past the end."""
    b, t = tokens.shape
    s = min(s, t)
    return torch.cat([tokens[:, s:], tokens.new_zeros(b, s)], dim=1)


def init_head_params(hcfg, tg, vm, init_lm_head, seed, device):
    """Linear weights ~ N(0, 0.02) (HF's initializer_range), norms 1; with init_lm_head the
    lm_head starts from the target's (tied) output rows of the draft vocab and norm from the
    target's final norm."""
    gen = torch.Generator().manual_seed(seed)
    h, inter = hcfg["hidden_size"], hcfg["intermediate_size"]
    qd = hcfg["num_attention_heads"] * hcfg["head_dim"]
    kd = hcfg["num_key_value_heads"] * hcfg["head_dim"]
    shapes = dict(zip(HEAD_WEIGHTS, [
        (h, 3 * hcfg["target_hidden_size"]), (h,), (h,), (qd, 2 * h), (kd, 2 * h), (kd, 2 * h),
        (h, qd), (h,), (inter, h), (inter, h), (h, inter), (h,), (hcfg["draft_vocab_size"], h)]))
    params = {name: torch.ones(shape) if len(shape) == 1 else
              torch.randn(shape, generator=gen) * 0.02 for name, shape in shapes.items()}
    if init_lm_head:
        params["lm_head.weight"] = tg.lm_head_f32[vm.target_ids].cpu().clone()
        params["norm.weight"] = tg.norm.float().cpu().clone()
    return {n: params[n].float().to(device).requires_grad_() for n in HEAD_WEIGHTS}


def read_head_config(head_dir):
    with open(os.path.join(head_dir, "config.json")) as f:
        return json.load(f)


def fit_new_rows(target_rows, old_ids, old_lm_head, new_ids):
    """lm_head rows for draft ids the saved head did not have: the target's output rows of those
    ids times the least-squares map A (float64) that best takes the target's rows of the saved
    head's ids to its trained lm_head rows (target_rows[old_ids] @ A ~ old_lm_head). Training
    moved the rows away from the target's (and the head's final norm with them), so the raw
    target rows are miscalibrated against the trained ones; the fitted map carries that shift."""
    rows = target_rows.detach().double().cpu()
    a = torch.linalg.lstsq(rows[old_ids], old_lm_head.detach().double().cpu()).solution
    return (rows[new_ids] @ a).float()


def load_init(head_dir, params, vm, target_rows=None):
    """Continues training from a head this script saved: its weights replace the initial ones.

    The saved head may be smaller than this run's in two ways, both grown so that the grown head
    computes the saved head's logits on the saved head's draft ids (up to float rounding):
    * draft vocabulary: the saved one must be a subset of this run's (e.g. the full vocabulary);
      its lm_head rows go to their ids' new draft indices; the other rows are, with target_rows
      (the target's output embedding [vocab, hidden]), fit_new_rows' least-squares extension of
      the trained rows (--new-rows-init fit), else they keep their initial values (the target's
      output rows with --lm-head-init target, as from scratch); norm.weight is the saved head's;
    * FFN width (intermediate_size): the saved neurons are the first ones; the new neurons keep
      their random gate / up rows (N(0, 0.02)) and get zero down_proj columns, so they add exactly
      nothing until trained (down_proj's gradient is not zero, so they start learning at once).
    Every other tensor must have the same shape. Returns a summary for train_info.json."""
    w = load_weights(head_dir)
    old_ids = [i + int(d) for i, d in enumerate(w["d2t"].tolist())]
    ids = [int(x) for x in vm.target_ids.tolist()]
    rows = draft_index_map(old_ids, ids)
    added = sorted(set(ids) - set(old_ids))  # this run's draft ids the saved head lacks
    if rows is None:
        raise SystemExit(f"--init {head_dir}: its draft vocabulary ({len(old_ids)} ids) is not a "
                         f"subset of this run's ({vm.size} ids)")
    widths = {w[n].shape[0] for n in FFN_IN_WEIGHTS if n in w}
    widths |= {w[FFN_OUT_WEIGHT].shape[1]} if FFN_OUT_WEIGHT in w else set()
    if len(widths) != 1:
        raise SystemExit(f"--init {head_dir}: FFN tensors of different widths {sorted(widths)}")
    old_inter = widths.pop()
    with torch.no_grad():
        for name, p in params.items():
            if name not in w:
                raise SystemExit(f"--init {head_dir}: no {name}")
            src = w[name].float().to(p.device)
            if name == "lm_head.weight":
                fits = tuple(src.shape) == (len(old_ids), p.shape[1])
                if fits:
                    p[torch.tensor(rows, dtype=torch.long, device=p.device)] = src
                    if added and target_rows is not None:
                        p[torch.tensor(draft_index_map(added, ids), device=p.device)] = (
                            fit_new_rows(target_rows, torch.tensor(old_ids), src,
                                         torch.tensor(added)).to(p.device))
            elif name in FFN_IN_WEIGHTS:
                fits = src.shape[1] == p.shape[1] and src.shape[0] <= p.shape[0]
                if fits:
                    p[:src.shape[0]] = src
            elif name == FFN_OUT_WEIGHT:
                fits = src.shape[0] == p.shape[0] and src.shape[1] <= p.shape[1]
                if fits:
                    p[:, :src.shape[1]] = src
                    p[:, src.shape[1]:] = 0.0
            else:
                fits = tuple(src.shape) == tuple(p.shape)
                if fits:
                    p.copy_(src)
            if not fits:
                raise SystemExit(f"--init {head_dir}: {name} {list(src.shape)} does not fit this "
                                 f"run's {list(p.shape)}")
    new_inter = params[FFN_OUT_WEIGHT].shape[1]
    return {"from": head_dir, "draft_vocab_size": [len(old_ids), vm.size],
            "new_lm_head_rows": len(added),
            "new_rows_init": ("none" if not added else "least-squares fit"
                              if target_rows is not None else "initial values"),
            "intermediate_size": [int(old_inter), int(new_inter)]}


def amp(device):
    """bf16 autocast for the head on CUDA; float32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def ttt_loss(head, tokens, feats, probs, top, n_steps):
    """Per-step soft cross entropy against the target and top-1 agreement, teacher-forced.

    Step s row t (position t+s-1) takes embed(x_{t+s}) and predicts the target's distribution
    at position t+s; rows with t+s past the window are left out."""
    rows, t = DraftRows(head, feats), tokens.shape[1]
    losses, accs = [], []
    for s in range(1, min(n_steps, t - 1) + 1):
        logits = rows.step(shift_left(tokens, s))
        n = t - s
        logp = logits[:, :n].float().log_softmax(-1)
        losses.append(-(probs[:, s:] * logp).sum(-1).mean())
        accs.append((logits[:, :n].argmax(-1) == top[:, s:]).float().mean().detach())
    return torch.stack(losses), torch.stack(accs)


# ----------------------------------------------------------------------------------------------
# Training.

def lr_at(args, step, progress):
    """Linear warm-up over warmup_steps, times a cosine from 1 to min_lr_ratio over progress
    (the larger of steps done / --steps and seconds spent / --time-budget-s)."""
    warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
    cos = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * warm * (args.min_lr_ratio + (1.0 - args.min_lr_ratio) * cos)


def make_optimizer(params, args, device):
    kw = dict(lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    if device.type == "cuda":
        try:
            return torch.optim.AdamW(params, fused=True, **kw)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(params, **kw)


def log_progress(step, t0, lr, hist, n_steps):
    """Prints the means of the rows in hist (total, per-step losses, per-step top-1)."""
    m = torch.stack(hist).mean(0).tolist()
    hist.clear()
    row = {"step": step, "elapsed_s": round(time.time() - t0, 1), "lr": lr, "loss": m[0],
           "step_loss": m[1:1 + n_steps], "step_top1": m[1 + n_steps:]}
    print(f"step {step:5d}  {row['elapsed_s']:7.1f}s  lr {lr:.2e}  loss {m[0]:.4f}  "
          f"step loss {' '.join(f'{x:.3f}' for x in row['step_loss'])}  "
          f"top1 {' '.join(f'{x:.3f}' for x in row['step_top1'])}", flush=True)
    return row


def batches(windows, batch_size, seed):
    """Endless random batches of windows (a fresh permutation each epoch)."""
    gen = torch.Generator().manual_seed(seed)
    n = windows.shape[0]
    while True:
        order = torch.randperm(n, generator=gen).to(windows.device)
        for i in range(0, n - batch_size + 1, batch_size):
            yield windows[order[i:i + batch_size]].long()


def doc_batches(ids, starts, context, batch_size, seed):
    """Endless random batches of the windows that start at a file's BOS: ids [N] (the stream,
    on the device), starts [n] their first positions."""
    offsets = torch.arange(context, device=ids.device)
    for first in batches(starts, batch_size, seed):
        yield ids[first[:, None] + offsets].long()


def training_data(train_ids, args, device):
    """Endless batches: --doc-windows of each batch from windows that start at a file's BOS
    (as every served prompt does), the rest from the stream cut at multiples of --context.
    Returns (batch iterator, summary)."""
    ctx, bsz = args.context, args.batch_size
    ids = train_ids.to(device)
    n_win, n_doc = ids.numel() // ctx, doc_batch_size(bsz, args.doc_windows)
    if n_win < bsz:
        raise SystemExit(f"{n_win} training windows of {ctx} tokens < batch {bsz}")
    parts, summary = [], {"train_windows": n_win, "doc_windows_per_batch": n_doc}
    if n_doc < bsz:
        parts.append(batches(ids[:n_win * ctx].view(n_win, ctx), bsz - n_doc, args.seed + 1))
    if n_doc:
        bos = (ids == BOS_ID).nonzero().flatten().tolist()
        starts = doc_window_starts(bos, ids.numel(), ctx)
        if len(starts) < n_doc:
            raise SystemExit(f"{len(starts)} windows start at a BOS < {n_doc} a batch")
        summary["doc_windows"] = len(starts)
        parts.append(doc_batches(ids, torch.tensor(starts, device=device), ctx, n_doc,
                                 args.seed + 2))

    def gen():
        while True:
            yield torch.cat([next(p) for p in parts])
    return gen(), summary


def train(tg, head, vm, train_ids, args):
    """AdamW on the head until --steps or --time-budget-s. Returns a summary dict."""
    device, ctx, bsz = head.embed.device, args.context, args.batch_size
    data, data_summary = training_data(train_ids, args, device)
    params = list(head.p.values())
    opt = make_optimizer(params, args, device)
    n_steps = min(args.ttt_steps, ctx - 1)
    weights = torch.tensor([args.step_weight ** s for s in range(n_steps)], device=device)
    hist, log, step, lr, stop, t0 = [], [], 0, 0.0, "steps", time.time()
    while step < args.steps:
        elapsed = time.time() - t0
        if elapsed >= args.time_budget_s:
            stop = "time budget"
            break
        lr = lr_at(args, step, max(step / args.steps, elapsed / args.time_budget_s))
        for group in opt.param_groups:
            group["lr"] = lr
        tokens = next(data)
        feats, probs, top = target_batch(tg, tokens, args.aux_layer_ids, vm)
        with amp(device):
            losses, accs = ttt_loss(head, tokens, feats, probs, top, n_steps)
        total = (weights * losses).sum()
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        step += 1
        hist.append(torch.cat([total.detach()[None], losses.detach(), accs]))
        if step == 1 or step % args.log_every == 0:
            log.append(log_progress(step, t0, lr, hist, n_steps))
    if hist:
        log.append(log_progress(step, t0, lr, hist, n_steps))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"steps_done": step, "stopped_by": stop, "wall_s": round(time.time() - t0, 1),
            "windows_seen": step * bsz, "tokens_seen": step * bsz * ctx, **data_summary,
            "ttt_steps": n_steps, "final": log[-1] if log else None, "log": log}


# ----------------------------------------------------------------------------------------------
# Held-out evaluation: greedy chain drafting as inference does it.

def target_greedy(tg, windows, anchors, k):
    """For each window and anchor t: the target's k greedy tokens after x_0..x_{t+1},
    recomputed without a cache (right padding never matters to a causal model). [b, A, k]."""
    b, length = windows.shape
    a = len(anchors)
    buf = torch.zeros(b * a, length + k + 1, dtype=torch.long, device=windows.device)
    buf[:, :length] = windows.repeat_interleave(a, 0)
    cur = torch.tensor(anchors, device=windows.device).repeat(b) + 1
    rows, out = torch.arange(b * a, device=windows.device), []
    with torch.no_grad():
        for _ in range(k):
            _, h = tg.forward(buf[:, :int(cur.max()) + 1])
            nxt = tg.logits(h[rows, cur]).argmax(-1)
            buf[rows, cur + 1] = nxt
            out.append(nxt)
            cur = cur + 1
    return torch.stack(out, dim=-1).view(b, a, k)


def pick_draft_vocab(logits, vm):
    """argmax over the draft vocab, mapped to a target id as i + d2t[i]."""
    idx = logits.argmax(-1)
    return idx + vm.d2t[idx]


def pick_full_softmax(logits, vm):
    """vLLM's compute_logits: draft logits scattered into a full-vocab row of -inf (target ids
    arange + d2t), softmax over the full vocab, argmax."""
    full = logits.float().new_full(tuple(logits.shape[:-1]) + (vm.vocab,), float("-inf"))
    full[..., vm.target_ids] = logits.float()
    return full.softmax(-1).argmax(-1)


def draft_chains(head, tokens, feats, k, pick, vm):
    """For every anchor t: step 1 over positions 0..t with target features (input x_{t+1}), then
    k-1 steps on the head's own hidden state and argmax. Returns target ids [B, T, k]."""
    ids, out = shift_left(tokens, 1), []
    with torch.no_grad(), amp(tokens.device):
        rows = DraftRows(head, feats)
        for _ in range(k):
            ids = pick(rows.step(ids), vm)
            out.append(ids)
    return torch.stack(out, dim=-1)


def accept_summary(matches, ks):
    """matches [N, A, K] bool: draft token j equals the target's greedy token j."""
    prefix = matches.long().cumprod(-1)
    res = {"accept_rate_by_depth": [round(x, 5) for x in prefix.float().mean((0, 1)).tolist()]}
    for k in ks:
        accepted = prefix[..., :k].sum(-1).float().mean().item()
        res[f"k{k}"] = {"mean_accepted": accepted, "mean_tokens_per_round": accepted + 1.0}
    return res


def evaluate(tg, head, vm, held_ids, args):
    """Greedy chain drafting on held-out windows vs the target's greedy continuation, plus the
    teacher-forced training-time-test losses on the same windows."""
    length, device = args.eval_len, head.embed.device
    n = min(args.eval_windows, held_ids.numel() // length)
    anchors = list(range(args.eval_start, length - 1, args.eval_stride))
    if n == 0 or not anchors:
        return {"skipped": f"{held_ids.numel()} held-out tokens, eval_len {length}"}
    windows = held_ids[:n * length].view(n, length).long().to(device)
    k, n_steps = max(args.eval_ks), min(args.ttt_steps, length - 1)
    picks = {"draft_vocab_argmax": pick_draft_vocab, "full_vocab_softmax": pick_full_softmax}
    matches, greedy_all, ttt = {name: [] for name in picks}, [], []
    for i in range(0, n, 16):
        win = windows[i:i + 16]
        feats, probs, top = target_batch(tg, win, args.aux_layer_ids, vm)
        greedy = target_greedy(tg, win, anchors, k)
        greedy_all.append(greedy)
        for name, pick in picks.items():
            matches[name].append(draft_chains(head, win, feats, k, pick, vm)[:, anchors] == greedy)
        with torch.no_grad(), amp(device):
            losses, accs = ttt_loss(head, win, feats, probs, top, n_steps)
        ttt.append(torch.cat([losses, accs]) * win.shape[0])
    ttt_mean = (torch.stack(ttt).sum(0) / n).tolist()
    res = {"windows": n, "window_len": length, "anchors": anchors, "k_max": k,
           "target_greedy_in_draft_vocab": vm.t2d[torch.cat(greedy_all)].float().mean().item(),
           "teacher_forced": {"step_loss": ttt_mean[:n_steps], "step_top1": ttt_mean[n_steps:]}}
    for name, m in matches.items():
        res[name] = accept_summary(torch.cat(m), args.eval_ks)
    return res


class ServeEval:
    """The serving-regime evaluation (serve_eval.py): tokens per verification round as specd's
    spec_bench counts them, on prompts cut from held-out files as the benchmark's were (files
    starting with one of the benchmark's prompts left out) and on the benchmark's own prompts
    (--serve-prompts, at most --serve-eval-files), for the head and the draft model
    (--serve-draft). A failure is recorded, never raised: the checkpoint matters more."""

    def __init__(self, args, tg, held_paths):
        import serve_eval
        self.se, self.args, self.tg = serve_eval, args, tg
        bench = (serve_eval.read_prompts(args.serve_prompts)
                 if args.serve_prompts and os.path.exists(args.serve_prompts) else [])
        held, skipped = serve_eval.serve_prompt_texts((read_text(p) for p in held_paths), bench,
                                                      args.serve_eval_files, args.seed)
        tok = load_tokenizer(args.target)

        def encode(texts):
            return [[BOS_ID] + e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        self.sets = {"held_out_files": encode(held) if held else [],
                     "benchmark_prompts": encode(bench[:args.serve_eval_files]) if bench else []}
        self.info = {"held_out_files": len(held), "skipped_as_benchmark_files": skipped,
                     "benchmark_prompts": len(self.sets["benchmark_prompts"]),
                     "prompts_file": args.serve_prompts, "draft": args.serve_draft,
                     "target_dtype": args.target_dtype}
        has_draft = args.serve_draft and os.path.exists(os.path.join(args.serve_draft,
                                                                     "config.json"))
        self.draft = Target(args.serve_draft, tg.embed.dtype, tg.device) if has_draft else None

    def __call__(self, head, vm, with_draft):
        out = dict(self.info)
        for name, prompts in self.sets.items():
            if not prompts:
                continue
            try:
                out[name] = self.se.serve_eval(
                    self.tg, prompts, self.args.eval_ks, self.args.serve_max_tokens,
                    self.args.aux_layer_ids, head, vm, self.draft if with_draft else None)
                print(f"serving-regime eval, {name} ({len(prompts)} prompts):\n"
                      + self.se.format_table(out[name]), flush=True)
            except Exception as e:
                traceback.print_exc()
                out[name] = {"error": repr(e)}
        return out


# ----------------------------------------------------------------------------------------------
# Checkpoint.

def save_checkpoint(out_dir, head, vm, hcfg):
    """config.json + model.safetensors (BF16 weights, I64 d2t, BOOL t2d), read back to check."""
    os.makedirs(out_dir, exist_ok=True)
    entries = [(name, "BF16", list(p.shape), tensor_bytes(p.detach().to(torch.bfloat16)))
               for name, p in head.p.items()]
    entries.append(("d2t", "I64", [vm.size], pack_i64(vm.d2t_list)))
    entries.append(("t2d", "BOOL", [vm.vocab], pack_bool(vm.t2d_list)))
    path = os.path.join(out_dir, "model.safetensors")
    write_safetensors(path, entries, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hcfg, f, indent=2)
        f.write("\n")
    tensors, meta = read_safetensors(path)
    for name, dtype, shape, raw in entries:
        if tensors[name] != (dtype, shape, raw) or meta != {"format": "pt"}:
            raise RuntimeError(f"{path}: {name} did not read back")
    try:
        from safetensors import safe_open
    except ImportError:
        return path
    with safe_open(path, framework="pt") as f:
        if sorted(f.keys()) != sorted(e[0] for e in entries):
            raise RuntimeError(f"{path}: safetensors lists other tensors")
    return path


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


# ----------------------------------------------------------------------------------------------
# Main.

def prepare_data(args, vocab):
    """Corpus files, the held-out split, tokenized train and held-out streams (int32)."""
    tok = load_tokenizer(args.target)
    files = collect_py_files(args.roots, args.min_file_bytes, args.max_file_bytes)
    held = [f for f in files if is_held_out(f, args.held_out_pct)]
    held_set = set(held)
    train_files = [f for f in files if f not in held_set]
    rng = random.Random(args.seed)
    rng.shuffle(train_files)
    rng.shuffle(held)
    chunk = 64 if args.quick else 1024
    train_arr, n_train = tokenize_files(train_files, tok, args.max_train_tokens, chunk)
    held_arr, n_held = tokenize_files(held, tok, args.eval_windows * args.eval_len, chunk)
    if not train_arr:
        raise SystemExit(f"no training tokens under {args.roots}")
    streams = [torch.frombuffer(a, dtype=torch.int32).clone() if len(a) else
               torch.zeros(0, dtype=torch.int32) for a in (train_arr, held_arr)]
    if int(streams[0].max()) >= vocab:
        raise SystemExit("token id past the target's vocab")
    stats = {"roots": args.roots, "files_found": len(files), "train_files": len(train_files),
             "held_files": len(held), "train_files_used": n_train, "held_files_used": n_held,
             "train_tokens": len(train_arr), "held_tokens": len(held_arr)}
    return streams[0], streams[1], stats, held


def draft_vocab_from(train_ids, vocab, size):
    counts = torch.bincount(train_ids.long(), minlength=vocab)[:vocab].tolist()
    draft_ids = build_draft_vocab(counts, size)
    covered = sum(counts[i] for i in draft_ids) / max(1, sum(counts))
    return draft_ids, covered


def versions(device):
    res = {"python": sys.version.split()[0], "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(device)
    try:
        import tokenizers
        res["tokenizers"] = tokenizers.__version__
    except ImportError:
        pass
    return res


def setup(args):
    """torch, seeds, device, target, data, draft vocab, head: everything before training."""
    import_torch()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device if args.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    tdtype = torch.bfloat16 if args.target_dtype == "bf16" else torch.float32
    tg = Target(args.target, tdtype, device)
    if len(args.aux_layer_ids) != 3 or not all(0 <= j <= tg.n_layers for j in args.aux_layer_ids):
        raise SystemExit(f"need 3 aux layer ids in 0..{tg.n_layers}: {args.aux_layer_ids}")
    if args.context + args.ttt_steps > tg.max_positions:
        raise SystemExit("--context + --ttt-steps past max_position_embeddings")
    resolve_head_sizes(args, tg.cfg)
    train_ids, held_ids, corpus, held_paths = prepare_data(args, tg.vocab)
    draft_ids, covered = draft_vocab_from(train_ids, tg.vocab, args.draft_vocab_size)
    vm = VocabMap(draft_ids, tg.vocab, device)
    hcfg = head_config(tg.cfg, args.draft_vocab_size, args.aux_layer_ids, args.intermediate_size)
    params = init_head_params(hcfg, tg, vm, args.lm_head_init == "target", args.seed, device)
    init = load_init(args.init, params, vm, tg.lm_head_f32 if args.new_rows_init == "fit"
                     else None) if args.init else None
    head = Head(hcfg, params, tg.embed.float(), tg.cos, tg.sin)
    corpus["draft_vocab_train_coverage"] = covered
    serve = None
    if args.serve_eval_files > 0:
        try:
            serve = ServeEval(args, tg, held_paths)
        except Exception:  # an evaluation is not worth a training run
            traceback.print_exc()
    return device, tg, vm, hcfg, head, train_ids, held_ids, corpus, init, serve


def resolve_head_sizes(args, tcfg):
    """--draft-vocab-size and --intermediate-size when not given: the --init head's, else 4096
    and the target's FFN width. --draft-vocab-size 0 means the target's whole vocabulary."""
    icfg = read_head_config(args.init) if args.init else {}
    if args.draft_vocab_size is None:
        args.draft_vocab_size = int(icfg.get("draft_vocab_size") or DEFAULT_DRAFT_VOCAB)
    elif args.draft_vocab_size == 0:
        args.draft_vocab_size = int(tcfg["vocab_size"])
    if args.intermediate_size is None:
        args.intermediate_size = int(icfg.get("intermediate_size") or tcfg["intermediate_size"])
    if not 0 < args.draft_vocab_size <= tcfg["vocab_size"] or args.intermediate_size <= 0:
        raise SystemExit(f"--draft-vocab-size {args.draft_vocab_size} (at most "
                         f"{tcfg['vocab_size']}) / --intermediate-size {args.intermediate_size}")


def run(args):
    t_start = time.time()
    device, tg, vm, hcfg, head, train_ids, held_ids, corpus, init, serve = setup(args)
    n_params = sum(p.numel() for p in head.p.values())
    print(f"device {device}; target {args.target} ({args.target_dtype}); corpus {corpus}; "
          f"head {n_params} params; prep {time.time() - t_start:.1f}s", flush=True)
    info = {"what": "EAGLE-3 draft head (LlamaForCausalLMEagle3) for " + args.target,
            "args": vars(args), "head_config": hcfg, "head_params": n_params, "init": init,
            "corpus": corpus,
            "optimizer": {"name": "AdamW", "betas": [0.9, 0.95], "fp32_master": True,
                          "autocast": "bf16" if device.type == "cuda" else "none"},
            "versions": versions(device), "timing": {"prep_s": round(time.time() - t_start, 1)}}
    if serve and args.init:  # the head as it was, and the draft model, on the same prompts
        t_serve = time.time()
        info["serve_eval_init"] = serve(head, vm, with_draft=True)
        info["timing"]["serve_eval_init_s"] = round(time.time() - t_serve, 1)
    try:
        info["training"] = train(tg, head, vm, train_ids, args)
    except KeyboardInterrupt:
        info["training"] = {"stopped_by": "interrupt"}
    path = save_checkpoint(args.out, head, vm, hcfg)
    info_path = os.path.join(args.out, "train_info.json")
    write_json(info_path, info)
    print(f"checkpoint: {os.path.abspath(path)} (+ config.json, train_info.json)", flush=True)
    t_eval = time.time()
    info["eval"] = evaluate(tg, head, vm, held_ids, args)
    info["timing"]["eval_s"] = round(time.time() - t_eval, 1)
    write_json(info_path, info)
    print("held-out eval: " + json.dumps(info["eval"]), flush=True)
    if serve:
        t_serve = time.time()
        info["serve_eval"] = serve(head, vm, with_draft=not args.init)
        info["timing"]["serve_eval_s"] = round(time.time() - t_serve, 1)
    info["timing"]["total_s"] = round(time.time() - t_start, 1)
    write_json(info_path, info)
    print(f"checkpoint: {os.path.abspath(args.out)}", flush=True)
    return 0


def parse_int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--target", default="models/codepair/target", help="target model folder")
    a("--out", default="models/codepair/eagle3", help="checkpoint folder (created)")
    a("--steps", type=int, default=2500, help="optimizer steps (upper bound)")
    a("--time-budget-s", type=float, default=420.0, help="stop training after this many seconds")
    a("--max-train-tokens", type=int, default=60_000_000, help="cap on training tokens")
    a("--context", type=int, default=1024, help="training window, tokens")
    a("--batch-size", type=int, default=32, help="windows per step")
    a("--lr", type=float, default=5e-4, help="peak learning rate")
    a("--warmup-steps", type=int, default=100)
    a("--min-lr-ratio", type=float, default=0.1, help="cosine floor, fraction of --lr")
    a("--weight-decay", type=float, default=0.0)
    a("--grad-clip", type=float, default=0.5, help="max gradient norm")
    a("--ttt-steps", type=int, default=7, help="training-time-test draft steps")
    a("--step-weight", type=float, default=0.8, help="loss weight of step s: this^(s-1)")
    a("--draft-vocab-size", type=int, default=None, help="draft vocabulary size (0: the "
      "target's whole vocabulary; default: the --init head's, else %d)" % DEFAULT_DRAFT_VOCAB)
    a("--intermediate-size", type=int, default=None, help="the head's FFN width (default: the "
      "--init head's, else the target's); wider than the --init head's grows it")
    a("--aux-layer-ids", type=parse_int_list, default=[1, 3, 5],
      help="target layers whose input residual stream feeds fc (vLLM convention)")
    a("--init", default="", help="continue from this head's weights (a folder this script "
      "wrote); its draft vocabulary must be a subset of this run's and its FFN no wider")
    a("--new-rows-init", choices=["fit", "target"], default="fit", help="with --init and a larger "
      "draft vocabulary: lm_head rows of the new ids from the target's output rows through the "
      "least-squares map of the target's rows onto the trained ones (fit), or as --lm-head-init "
      "makes them (target)")
    a("--lm-head-init", choices=["target", "random"], default="target",
      help="start lm_head / norm from the target's output embedding rows / final norm")
    a("--target-dtype", choices=["bf16", "fp32"], default="bf16")
    a("--roots", nargs="*", default=None, help="corpus roots (default: sysconfig purelib, "
      "platlib, stdlib)")
    a("--held-out-pct", type=int, default=2, help="files with sha1(path) %% 100 < this")
    a("--min-file-bytes", type=int, default=200)
    a("--max-file-bytes", type=int, default=300_000)
    a("--eval-windows", type=int, default=64)
    a("--eval-len", type=int, default=256)
    a("--eval-start", type=int, default=64, help="first anchor position")
    a("--eval-stride", type=int, default=16, help="anchor spacing")
    a("--eval-ks", type=parse_int_list, default=[4, 7], help="draft lengths to report")
    a("--doc-windows", type=float, default=0.0, help="fraction of each batch's windows that "
      "start at a training file's BOS (as served prompts do); the rest are cut from the stream")
    a("--serve-eval-files", type=int, default=128, help="serving-regime evaluation "
      "(serve_eval.py): prompts cut from this many held-out files (0: no such evaluation)")
    a("--serve-prompts", default=None, help="the benchmark's prompts.jsonl: left out of the "
      "held-out files, and evaluated too (default: prompts.jsonl beside --target; '': none)")
    a("--serve-draft", default=None, help="draft model evaluated beside the head (default: "
      "draft/ beside --target; '': none)")
    a("--serve-max-tokens", type=int, default=64, help="tokens generated per prompt")
    a("--device", default="auto", help="auto, cuda, cuda:N or cpu")
    a("--seed", type=int, default=0)
    a("--log-every", type=int, default=50)
    a("--quick", action="store_true", help="smoke test: " + ", ".join(
        f"{k}={v}" for k, v in QUICK.items()) + " (unless given)")
    a("--self-test", action="store_true", help="check the pure-Python parts (and with torch, "
      "the model math) and exit")
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    if args.roots is None:
        args.roots = default_roots()
    beside = os.path.dirname(os.path.abspath(args.target))
    if args.serve_prompts is None:
        args.serve_prompts = os.path.join(beside, "prompts.jsonl")
    if args.serve_draft is None:
        args.serve_draft = os.path.join(beside, "draft")
    if not 0.0 <= args.doc_windows <= 1.0:
        p.error("--doc-windows is a fraction in [0, 1]")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        return self_test(args)
    return run(args)


# ----------------------------------------------------------------------------------------------
# Self-test.

def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok  {what}")


def test_safetensors(tmp):
    vals = [1.0, -2.5, 0.15625, 3.0, -0.0078125, 65280.0]
    i64 = [-3, 0, 7, 2 ** 40, -(2 ** 62)]
    path = os.path.join(tmp, "t.safetensors")
    write_safetensors(path, [("w", "BF16", [2, 3], pack_bf16(vals)), ("t2d", "BOOL", [3],
                             pack_bool([True, False, True])), ("d2t", "I64", [5], pack_i64(i64))],
                      {"format": "pt"})
    tensors, meta = read_safetensors(path)
    check(meta == {"format": "pt"}, "safetensors: __metadata__ format pt")
    check(tensors["w"][:2] == ("BF16", [2, 3]) and unpack_bf16(tensors["w"][2]) == vals,
          "safetensors: 2x3 BF16 tensor reads back")
    check(tensors["d2t"][:2] == ("I64", [5]) and unpack_i64(tensors["d2t"][2]) == i64,
          "safetensors: I64 tensor reads back")
    check(unpack_bool(tensors["t2d"][2]) == [True, False, True], "safetensors: BOOL reads back")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    check(n % 8 == 0 and all(v["data_offsets"][0] % DTYPE_SIZES[v["dtype"]] == 0
                             for k, v in header.items() if k != "__metadata__"),
          "safetensors: header padded to 8, tensors aligned")
    check(f32_to_bf16_bits(1.00390625) == 0x3F80 and f32_to_bf16_bits(1.01171875) == 0x3F82,
          "bf16: round to nearest even")


def test_vocab_and_config():
    counts = [5, 0, 9, 9, 1, 7, 9, 0]
    check(build_draft_vocab(counts, 4) == [0, 1, 2, 3], "draft vocab: ties by lower id, 0/1 in")
    ids = build_draft_vocab(counts, 5)
    d2t, t2d = make_d2t_t2d(ids, len(counts))
    check(ids == [0, 1, 2, 3, 6] and d2t == [0, 0, 0, 0, 2], "d2t = target id - draft index")
    check(t2d == [True, True, True, True, False, False, True, False], "t2d marks drafted ids")
    check(all(i + d2t[i] == ids[i] for i in range(len(ids))), "target id = i + d2t[i]")
    tcfg = {"hidden_size": 384, "intermediate_size": 1024, "num_attention_heads": 6,
            "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5, "vocab_size": 8192,
            "max_position_embeddings": 8192, "bos_token_id": 0, "eos_token_id": 1,
            "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    cfg = head_config(tcfg, 4096, [1, 3, 5])
    check(cfg["rope_theta"] == 100000.0 and "rope_parameters" not in cfg
          and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
          and cfg["architectures"] == ["LlamaForCausalLMEagle3"]
          and cfg["intermediate_size"] == 1024, "head config.json fields")
    wide = head_config(tcfg, 8192, [1, 3, 5], 3072)
    check(wide["intermediate_size"] == 3072 and wide["draft_vocab_size"] == 8192
          and sorted(wide) == sorted(cfg), "head config.json: FFN width and full vocab, same keys")
    check(draft_index_map([0, 1, 5], [0, 1, 2, 5, 7]) == [0, 1, 3]
          and draft_index_map([0, 3], [0, 1, 2]) is None
          and draft_index_map(ids, list(range(len(counts)))) == ids,
          "draft_index_map: saved draft ids -> this run's draft indices (subset only)")
    d2t, t2d = make_d2t_t2d(build_draft_vocab(counts, len(counts)), len(counts))
    check(d2t == [0] * len(counts) and all(t2d), "full draft vocab: d2t all 0, t2d all true")


def test_head_sizes(tmp):
    """--draft-vocab-size / --intermediate-size: given, 0 (full vocab), or from --init."""
    tcfg = {"vocab_size": 8192, "intermediate_size": 1024}
    init = os.path.join(tmp, "init")
    os.makedirs(init)
    with open(os.path.join(init, "config.json"), "w") as f:
        json.dump({"draft_vocab_size": 8192, "intermediate_size": 3072}, f)
    got = []
    for init_dir, dv, inter in [("", None, None), ("", 0, 2048), (init, None, None),
                                (init, 4096, 1024)]:
        a = argparse.Namespace(init=init_dir, draft_vocab_size=dv, intermediate_size=inter)
        resolve_head_sizes(a, tcfg)
        got.append((a.draft_vocab_size, a.intermediate_size))
    check(got == [(4096, 1024), (8192, 2048), (8192, 3072), (4096, 1024)],
          "head sizes: defaults, 0 = full vocab, --init head's when not given")


def test_corpus(tmp):
    root = os.path.join(tmp, "site")
    os.makedirs(os.path.join(root, "pkg", "sub"))
    for rel, size in [("pkg/a.py", 300), ("pkg/sub/b.py", 500), ("pkg/tiny.py", 10),
                      ("pkg/c.txt", 300)]:
        with open(os.path.join(root, rel), "w") as f:
            f.write("#" * size)
    os.symlink(os.path.join(root, "pkg", "a.py"), os.path.join(root, "link.py"))
    files = collect_py_files([root, os.path.join(root, "pkg")], 200, 300_000)
    real = os.path.realpath(root)
    check(files == [os.path.join(real, "pkg", "a.py"), os.path.join(real, "pkg", "sub", "b.py")],
          "corpus: *.py by size, sorted, each once")
    held = sum(is_held_out(f"/x/{i}.py", 2) for i in range(10000))
    check(100 < held < 300, f"held-out split ~2% ({held} of 10000)")


def self_test(args):
    with tempfile.TemporaryDirectory() as tmp:
        test_safetensors(tmp)
        test_corpus(tmp)
        test_head_sizes(tmp)
    test_vocab_and_config()
    check(doc_window_starts([0, 5, 9, 12], 14, 4) == [0, 5, 9]
          and [doc_batch_size(32, f) for f in (0.0, 0.5, 1.0)] == [0, 16, 32]
          and doc_batch_size(8, 0.3) == 2, "doc windows: BOS starts that fit, count per batch")
    import serve_eval
    serve_eval.self_test()
    try:
        import_torch()
    except ImportError:
        print("torch not installed: torch checks skipped")
        print("self-test passed")
        return 0
    torch_self_test(args)
    print("self-test passed")
    return 0


def torch_self_test(args):
    torch.manual_seed(0)
    test_ttt_attention()
    test_chain_causality()
    test_full_vocab_targets()
    test_grow_init()
    test_doc_windows()
    head, vm = tiny_head()
    import serve_eval
    serve_eval.torch_self_test(head, vm, FakeTarget(40, 32))
    with tempfile.TemporaryDirectory() as tmp:
        t = torch.randn(2, 3).to(torch.bfloat16)
        path = os.path.join(tmp, "b.safetensors")
        write_safetensors(path, [("t", "BF16", [2, 3], tensor_bytes(t))])
        back = bytes_to_tensor(*read_safetensors(path)[0]["t"])
        check(torch.equal(back, t), "torch: bf16 tensor bytes round-trip")
    golden = os.path.join(os.path.dirname(os.path.abspath(args.target)), "golden.json")
    if os.path.exists(os.path.join(args.target, "config.json")) and os.path.exists(golden):
        test_target_golden(args.target, golden)
    else:
        print(f"no {golden}: target golden check skipped")


def test_ttt_attention():
    b, hq, hkv, t, d, s = 2, 4, 2, 6, 8, 3
    q = torch.randn(b, hq, t, d, dtype=torch.float64)
    cache = [(torch.randn(b, hkv, t, d, dtype=torch.float64),
              torch.randn(b, hkv, t, d, dtype=torch.float64)) for _ in range(s)]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    got = ttt_attention(q, cache, mask)
    want = torch.zeros_like(got)
    for bi in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            for a in range(t):  # anchor a: step-1 keys 0..a, then its own keys of steps 2..s
                keys = torch.cat([cache[0][0][bi, g, :a + 1]] + [c[0][bi, g, a:a + 1]
                                                                 for c in cache[1:]])
                vals = torch.cat([cache[0][1][bi, g, :a + 1]] + [c[1][bi, g, a:a + 1]
                                                                 for c in cache[1:]])
                w = ((keys @ q[bi, h, a]) / math.sqrt(d)).softmax(0)
                want[bi, h, a] = w @ vals
    check(torch.allclose(got, want, atol=1e-10), "torch: TTT attention = per-anchor chain")


class FakeTarget:
    """What init_head_params and target_batch read of a target: random output rows, a final norm
    of ones, and a forward whose aux features are multiples of the embedding."""

    def __init__(self, vocab, hidden):
        self.lm_head_f32, self.norm = torch.randn(vocab, hidden), torch.ones(hidden)
        self.embed = torch.randn(vocab, hidden)

    def forward(self, ids, aux_ids=()):
        h = F.embedding(ids, self.embed)
        return [h * (j + 1) for j in aux_ids], h

    def logits(self, h):
        return F.linear(h.float(), self.lm_head_f32)


def tiny_head(vocab=40, draft=16, hidden=32, seed=0, inter=48, tg=None, embed=None):
    """A random head (draft ids 0, 2, 4, ... unless draft == vocab) and its VocabMap."""
    hcfg = {"hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5,
            "target_hidden_size": hidden, "draft_vocab_size": draft}
    tg = tg or FakeTarget(vocab, hidden)
    ids = list(range(vocab)) if draft == vocab else list(range(0, 2 * draft, 2))
    vm = VocabMap(ids, vocab, torch.device("cpu"))
    params = init_head_params(hcfg, tg, vm, True, seed, torch.device("cpu"))
    with torch.no_grad():
        for p in params.values():
            p.add_(0.1 * torch.randn_like(p))
    cos, sin = rope_tables(10000.0, 8, 64, "cpu")
    return Head(hcfg, params, torch.randn(vocab, hidden) if embed is None else embed, cos, sin), vm


def test_full_vocab_targets():
    """A full draft vocabulary: d2t all 0, t2d all true, and target_batch's shortcut (no gathers)
    gives what the gather path gives."""
    vocab, cpu = 40, torch.device("cpu")
    tg, tokens = FakeTarget(vocab, 32), torch.randint(0, vocab, (2, 9))
    full, gathered = (VocabMap(list(range(vocab)), vocab, cpu) for _ in range(2))
    gathered.full = False
    a, b = target_batch(tg, tokens, [1, 3, 5], full), target_batch(tg, tokens, [1, 3, 5], gathered)
    check(full.full and full.d2t_list == [0] * vocab and all(full.t2d_list)
          and all(torch.equal(x, y) for x, y in zip(a, b)),
          "torch: full draft vocab: d2t 0, t2d true, target_batch shortcut = gather path")


def test_grow_init():
    """--init of a smaller head into a larger one (draft vocabulary 16 of 40 ids -> all 40, FFN
    48 -> 96): the grown head gives the saved head's logits on the saved ids and the same hidden
    states at every draft step (function-preserving); the new FFN neurons add nothing but get a
    gradient; the new lm_head rows are the least-squares extension; the grown head saves as a
    full-vocabulary checkpoint. Also: the same sizes copy exactly, and misfits are refused."""
    vocab, hidden, cpu = 40, 32, torch.device("cpu")
    t_rows = torch.randn(vocab, 8, dtype=torch.float64)
    a_true = torch.randn(8, 5, dtype=torch.float64)
    old, new = torch.arange(0, 40, 3), torch.tensor([i for i in range(vocab) if i % 3])
    fitted = fit_new_rows(t_rows, old, t_rows[old] @ a_true, new)
    check(torch.allclose(fitted.double(), t_rows[new] @ a_true, atol=1e-4),
          "torch: fit_new_rows recovers a linear map of the target's rows")
    tg, embed = FakeTarget(vocab, hidden), torch.randn(vocab, hidden)
    small, vm_small = tiny_head(vocab, 16, hidden, seed=0, inter=48, tg=tg, embed=embed)
    small_cfg = {"hidden_size": hidden, "intermediate_size": 48, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5,
                 "target_hidden_size": hidden, "draft_vocab_size": 16}
    with tempfile.TemporaryDirectory() as tmp:
        saved_dir, grown_dir = os.path.join(tmp, "saved"), os.path.join(tmp, "grown")
        save_checkpoint(saved_dir, small, vm_small, small_cfg)
        saved = {n: t.float() for n, t in load_weights(saved_dir).items()}
        ref = Head(small_cfg, {n: saved[n] for n in HEAD_WEIGHTS}, embed, small.cos, small.sin)
        same = init_head_params(small_cfg, tg, vm_small, True, 1, cpu)
        info_same = load_init(saved_dir, same, vm_small, tg.lm_head_f32)
        check(all(torch.equal(same[n], saved[n]) for n in HEAD_WEIGHTS)
              and info_same["new_lm_head_rows"] == 0, "torch: --init of the same sizes copies")
        vm = VocabMap(list(range(vocab)), vocab, cpu)
        big_cfg = dict(small_cfg, draft_vocab_size=vocab, intermediate_size=96)
        params = init_head_params(big_cfg, tg, vm, True, 1, cpu)
        info = load_init(saved_dir, params, vm, tg.lm_head_f32)
        big = Head(big_cfg, params, embed, small.cos, small.sin)
        old_ids = vm_small.target_ids
        added = torch.tensor([i for i in range(vocab) if not bool(vm_small.t2d[i])])
        feats, tokens = torch.randn(2, 10, 3 * hidden), torch.randint(0, vocab, (2, 10))
        ref_rows, big_rows = DraftRows(ref, feats), DraftRows(big, feats)
        same_logits = same_hidden = True
        with torch.no_grad():
            for s in range(1, 5):
                ids = shift_left(tokens, s)
                lr, lb = ref_rows.step(ids), big_rows.step(ids)
                same_logits = same_logits and torch.allclose(lb[..., old_ids], lr, atol=1e-5)
                same_hidden = same_hidden and torch.allclose(big_rows.hid, ref_rows.hid, atol=1e-5)
        check(same_logits and same_hidden and info["draft_vocab_size"] == [16, vocab]
              and info["intermediate_size"] == [48, 96] and info["new_lm_head_rows"] == 24,
              "torch: grown head (vocab 16 -> 40, FFN 48 -> 96) = saved head on its ids, "
              "4 draft steps")
        want = fit_new_rows(tg.lm_head_f32, old_ids, saved["lm_head.weight"], added)
        check(torch.equal(params["lm_head.weight"][added], want)
              and torch.equal(params["lm_head.weight"][old_ids], saved["lm_head.weight"]),
              "torch: grown lm_head: saved rows at their ids, fitted rows at the new ids")
        down, gate = params[FFN_OUT_WEIGHT], params["midlayer.mlp.gate_proj.weight"]
        logits = DraftRows(big, feats).step(shift_left(tokens, 1))
        (logits.float() ** 2).mean().backward()
        check(bool((down[:, 48:] == 0).all()) and bool((gate[48:] != 0).any())
              and bool((down.grad[:, 48:] != 0).any()) and bool((gate.grad[48:] == 0).all()),
              "torch: new FFN neurons: zero down_proj columns, random gate rows, down_proj learns")
        save_checkpoint(grown_dir, big, vm, big_cfg)
        back = load_weights(grown_dir)
        check(back["d2t"].tolist() == [0] * vocab and bool(back["t2d"].all())
              and tuple(back["lm_head.weight"].shape) == (vocab, hidden)
              and tuple(back[FFN_OUT_WEIGHT].shape) == (hidden, 96)
              and read_head_config(grown_dir)["draft_vocab_size"] == vocab,
              "torch: grown head saves with d2t 0, t2d true, lm_head [vocab, hidden]")
        refused = []
        for cfg, ids in [(dict(small_cfg, intermediate_size=32), list(range(0, 32, 2))),
                         (small_cfg, list(range(1, 33, 2)))]:
            try:
                load_init(saved_dir, init_head_params(cfg, tg, VocabMap(ids, vocab, cpu), True, 1,
                                                      cpu), VocabMap(ids, vocab, cpu))
                refused.append(False)
            except SystemExit:
                refused.append(True)
        check(refused == [True, True], "torch: --init refuses a wider FFN or a vocab not a subset")


def test_doc_windows():
    """--doc-windows: the first round(frac * batch) windows of a batch start at a file's BOS and
    run on through the next files; the rest are the stream's windows at multiples of --context."""
    files = [[BOS_ID] + [7 + i] * (3 + 2 * i) + [EOS_ID] for i in range(12)]
    stream = torch.tensor([x for f in files for x in f], dtype=torch.int32)
    args = argparse.Namespace(context=8, batch_size=4, doc_windows=0.5, seed=0)
    data, info = training_data(stream, args, torch.device("cpu"))
    starts = [i for i, x in enumerate(stream.tolist()) if x == BOS_ID and i + 8 <= len(stream)]
    firsts, ok = set(), True
    for _ in range(len(starts)):
        b = next(data)
        ok = ok and tuple(b.shape) == (4, 8) and b.dtype == torch.long
        for row in b[:2].tolist():  # the stream windows come first, then the doc windows
            ok = ok and any(row == stream[s * 8:s * 8 + 8].tolist()
                            for s in range(len(stream) // 8))
        for row in b[2:].tolist():
            hits = [s for s in starts if stream[s:s + 8].tolist() == row]
            ok = ok and row[0] == BOS_ID and bool(hits)
            firsts.update(hits)
    check(ok and info["doc_windows_per_batch"] == 2 and info["doc_windows"] == len(starts)
          and len(firsts) > len(starts) // 2,
          "torch: doc windows start at a BOS and run on; the other windows are the stream's")


def test_chain_causality():
    """Anchor t's chain must not depend on anything after position t (and t+1's token)."""
    head, vm = tiny_head()
    b, t, k = 2, 12, 4
    tokens = torch.randint(0, 40, (b, t))
    feats = torch.randn(b, t, 3 * 32)
    with torch.no_grad():
        full_rows, ids_full, logits_full = DraftRows(head, feats), [], []
        for s in range(1, k + 1):
            ids_full.append(shift_left(tokens, s))
            logits_full.append(full_rows.step(ids_full[-1]))
        ok = True
        for a in (0, 5, 11):
            rows = DraftRows(head, feats[:, :a + 1])
            for s in range(k):
                got = rows.step(ids_full[s][:, :a + 1])
                ok = ok and torch.allclose(got, logits_full[s][:, :a + 1], atol=1e-5)
    check(ok, "torch: drafts of anchor t ignore positions > t")
    d1 = draft_chains(head, tokens, feats, k, pick_draft_vocab, vm)
    d2 = draft_chains(head, tokens, feats, k, pick_full_softmax, vm)
    check(torch.equal(d1, d2) and bool(vm.t2d[d1].all()), "torch: d2t argmax = full softmax")
    same = all(reference_chain(head, tokens[i], feats[i], a, k, vm) == d1[i, a].tolist()
               for i in range(b) for a in range(t))
    check(same, "torch: batched chains = one-anchor-at-a-time decoding with a KV cache")


def reference_chain(head, tokens, feats, t, k, vm):
    """Inference as an engine runs it, one anchor, float32: prefill rows 0..t (causal), then
    one row per draft step attending every cached key. Returns k drafted target ids."""
    p, hd = head.p, head.head_dim
    rep = head.heads // head.kv_heads

    def row(emb, hid, pos, keys, vals, causal):
        x = torch.cat([rms_norm(emb, p["midlayer.input_layernorm.weight"], head.eps),
                       rms_norm(hid, p["midlayer.hidden_norm.weight"], head.eps)], dim=-1)
        n = x.shape[0]
        q, kk, vv = (F.linear(x, p[f"midlayer.self_attn.{w}_proj.weight"]).view(n, -1, hd)
                     .transpose(0, 1) for w in "qkv")
        cos, sin = head.cos[pos], head.sin[pos]
        q, kk = apply_rope(q[None], cos, sin)[0], apply_rope(kk[None], cos, sin)[0]
        keys.append(kk)
        vals.append(vv)
        kc, vc = torch.cat(keys, 1).repeat_interleave(rep, 0), torch.cat(vals, 1).repeat_interleave(
            rep, 0)
        scores = q @ kc.transpose(-1, -2) / math.sqrt(hd)
        if causal:
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        o = (scores.softmax(-1) @ vc).transpose(0, 1).reshape(n, -1)
        res = F.linear(o, p["midlayer.self_attn.o_proj.weight"]) + hid
        h = rms_norm(res, p["midlayer.post_attention_layernorm.weight"], head.eps)
        pre = F.linear(F.silu(F.linear(h, p["midlayer.mlp.gate_proj.weight"])) * F.linear(
            h, p["midlayer.mlp.up_proj.weight"]), p["midlayer.mlp.down_proj.weight"]) + res
        return F.linear(rms_norm(pre, p["norm.weight"], head.eps), p["lm_head.weight"]), pre

    with torch.no_grad():
        keys, vals, out = [], [], []
        ids = torch.cat([tokens[1:t + 2], tokens.new_zeros(1)])[:t + 1]
        logits, pre = row(F.embedding(ids, head.embed), F.linear(feats[:t + 1], p["fc.weight"]),
                          torch.arange(t + 1), keys, vals, True)
        logits, pre = logits[-1:], pre[-1:]
        for s in range(k):
            idx = int(logits[0].argmax())
            out.append(idx + int(vm.d2t[idx]))
            if s + 1 < k:
                logits, pre = row(F.embedding(torch.tensor([out[-1]]), head.embed), pre,
                                  torch.tensor([t + s + 1]), keys, vals, False)
    return out


def test_target_golden(target_dir, golden_path):
    """Our plain-torch target (float32, CPU) against HF's goldens: top-8 logits, 8 greedy."""
    tg = Target(target_dir, torch.float32, torch.device("cpu"))
    with open(golden_path) as f:
        cases = json.load(f)["target"]
    worst, same = 0.0, True
    for case in cases:
        ids = torch.tensor([case["prompt_ids"]])
        with torch.no_grad():
            logits = tg.logits(tg.forward(ids)[1])[0, -1]
        top = logits.topk(8)
        same = same and top.indices.tolist() == case["last_logits_top8_ids"]
        worst = max(worst, (top.values - torch.tensor(case["last_logits_top8"])).abs().max().item())
        greedy = target_greedy(tg, ids, [ids.shape[1] - 2], 8)[0, 0].tolist()
        same = same and greedy == case["greedy_ids"][:8]
    check(same and worst < 2e-3, f"torch: target matches golden.json (max |dlogit| {worst:.2e})")
    try:
        tok = load_tokenizer(target_dir)
    except ImportError:
        print("tokenizers not installed: tokenizer check skipped")
        return
    enc = [[BOS_ID] + tok.encode(c["prompt"], add_special_tokens=False).ids for c in cases]
    check(enc == [c["prompt_ids"] for c in cases], "tokenizer: BOS + ids = golden prompt_ids")


if __name__ == "__main__":
    sys.modules.setdefault("train_eagle3", sys.modules[__name__])  # serve_eval imports it
    sys.exit(main())
