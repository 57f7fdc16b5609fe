// Paged prefill attention kernel (flash-attention 2 over the paged cache; any number of queries
// per sequence) and the tile helpers the verification kernel shares. Include from .cu files only.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"

namespace specd::kernels::attention {

// ---------------------------------------------------------------------------------------------
// Prefill / verification (flash-attention 2 over the paged cache). Grid: (q tiles of 64 rows,
// q heads, sequences), the latest q tiles (the most keys) first. Each of the 4 warps owns 16
// query rows, held as A fragments in registers. K/V tiles of kBlockN tokens go through shared
// memory with cp.async, double buffered, each 16-byte chunk placed at column chunk ^ (row % 8)
// so ldmatrix reads are bank-conflict free; every chunk looks up its own block, so a tile may
// span blocks or sit inside one. Tokens outside the CTA's key range are zero-filled and never
// read from the cache. The token-tree variant (kTreeMask) also applies each row's tree mask on
// the tiles that reach its sequence's tree. Reference: Tri Dao, "FlashAttention-2" (2023),
// Algorithm 1.

struct PrefillParams {
  const __nv_bfloat16* q;  // [num_tokens, num_q_heads, head_dim], row stride q_stride
  int64_t q_stride;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  const int32_t* cu_q_lens;  // [num_seqs + 1]
  const int32_t* seq_lens;   // [num_seqs]
  int32_t num_kv_heads;
  int32_t group;
  int32_t log2_block_size;
  int32_t sliding_window;
  float scale_log2;
  __nv_bfloat16* out;  // [num_tokens, num_q_heads, head_dim], row stride out_stride
  int64_t out_stride;
};

// ---------------------------------------------------------------------------------------------
// Token-tree masks (speculative tree verification; attention.h, AttentionTreeMask): sequence s's
// keys at slots >= tree_starts[s] are visible to query token t only where bit (key - start) of
// t's mask row is set; keys before the start keep the causal rule alone. The tree variants of the
// prefill and verification kernels load their sequence's start once per CTA and, for each KV
// tile that reaches it, each row's mask bits for the tile's keys (kBlockN / 32 + 1 read-only
// 4-byte loads per row and tile; a tree is a few tiles at the end of the context).

struct TreeMaskParams {
  const int32_t* tree_starts;  // [num_seqs] int32, device; >= seq_len: no tree
  const uint64_t* masks;       // [num_tokens, mask_words] uint64, device
  int32_t mask_words;          // 1 .. kMaxTreeMaskWords
};

// The prefill kernel's parameters with a tree mask (PagedPrefillKernel<kHeadDim, true>).
struct PrefillTreeParams : PrefillParams {
  TreeMaskParams tree;
};
template <bool kTreeMask>
using PrefillKernelParams = std::conditional_t<kTreeMask, PrefillTreeParams, PrefillParams>;

// Sequence `seq`'s first tree slot (clipped to >= 0), or INT_MAX where it has no tree (a start
// at or past seq_len), so a tile reaches it only if the sequence has a tree and no mask row of a
// sequence without one is read.
__device__ __forceinline__ int TreeStart(const TreeMaskParams& tree, int seq, int seq_len) {
  const int start = __ldg(tree.tree_starts + seq);
  return start < seq_len ? max(start, 0) : INT_MAX;
}

// 32-bit word w of a mask row (bit b of the row is bit b % 32 of word b / 32: the uint64 words
// little-endian), extended: all ones before the row (keys before the tree start, which the
// causal rule alone decides), zeros past its mask_words (invalid keys).
__device__ __forceinline__ uint32_t TreeMaskWord32(const uint32_t* row, int words32, int w) {
  return w < 0 ? ~0u : w < words32 ? __ldg(row + w) : 0u;
}

// Hides the keys the tree does not show query row `token` (its mask row) in one tile's scores:
// s[nt][2 h + c] (C fragments: row g + 8 h of the warp, key key0 + 8 nt + 2 t + c) becomes -inf
// where the extended mask bit (key - start) is clear. The tile's bits are funnel-shifted out of
// the kBlockN / 32 + 1 words they span, one 32-bit window per 32 keys.
template <int kBlockN>
__device__ __forceinline__ void ApplyTreeMaskRow(float (&s)[kBlockN / 8][4], int h,
                                                 const TreeMaskParams& tree, int64_t token,
                                                 int start, int key0, int t) {
  constexpr int kWindows = (kBlockN + 31) / 32;
  const uint32_t* row = reinterpret_cast<const uint32_t*>(tree.masks + token * tree.mask_words);
  const int rel = key0 - start;
  const int w0 = rel >> 5, shift = rel & 31;  // floor division and its remainder, rel < 0 too
  uint32_t words[kWindows + 1];
#pragma unroll
  for (int i = 0; i <= kWindows; ++i) words[i] = TreeMaskWord32(row, 2 * tree.mask_words, w0 + i);
#pragma unroll
  for (int i = 0; i < kWindows; ++i) {
    const uint32_t window = __funnelshift_r(words[i], words[i + 1], shift);  // keys 32 i ...
#pragma unroll
    for (int nt = 4 * i; nt < 4 * i + 4 && nt < kBlockN / 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const bool visible = (window >> (8 * (nt - 4 * i) + 2 * t + c)) & 1u;
        s[nt][2 * h + c] = visible ? s[nt][2 * h + c] : kNegInf;
      }
    }
  }
}

template <int kHeadDim>
struct PrefillConfig {
  static_assert(kHeadDim == 16 || kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128 ||
                kHeadDim == 256);
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = 16 * kWarps;  // query rows per CTA
  // Keys per tile: 8 KiB of K per stage, capped at 128 keys (head_dim 16: 4 KiB) so S stays
  // at 64 registers per thread (256 keys make ptxas spill).
  static constexpr int kBlockN = kHeadDim >= 32 ? 4096 / kHeadDim : 128;
  static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks per K/V row
  static constexpr int kKChunks = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kSTiles = kBlockN / 8;     // n8 tiles of S
  static constexpr int kOTiles = kHeadDim / 8;    // n8 tiles of O
  static constexpr int kTileElems = kBlockN * kHeadDim;
  static constexpr int kCopiesPerThread = kBlockN * kChunks / kThreads;
  static_assert(kCopiesPerThread >= 1 && kCopiesPerThread * kThreads == kBlockN * kChunks);
  static_assert(kKChunks == 1 || kKChunks % 2 == 0);
  static_assert(kOTiles % 2 == 0 && kBlockN % 16 == 0);
};

// Element offset of (row, 16-byte chunk) in a swizzled [rows][kHeadDim] tile. Rows of 8 or more
// chunks XOR the chunk with row % 8; narrower rows (head_dim 16, 32: 8 / kChunks rows per 128
// bytes) XOR it with (row / (8 / kChunks)) % kChunks, so any 8 consecutive rows' chunk c still
// falls in 8 distinct 16-byte bank groups and the swizzle stays inside the row.
template <int kHeadDim>
__device__ __forceinline__ int SwizzledOffset(int row, int chunk) {
  constexpr int kChunks = kHeadDim / 8;
  if constexpr (kChunks >= 8) {
    return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
  } else {
    return row * kHeadDim + ((chunk ^ ((row / (8 / kChunks)) & (kChunks - 1))) << 3);
  }
}

// Queues the copies of keys [tile * kBlockN, +kBlockN) into one stage (kThreads threads share
// them); keys outside [kv_lo, kv_hi) become zeros. kStreamOnce (verification: each key is read
// once per call): KV copies evict first from L2 and block-table reads last (attention_common.cuh;
// the policies are made here, per tile, so they hold no registers across the caller's loop);
// prefill keeps the default policy, its query tiles share keys.
template <int kHeadDim, int kThreads = PrefillConfig<kHeadDim>::kThreads, bool kStreamOnce = false>
__device__ __forceinline__ void LoadPrefillKvTile(const PrefillParams& p, const int32_t* table,
                                                  int kv_head, int tile, int kv_lo, int kv_hi,
                                                  __nv_bfloat16* k_stage, __nv_bfloat16* v_stage) {
  const uint64_t kv_policy = kStreamOnce ? L2EvictFirstPolicy() : 0;
  const uint64_t meta_policy = kStreamOnce ? L2EvictLastPolicy() : 0;
  using Cfg = PrefillConfig<kHeadDim>;
  constexpr int kCopies = Cfg::kBlockN * Cfg::kChunks / kThreads;
  static_assert(kCopies >= 1 && kCopies * kThreads == Cfg::kBlockN * Cfg::kChunks);
  const int block_mask = (1 << p.log2_block_size) - 1;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int index = threadIdx.x + i * kThreads;
    const int row = index / Cfg::kChunks, chunk = index % Cfg::kChunks;
    const int tok = tile * Cfg::kBlockN + row;
    const bool valid = tok >= kv_lo && tok < kv_hi;
    int64_t offset = 0;
    if (valid) {
      const int32_t* entry = table + (tok >> p.log2_block_size);
      const int64_t block = kStreamOnce ? LoadHinted(entry, meta_policy) : __ldg(entry);
      offset = (((block * p.num_kv_heads + kv_head) << p.log2_block_size) | (tok & block_mask)) *
                   kHeadDim +
               chunk * 8;
    }
    const int dst = SwizzledOffset<kHeadDim>(row, chunk);
    if constexpr (kStreamOnce) {
      CpAsync16Hinted(SmemAddr(k_stage + dst), p.k_cache + offset, valid, kv_policy);
      CpAsync16Hinted(SmemAddr(v_stage + dst), p.v_cache + offset, valid, kv_policy);
    } else {
      CpAsync16(SmemAddr(k_stage + dst), p.k_cache + offset, valid);
      CpAsync16(SmemAddr(v_stage + dst), p.v_cache + offset, valid);
    }
  }
}

// One KV tile's second half, shared by the prefill and verification kernels: the online
// softmax over the warp's masked, scaled scores (log2 domain) and O += P V.
//   s     [kSTiles][4] fp32 registers; in: the tile's scores (-inf where masked); out: P
//   m, l  [2] running row max and sum of rows g and g + 8; o [kOTiles][4] running output
//   v_tile  the tile's V in shared memory, swizzled as LoadPrefillKvTile leaves it
template <int kHeadDim>
__device__ __forceinline__ void SoftmaxAndAccumulatePV(
    float (&s)[PrefillConfig<kHeadDim>::kSTiles][4], float (&m)[2], float (&l)[2],
    float (&o)[PrefillConfig<kHeadDim>::kOTiles][4], const __nv_bfloat16* v_tile, int lane) {
  using Cfg = PrefillConfig<kHeadDim>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = kNegInf;
#pragma unroll
    for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
      tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
    }
    float m_use;
    const float alpha = OnlineSoftmaxRescale(m[h], QuadMax(tile_max), m_use);
    l[h] *= alpha;
#pragma unroll
    for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[nt][2 * h + c] = exp2f(s[nt][2 * h + c] - m_use);
        l[h] += s[nt][2 * h + c];
      }
    }
#pragma unroll
    for (int j = 0; j < Cfg::kOTiles; ++j) o[j][2 * h] *= alpha, o[j][2 * h + 1] *= alpha;
  }
  // O += P V: two n8 tiles of S form one k16 A fragment; ldmatrix.trans gives B of two
  // head_dim n-tiles for 16 keys.
#pragma unroll
  for (int kc = 0; kc < Cfg::kBlockN / 16; ++kc) {
    const uint32_t a0 = PackBf16x2(s[2 * kc][0], s[2 * kc][1]);
    const uint32_t a1 = PackBf16x2(s[2 * kc][2], s[2 * kc][3]);
    const uint32_t a2 = PackBf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
    const uint32_t a3 = PackBf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
    for (int j = 0; j < Cfg::kOTiles; j += 2) {
      uint32_t b[4];
      LdMatrixX4Trans(
          b, SmemAddr(v_tile + SwizzledOffset<kHeadDim>(
                                   16 * kc + 8 * ((lane >> 3) & 1) + (lane & 7), j + (lane >> 4))));
      Mma16816(o[j][0], o[j][1], o[j][2], o[j][3], a0, a1, a2, a3, b[0], b[1]);
      Mma16816(o[j + 1][0], o[j + 1][1], o[j + 1][2], o[j + 1][3], a0, a1, a2, a3, b[2], b[3]);
    }
  }
}

// kTreeMask: the token-tree variant (parameters PrefillTreeParams); false compiles to the dense
// causal kernel, every tree step sitting under `if constexpr`.
template <int kHeadDim, bool kTreeMask = false>
__global__ void __launch_bounds__(PrefillConfig<kHeadDim>::kThreads)
    PagedPrefillKernel(const PrefillKernelParams<kTreeMask> p) {
  using Cfg = PrefillConfig<kHeadDim>;
  __shared__ alignas(128) __nv_bfloat16 k_smem[2][Cfg::kTileElems];
  __shared__ alignas(128) __nv_bfloat16 v_smem[2][Cfg::kTileElems];
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, seq = blockIdx.z;
  const int q_begin = p.cu_q_lens[seq];
  const int q_len = p.cu_q_lens[seq + 1] - q_begin;
  const int m0 = q_tile * Cfg::kBlockM;
  if (m0 >= q_len) return;
  const int seq_len = min(p.seq_lens[seq], p.max_blocks_per_seq << p.log2_block_size);
  const int ctx = seq_len - q_len;  // position of query 0 (the cached context before the chunk)
  const int kv_head = head / p.group;
  [[maybe_unused]] int tree_start = INT_MAX;  // the tree variant's first tree slot
  if constexpr (kTreeMask) tree_start = TreeStart(p.tree, seq, seq_len);
  // Keys any row of this CTA may see: [kv_lo, kv_hi).
  const int kv_hi = min(seq_len, ctx + min(m0 + Cfg::kBlockM, q_len));
  const int kv_lo = p.sliding_window > 0 ? max(0, ctx + m0 - p.sliding_window + 1) : 0;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;

  // Q rows m0 + 16 warp + g (+ 8) as A fragments; rows past q_len are zeros.
  uint32_t qf[Cfg::kKChunks][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = m0 + 16 * warp + g + 8 * h;
    const __nv_bfloat16* src = p.q + static_cast<int64_t>(q_begin + qi) * p.q_stride +
                               static_cast<int64_t>(head) * kHeadDim + 2 * t;
#pragma unroll
    for (int c = 0; c < Cfg::kKChunks; ++c) {
      qf[c][h] = qi < q_len ? __ldg(reinterpret_cast<const uint32_t*>(src + 16 * c)) : 0u;
      qf[c][2 + h] = qi < q_len ? __ldg(reinterpret_cast<const uint32_t*>(src + 16 * c + 8)) : 0u;
    }
  }
  float o[Cfg::kOTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  // Positions of this warp's first and last rows, for the tile-needs-a-mask test.
  const int warp_pos_lo = ctx + m0 + 16 * warp, warp_pos_hi = warp_pos_lo + 15;

  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int first_tile = kv_lo / Cfg::kBlockN;
  const int num_tiles = max(0, (kv_hi + Cfg::kBlockN - 1) / Cfg::kBlockN - first_tile);
  if (num_tiles > 0) {
    LoadPrefillKvTile<kHeadDim>(p, table, kv_head, first_tile, kv_lo, kv_hi, k_smem[0], v_smem[0]);
  }
  CpAsyncCommit();
  for (int it = 0; it < num_tiles; ++it) {
    const int tile = first_tile + it, stage = it & 1;
    if (it + 1 < num_tiles) {
      LoadPrefillKvTile<kHeadDim>(p, table, kv_head, tile + 1, kv_lo, kv_hi, k_smem[stage ^ 1],
                                  v_smem[stage ^ 1]);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();  // this tile's group has landed (the next one may be in flight)
    __syncthreads();

    // S = Q K^T: ldmatrix x4 gives B of two k-chunks for 8 keys.
    float s[Cfg::kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      if constexpr (Cfg::kKChunks == 1) {  // head_dim 16: ldmatrix x2, one k-chunk
        uint32_t b[2];
        LdMatrixX2(b, SmemAddr(k_smem[stage] +
                               SwizzledOffset<kHeadDim>(8 * nt + (lane & 7), (lane >> 3) & 1)));
        Mma16816(s[nt][0], s[nt][1], s[nt][2], s[nt][3], qf[0][0], qf[0][1], qf[0][2], qf[0][3],
                 b[0], b[1]);
      } else {
#pragma unroll
        for (int c = 0; c < Cfg::kKChunks; c += 2) {
          uint32_t b[4];
          LdMatrixX4(b, SmemAddr(k_smem[stage] + SwizzledOffset<kHeadDim>(8 * nt + (lane & 7),
                                                                          2 * c + (lane >> 3))));
          Mma16816(s[nt][0], s[nt][1], s[nt][2], s[nt][3], qf[c][0], qf[c][1], qf[c][2], qf[c][3],
                   b[0], b[1]);
          Mma16816(s[nt][0], s[nt][1], s[nt][2], s[nt][3], qf[c + 1][0], qf[c + 1][1], qf[c + 1][2],
                   qf[c + 1][3], b[2], b[3]);
        }
      }
    }
    // Causal and window mask (only where the tile reaches past a row's visible keys), scale.
    const int key0 = tile * Cfg::kBlockN;
    // Tree variant: a tile that reaches the tree (CTA-uniform) takes the causal mask, then each
    // row's tree bits; rows past q_len read the last query's row (their output is never written).
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
        const int pos = warp_pos_lo + g + 8 * (e >> 1);
        const bool valid = !needs_mask || (key <= pos && key >= kv_lo && key < kv_hi &&
                                           (p.sliding_window == 0 || key > pos - p.sliding_window));
        s[nt][e] = valid ? s[nt][e] * p.scale_log2 : kNegInf;
      }
    }
    if constexpr (kTreeMask) {
      if (tree_tile) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qi = min(m0 + 16 * warp + g + 8 * h, q_len - 1);
          ApplyTreeMaskRow<Cfg::kBlockN>(s, h, p.tree, q_begin + qi, tree_start, key0, t);
        }
      }
    }
    SoftmaxAndAccumulatePV<kHeadDim>(s, m, l, o, v_smem[stage], lane);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float row_sum = QuadSum(l[h]);
    const float inv_l = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
    const int qi = m0 + 16 * warp + g + 8 * h;
    if (qi >= q_len) continue;
    __nv_bfloat16* dst = p.out + static_cast<int64_t>(q_begin + qi) * p.out_stride +
                         static_cast<int64_t>(head) * kHeadDim + 2 * t;
#pragma unroll
    for (int j = 0; j < Cfg::kOTiles; ++j) {
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
          __floats2bfloat162_rn(o[j][2 * h] * inv_l, o[j][2 * h + 1] * inv_l);
    }
  }
}

}  // namespace specd::kernels::attention
