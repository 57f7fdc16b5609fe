#!/usr/bin/env python3
"""verify_torch_bench: the PyTorch eager two-step verification baseline of issue 5.

Step 1, acceptance: eq / cumprod / sum gives each sequence's accepted length, a gather the next
token. Step 2, mask-gather packing: the committed positions (j <= k_i) become one flat index
(nonzero of the mask: one device-to-host sync, as any eager boolean indexing) that gathers the
committed tokens (target tokens: they equal the drafts before k_i), their KV slots and, with
kv_bytes > 0, their KV rows; cumsum gives the committed offsets. The same work as
kernels::VerifyGreedyAndPack (tools/gpu/verify_bench.cc), on the same synthetic workload (the
batched-verification study's: k_i ~ Binomial(K, alpha), target agrees before k_i and differs at
k_i) and the same sweep, timed the same way: CUDA events around each call, 20 warm-ups, median
and p95 of 200, one synchronisation at the end. Rows print as verify_bench's:

    row IMPL BATCH K ALPHA KV_BYTES MEDIAN_US P95_US

With --compare FILE (verify_bench's output from the same device run) it prints the ratios and
issue 5's targets instead of timing alone: torch / fused >= 10x at batch <= 32 and K = 8;
serial / ballot >= 1.5x at batch 32, K 128, alpha 0.9.

Usage: verify_torch_bench.py [--quick] [--iters N] [--compare VERIFY_BENCH_OUTPUT]
Exit status: 0 when it ran, 2 on bad flags, 77 without PyTorch or a CUDA device.
"""
import argparse
import random
import sys

VOCAB = 4096  # the study's synthetic vocabulary
WARMUP = 20

SWEEP = dict(batches=[1, 4, 16, 32, 64], ks=[4, 8, 16, 64, 128], alphas=[0.3, 0.6, 0.9])
QUICK_SWEEP = dict(batches=[1, 32], ks=[8, 128], alphas=[0.9])
CROSSOVER = dict(batches=[1, 16, 32, 64, 128, 256, 512, 1024], kv=[0, 256, 1024, 4096],
                 ks=[8, 128])
QUICK_CROSSOVER = dict(batches=[32, 256], kv=[0, 4096], ks=[8, 128])


def make_inputs(torch, batch, k, alpha, kv_bytes, device):
    """The study's generator: drafts uniform, k_i ~ Binomial(K, alpha), one mismatch at k_i."""
    rng = random.Random(7 + batch * 1000003 + k * 1009 + int(alpha * 100))
    drafts = [[rng.randrange(VOCAB) for _ in range(k)] for _ in range(batch)]
    targets = []
    for row in drafts:
        accepted = sum(rng.random() < alpha for _ in range(k))
        t = row + [rng.randrange(VOCAB)]
        if accepted < k:
            t[accepted] = (t[accepted] + 1 + rng.randrange(VOCAB - 1)) % VOCAB
        targets.append(t)
    long = dict(dtype=torch.long, device=device)
    slots = torch.randint(0, 1 << 24, (batch, k + 1), dtype=torch.int32, device=device)
    kv = None
    if kv_bytes:
        kv = torch.randint(0, 256, (batch * (k + 1), kv_bytes), dtype=torch.uint8, device=device)
    return (torch.tensor(drafts, **long).view(batch, k), torch.tensor(targets, **long), slots, kv)


def two_step(torch, drafts, targets, slots, kv, positions):
    """Acceptance, next token, then mask-gather packing. Returns every output."""
    k = drafts.shape[1]
    # Step 1: accepted lengths from eq / cumprod / sum; the next token by gather.
    matches = (drafts == targets[:, :k]).to(torch.int32)
    accepted = matches.cumprod(dim=1).sum(dim=1)
    next_tokens = targets.gather(1, accepted.unsqueeze(1)).squeeze(1)
    # Step 2: committed positions j <= k_i, gathered flat.
    mask = positions.unsqueeze(0) <= accepted.unsqueeze(1)
    index = mask.view(-1).nonzero().squeeze(1)
    cu_committed = torch.nn.functional.pad(torch.cumsum(accepted + 1, 0), (1, 0))
    committed_tokens = targets.view(-1).index_select(0, index)
    committed_slots = slots.view(-1).index_select(0, index)
    packed_kv = kv.index_select(0, index) if kv is not None else None
    return accepted, next_tokens, cu_committed, committed_tokens, committed_slots, packed_kv


def check(torch, drafts, targets, outputs):
    """The baseline's acceptance against a plain Python scan (it must compute the right thing)."""
    accepted, next_tokens = outputs[0].tolist(), outputs[1].tolist()
    for i, (d, t) in enumerate(zip(drafts.tolist(), targets.tolist())):
        k = 0
        while k < len(d) and d[k] == t[k]:
            k += 1
        if accepted[i] != k or next_tokens[i] != t[k]:
            raise RuntimeError(f"baseline mismatch at sequence {i}")
    if outputs[3].numel() != sum(a + 1 for a in accepted):
        raise RuntimeError("baseline packed the wrong number of tokens")


def time_calls(torch, fn, iters):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, stop in zip(starts, stops):
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    us = sorted(start.elapsed_time(stop) * 1e3 for start, stop in zip(starts, stops))
    return us[len(us) // 2], us[min(len(us) - 1, len(us) * 95 // 100)]


def header():
    print(f"row {'impl':<12} {'batch':>5} {'K':>4} {'alpha':>5} {'kv_B':>6} "
          f"{'median_us':>9} {'p95_us':>9}")


def run_config(torch, batch, k, alpha, kv_bytes, iters, rows):
    drafts, targets, slots, kv = make_inputs(torch, batch, k, alpha, kv_bytes, "cuda")
    positions = torch.arange(k + 1, device="cuda")
    fn = lambda: two_step(torch, drafts, targets, slots, kv, positions)  # noqa: E731
    check(torch, drafts, targets, fn())
    median, p95 = time_calls(torch, fn, iters)
    rows[("torch", batch, k, round(alpha, 2), kv_bytes)] = median
    print(f"row {'torch':<12} {batch:5d} {k:4d} {alpha:5.2f} {kv_bytes:6d} {median:9.2f} "
          f"{p95:9.2f}", flush=True)


def bench(torch, quick, iters):
    """Times every configuration, printing rows; returns them as parse_rows would."""
    rows = {}
    print(f"# verify_torch_bench on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{iters} iterations after {WARMUP} warm-ups, median/p95 us")
    sweep = QUICK_SWEEP if quick else SWEEP
    print("# sweep: acceptance + packing of tokens and KV slots (kv_bytes 0)")
    header()
    for batch in sweep["batches"]:
        for k in sweep["ks"]:
            for alpha in sweep["alphas"]:
                run_config(torch, batch, k, alpha, 0, iters, rows)
    crossover = QUICK_CROSSOVER if quick else CROSSOVER
    print("# crossover configurations, alpha 0.9, KV rows of kv_bytes")
    header()
    for k in crossover["ks"]:
        for kv_bytes in crossover["kv"]:
            for batch in crossover["batches"]:
                run_config(torch, batch, k, 0.9, kv_bytes, iters, rows)
    return rows


def parse_rows(lines):
    """{(impl, batch, K, alpha, kv_bytes): median_us} from "row ..." lines (headers skipped)."""
    rows = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 8 or parts[0] != "row" or parts[1] == "impl":
            continue
        impl, batch, k, alpha, kv, median = parts[1:7]
        rows[(impl, int(batch), int(k), round(float(alpha), 2), int(kv))] = float(median)
    return rows


def compare(rows):
    """Ratio table and issue 5's targets from the combined rows."""
    configs = sorted({key[1:] for key in rows if key[0] == "torch"})
    print("# ratios of medians: torch/fused, torch/multiblock, torch/ballot, serial/ballot, "
          "fused/multiblock")
    print(f"{'batch':>5} {'K':>4} {'alpha':>5} {'kv_B':>6} {'torch_us':>9} {'fused_us':>9} "
          f"{'t/fused':>8} {'t/multi':>8} {'t/ballot':>8} {'ser/bal':>8} {'fus/mul':>8}")

    def ratio(a, b):
        return f"{a / b:8.2f}" if a is not None and b else f"{'-':>8}"

    met, total = 0, 0
    for config in configs:
        get = lambda impl: rows.get((impl,) + config)  # noqa: E731
        torch_us, fused, multi = get("torch"), get("fused"), get("multiblock")
        ballot, serial = get("ballot"), get("serial")
        print(f"{config[0]:5d} {config[1]:4d} {config[2]:5.2f} {config[3]:6d} {torch_us:9.2f} "
              f"{fused if fused else float('nan'):9.2f} {ratio(torch_us, fused)} "
              f"{ratio(torch_us, multi)} {ratio(torch_us, ballot)} {ratio(serial, ballot)} "
              f"{ratio(fused, multi)}")
    print("# issue 5 targets")
    for config in configs:
        batch, k, alpha, kv = config
        if k == 8 and batch <= 32 and kv == 0 and rows.get(("fused",) + config):
            r = rows[("torch",) + config] / rows[("fused",) + config]
            total += 1
            met += r >= 10
            print(f"target torch/fused >= 10x  batch {batch:3d} K 8 alpha {alpha:.2f}: "
                  f"{r:6.2f}x {'met' if r >= 10 else 'NOT met'}")
    key = (32, 128, 0.9, 0)
    if ("ballot",) + key in rows and ("serial",) + key in rows:
        r = rows[("serial",) + key] / rows[("ballot",) + key]
        total += 1
        met += r >= 1.5
        print(f"target serial/ballot >= 1.5x batch 32 K 128 alpha 0.90: {r:6.2f}x "
              f"{'met' if r >= 1.5 else 'NOT met'}")
    print(f"targets met: {met}/{total}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--compare", metavar="VERIFY_BENCH_OUTPUT")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    try:
        import torch
    except ImportError:
        print("verify_torch_bench: PyTorch is not installed", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("verify_torch_bench: no CUDA device", file=sys.stderr)
        return 77
    rows = bench(torch, args.quick, args.iters)
    if args.compare:
        with open(args.compare) as f:
            kernel_rows = parse_rows(f)
        kernel_rows.update(rows)
        compare(kernel_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
