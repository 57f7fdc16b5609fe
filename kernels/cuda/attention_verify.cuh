// Split-KV paged attention for short query runs (speculative verification: K + 1 queries per
// sequence with the GQA group folded into rows). Builds on the prefill tiles; its splits merge
// with the decode combine kernel. Include from .cu files only.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_prefill.cuh"

namespace specd::kernels::attention {

// ---------------------------------------------------------------------------------------------
// Verification (short query runs, split-KV). Grid: one CTA per (sequence, kv head, row tile,
// split), flattened into blockIdx.x in that order (split fastest). A sequence's q_len queries and
// its kv head's `group` q heads fold into q_len * group rows, row r = query r / group, q head
// kv_head * group + r % group, so the whole group and every query of the run share one read of
// the KV; a row tile is 16 rows per warp (kWarps warps). The CTA's keys -- those its rows may see,
// [window start of its first query, position of its last query] -- are cut into num_splits equal
// runs of kBlockN-key tiles, one per split, which stream through a kStages-deep cp.async ring of
// K/V tiles in shared memory (the prefill kernel's swizzled tiles, ldmatrix and mma math; each
// warp computes its 16 rows against every tile), each row masked by its own causal limit (query
// i of q_len sees keys <= seq_len - q_len + i) and window. One split writes bf16 rows of `out`;
// more write fp32 partial rows and their log2-sum-exps for the combine (attention_combine.cuh),
// whose rows are (token, q head) here. A row that sees no key of its split (an empty split, or keys
// all past its causal limit) gets lse -inf (weight 0) and no partial row. The token-tree variant
// (TreeVerifyVariant) also hides, on the tiles that reach a sequence's tree, each row's keys its
// query token's mask row leaves clear (attention_prefill.cuh, ApplyTreeMaskRow). Dynamic shared
// memory: VerifySmemBytes. References: Tri Dao et al., "Flash-Decoding for long-context inference"
// (2023); FlashInfer's batch decode with GQA group folding.

struct VerifyParams {
  PrefillParams pre;  // q, caches, tables, cu_q_lens, seq_lens, out: as for the prefill kernel
  int32_t num_q_heads;
  int32_t max_q_len;      // queries past it (of a longer run) are not computed
  int32_t num_row_tiles;  // ceil(max_q_len * group / (16 * kWarps))
  int32_t num_splits;
  float* partial_out;  // num_splits > 1: [num_tokens, num_q_heads, num_splits, head_dim] fp32
  float* partial_lse;  // num_splits > 1: [num_tokens, num_q_heads, num_splits] fp32, log2 domain
};

template <int kHeadDim, int kStages>
constexpr int VerifySmemBytes() {
  return kStages * 2 * PrefillConfig<kHeadDim>::kTileElems * 2;  // K and V stages, bf16
}

// The kernel's variant policy (FlashInfer's attention variants): where key j of the attention
// lives and what else a tile's scores feed. This default -- key j is position j of the sequence,
// no hook -- is PagedVerifyAttention; every member compiles to the code the kernel had before
// variants. The Vegas variants (vegas_attention.cuh: score collection, token-index sparse keys)
// provide the same members:
//   Params               the kernel's parameter struct: VerifyParams or a struct derived from it
//   Keys(params, seq)    per-CTA key map: Count(seq_len) the keys of the sequence (its queries
//                        are the last q_len of them), LoadTile(...) LoadPrefillKvTile's contract
//                        with keys in place of positions
//   kScoreHook           whether TileScores runs on every tile: for custom rows (NSA) on the raw
//                        Q K^T scores before the mask (the Keys member), else (VegasScoreVariant)
//                        on the scaled, masked log2-domain scores with the rows' running softmax
//                        statistics (m, l) before the tile, then FinishScores after the last tile
//   kMinCtasPerSm        __launch_bounds__' CTAs per SM; 0 leaves ptxas its own register choice
//                        (the dense kernel's; 1 lets a variant with more live state use up to 255
//                        registers instead of spilling)
//   kTreeMask            optional (VerifyTreeMask: false where absent): whether Params holds a
//                        token-tree mask (`tree`, TreeMaskParams) that each row's keys pass too
struct DenseVerifyVariant {
  using Params = VerifyParams;
  static constexpr bool kScoreHook = false;
  static constexpr bool kTreeMask = false;
  static constexpr int kMinCtasPerSm = 0;
  struct Keys {
    template <typename AnyParams>
    __device__ __forceinline__ Keys(const AnyParams&, int) {}
    __device__ __forceinline__ int Count(int seq_len) { return seq_len; }
    template <int kHeadDim, int kThreads>
    __device__ __forceinline__ void LoadTile(const PrefillParams& p, const int32_t* table,
                                             int kv_head, int tile, int kv_lo, int kv_hi,
                                             __nv_bfloat16* k_stage, __nv_bfloat16* v_stage) const {
      LoadPrefillKvTile<kHeadDim, kThreads, true>(p, table, kv_head, tile, kv_lo, kv_hi, k_stage,
                                                  v_stage);
    }
  };
};

// Token-tree verification (attention.h, AttentionTreeMask): the dense keys and mask, plus each
// row's tree-mask bits -- the row of its query token (rows fold queries and q heads) -- on the
// tiles that reach its sequence's tree.
struct TreeVerifyParams : VerifyParams {
  TreeMaskParams tree;
};
struct TreeVerifyVariant {
  using Params = TreeVerifyParams;
  using Keys = DenseVerifyVariant::Keys;
  static constexpr bool kScoreHook = false;
  static constexpr bool kTreeMask = true;
  // The tree pass spilled at head_dim 16 and 64 (one warp) under ptxas' default register choice
  // (168); one CTA per SM as the floor lets it take up to 255, which still fits the 4 CTAs per
  // SM the grid is sized for.
  static constexpr int kMinCtasPerSm = 1;
};

// Variant::kTreeMask, false for variants without the member (the Vegas variants).
template <typename Variant, typename = void>
struct VerifyTreeMask : std::false_type {};
template <typename Variant>
struct VerifyTreeMask<Variant, std::void_t<decltype(Variant::kTreeMask)>>
    : std::bool_constant<Variant::kTreeMask> {};

// Variant::kCustomRows, false where absent (the dense, tree and Vegas variants). A custom-rows
// variant (the NSA variants, nsa_attention.cuh) takes over what the default derives from a
// sequence's run: the CTA's unit (blockIdx' sequence slot) is whatever its Keys name, rows are
// (query, branch, q head) with Variant::kBranches softmaxes per query and head, each row's
// position, key range and mask come from Keys, and every CTA writes fp32 partial rows (even with
// one split) for the variant's own combine; it waits for its predecessor grid first, so its
// launcher may launch it as a programmatic dependent. Its Keys add to the default members:
//   Keys(params, unit, kv_head)  first_token, num_queries, table_row (the block-table row)
//   Position(qi)                 query qi's position
//   KeyRange(q_first, q_last, kv_lo, kv_hi)   keys any row of queries q_first..q_last may see
//   WarpNeedsTile<kHeadDim>(key0, pos, qi, branch, valid)  false (warp-uniform) skips the tile's
//                                math for the warp, whose rows would mask all of it
//   MaskTile<kHeadDim>(params, s, key0, pos, qi, branch, t)   scales and masks a tile's scores
//   TileScores<kHeadDim>(params, s, key0, token, head, valid, pos, t)  with kScoreHook
// Partial row of (token, q head h, branch b): (token * num_q_heads + h) * kBranches + b.
template <typename Variant, typename = void>
struct VerifyCustomRows : std::false_type {};
template <typename Variant>
struct VerifyCustomRows<Variant, std::void_t<decltype(Variant::kCustomRows)>>
    : std::bool_constant<Variant::kCustomRows> {};

// Variant::kStagedKeys, false where absent. A staged-keys variant (NsaSparseVariant) copies what
// its key map reads per tile -- for the sparse NSA keys, the union's block ids, query masks and
// physical pages -- for the CTA's tiles into shared memory once, before the first tile, so no tile
// waits on a chain of global loads to find its keys. Its Keys add
//   Stage<kThreads>(params, smem, key_begin, key_end)  all threads; the kernel syncs after it
// and its Params a `staged_bytes` member: the dynamic shared memory past the K/V stages.
template <typename Variant, typename = void>
struct VerifyStagedKeys : std::false_type {};
template <typename Variant>
struct VerifyStagedKeys<Variant, std::void_t<decltype(Variant::kStagedKeys)>>
    : std::bool_constant<Variant::kStagedKeys> {};

// Softmaxes per (query, q head) row group: Variant::kBranches for custom-rows variants, else 1.
template <typename Variant, bool = VerifyCustomRows<Variant>::value>
struct VerifyBranches : std::integral_constant<int, 1> {};
template <typename Variant>
struct VerifyBranches<Variant, true> : std::integral_constant<int, Variant::kBranches> {};

// Variant::ScoreState where the variant has one (VegasScoreVariant: statistics its TileScores
// keeps across a split's tiles and FinishScores writes when the split ends), else an empty type.
// A stateful score hook also writes, per split, EmptyStats for a CTA without tiles and, from split
// 0, for the splits from the launch's num_splits to Variant::kStatSplits.
template <typename Variant, typename = void>
struct VerifyScoreState {
  struct type {};
  static constexpr bool kStateful = false;
};
template <typename Variant>
struct VerifyScoreState<Variant, std::void_t<typename Variant::ScoreState>> {
  using type = typename Variant::ScoreState;
  static constexpr bool kStateful = true;
};

// The CTA's key map: Keys(params, seq) for the default rows, Keys(params, unit, kv_head) for
// custom rows.
template <typename Variant>
__device__ __forceinline__ typename Variant::Keys MakeVerifyKeys(const typename Variant::Params& vp,
                                                                 int seq, int kv_head) {
  if constexpr (VerifyCustomRows<Variant>::value) {
    return typename Variant::Keys(vp, seq, kv_head);
  } else {
    return typename Variant::Keys(vp, seq);
  }
}

template <int kHeadDim, int kWarps, int kStages, typename Variant = DenseVerifyVariant>
__global__ void __launch_bounds__(kWarps* kWarpSize, Variant::kMinCtasPerSm)
    PagedVerifyKernel(const typename Variant::Params vp) {
  using Cfg = PrefillConfig<kHeadDim>;
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kCtaRows = 16 * kWarps;
  constexpr bool kTreeMask = VerifyTreeMask<Variant>::value;
  constexpr bool kCustomRows = VerifyCustomRows<Variant>::value;
  constexpr int kBranches = VerifyBranches<Variant>::value;
  static_assert(kStages >= 2 && !(kTreeMask && kCustomRows));
  extern __shared__ uint4 verify_smem[];  // K stages, V stages, staged keys (VerifyStagedKeys)
  __nv_bfloat16* k_smem = reinterpret_cast<__nv_bfloat16*>(verify_smem);
  __nv_bfloat16* v_smem = k_smem + kStages * Cfg::kTileElems;
  const PrefillParams& p = vp.pre;
  AllowDependentLaunch();
  // Custom rows (the NSA launchers) launch it as a programmatic dependent (common.cuh).
  if constexpr (kCustomRows) WaitForPrerequisiteGrid();
  // The metadata read before the first KV copy stays in L2 (KV copies: LoadPrefillKvTile).
  const uint64_t meta_policy = L2EvictLastPolicy();
  int index = blockIdx.x;
  const int split = index % vp.num_splits;
  index /= vp.num_splits;
  const int row_tile = index % vp.num_row_tiles;
  index /= vp.num_row_tiles;
  const int kv_head = index % p.num_kv_heads;
  const int seq = index / p.num_kv_heads;
  auto keys = MakeVerifyKeys<Variant>(vp, seq, kv_head);
  const int group = p.group;
  // Rows per query: the q-head group times the variant's branches (1 but for custom rows).
  const int query_rows = group * kBranches;
  int q_begin, q_len, seq_lens_value = 0, kv_lo, kv_hi;
  if constexpr (kCustomRows) {
    q_begin = keys.first_token;
    q_len = min(keys.num_queries, vp.max_q_len);
  } else {
    q_begin = LoadHinted(p.cu_q_lens + seq, meta_policy);
    const int q_end = LoadHinted(p.cu_q_lens + seq + 1, meta_policy);
    seq_lens_value = LoadHinted(p.seq_lens + seq, meta_policy);
    q_len = min(q_end - q_begin, vp.max_q_len);
  }
  const int num_rows = q_len * query_rows;
  const int r0 = row_tile * kCtaRows;
  if (r0 >= num_rows) return;  // CTA-uniform; no token owns these rows
  int seq_len = 0;             // custom rows: unused (their keys say where they are)
  if constexpr (!kCustomRows) {
    seq_len = keys.Count(min(seq_lens_value, p.max_blocks_per_seq << p.log2_block_size));
  }
  const int ctx = seq_len - q_len;            // position of query 0
  [[maybe_unused]] int tree_start = INT_MAX;  // the tree variant's first tree slot
  if constexpr (kTreeMask) tree_start = TreeStart(vp.tree, seq, seq_len);
  // Keys any row of this CTA may see: [kv_lo, kv_hi), then this split's share of its tiles.
  const int q_first = r0 / query_rows, q_last = (min(num_rows, r0 + kCtaRows) - 1) / query_rows;
  if constexpr (kCustomRows) {
    keys.KeyRange(q_first, q_last, kv_lo, kv_hi);
  } else {
    kv_hi = max(0, min(seq_len, ctx + q_last + 1));
    kv_lo = p.sliding_window > 0 ? max(0, ctx + q_first - p.sliding_window + 1) : 0;
  }
  const int first = kv_lo / Cfg::kBlockN;
  const int last = max(first, (kv_hi + Cfg::kBlockN - 1) / Cfg::kBlockN);
  const int per_split = (last - first + vp.num_splits - 1) / vp.num_splits;
  const int tile_begin = first + split * per_split;
  const int num_tiles = max(0, min(tile_begin + per_split, last) - tile_begin);

  constexpr bool kScoreState = VerifyScoreState<Variant>::kStateful && !kCustomRows;
  if constexpr (kScoreState) {  // the splits past the launch's, then an empty split's statistics
    const int rows_end = min(num_rows, r0 + kCtaRows);
    if (split == 0) {
      Variant::EmptyStats(vp, seq, kv_head, r0, rows_end, q_len, vp.num_splits,
                          Variant::kStatSplits);
    }
    if (num_tiles == 0)
      Variant::EmptyStats(vp, seq, kv_head, r0, rows_end, q_len, split, split + 1);
  }
  if (num_tiles == 0 && (vp.num_splits > 1 || kCustomRows)) {  // CTA-uniform: an empty partial
    for (int r = r0 + threadIdx.x; r < min(num_rows, r0 + kCtaRows); r += kThreads) {
      const int64_t token = q_begin + r / query_rows;
      const int in_query = r % query_rows;
      int64_t row = token * vp.num_q_heads + kv_head * group + in_query % group;
      if constexpr (kCustomRows) row = row * kBranches + in_query / group;
      vp.partial_lse[row * vp.num_splits + split] = kNegInf;
    }
    return;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = r0 + 16 * warp;
  const bool warp_active = warp_row0 < num_rows;  // warp-uniform
  // This lane's rows g and g + 8 of the warp's 16: query, q head, position; Q as A fragments
  // (rows past num_rows are zeros and never written).
  int row_token[2], row_head[2], row_pos[2];
  [[maybe_unused]] int row_query[2], row_branch[2];  // custom rows: query in the run, branch
  bool row_valid[2];
  uint32_t qf[Cfg::kKChunks][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp_row0 + g + 8 * h;
    row_valid[h] = r < num_rows;
    if constexpr (kCustomRows) {
      const int qi = row_valid[h] ? r / query_rows : 0;
      const int in_query = row_valid[h] ? r % query_rows : 0;
      row_query[h] = qi;
      row_branch[h] = in_query / group;
      row_token[h] = q_begin + qi;
      row_head[h] = kv_head * group + in_query % group;
      row_pos[h] = keys.Position(qi);
    } else {
      const int qi = row_valid[h] ? r / group : 0;
      row_token[h] = q_begin + qi;
      row_head[h] = kv_head * group + (row_valid[h] ? r % group : 0);
      row_pos[h] = ctx + qi;
    }
    const __nv_bfloat16* src = p.q + static_cast<int64_t>(row_token[h]) * p.q_stride +
                               static_cast<int64_t>(row_head[h]) * kHeadDim + 2 * t;
#pragma unroll
    for (int c = 0; c < Cfg::kKChunks; ++c) {
      qf[c][h] = row_valid[h] ? __ldg(reinterpret_cast<const uint32_t*>(src + 16 * c)) : 0u;
      qf[c][2 + h] = row_valid[h] ? __ldg(reinterpret_cast<const uint32_t*>(src + 16 * c + 8)) : 0u;
    }
  }
  // Positions of the warp's first and last rows, for the tile-needs-a-mask test.
  [[maybe_unused]] const int warp_pos_lo = ctx + warp_row0 / group;
  [[maybe_unused]] const int warp_pos_hi = ctx + (min(num_rows, warp_row0 + 16) - 1) / group;
  float o[Cfg::kOTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  [[maybe_unused]] typename VerifyScoreState<Variant>::type score_state{};
  if constexpr (kScoreState) score_state.Init(vp, seq, kv_head, warp_row0, num_rows, q_len, lane);

  int table_row = seq;
  if constexpr (kCustomRows) table_row = keys.table_row;
  const int32_t* table = p.block_tables + static_cast<int64_t>(table_row) * p.max_blocks_per_seq;
  if constexpr (VerifyStagedKeys<Variant>::value) {
    keys.template Stage<kThreads>(vp, v_smem + kStages * Cfg::kTileElems, tile_begin * Cfg::kBlockN,
                                  (tile_begin + num_tiles) * Cfg::kBlockN);
    __syncthreads();
  }
  // Prologue: the first kStages - 1 tiles, one cp.async group each (empty past the end, so the
  // group count stays uniform for the waits).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) {
      keys.template LoadTile<kHeadDim, kThreads>(p, table, kv_head, tile_begin + s, kv_lo, kv_hi,
                                                 k_smem + s * Cfg::kTileElems,
                                                 v_smem + s * Cfg::kTileElems);
    }
    CpAsyncCommit();
  }
  int stage = 0;
#pragma unroll 1
  for (int it = 0; it < num_tiles; ++it) {
    CpAsyncWait<kStages - 2>();  // tile `it` has landed (later ones may be in flight)
    __syncthreads();  // visible to every warp; every warp is done with the stage refilled next
    {
      const int ahead = it + kStages - 1;
      const int fill = stage == 0 ? kStages - 1 : stage - 1;  // the stage read last iteration
      if (ahead < num_tiles) {
        keys.template LoadTile<kHeadDim, kThreads>(p, table, kv_head, tile_begin + ahead, kv_lo,
                                                   kv_hi, k_smem + fill * Cfg::kTileElems,
                                                   v_smem + fill * Cfg::kTileElems);
      }
      CpAsyncCommit();
    }
    const __nv_bfloat16* k_stage = k_smem + stage * Cfg::kTileElems;
    const __nv_bfloat16* v_stage = v_smem + stage * Cfg::kTileElems;
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (!warp_active) continue;
    const int tile = tile_begin + it;
    if constexpr (kCustomRows) {  // warp-uniform: no row of the warp sees a key of the tile
      if (!keys.template WarpNeedsTile<kHeadDim>(tile * Cfg::kBlockN, row_pos, row_query,
                                                 row_branch, row_valid)) {
        continue;
      }
    }

    // S = Q K^T: ldmatrix x4 gives B of two k-chunks for 8 keys.
    float s[Cfg::kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      if constexpr (Cfg::kKChunks == 1) {  // head_dim 16: ldmatrix x2, one k-chunk
        uint32_t b[2];
        LdMatrixX2(
            b, SmemAddr(k_stage + SwizzledOffset<kHeadDim>(8 * nt + (lane & 7), (lane >> 3) & 1)));
        Mma16816(s[nt][0], s[nt][1], s[nt][2], s[nt][3], qf[0][0], qf[0][1], qf[0][2], qf[0][3],
                 b[0], b[1]);
      } else {
#pragma unroll
        for (int c = 0; c < Cfg::kKChunks; c += 2) {
          uint32_t b[4];
          LdMatrixX4(b, SmemAddr(k_stage + SwizzledOffset<kHeadDim>(8 * nt + (lane & 7),
                                                                    2 * c + (lane >> 3))));
          Mma16816(s[nt][0], s[nt][1], s[nt][2], s[nt][3], qf[c][0], qf[c][1], qf[c][2], qf[c][3],
                   b[0], b[1]);
          Mma16816(s[nt][0], s[nt][1], s[nt][2], s[nt][3], qf[c + 1][0], qf[c + 1][1], qf[c + 1][2],
                   qf[c + 1][3], b[2], b[3]);
        }
      }
    }
    if constexpr (Variant::kScoreHook && kCustomRows) {  // raw scores, before scale and mask
      keys.template TileScores<kHeadDim>(vp, s, tile * Cfg::kBlockN, row_token, row_head, row_valid,
                                         row_pos, t);
    }
    // Causal and window mask per row (only where the tile reaches past some row's visible keys).
    const int key0 = tile * Cfg::kBlockN;
    if constexpr (kCustomRows) {  // each row's own mask (branch, selection, window)
      keys.template MaskTile<kHeadDim>(vp, s, key0, row_pos, row_query, row_branch, t);
    } else {
      // Tree variant: a tile that reaches the tree (CTA-uniform) takes the causal mask, then the
      // tree bits of rows g and g + 8 (their query tokens' mask rows).
      [[maybe_unused]] bool tree_tile = false;
      if constexpr (kTreeMask) tree_tile = key0 + Cfg::kBlockN > tree_start;
      const bool needs_mask = key0 + Cfg::kBlockN - 1 > warp_pos_lo ||
                              (p.sliding_window > 0 && key0 <= warp_pos_hi - p.sliding_window) ||
                              key0 < kv_lo || key0 + Cfg::kBlockN > kv_hi || tree_tile;
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * nt + 2 * t + (e & 1);
          const int pos = row_pos[e >> 1];
          const bool valid =
              !needs_mask || (key <= pos && key >= kv_lo && key < kv_hi &&
                              (p.sliding_window == 0 || key > pos - p.sliding_window));
          s[nt][e] = valid ? s[nt][e] * p.scale_log2 : kNegInf;
        }
      }
      if constexpr (kTreeMask) {
        if (tree_tile) {
          ApplyTreeMaskRow<Cfg::kBlockN>(s, 0, vp.tree, row_token[0], tree_start, key0, t);
          ApplyTreeMaskRow<Cfg::kBlockN>(s, 1, vp.tree, row_token[1], tree_start, key0, t);
        }
      }
    }
    if constexpr (Variant::kScoreHook && !kCustomRows) {  // scaled and masked, m and l before
      Variant::template TileScores<kHeadDim>(vp, s, m, l, key0, ctx, lane, score_state);
    }
    SoftmaxAndAccumulatePV<kHeadDim>(s, m, l, o, v_stage, lane);
  }
  CpAsyncWait<0>();  // no copy outlives the CTA (only empty groups can remain)
  if (!warp_active) return;
  if constexpr (kScoreState) {
    if (num_tiles > 0) {  // else EmptyStats wrote them
      Variant::FinishScores(vp, score_state, m, l, seq, kv_head, split, warp_row0, lane);
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float row_sum = QuadSum(l[h]);
    if (!row_valid[h]) continue;
    const float inv_l = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
    if (vp.num_splits == 1 && !kCustomRows) {
      __nv_bfloat16* dst = p.out + static_cast<int64_t>(row_token[h]) * p.out_stride +
                           static_cast<int64_t>(row_head[h]) * kHeadDim + 2 * t;
#pragma unroll
      for (int j = 0; j < Cfg::kOTiles; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
            __floats2bfloat162_rn(o[j][2 * h] * inv_l, o[j][2 * h + 1] * inv_l);
      }
    } else {
      int64_t vrow = static_cast<int64_t>(row_token[h]) * vp.num_q_heads + row_head[h];
      if constexpr (kCustomRows) vrow = vrow * kBranches + row_branch[h];
      const int64_t prow = vrow * vp.num_splits + split;
      if (t == 0) vp.partial_lse[prow] = row_sum > 0.0f ? m[h] + __log2f(row_sum) : kNegInf;
      if (row_sum == 0.0f) continue;  // lse -inf: the combine kernel ignores the row's bits
      float* dst = vp.partial_out + prow * kHeadDim + 2 * t;
#pragma unroll
      for (int j = 0; j < Cfg::kOTiles; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[j][2 * h] * inv_l, o[j][2 * h + 1] * inv_l);
      }
    }
  }
}

}  // namespace specd::kernels::attention
