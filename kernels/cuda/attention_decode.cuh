// Split-KV paged decode attention kernels (one query per sequence); their splits merge in
// attention_combine.cuh. See attention_common.cuh for the fragment notation. Include from .cu
// files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace specd::kernels::attention {

// ---------------------------------------------------------------------------------------------
// Decode (flash-decoding, split-KV). Grid: one CTA per (sequence, kv head, part, split), where a
// part is up to kRows q heads of the kv head's group (one part unless the group exceeds 16).
// Each of the 4 warps streams whole kStep-token tiles of its kv head (contiguous in the HND
// layout) straight from global memory into registers with 16-byte loads -- all of a tile's K and
// V loads in flight at once -- and computes S = Q K^T and O^T += V^T P^T with mma, keeping its
// own online softmax state. Warps take the split's tiles round-robin; at the end the four states
// merge through shared memory and the CTA writes either the bf16 output (one split) or an fp32
// partial output and its log2-sum-exp for the combine kernel.
//
// No shared-memory staging of K and V: the mma fragments are built from the 16-byte loads.
//   S = Q K^T (m16n8k16; M = q heads, N = 8 tokens, K = head_dim): lane (g, t) loads
//     K[token g][vectors t + 4i] (i < D/32). head_dim is permuted -- a dot product does not care
//     about the order of its terms -- so that word w of vector i is B register (w & 1) of k-chunk
//     2i + w / 2; Q is loaded the same way as the A operand (rows g, g + 8 = q heads).
//   O^T = V^T P^T (M = head_dim, N = q heads, K = tokens): S's C fragment (head g, tokens 2t,
//     2t+1) is already P^T's B fragment. Lane (g, t) loads V[tokens 2t, 2t+1 (+8)][vectors
//     g + 8jj] (jj < D/64); one byte permute pairs an element across two tokens into an A
//     register. M-tile mt = 4jj + w covers head_dim 8 (g + 8jj) + 2w (row g) and + 1 (row g + 8),
//     so each lane's accumulator holds head_dim pairs (d, d + 1) of q heads 2t and 2t + 1.
// References: Tri Dao et al., "Flash-Decoding for long-context inference" (2023); FlashInfer
// include/flashinfer/attention/decode.cuh (split-KV, merge by log-sum-exp).

struct DecodeParams {
  const __nv_bfloat16* q;  // [num_seqs, num_q_heads, head_dim], row stride q_stride
  int64_t q_stride;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  const int32_t* seq_lens;  // [num_seqs]
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t group;  // num_q_heads / num_kv_heads
  int32_t num_parts;
  int32_t log2_block_size;
  int32_t sliding_window;
  int32_t num_splits;
  float scale_log2;    // softmax scale * log2(e)
  __nv_bfloat16* out;  // num_splits == 1: [num_seqs, num_q_heads, head_dim], out_stride
  int64_t out_stride;
  float* partial_out;  // num_splits > 1: [num_seqs, num_q_heads, num_splits, head_dim]
  float* partial_lse;  // num_splits > 1: [num_seqs, num_q_heads, num_splits], log2 domain
};

template <int kHeadDim, int kRows>
struct DecodeConfig {
  static_assert(kHeadDim == 16 || kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128 ||
                kHeadDim == 256);
  static_assert(kRows == 8 || kRows == 16);
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  // Tokens per warp tile: 16 keeps 8 KiB of K+V in flight per warp at head_dim 128; 8 at 256
  // keeps the registers in bounds. Block sizes are multiples, so a tile never spans two blocks.
  static constexpr int kStep = kHeadDim <= 128 ? 16 : 8;
  static constexpr int kTokTiles = kStep / 8;  // n8 tiles of tokens in S
  // Below head_dim 32 (K, Q) and 64 (V) the fragments are zero-padded to those widths: lanes
  // whose vector lies past the row load zeros (which add nothing to S, and give O^T rows past
  // head_dim that are never written out), so the layouts below hold for every head_dim.
  static constexpr int kRowVecs = kHeadDim / 8;  // 16-byte vectors of one head row
  static constexpr int kKVecs = kHeadDim >= 32 ? kHeadDim / 32 : 1;  // K, Q vectors per lane
  static constexpr int kVVecs = kHeadDim >= 64 ? kHeadDim / 64 : 1;  // V vectors per lane/token
  static constexpr int kMTiles = 4 * kVVecs;  // m16 tiles of O^T (head_dim / 16 from 64 up)
  static constexpr int kHalves = kRows / 8;   // q heads g (and g + 8) in use
  // Occupancy the register budget is sized for (launch bounds: 65536 / (128 * n) registers per
  // thread; 128 fits head_dim 128 with 8 heads without spills); ChooseDecodeSplits sizes the
  // grid to one wave of it. (PagedDecodePipeKernel, where it runs: kDecodePipeCtasPerSm.)
  static constexpr int kMinCtasPerSm = kHeadDim == 256                    ? 2
                                       : (kHeadDim == 128 && kRows == 16) ? 3
                                                                          : 4;
};

template <int kHeadDim, int kRows>
struct DecodeSmem {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  static constexpr int kAcc = Cfg::kMTiles * Cfg::kHalves * 4;  // accumulator floats per lane
  // Two warps' states in flight during the tree merge, [slot][value][lane]; slot 1 is reused as
  // the final [kRows][kHeadDim] output tile (the same number of floats).
  float acc[2][kAcc][kWarpSize];
  float m[2][Cfg::kHalves][kWarpSize];
  float l[2][Cfg::kHalves][kWarpSize];
  float lse[kRows];
  static_assert(kAcc * kWarpSize >= kRows * kHeadDim);  // slot 1 holds the output tile
};

// Lane (g, t)'s value for q heads 2t and 2t + 1 (of one half) from the per-head values lanes
// 4 * head hold (row g of the S layout) -- the move from S's rows to O^T's columns.
__device__ __forceinline__ float2 HeadPairFromRows(float row_value, int t) {
  return make_float2(__shfl_sync(0xffffffffu, row_value, 8 * t),
                     __shfl_sync(0xffffffffu, row_value, 8 * t + 4));
}

// One warp's running state.
template <int kHeadDim, int kRows>
struct DecodeWarpState {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  // O^T accumulator [m-tile][half][c]: c = 0, 1: head_dim d of heads 2t, 2t + 1; c = 2, 3: d + 1.
  float o[Cfg::kMTiles][Cfg::kHalves][4];
  float m[Cfg::kHalves];  // max of q head 8 half + g (log2 domain), same across the quad
  float l[Cfg::kHalves];  // this lane's part of that head's sum

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < Cfg::kHalves; ++h)
        o[mt][h][0] = o[mt][h][1] = o[mt][h][2] = o[mt][h][3] = 0;
    }
#pragma unroll
    for (int h = 0; h < Cfg::kHalves; ++h) m[h] = kNegInf, l[h] = 0.0f;
  }

  // Multiplies the accumulator columns of half h by the per-head factors `scale` (S layout).
  __device__ __forceinline__ void ScaleColumns(int h, float scale, int t) {
    const float2 f = HeadPairFromRows(scale, t);
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      o[mt][h][0] *= f.x, o[mt][h][1] *= f.y, o[mt][h][2] *= f.x, o[mt][h][3] *= f.y;
    }
  }

  __device__ __forceinline__ void Store(DecodeSmem<kHeadDim, kRows>& sm, int slot, int lane) const {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < Cfg::kHalves; ++h) {
#pragma unroll
        for (int c = 0; c < 4; ++c)
          sm.acc[slot][(mt * Cfg::kHalves + h) * 4 + c][lane] = o[mt][h][c];
      }
    }
#pragma unroll
    for (int h = 0; h < Cfg::kHalves; ++h) sm.m[slot][h][lane] = m[h], sm.l[slot][h][lane] = l[h];
  }

  // Writes half h of the accumulator into `tile` as rows [q head][kHeadDim], this lane's heads
  // 2t and 2t + 1 (of the half) scaled by scale.x and scale.y.
  __device__ __forceinline__ void StoreRows(float* tile, int h, float2 scale, int lane) const {
    const int g = lane / 4, t = lane % 4;
    const int head = 8 * h + 2 * t;
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
      const int d = 8 * (g + 8 * (mt / 4)) + 2 * (mt % 4);
      if (Cfg::kRowVecs < 8 && d >= kHeadDim) continue;  // padding rows of O^T
      *reinterpret_cast<float2*>(tile + head * kHeadDim + d) =
          make_float2(o[mt][h][0] * scale.x, o[mt][h][2] * scale.x);
      *reinterpret_cast<float2*>(tile + (head + 1) * kHeadDim + d) =
          make_float2(o[mt][h][1] * scale.y, o[mt][h][3] * scale.y);
    }
  }

  // Folds another warp's state (same lane, so the same heads and columns) into this one.
  __device__ __forceinline__ void Merge(const DecodeSmem<kHeadDim, kRows>& sm, int slot, int lane) {
    const int t = lane % 4;
#pragma unroll
    for (int h = 0; h < Cfg::kHalves; ++h) {
      const float m_other = sm.m[slot][h][lane];
      const float m_new = fmaxf(m[h], m_other);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      const float self_scale = exp2f(m[h] - m_use), other_scale = exp2f(m_other - m_use);
      m[h] = m_new;
      l[h] = l[h] * self_scale + sm.l[slot][h][lane] * other_scale;
      const float2 fs = HeadPairFromRows(self_scale, t), fo = HeadPairFromRows(other_scale, t);
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float other = sm.acc[slot][(mt * Cfg::kHalves + h) * 4 + c][lane];
          o[mt][h][c] = o[mt][h][c] * ((c & 1) ? fs.y : fs.x) + other * ((c & 1) ? fo.y : fo.x);
        }
      }
    }
  }
};

// The CTA's Q rows as A fragments: q[half][i] is the 16-byte vector t + 4i of q head
// head0 + g + 8 * half (zeros past the part's rows).
template <int kHeadDim, int kRows>
__device__ __forceinline__ void LoadDecodeQ(
    const DecodeParams& p, int seq, int head0, int rows, int lane,
    uint4 (&q)[DecodeConfig<kHeadDim, kRows>::kHalves][DecodeConfig<kHeadDim, kRows>::kKVecs]) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < Cfg::kHalves; ++h) {
    const int row = g + 8 * h;
    const __nv_bfloat16* src =
        p.q + seq * p.q_stride + static_cast<int64_t>(head0 + row) * kHeadDim;
#pragma unroll
    for (int i = 0; i < Cfg::kKVecs; ++i) {
      const bool in_row = Cfg::kRowVecs >= 4 || t + 4 * i < Cfg::kRowVecs;
      q[h][i] = row < rows && in_row ? __ldg(reinterpret_cast<const uint4*>(src + 8 * (t + 4 * i)))
                                     : make_uint4(0, 0, 0, 0);
    }
  }
}

// One kStep-token tile of one warp: S = Q K^T, mask, online softmax, O^T += V^T P^T.
//   k[tt][i]      K[token 8tt + g][vector t + 4i]
//   v[tt][e][jj]  V[token 8tt + 2t + e][vector g + 8jj], zeros for masked tokens
//   valid[tt][e]  whether token 8tt + 2t + e is inside [kv_begin, kv_end)
template <int kHeadDim, int kRows>
__device__ __forceinline__ void DecodeTile(
    const uint4 (&q)[DecodeConfig<kHeadDim, kRows>::kHalves][DecodeConfig<kHeadDim, kRows>::kKVecs],
    const uint4 (
        &k)[DecodeConfig<kHeadDim, kRows>::kTokTiles][DecodeConfig<kHeadDim, kRows>::kKVecs],
    const uint4 (
        &v)[DecodeConfig<kHeadDim, kRows>::kTokTiles][2][DecodeConfig<kHeadDim, kRows>::kVVecs],
    const bool (&valid)[DecodeConfig<kHeadDim, kRows>::kTokTiles][2], float scale_log2, int t,
    DecodeWarpState<kHeadDim, kRows>& st) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  constexpr bool kTwoHalves = Cfg::kHalves == 2;
  float s[Cfg::kTokTiles][4];
#pragma unroll
  for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
    s[tt][0] = s[tt][1] = s[tt][2] = s[tt][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < Cfg::kKVecs; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // k-chunk 2i + half: words 2 half, 2 half + 1
        const uint32_t a1 = kTwoHalves ? Word(q[Cfg::kHalves - 1][i], 2 * half) : 0u;
        const uint32_t a3 = kTwoHalves ? Word(q[Cfg::kHalves - 1][i], 2 * half + 1) : 0u;
        Mma16816(s[tt][0], s[tt][1], s[tt][2], s[tt][3], Word(q[0][i], 2 * half), a1,
                 Word(q[0][i], 2 * half + 1), a3, Word(k[tt][i], 2 * half),
                 Word(k[tt][i], 2 * half + 1));
      }
    }
  }
  // Scale into the log2 domain; masked tokens become -inf (also where their cache rows hold
  // NaN), so their probabilities are exactly 0.
#pragma unroll
  for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) s[tt][c] = valid[tt][c & 1] ? s[tt][c] * scale_log2 : kNegInf;
  }
  uint32_t p[Cfg::kHalves][Cfg::kTokTiles];  // P^T B fragments, bf16 pairs
#pragma unroll
  for (int h = 0; h < Cfg::kHalves; ++h) {
    float tile_max = kNegInf;
#pragma unroll
    for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
      tile_max = fmaxf(tile_max, fmaxf(s[tt][2 * h], s[tt][2 * h + 1]));
    }
    float m_use;
    const float alpha = OnlineSoftmaxRescale(st.m[h], QuadMax(tile_max), m_use);
    st.l[h] *= alpha;
#pragma unroll
    for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
      const float p0 = exp2f(s[tt][2 * h] - m_use), p1 = exp2f(s[tt][2 * h + 1] - m_use);
      st.l[h] += p0 + p1;
      p[h][tt] = PackBf16x2(p0, p1);
    }
    st.ScaleColumns(h, alpha, t);
  }
  // O^T += V^T P^T: A = one head_dim element pair of two tokens per register.
#pragma unroll
  for (int jj = 0; jj < Cfg::kVVecs; ++jj) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int mt = 4 * jj + w;
      const uint32_t x0 = Word(v[0][0][jj], w), x1 = Word(v[0][1][jj], w);
      const uint32_t a0 = __byte_perm(x0, x1, 0x5410), a1 = __byte_perm(x0, x1, 0x7632);
      if constexpr (Cfg::kTokTiles == 2) {
        const uint32_t y0 = Word(v[1][0][jj], w), y1 = Word(v[1][1][jj], w);
        const uint32_t a2 = __byte_perm(y0, y1, 0x5410), a3 = __byte_perm(y0, y1, 0x7632);
#pragma unroll
        for (int h = 0; h < Cfg::kHalves; ++h) {
          float* o = st.o[mt][h];
          Mma16816(o[0], o[1], o[2], o[3], a0, a1, a2, a3, p[h][0], p[h][1]);
        }
      } else {
#pragma unroll
        for (int h = 0; h < Cfg::kHalves; ++h) {
          float* o = st.o[mt][h];
          Mma1688(o[0], o[1], o[2], o[3], a0, a1, p[h][0]);
        }
      }
    }
  }
}

// Tokens [kv_begin, kv_end) of the sequence and this split's tile range [first, last) of them.
struct DecodeRange {
  int kv_begin, kv_end, first_tile, last_tile;
};

// seq_lens_value: p.seq_lens[seq] (loaded by the caller, which may choose how).
template <int kStep>
__device__ __forceinline__ DecodeRange SplitRangeOf(const DecodeParams& p, int seq_lens_value,
                                                    int split) {
  const int seq_len = max(0, min(seq_lens_value, p.max_blocks_per_seq << p.log2_block_size));
  DecodeRange r;
  r.kv_end = seq_len;
  r.kv_begin = p.sliding_window > 0 ? max(0, seq_len - p.sliding_window) : 0;
  const int first = r.kv_begin / kStep, last = (seq_len + kStep - 1) / kStep;
  const int per_split = (last - first + p.num_splits - 1) / p.num_splits;
  r.first_tile = first + split * per_split;
  r.last_tile = min(r.first_tile + per_split, last);
  return r;
}

template <int kStep>
__device__ __forceinline__ DecodeRange SplitRange(const DecodeParams& p, int seq, int split) {
  return SplitRangeOf<kStep>(p, p.seq_lens[seq], split);
}

// Writes the CTA's rows from the final [kRows][kHeadDim] tile in shared memory, or zeros / an
// empty partial (lse = -inf) when the split has no key (`tile` == nullptr).
template <int kHeadDim, int kRows>
__device__ __forceinline__ void WriteDecodeRows(const DecodeParams& p, int seq, int head0, int rows,
                                                int split, const float* tile, const float* lse) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  if (p.num_splits == 1) {
    for (int i = threadIdx.x; i < rows * kHeadDim / 8; i += Cfg::kThreads) {
      const int r = i / (kHeadDim / 8), c = (i % (kHeadDim / 8)) * 8;
      Bf16Vec<8> out;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        out.v[e] = __float2bfloat16_rn(tile != nullptr ? tile[r * kHeadDim + c + e] : 0.0f);
      }
      out.Store(p.out + seq * p.out_stride + static_cast<int64_t>(head0 + r) * kHeadDim + c);
    }
    return;
  }
  const int64_t row0 = static_cast<int64_t>(seq) * p.num_q_heads + head0;
  if (tile != nullptr) {
    for (int i = threadIdx.x; i < rows * kHeadDim / 4; i += Cfg::kThreads) {
      const int r = i / (kHeadDim / 4), c = (i % (kHeadDim / 4)) * 4;
      const float4 value = *reinterpret_cast<const float4*>(tile + r * kHeadDim + c);
      *reinterpret_cast<float4*>(p.partial_out + ((row0 + r) * p.num_splits + split) * kHeadDim +
                                 c) = value;
    }
  }
  for (int r = threadIdx.x; r < rows; r += Cfg::kThreads) {
    p.partial_lse[(row0 + r) * p.num_splits + split] = tile != nullptr ? lse[r] : kNegInf;
  }
}

// Loads one tile's K and V (masked tokens' V as zeros: their rows may be stale or NaN, and
// 0 * NaN would poison O) and runs it.
template <int kHeadDim, int kRows>
__device__ __forceinline__ void DecodeStep(
    const DecodeParams& p, const DecodeRange& range, int64_t row0, int tok0, int lane,
    const uint4 (&q)[DecodeConfig<kHeadDim, kRows>::kHalves][DecodeConfig<kHeadDim, kRows>::kKVecs],
    DecodeWarpState<kHeadDim, kRows>& st) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  const int g = lane / 4, t = lane % 4;
  const __nv_bfloat16* k_tile = p.k_cache + row0 * kHeadDim + g * kHeadDim + 8 * t;
  const __nv_bfloat16* v_tile = p.v_cache + row0 * kHeadDim + 2 * t * kHeadDim + 8 * g;
  const bool v_in_row = Cfg::kRowVecs >= 8 || g < Cfg::kRowVecs;  // head_dim < 64: pad lanes
  uint4 k[Cfg::kTokTiles][Cfg::kKVecs];
  uint4 v[Cfg::kTokTiles][2][Cfg::kVVecs];
  bool valid[Cfg::kTokTiles][2];
#pragma unroll
  for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
#pragma unroll
    for (int i = 0; i < Cfg::kKVecs; ++i) {
      const bool in_row = Cfg::kRowVecs >= 4 || t + 4 * i < Cfg::kRowVecs;
      k[tt][i] =
          in_row ? LoadStreaming(k_tile + 8 * tt * kHeadDim + 32 * i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tok = tok0 + 8 * tt + 2 * t + e;
      valid[tt][e] = tok >= range.kv_begin && tok < range.kv_end;
#pragma unroll
      for (int jj = 0; jj < Cfg::kVVecs; ++jj) {
        v[tt][e][jj] = valid[tt][e] && v_in_row
                           ? LoadStreaming(v_tile + (8 * tt + e) * kHeadDim + 64 * jj)
                           : make_uint4(0, 0, 0, 0);
      }
    }
  }
  DecodeTile<kHeadDim, kRows>(q, k, v, valid, p.scale_log2, t, st);
}

// Merges the four warps' states (2,3 -> 0,1, then 1 -> 0), normalises, and leaves the CTA's
// [kRows][kHeadDim] output in shared memory slot 1 and the log2-sum-exps in sm.lse. Returns the
// tile. Every thread of the CTA calls it.
template <int kHeadDim, int kRows>
__device__ __forceinline__ const float* MergeDecodeWarps(DecodeSmem<kHeadDim, kRows>& sm,
                                                         DecodeWarpState<kHeadDim, kRows>& st,
                                                         int warp, int lane) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  static_assert(Cfg::kWarps == 4);
  if (warp >= 2) st.Store(sm, warp - 2, lane);
  __syncthreads();
  if (warp < 2) st.Merge(sm, warp, lane);
  __syncthreads();
  if (warp == 1) st.Store(sm, 0, lane);
  __syncthreads();
  float* tile = &sm.acc[1][0][0];  // slot 1 is free from here on
  if (warp == 0) {
    st.Merge(sm, 0, lane);
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < Cfg::kHalves; ++h) {
      const float l = QuadSum(st.l[h]);
      if (t == 0) sm.lse[g + 8 * h] = l > 0.0f ? st.m[h] + __log2f(l) : kNegInf;
      st.StoreRows(tile, h, HeadPairFromRows(l > 0.0f ? 1.0f / l : 0.0f, t), lane);
    }
  }
  __syncthreads();
  return tile;
}

template <int kHeadDim, int kRows>
__global__ void __launch_bounds__(DecodeConfig<kHeadDim, kRows>::kThreads,
                                  DecodeConfig<kHeadDim, kRows>::kMinCtasPerSm)
    PagedDecodeKernel(const DecodeParams p) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  __shared__ DecodeSmem<kHeadDim, kRows> sm;
  AllowDependentLaunch();     // first: dependents launch early (common.cuh)
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent where it decodes
  int index = blockIdx.x;
  const int split = index % p.num_splits;
  index /= p.num_splits;
  const int part = index % p.num_parts;
  index /= p.num_parts;
  const int kv_head = index % p.num_kv_heads;
  const int seq = index / p.num_kv_heads;
  const int head0 = kv_head * p.group + part * kRows;
  const int rows = min(kRows, p.group - part * kRows);
  const DecodeRange range = SplitRange<Cfg::kStep>(p, seq, split);
  if (range.first_tile >= range.last_tile) {  // CTA-uniform
    WriteDecodeRows<kHeadDim, kRows>(p, seq, head0, rows, split, nullptr, nullptr);
    return;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  uint4 q[Cfg::kHalves][Cfg::kKVecs];
  LoadDecodeQ<kHeadDim, kRows>(p, seq, head0, rows, lane, q);
  DecodeWarpState<kHeadDim, kRows> st;
  st.Init();

  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int block_mask = (1 << p.log2_block_size) - 1;
  int tile = range.first_tile + warp;
  // The next tile's block id is fetched one tile ahead, so its latency hides behind a tile.
  int block =
      tile < range.last_tile ? __ldg(table + ((tile * Cfg::kStep) >> p.log2_block_size)) : 0;
#pragma unroll 1
  for (; tile < range.last_tile; tile += Cfg::kWarps) {
    const int tok0 = tile * Cfg::kStep;
    // Cache row of the tile's first token: (block, kv head) tile, then the row inside it.
    const int64_t row0 =
        ((static_cast<int64_t>(block) * p.num_kv_heads + kv_head) << p.log2_block_size) |
        (tok0 & block_mask);
    const int next = tile + Cfg::kWarps;
    if (next < range.last_tile) block = __ldg(table + ((next * Cfg::kStep) >> p.log2_block_size));
    DecodeStep<kHeadDim, kRows>(p, range, row0, tok0, lane, q, st);
  }
  const float* out_tile = MergeDecodeWarps<kHeadDim, kRows>(sm, st, warp, lane);
  WriteDecodeRows<kHeadDim, kRows>(p, seq, head0, rows, split, out_tile, sm.lse);
}

}  // namespace specd::kernels::attention
