"""Greedy EAGLE-3 drafts of a trained head, computed by the training script's plain-torch code in
float32, as a golden for specd's C++ head (engine/model/eagle3_head_golden_test.cc).

For the first prompts of models/codepair/golden.json and a few anchors t in each, the head runs
positions 0..t with the target's hidden states (token p + 1's embedding at position p), then K
draft steps on its own hidden state and argmax, exactly as an engine drafts
(train_eagle3.reference_chain). Each draft step also records the gap between its two best logits,
so the C++ test can tell a near-tie (where fp32 summation order may pick the other id) from a
real mismatch.

    python3 tools/train/eagle3_golden.py --target models/codepair/target \
        --head models/codepair/eagle3 --out models/codepair/eagle3/golden.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_eagle3 as te  # noqa: E402


def load_head(head_dir, target):
    te.import_torch()
    torch = te.torch
    with open(os.path.join(head_dir, "config.json")) as f:
        hcfg = json.load(f)
    tensors, _ = te.read_safetensors(os.path.join(head_dir, "model.safetensors"))
    params = {n: te.bytes_to_tensor(*t) for n, t in tensors.items()}
    d2t = params.pop("d2t").long()
    params.pop("t2d", None)
    params = {n: t.float() for n, t in params.items()}
    cos, sin = te.rope_tables(te.rope_theta_of(hcfg), hcfg["head_dim"], 8192, "cpu")
    head = te.Head(hcfg, params, target.embed.float(), cos, sin)
    draft_ids = (torch.arange(d2t.numel()) + d2t).tolist()
    vm = te.VocabMap(draft_ids, target.vocab, "cpu")
    return head, hcfg, vm


def chain_with_gaps(head, tokens, feats, t, k, vm):
    """reference_chain's drafts, and the gap between the two best logits at each draft step
    (read off the argmax calls reference_chain makes on each step's draft-vocabulary row)."""
    te.import_torch()
    torch = te.torch
    gaps = []
    original = torch.Tensor.argmax

    def recording_argmax(self, *a, **kw):
        if self.dim() == 1 and self.numel() == vm.size:
            top = torch.topk(self.float(), 2).values
            gaps.append(float(top[0] - top[1]))
        return original(self, *a, **kw)

    torch.Tensor.argmax = recording_argmax
    try:
        drafts = te.reference_chain(head, tokens, feats, t, k, vm)
    finally:
        torch.Tensor.argmax = original
    return drafts, gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="models/codepair/target")
    ap.add_argument("--head", default="models/codepair/eagle3")
    ap.add_argument("--golden", default="models/codepair/golden.json")
    ap.add_argument("--out", default="models/codepair/eagle3/golden.json")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--k", type=int, default=7)
    args = ap.parse_args()
    te.import_torch()
    torch = te.torch
    target = te.Target(args.target, torch.float32, "cpu")
    head, hcfg, vm = load_head(args.head, target)
    aux_ids = hcfg["eagle_aux_hidden_state_layer_ids"]
    with open(args.golden) as f:
        prompts = [g["prompt_ids"] for g in json.load(f)["target"][:args.prompts]]
    out = {"what": __doc__.splitlines()[0], "head": args.head, "k": args.k,
           "torch": torch.__version__, "prompts": []}
    for ids in prompts:
        tokens = torch.tensor(ids)
        with torch.no_grad():
            aux, _ = target.forward(tokens[None], aux_ids)
        feats = torch.cat(aux, dim=-1)[0].float()
        n = len(ids)
        anchors = sorted({n - 2, n // 2, 3 * n // 4, 16})
        entry = {"prompt_ids": ids, "anchors": []}
        for t in anchors:
            drafts, gaps = chain_with_gaps(head, tokens, feats, t, args.k, vm)
            entry["anchors"].append({"t": t, "drafts": drafts, "top2_gaps": gaps})
            print(f"prompt of {n} ids, anchor {t}: drafts {drafts}, min gap {min(gaps):.4f}")
        out["prompts"].append(entry)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
