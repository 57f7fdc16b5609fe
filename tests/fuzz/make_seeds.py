#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ from real inputs (issue 15).

Usage: tests/fuzz/make_seeds.py [SHARED_DIR]   (default: ../shared next to the repository)

Sources: request bodies as the OpenAI SDKs and tests/http_test.py send them, the bundled
codepair model (tokenizer, config, chat template), the chat templates of
engine/tokenizer/jinja/testdata, and $SHARED_DIR/models (stories260K, babyllama, tiny-random,
shapes, llama.cpp's vocab GGUFs). Large real files are trimmed to a few KB by rewriting them
with fewer entries (vocabularies, tensors); the trimmed files stay well-formed. The wire corpus
is written by the wire fuzzer itself from distributed_test::AllSampleMessages (engine/distributed owns the
frame layout):
  rm tests/fuzz/corpus/wire/*; SPECD_FUZZ_WRITE_SEEDS=$PWD/tests/fuzz/corpus/wire \
      build-asan/tests/fuzz/wire_fuzzer -runs=0 tests/fuzz/corpus/wire Crash reproducers are added by hand as crash-<what> files
and are never regenerated.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
MODELS = os.path.join(SHARED, "models")
CODEPAIR = os.path.join(ROOT, "models", "codepair")


def out_dir(target):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    return d


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(out_dir(target), name), "wb") as f:
        f.write(data)


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


# ---- openai_request: request bodies of every route --------------------------------------
REQUESTS = {
    "completion_string": {"model": "codepair", "prompt": "def main(", "max_tokens": 8},
    "completion_list": {"prompt": ["def f(", "class A:"], "n": 2, "temperature": 0.7,
                        "top_p": 0.9, "seed": 7},
    "completion_ids": {"prompt": [[0, 400, 500], [12, 13]], "max_tokens": 4, "logprobs": 3,
                       "echo": False},
    "completion_stream": {"prompt": "import os\n", "stream": True,
                          "stream_options": {"include_usage": True}, "stop": ["\n\n", "def"],
                          "presence_penalty": 0.5, "frequency_penalty": 0.2},
    "completion_spec": {"prompt": "for i in range(", "max_tokens": 16,
                        "speculation": {"method": "ngram", "num_speculative_tokens": 4}},
    "completion_ssd": {"prompt": "x = ", "speculation": {"method": "ssd"}, "top_k": 20,
                       "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True,
                       "return_tokens_as_token_ids": True},
    "chat_simple": {"model": "codepair", "messages": [{"role": "user", "content": "hi"}]},
    "chat_roles": {"messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "write f"},
                                {"role": "assistant", "content": "def f(): pass"},
                                {"role": "user", "content": "again"}],
                   "max_completion_tokens": 12, "logprobs": True, "top_logprobs": 2},
    "chat_parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "stream": True},
    "chat_tools": {"messages": [{"role": "user", "content": "run it"},
                                {"role": "assistant", "content": None, "tool_calls": [
                                    {"id": "c1", "type": "function", "function": {
                                        "name": "run", "arguments": "{\"code\": \"1\"}"}}]},
                                {"role": "tool", "tool_call_id": "c1", "content": "1"}],
                   "tools": [{"type": "function", "function": {
                       "name": "run", "parameters": {"type": "object", "properties": {
                           "code": {"type": "string"}}}}}],
                   "chat_template_kwargs": {"enable_thinking": False}},
    "chat_draft": {"messages": [{"role": "user", "content": "x"}], "n": 3,
                   "speculation": {"method": "draft_model", "num_speculative_tokens": 3}},
    "tokenize_prompt": {"prompt": "def f(x):\n    return x", "add_special_tokens": True,
                        "return_token_strs": True},
    "tokenize_messages": {"messages": [{"role": "user", "content": "hello"}],
                          "add_generation_prompt": True},
    "detokenize": {"tokens": [0, 6398, 312, 331, 4590]},
    "bad_types": {"prompt": 3, "max_tokens": "x", "temperature": None, "n": -1},
    "unicode": {"prompt": "caf\u00e9 \u6f22\u5b57 \U0001f999 <|user|>", "stop": "\u00e9"},
}

# ---- chat_template: every testdata template with a conversation --------------------------
CONTEXT = {"messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Write f(x)."},
    {"role": "assistant", "content": "def f(x): return x", "tool_calls": [
        {"type": "function", "function": {"name": "run", "arguments": {"code": "f(1)"}}}]},
    {"role": "tool", "content": "1"},
    {"role": "user", "content": "Thanks"}],
    "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
    "tools": [{"type": "function", "function": {"name": "run", "description": "Runs code",
                                                  "parameters": {"type": "object"}}}],
    "enable_thinking": False, "date_string": "26 Jul 2024"}


def chat_template_seeds():
    tdir = os.path.join(ROOT, "engine", "tokenizer", "jinja", "testdata")
    ctx = json.dumps(CONTEXT)
    for name in sorted(os.listdir(tdir)):
        if name.endswith(".jinja"):
            write("chat_template", name[:-len(".jinja")], read(os.path.join(tdir, name)) + "\0" + ctx)
    cfg = json.loads(read(os.path.join(CODEPAIR, "target", "tokenizer_config.json")))
    write("chat_template", "codepair", cfg["chat_template"] + "\0" + ctx)
    write("chat_template", "codepair_no_context", cfg["chat_template"])


# ---- tokenizer / detokenizer: texts and ids from the real vector files --------------------
def jsonl(path, limit):
    rows = []
    for line in read(path).splitlines()[:limit]:
        rows.append(json.loads(line))
    return rows


def tokenizer_seeds():
    vec = {0: jsonl(os.path.join(CODEPAIR, "tokenizer_vectors.jsonl"), 400),
           1: jsonl(os.path.join(MODELS, "stories260K", "golden", "hf_tokenizers_vectors.jsonl"), 400),
           2: []}
    picks = [0, 3, 7, 15, 40, 90, 150, 220, 280]
    for which, rows in vec.items():
        for i in picks:
            if i >= len(rows):
                continue
            row = rows[i]
            control = which | (4 if i % 2 else 0) | (8 if i % 3 == 0 else 0)
            write("tokenizer", f"t{which}_{i}", bytes([control]) + row["text"].encode())
            ids = b"".join(struct.pack("<H", x) for x in row["ids"][:48])
            write("detokenizer", f"t{which}_{i}", bytes([which | (4 if i % 2 else 0), i % 7]) + ids)
    for which in range(3):
        write("tokenizer", f"t{which}_mixed", bytes([which]) +
              "Once upon a time \u00e9\u6f22 \U0001f999 <s> </s> <|user|>\n\t  x".encode())
    write("tokenizer", "t2_story", bytes([2]) + b"Lily saw a big dog. She was happy!")


# ---- tokenizer_load: real tokenizer.json files (small ones whole, codepair trimmed) ------
def trimmed_byte_level(path, keep):
    tok = json.loads(read(path))
    vocab = tok["model"]["vocab"]
    kept = {p: i for p, i in vocab.items() if i < keep}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in kept and b in kept and a + b in kept:
            merges.append(m)
    tok["model"]["vocab"] = kept
    tok["model"]["merges"] = merges
    tok["added_tokens"] = [dict(t, id=keep + k) for k, t in enumerate(tok["added_tokens"])]
    return json.dumps(tok, ensure_ascii=False)


def tokenizer_load_seeds():
    write("tokenizer_load", "stories260K", read(os.path.join(MODELS, "stories260K", "hf", "tokenizer.json")))
    write("tokenizer_load", "babyllama", read(os.path.join(MODELS, "babyllama-tok105", "hf", "tokenizer.json")))
    write("tokenizer_load", "codepair_trimmed",
          trimmed_byte_level(os.path.join(CODEPAIR, "target", "tokenizer.json"), 400))


# ---- model_config: real config.json / generation_config.json files -----------------------
def model_config_seeds():
    write("model_config", "codepair", read(os.path.join(CODEPAIR, "target", "config.json")))
    write("model_config", "codepair_generation", read(os.path.join(CODEPAIR, "target", "generation_config.json")))
    write("model_config", "codepair_eagle3", read(os.path.join(CODEPAIR, "eagle3", "config.json")))
    for v in ("llama3", "llama-linear", "qwen2", "qwen3", "mistral"):
        write("model_config", "tiny_" + v, read(os.path.join(MODELS, "tiny-random", v, "config.json")))
    sdir = os.path.join(MODELS, "shapes")
    for name in sorted(os.listdir(sdir)):
        p = os.path.join(sdir, name)
        if name.endswith(".json"):
            write("model_config", "shape_" + name[:-5], read(p))
        elif os.path.isdir(p) and os.path.exists(os.path.join(p, "config.json")):
            write("model_config", "shape_" + name, read(os.path.join(p, "config.json")))


# ---- safetensors: real headers with the tensors shrunk ------------------------------------
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}


def safetensors_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] -> bytes with deterministic, non-zero data."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    data = bytes((i * 37 + 11) % 251 for i in range(offset))
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    path = os.path.join(MODELS, "tiny-random", "qwen2", "model.safetensors")
    raw = read(path, "rb")
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    meta = header.pop("__metadata__", None)
    # The real names and dtypes, each shape cut to at most 4 per dimension.
    real = [(k, v["dtype"], [min(d, 4) for d in v["shape"]]) for k, v in sorted(header.items())]
    write("safetensors", "tiny_qwen2_shrunk", safetensors_file(real[:12], meta))
    write("safetensors", "dtypes", safetensors_file(
        [("a", "F32", [2, 3]), ("b", "F16", [4]), ("c", "BF16", [2, 2]), ("d", "I8", [3]),
         ("e", "F64", [1]), ("s", "F32", []), ("z", "F32", [0, 5])]))
    write("safetensors", "real_header_no_data", raw[:8 + hlen])


# ---- gguf: llama.cpp's vocab files with the vocabulary cut to a few hundred tokens --------
GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}


class GgufCursor:
    def __init__(self, raw):
        self.raw, self.pos = raw, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.raw, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.raw[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, vtype):
        if vtype in GGUF_SCALAR:
            return self.take(GGUF_SCALAR[vtype])
        if vtype == 8:
            return self.string()
        assert vtype == 9, vtype
        etype, n = self.take("<I"), self.take("<Q")
        return (etype, [self.value(etype) for _ in range(n)])


def gguf_pack(vtype, v):
    if vtype in GGUF_SCALAR:
        return struct.pack(GGUF_SCALAR[vtype], v)
    if vtype == 8:
        return struct.pack("<Q", len(v)) + v
    etype, items = v
    return struct.pack("<IQ", etype, len(items)) + b"".join(gguf_pack(etype, x) for x in items)


def trimmed_gguf(path, keep):
    """The metadata of `path` with token arrays cut to `keep` entries, no tensors."""
    c = GgufCursor(read(path, "rb"))
    magic, version, _tensors, nkv = c.take("<I"), c.take("<I"), c.take("<Q"), c.take("<Q")
    kvs = []
    for _ in range(nkv):
        key, vtype = c.string(), None
        vtype = c.take("<I")
        kvs.append((key, vtype, c.value(vtype)))
    tokens = None
    out = []
    for key, vtype, v in kvs:
        if key in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.scores", b"tokenizer.ggml.token_type"):
            v = (v[0], v[1][:keep])
            if key == b"tokenizer.ggml.tokens":
                tokens = set(v[1])
        out.append((key, vtype, v))
    final = []
    for key, vtype, v in out:
        if key == b"tokenizer.ggml.merges":
            v = (v[0], [m for m in v[1] if all(p in tokens for p in m.split(b" ", 1))
                        and m.replace(b" ", b"") in tokens][:300])
        elif key.endswith(b"_token_id") and isinstance(v, int) and v >= keep:
            v = keep - 1
        final.append((key, vtype, v))
    body = b"".join(struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + gguf_pack(t, v)
                    for k, t, v in final)
    return struct.pack("<IIQQ", magic, version, 0, len(final)) + body


def gguf_seeds():
    vdir = os.path.join(MODELS, "vocab-tests")
    for name, keep in (("llama-spm", 400), ("gpt-2", 600), ("phi-3", 400), ("bert-bge", 400),
                       ("deepseek-coder", 600)):
        write("gguf", name, trimmed_gguf(os.path.join(vdir, f"ggml-vocab-{name}.gguf"), keep))
    write("gguf", "stories260K", trimmed_gguf(os.path.join(MODELS, "stories260K", "stories260K.gguf"), 512))


def nested(depth):
    return "[" * depth + "]" * depth


# Issue 15's defect 1 (JSON nested ~100,000 levels overflowed the stack and took the server
# down), as replayed by the corpus test: each must be refused with a 400.
DEEP_REQUESTS = {
    "crash-deep-prompt": '{"prompt": ' + nested(100000) + "}",
    "crash-deep-content": '{"messages": [{"role": "user", "content": ' + nested(20000) + "}]}",
    "crash-deep-tools": '{"messages": [{"role": "user", "content": "x"}], "tools": '
                        + nested(20000) + "}",
    "crash-deep-kwargs": '{"messages": [], "chat_template_kwargs": {"a": ' + nested(20000) + "}}",
}


def main():
    for name, body in REQUESTS.items():
        write("openai_request", name, json.dumps(body, ensure_ascii=False))
    for name, body in DEEP_REQUESTS.items():
        write("openai_request", name, body)
    chat_template_seeds()
    tokenizer_seeds()
    tokenizer_load_seeds()
    model_config_seeds()
    safetensors_seeds()
    gguf_seeds()
    out_dir("wire")
    print("seeds written under", os.path.join(HERE, "corpus"))


if __name__ == "__main__":
    main()
