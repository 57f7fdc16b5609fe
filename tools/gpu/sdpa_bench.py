#!/usr/bin/env python3
"""sdpa_bench: PyTorch's scaled_dot_product_attention for one decode query, the baseline of
attention_bench. Same shapes (Llama-3.1-8B: 32 q heads, 8 kv heads, head_dim 128), context
32768, batch 1 and 8, on contiguous bf16 K/V [batch, kv_heads, context, head_dim] (enable_gqa,
so K/V are read once per kv head). Rate = KV bytes read / time, against a device-to-device copy
(bytes read + written / time) measured here with torch. Each number is the median of --iters
calls timed one by one with CUDA events, rotating over K/V sets that together exceed L2; each
SDPA backend that accepts the shapes gets a row, the default dispatch first.
  python3 tools/gpu/sdpa_bench.py [--iters N] [--context N]
Exit status: 0 when the default dispatch ran for every batch, 1 otherwise, 77 without a GPU.
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
ROTATION_BYTES = 2 << 30  # K/V bytes the rotation spans (H100 L2: 50 MB)
COPY_BYTES = 512 << 20
WARMUP = 5


def median_ms(iters, fn):
    """Median milliseconds of fn(i) over iters calls, each between its own pair of events."""
    for i in range(WARMUP):
        fn(i)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(iters)]
    for i, (start, stop) in enumerate(pairs):
        start.record()
        fn(i)
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in pairs)


def copy_gbps(iters):
    src = torch.full((COPY_BYTES // 2,), 1.1719, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(iters, lambda i: dst.copy_(src))
    return 2.0 * COPY_BYTES / (ms * 1e6)


def backends():
    """(name, context manager factory or None for the default dispatch)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = [("default", None)]
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is not None:
            rows.append((name.lower(), lambda b=backend: sdpa_kernel(b)))
    return rows


def time_batch(batch, context, iters):
    kv_bytes = 2 * batch * KV_HEADS * context * HEAD_DIM * 2
    num_sets = max(2, ROTATION_BYTES // kv_bytes)
    q = torch.empty(batch, HEADS, 1, HEAD_DIM, dtype=torch.bfloat16, device="cuda").uniform_(-8, 8)
    sets = []
    for _ in range(num_sets):
        k = torch.empty(batch, KV_HEADS, context, HEAD_DIM, dtype=torch.bfloat16,
                        device="cuda").uniform_(-1, 1)
        sets.append((k, torch.empty_like(k).uniform_(-1, 1)))
    results = []
    for name, make_ctx in backends():
        def call(i):
            k, v = sets[i % num_sets]
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            if make_ctx is None:
                ms = median_ms(iters, call)
            else:
                with make_ctx():
                    ms = median_ms(iters, call)
        except RuntimeError as e:  # the backend refuses these shapes
            results.append((name, None, str(e).splitlines()[0][:60]))
            continue
        results.append((name, ms, kv_bytes / (ms * 1e6)))
    del sets
    torch.cuda.empty_cache()
    return num_sets, kv_bytes, results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--context", type=int, default=32768)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_bench: no CUDA device visible", file=sys.stderr)
        return 77
    props = torch.cuda.get_device_properties(0)
    print(f"sdpa_bench: device 0: {props.name}, {props.multi_processor_count} SMs; torch "
          f"{torch.__version__}; median of {args.iters} calls")
    copy = copy_gbps(args.iters)
    rows, ok = [], True
    for batch in (1, 8):
        num_sets, kv_bytes, results = time_batch(batch, args.context, args.iters)
        print(f"batch {batch}: {num_sets} K/V sets of {kv_bytes / 2**20:.0f} MiB rotate")
        for name, ms, rate in results:
            if ms is None:
                print(f"  {name}: not run ({rate})")
                ok = ok and name != "default"
            else:
                rows.append((batch, name, ms, rate))
    print(f"memcpy D2D (torch copy_) {COPY_BYTES >> 20} MiB: {copy:.1f} GB/s "
          "(bytes read + written)")
    print(f"sdpa decode, Llama-3.1-8B shapes (hq 32, hkv 8, d 128), contiguous K/V, "
          f"context {args.context}:")
    print(f"{'batch':<6} {'backend':<20} {'us/call':>10} {'KV GB/s':>12} {'%memcpy':>9}")
    for batch, name, ms, rate in rows:
        print(f"{batch:<6} {name:<20} {ms * 1e3:>10.1f} {rate:>12.1f} {100 * rate / copy:>8.1f}%")
    print(f"sdpa_bench: {'ok' if ok else 'FAILED (default dispatch did not run)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
