// Sparse drafting attention for one query per sequence (Vegas' draft steps; launcher in vegas.cu,
// contract in vegas.h, PagedSparseDecodeAttention): the split-KV decode kernel of
// attention_decode.cuh over a key list instead of a contiguous range. Key j of a sequence is
// token token_indices[j] for j < count, else token recent_start + j - count (the selected prefix
// tokens, then every token from recent_start up to the query): so the keys ascend with their
// positions, as VegasSparseVariant's do. Each warp streams its tiles' K and V rows straight into
// registers as PagedDecodeKernel does, but every lane addresses its own tokens' rows (a key's
// token, then its block through the table), and the next tile's rows are looked up while the
// current tile's K and V loads are in flight, so the two dependent loads of a key cost no
// latency of their own. Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_decode.cuh"

namespace specd::kernels::attention {

struct SparseDecodeKeys {
  const int32_t* token_indices;  // [rows, index_stride]
  int64_t index_stride;
  const int32_t* index_counts;   // [rows]
  const int32_t* recent_starts;  // [num_seqs]
  const int32_t* index_rows;     // [num_seqs] each sequence's row; null: row = sequence
};

// The cache rows (block, kv head, row) of one tile's tokens, as a lane needs them: K of token
// 8 tt + g, V of tokens 8 tt + 2 t + e (-1: past the keys). 32 bits: a layer's cache holds fewer
// than 2^31 rows of head_dim elements (2^31 rows would be 512 GiB at head_dim 128), and 64-bit
// rows for the current and the next tile spilled registers.
template <int kTokTiles>
struct SparseTileRows {
  int32_t k[kTokTiles];
  int32_t v[kTokTiles][2];
};

template <int kHeadDim, int kRows>
__device__ __forceinline__ void SparseRows(
    const DecodeParams& p, const int32_t* table, const int32_t* indices, int count,
    int recent_start, int num_keys, int kv_head, int tok0, int lane,
    SparseTileRows<DecodeConfig<kHeadDim, kRows>::kTokTiles>& r) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  const int g = lane / 4, t = lane % 4;
  const int block_mask = (1 << p.log2_block_size) - 1;
  auto row_of = [&](int key) -> int32_t {
    if (key >= num_keys) return -1;
    const int tok = key < count ? __ldg(indices + key) : recent_start + (key - count);
    const int block = __ldg(table + (tok >> p.log2_block_size));
    return ((block * p.num_kv_heads + kv_head) << p.log2_block_size) | (tok & block_mask);
  };
#pragma unroll
  for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
    r.k[tt] = row_of(tok0 + 8 * tt + g);
#pragma unroll
    for (int e = 0; e < 2; ++e) r.v[tt][e] = row_of(tok0 + 8 * tt + 2 * t + e);
  }
}

// One tile: K and V of the looked-up rows (masked keys' V as zeros), then DecodeTile.
template <int kHeadDim, int kRows>
__device__ __forceinline__ void SparseDecodeStep(
    const DecodeParams& p, const SparseTileRows<DecodeConfig<kHeadDim, kRows>::kTokTiles>& r,
    int lane,
    const uint4 (&q)[DecodeConfig<kHeadDim, kRows>::kHalves][DecodeConfig<kHeadDim, kRows>::kKVecs],
    DecodeWarpState<kHeadDim, kRows>& st) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  const int g = lane / 4, t = lane % 4;
  const bool v_in_row = Cfg::kRowVecs >= 8 || g < Cfg::kRowVecs;  // head_dim < 64: pad lanes
  uint4 k[Cfg::kTokTiles][Cfg::kKVecs];
  uint4 v[Cfg::kTokTiles][2][Cfg::kVVecs];
  bool valid[Cfg::kTokTiles][2];
#pragma unroll
  for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
    const __nv_bfloat16* k_row =
        p.k_cache + static_cast<int64_t>(r.k[tt] < 0 ? 0 : r.k[tt]) * kHeadDim + 8 * t;
#pragma unroll
    for (int i = 0; i < Cfg::kKVecs; ++i) {
      const bool in_row = Cfg::kRowVecs >= 4 || t + 4 * i < Cfg::kRowVecs;
      // A masked key's K is read from row 0 (any finite row: its score is masked to -inf).
      k[tt][i] = in_row ? LoadStreaming(k_row + 32 * i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      valid[tt][e] = r.v[tt][e] >= 0;
      const __nv_bfloat16* v_row =
          p.v_cache + static_cast<int64_t>(valid[tt][e] ? r.v[tt][e] : 0) * kHeadDim + 8 * g;
#pragma unroll
      for (int jj = 0; jj < Cfg::kVVecs; ++jj) {
        v[tt][e][jj] =
            valid[tt][e] && v_in_row ? LoadStreaming(v_row + 64 * jj) : make_uint4(0, 0, 0, 0);
      }
    }
  }
  DecodeTile<kHeadDim, kRows>(q, k, v, valid, p.scale_log2, t, st);
}

// Occupancy the register budget is sized for: PagedDecodeKernel's, but 3 CTAs an SM at
// head_dim 128 (the lookups' rows for two tiles spilled at 4: 128 registers a thread).
template <int kHeadDim, int kRows>
inline constexpr int kSparseDecodeMinCtas =
    kHeadDim == 128 ? 3 : DecodeConfig<kHeadDim, kRows>::kMinCtasPerSm;

// Grid and outputs as PagedDecodeKernel (one CTA per (sequence, kv head, part, split); splits
// divide the sequence's key list).
template <int kHeadDim, int kRows>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim, kRows>::kThreads,
                                  kSparseDecodeMinCtas<kHeadDim, kRows>)
    PagedSparseDecodeKernel(const DecodeParams p, const SparseDecodeKeys keys) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  __shared__ DecodeSmem<kHeadDim, kRows> sm;
  AllowDependentLaunch();     // first: dependents launch early (common.cuh)
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  int index = blockIdx.x;
  const int split = index % p.num_splits;
  index /= p.num_splits;
  const int part = index % p.num_parts;
  index /= p.num_parts;
  const int kv_head = index % p.num_kv_heads;
  const int seq = index / p.num_kv_heads;
  const int head0 = kv_head * p.group + part * kRows;
  const int rows = min(kRows, p.group - part * kRows);
  // The sequence's keys: its list (clipped to the stride) and the tokens from recent_start.
  const int list_row = keys.index_rows != nullptr ? __ldg(keys.index_rows + seq) : seq;
  const int seq_len =
      max(0, min(__ldg(p.seq_lens + seq), p.max_blocks_per_seq << p.log2_block_size));
  int count = __ldg(keys.index_counts + list_row);
  count = count < 0 ? 0 : count > keys.index_stride ? static_cast<int>(keys.index_stride) : count;
  const int recent_start = min(max(0, __ldg(keys.recent_starts + seq)), seq_len);
  const int num_keys = count + seq_len - recent_start;
  const int last = (num_keys + Cfg::kStep - 1) / Cfg::kStep;
  const int per_split = (last + p.num_splits - 1) / p.num_splits;
  const int first_tile = split * per_split, last_tile = min(first_tile + per_split, last);
  if (first_tile >= last_tile) {  // CTA-uniform
    WriteDecodeRows<kHeadDim, kRows>(p, seq, head0, rows, split, nullptr, nullptr);
    return;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  uint4 q[Cfg::kHalves][Cfg::kKVecs];
  LoadDecodeQ<kHeadDim, kRows>(p, seq, head0, rows, lane, q);
  DecodeWarpState<kHeadDim, kRows> st;
  st.Init();
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int32_t* indices = keys.token_indices + static_cast<int64_t>(list_row) * keys.index_stride;
  int tile = first_tile + warp;
  SparseTileRows<Cfg::kTokTiles> cur, next;
  if (tile < last_tile) {
    SparseRows<kHeadDim, kRows>(p, table, indices, count, recent_start, num_keys, kv_head,
                                tile * Cfg::kStep, lane, cur);
  }
#pragma unroll 1
  for (; tile < last_tile; tile += Cfg::kWarps) {
    const int after = tile + Cfg::kWarps;
    if (after < last_tile) {
      SparseRows<kHeadDim, kRows>(p, table, indices, count, recent_start, num_keys, kv_head,
                                  after * Cfg::kStep, lane, next);
    }
    SparseDecodeStep<kHeadDim, kRows>(p, cur, lane, q, st);
    cur = next;
  }
  const float* out_tile = MergeDecodeWarps<kHeadDim, kRows>(sm, st, warp, lane);
  WriteDecodeRows<kHeadDim, kRows>(p, seq, head0, rows, split, out_tile, sm.lse);
}

}  // namespace specd::kernels::attention
