// Pipelined split-KV decode kernel: PagedDecodeKernel's CTA work and tile math with K/V tiles
// staged through a cp.async ring in shared memory (attention_decode.cuh has the register kernel
// and the combine). Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_decode.cuh"

namespace specd::kernels::attention {

// Pipelined decode: the same CTA work and tile math as PagedDecodeKernel, but each warp streams
// its tiles through a private ring of kStages K/V tiles in shared memory filled by cp.async, so
// kStages - 1 tiles (8 KiB each at head_dim 128) stay in flight while it computes one, without
// holding registers for them. 3 CTAs share an SM (2 stages: 64 KiB of ring per CTA) and leave
// registers for the combine kernel's CTAs to become resident before the decode grid drains
// (measured: the split path costs ~2 us over an unsplit launch of the same bytes, ~4 us after
// the register kernel, which fills the register file). Written for kStep 16 and rows of 8 or 16
// chunks (head_dim 64, 128); launched for head_dim 128 with up to 8 q heads per kv head, the
// shapes it was measured on. Dynamic shared memory: DecodePipeSmemBytes (the only shared memory:
// the warps merge through their rings, WriteMergedWarps). K/V copies carry an L2 evict-first
// policy and the sequence lengths and block-table reads an evict-last one, so the metadata every
// CTA waits on before its first KV load stays in L2 between calls.
// H100, Llama-3.1-8B shapes, context 32768, batch 1 (attention_bench --sweep 1, 2026-11-23): KV
// read at 81-82% of the copy bandwidth (33 splits) against 80-81% for the register kernel at
// its best split count, and 69% with 8 splits (64 CTAs) where the register kernel gets 47%.
// With the one-barrier merge and the L2 policies (2026-11-24, 32 splits): 85.1-85.3% in a scratch
// probe against 82.1-82.6% before (attention_bench median 84.9%); with the quarter-row combine
// (attention_combine.cuh) 85.4-85.8% in twelve attention_bench runs (docs/benchmarks.md, "fourth
// pass" and "fifth pass").
//
// Swizzles (16-byte chunk c of row r of a tile): K at c ^ 4 (r & 1), V at c ^ 2 ((r >> 1) & 3).
// DecodeTile's fragment reads take, per 8 lanes, 2 K rows x 4 chunks and 4 V rows x 2 chunks
// from rows 256 (head_dim 128) or 128 bytes apart: unswizzled, 2- and 4-way bank conflicts.
template <int kHeadDim>
struct DecodePipeLayout {
  static constexpr int kChunks = kHeadDim / 8;
  static_assert(kChunks == 8 || kChunks == 16);
  __device__ __forceinline__ static int K(int r, int c) {
    return r * kChunks + (c ^ ((r & 1) << 2));
  }
  __device__ __forceinline__ static int V(int r, int c) {
    return r * kChunks + (c ^ (((r >> 1) & 3) << 1));
  }
};

template <int kHeadDim, int kRows, int kStages>
constexpr int DecodePipeSmemBytes() {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  return Cfg::kWarps * kStages * 2 * Cfg::kStep * kHeadDim * 2;  // K and V, bf16
}

// Queues one tile's K and V (cache rows row0 .. row0 + kStep - 1, contiguous: a tile never spans
// blocks) into `stage` (K tile then V tile, uint4 chunks) under `l2_policy`. Masked tokens' V is
// zero-filled without reading the cache (stale rows may hold NaN, and 0 * NaN would poison O).
template <int kHeadDim, int kRows>
__device__ __forceinline__ void QueueDecodeTile(const DecodeParams& p, const DecodeRange& range,
                                                int64_t row0, int tok0, int lane, uint4* stage,
                                                uint64_t l2_policy) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  using L = DecodePipeLayout<kHeadDim>;
  constexpr int kTileChunks = Cfg::kStep * L::kChunks;
  static_assert(kTileChunks % kWarpSize == 0);
  const uint4* k_src = reinterpret_cast<const uint4*>(p.k_cache + row0 * kHeadDim);
  const uint4* v_src = reinterpret_cast<const uint4*>(p.v_cache + row0 * kHeadDim);
#pragma unroll
  for (int j = 0; j < kTileChunks / kWarpSize; ++j) {
    const int x = lane + kWarpSize * j, r = x / L::kChunks, c = x % L::kChunks;
    const int tok = tok0 + r;
    CpAsync16Hinted(SmemAddr(stage + L::K(r, c)), k_src + x, true, l2_policy);
    CpAsync16Hinted(SmemAddr(stage + kTileChunks + L::V(r, c)), v_src + x,
                    tok >= range.kv_begin && tok < range.kv_end, l2_policy);
  }
}

// Reads one queued tile into DecodeTile's fragments and runs it.
template <int kHeadDim, int kRows>
__device__ __forceinline__ void DecodePipeStep(
    const DecodeParams& p, const DecodeRange& range, int tok0, int lane, const uint4* stage,
    const uint4 (&q)[DecodeConfig<kHeadDim, kRows>::kHalves][DecodeConfig<kHeadDim, kRows>::kKVecs],
    DecodeWarpState<kHeadDim, kRows>& st) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  using L = DecodePipeLayout<kHeadDim>;
  constexpr int kTileChunks = Cfg::kStep * L::kChunks;
  const int g = lane / 4, t = lane % 4;
  uint4 k[Cfg::kTokTiles][Cfg::kKVecs];
  uint4 v[Cfg::kTokTiles][2][Cfg::kVVecs];
  bool valid[Cfg::kTokTiles][2];
#pragma unroll
  for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
#pragma unroll
    for (int i = 0; i < Cfg::kKVecs; ++i) k[tt][i] = stage[L::K(8 * tt + g, t + 4 * i)];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tok = tok0 + 8 * tt + 2 * t + e;
      valid[tt][e] = tok >= range.kv_begin && tok < range.kv_end;
#pragma unroll
      for (int jj = 0; jj < Cfg::kVVecs; ++jj) {
        v[tt][e][jj] = stage[kTileChunks + L::V(8 * tt + 2 * t + e, g + 8 * jj)];
      }
    }
  }
  DecodeTile<kHeadDim, kRows>(q, k, v, valid, p.scale_log2, t, st);
}

// Merges the four warps' states and writes the CTA's rows as WriteDecodeRows does, behind one
// barrier: each warp leaves its unnormalised O (as [kRows][kHeadDim] rows), row maxima and row
// sums in its own ring (free once the caller's CpAsyncWait<0> has landed its copies), then every
// thread merges float4 columns of the four warps. MergeDecodeWarps' tree (three barriers, two
// states at a time, then WriteDecodeRows re-reading the tile) kept the call's last CTAs ~1.4 us
// longer (H100, Llama-3.1-8B shapes, 32K, batch 1; docs/benchmarks.md, "fourth pass").
template <int kHeadDim, int kRows, int kStages>
__device__ __forceinline__ void WriteMergedWarps(const DecodeParams& p, int seq, int head0,
                                                 int rows, int split,
                                                 const DecodeWarpState<kHeadDim, kRows>& st,
                                                 uint4* rings, int warp, int lane) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  constexpr int kRingFloats = kStages * Cfg::kStep * kHeadDim;  // 2 tiles of bf16 per stage
  constexpr int kM = kRows * kHeadDim, kL = kM + kRows;         // offsets of m and l
  static_assert(kL + kRows <= kRingFloats);
  float* own = reinterpret_cast<float*>(rings) + warp * kRingFloats;
  const int g = lane / 4, t = lane % 4;
  __syncwarp();  // every lane is done reading the ring
#pragma unroll
  for (int h = 0; h < Cfg::kHalves; ++h) {
    const float l = QuadSum(st.l[h]);
    if (t == 0) own[kM + g + 8 * h] = st.m[h], own[kL + g + 8 * h] = l;
    st.StoreRows(own, h, make_float2(1.0f, 1.0f), lane);
  }
  __syncthreads();
  const float* all = reinterpret_cast<const float*>(rings);
  const int64_t row0 = static_cast<int64_t>(seq) * p.num_q_heads + head0;
  for (int i = threadIdx.x; i < rows * kHeadDim / 4; i += Cfg::kThreads) {
    const int r = i / (kHeadDim / 4), c = (i % (kHeadDim / 4)) * 4;
    float m[Cfg::kWarps], max_m = kNegInf;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      m[w] = all[w * kRingFloats + kM + r];
      max_m = fmaxf(max_m, m[w]);
    }
    // Warps that saw no key of the row (m = -inf) weigh exactly 0.
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float weight = m[w] == kNegInf ? 0.0f : exp2f(m[w] - max_m);
      if (weight == 0.0f) continue;
      const float* base = all + w * kRingFloats;
      sum += weight * base[kL + r];
      const float4 o = *reinterpret_cast<const float4*>(base + r * kHeadDim + c);
      acc.x += weight * o.x, acc.y += weight * o.y, acc.z += weight * o.z, acc.w += weight * o.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    if (p.num_splits == 1) {
      Bf16Vec<4> out;
      out.v[0] = __float2bfloat16_rn(acc.x), out.v[1] = __float2bfloat16_rn(acc.y);
      out.v[2] = __float2bfloat16_rn(acc.z), out.v[3] = __float2bfloat16_rn(acc.w);
      out.Store(p.out + seq * p.out_stride + static_cast<int64_t>(head0 + r) * kHeadDim + c);
    } else {
      *reinterpret_cast<float4*>(p.partial_out + ((row0 + r) * p.num_splits + split) * kHeadDim +
                                 c) = acc;
      if (c == 0) {
        p.partial_lse[(row0 + r) * p.num_splits + split] =
            sum > 0.0f ? max_m + __log2f(sum) : kNegInf;
      }
    }
  }
}

// Grid and arguments as PagedDecodeKernel (DecodeParams: q, caches, tables and outputs with
// their shapes above); kMinCtas: the occupancy its launch bounds size registers for.
template <int kHeadDim, int kRows, int kStages, int kMinCtas>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim, kRows>::kThreads, kMinCtas)
    PagedDecodePipeKernel(const DecodeParams p) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  static_assert(Cfg::kStep == 16 && kStages >= 2);
  constexpr int kTileChunks = Cfg::kStep * DecodePipeLayout<kHeadDim>::kChunks;
  extern __shared__ uint4 pipe_smem[];  // [kWarps][kStages][K tile, V tile]
  AllowDependentLaunch();               // first: dependents launch early (common.cuh)
  WaitForPrerequisiteGrid();            // launched as a programmatic dependent where it decodes
  const uint64_t kv_policy = L2EvictFirstPolicy(), meta_policy = L2EvictLastPolicy();
  int index = blockIdx.x;
  const int split = index % p.num_splits;
  index /= p.num_splits;
  const int part = index % p.num_parts;
  index /= p.num_parts;
  const int kv_head = index % p.num_kv_heads;
  const int seq = index / p.num_kv_heads;
  const int head0 = kv_head * p.group + part * kRows;
  const int rows = min(kRows, p.group - part * kRows);
  const DecodeRange range =
      SplitRangeOf<Cfg::kStep>(p, LoadHinted(p.seq_lens + seq, meta_policy), split);
  if (range.first_tile >= range.last_tile) {  // CTA-uniform
    WriteDecodeRows<kHeadDim, kRows>(p, seq, head0, rows, split, nullptr, nullptr);
    return;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  uint4* ring = pipe_smem + warp * kStages * 2 * kTileChunks;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int block_mask = (1 << p.log2_block_size) - 1;
  // Cache row of a tile's first token: (block, kv head) tile, then the row inside it.
  auto cache_row = [&](int tile, int block) {
    return ((static_cast<int64_t>(block) * p.num_kv_heads + kv_head) << p.log2_block_size) |
           ((tile * Cfg::kStep) & block_mask);
  };
  auto block_of = [&](int tile) {
    return tile < range.last_tile
               ? LoadHinted(table + ((tile * Cfg::kStep) >> p.log2_block_size), meta_policy)
               : 0;
  };
  // Prologue: the warp's first kStages - 1 tiles (warps take tiles round-robin), one cp.async
  // group each -- empty past the end, so the group count stays uniform for the waits below.
  int issue = range.first_tile + warp;
  int blocks[kStages - 1];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) blocks[s] = block_of(issue + s * Cfg::kWarps);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (issue < range.last_tile) {
      QueueDecodeTile<kHeadDim, kRows>(p, range, cache_row(issue, blocks[s]), issue * Cfg::kStep,
                                       lane, ring + s * 2 * kTileChunks, kv_policy);
    }
    CpAsyncCommit();
    issue += Cfg::kWarps;
  }
  int next_block = block_of(issue);  // fetched a tile ahead, so its latency hides behind one
  uint4 q[Cfg::kHalves][Cfg::kKVecs];
  LoadDecodeQ<kHeadDim, kRows>(p, seq, head0, rows, lane, q);
  DecodeWarpState<kHeadDim, kRows> st;
  st.Init();
  int read_stage = 0, write_stage = kStages - 1;
#pragma unroll 1
  for (int tile = range.first_tile + warp; tile < range.last_tile; tile += Cfg::kWarps) {
    CpAsyncWait<kStages - 2>();
    __syncwarp();  // every lane's copies of this tile landed; every lane is done with write_stage
    if (issue < range.last_tile) {
      QueueDecodeTile<kHeadDim, kRows>(p, range, cache_row(issue, next_block), issue * Cfg::kStep,
                                       lane, ring + write_stage * 2 * kTileChunks, kv_policy);
    }
    CpAsyncCommit();
    issue += Cfg::kWarps;
    next_block = block_of(issue);
    DecodePipeStep<kHeadDim, kRows>(p, range, tile * Cfg::kStep, lane,
                                    ring + read_stage * 2 * kTileChunks, q, st);
    write_stage = read_stage;
    read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
  }
  CpAsyncWait<0>();
  WriteMergedWarps<kHeadDim, kRows, kStages>(p, seq, head0, rows, split, st, pipe_smem, warp, lane);
}

}  // namespace specd::kernels::attention
