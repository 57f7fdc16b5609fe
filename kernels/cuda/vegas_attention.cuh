// Vegas variants of the split-KV verification kernel (attention_verify.cuh; launchers in
// vegas.cu, contracts in vegas.h): the verification pass that also writes the head-averaged
// pre-softmax scores of a run's first and last query over the scored prefix, and sparse drafting
// attention whose keys are a per-sequence token-index list plus the recent tokens. Both are
// variant policies of PagedVerifyKernel, so they share its mainloop. Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_verify.cuh"

namespace specd::kernels::attention {

// ---------------------------------------------------------------------------------------------
// Score collection ("Collect-2-Query", Vegas paper section 3.3). Each tile's raw Q K^T (fp32,
// before the scale and the mask) of the rows of query 0 and of query q_len - 1 is scaled by
// scale / num_q_heads and stored per q head, for keys of the prefix [0, seq_len - q_len): the
// selection ranks by each head's attention weights over the prefix (a softmax per head, then the
// mean over heads), which needs the heads apart; summing a row's num_q_heads parts gives the
// average raw score over the heads. Only the warps holding a target query's rows do the work,
// each lane storing its own rows' keys (no shuffles), and tiles past the prefix skip it, so the
// pass reads the KV once as before. Every (row, head, key) is written by one lane: no atomics.
//   scores  [num_seqs, 2, num_q_heads, score_stride] fp32: row 0 query 0, row 1 the last query

struct VegasScoreParams : VerifyParams {
  float* scores;
  int64_t score_stride;  // keys per row (>= the longest prefix; later keys are not stored)
  float score_scale;     // softmax scale / num_q_heads
};

struct VegasScoreVariant {
  using Params = VegasScoreParams;
  using Keys = DenseVerifyVariant::Keys;
  static constexpr bool kScoreHook = true;
  // The hook on top of the mainloop's fragments spilled at head_dim 32 and 64 under ptxas'
  // default register choice; one CTA per SM as the floor lets it take up to 255 registers.
  static constexpr int kMinCtasPerSm = 1;

  // Keys key and key + 1 (pair) or key alone of one head's row, scaled.
  __device__ __forceinline__ static void Store(float* dst, float a, float b, const Params& vx,
                                               bool pair) {
    if (pair) {
      *reinterpret_cast<float2*>(dst) = make_float2(a * vx.score_scale, b * vx.score_scale);
    } else {
      *dst = a * vx.score_scale;
    }
  }

  //   s         [kSTiles][4] raw scores of the warp's rows g, g + 8 (C fragments), keys key0 + ...
  //   prefix    keys before the run (seq_len - q_len): the keys stored
  //   warp_row0 the warp's first row (row r: query r / group, q head kv_head * group + r % group)
  template <int kHeadDim>
  __device__ __forceinline__ static void TileScores(
      const Params& vx, const float (&s)[PrefillConfig<kHeadDim>::kSTiles][4], int key0, int prefix,
      int seq, int kv_head, int warp_row0, int num_rows, int q_len, int lane) {
    using Cfg = PrefillConfig<kHeadDim>;
    const int limit = prefix < vx.score_stride ? prefix : static_cast<int>(vx.score_stride);
    if (key0 >= limit) return;  // warp-uniform: the tile holds no scored key
    const int group = vx.pre.group, num_q_heads = vx.pre.num_kv_heads * group;
    const int g = lane / 4, t = lane % 4;
#pragma unroll 1
    for (int target = 0; target < 2; ++target) {
      const int lo = (target == 0 ? 0 : q_len - 1) * group, hi = lo + group;
      if (hi <= warp_row0 || lo >= warp_row0 + 16) continue;  // warp-uniform
      // The lane's rows g and g + 8 (fragments 0-1 and 2-3); -1: not a row of this target.
      const int r0 = warp_row0 + g, r1 = r0 + 8;
      const int h0 = r0 >= lo && r0 < hi && r0 < num_rows ? kv_head * group + r0 % group : -1;
      const int h1 = r1 >= lo && r1 < hi && r1 < num_rows ? kv_head * group + r1 % group : -1;
      float* base =
          vx.scores + (static_cast<int64_t>(seq) * 2 + target) * num_q_heads * vx.score_stride;
      // One row per pass, one store pointer live: the second pass only when both rows belong to
      // the target (groups above 8). Fragments are picked by selects, never by a runtime index.
#pragma unroll 1
      for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1 && (h0 < 0 || h1 < 0)) break;
        const bool second = pass == 1 || h0 < 0;
        const int h = second ? h1 : h0;
        if (h < 0) continue;
        float* dst = base + static_cast<int64_t>(h) * vx.score_stride;
#pragma unroll
        for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
          const int key = key0 + 8 * nt + 2 * t;
          if (key >= limit) continue;
          Store(dst + key, second ? s[nt][2] : s[nt][0], second ? s[nt][3] : s[nt][1], vx,
                key + 1 < limit);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Sparse keys (Vegas drafting, and StreamingLLM's sinks + window as an index list). Key j of the
// attention is token token_indices[j] for j < count, else token recent_start + j - count: the
// listed prefix tokens, then every token from recent_start to the query. The indices ascend and
// lie below recent_start, so the keys ascend with their positions and the causal rule in key
// coordinates (the run's queries are the last q_len keys) is the causal rule on positions. K and
// V are read in place through the block table, 16-byte chunk by chunk as the dense loader does.

struct VegasSparseParams : VerifyParams {
  const int32_t* token_indices;  // [rows, index_stride]
  int64_t index_stride;
  const int32_t* index_counts;   // [rows]
  const int32_t* recent_starts;  // [num_seqs]
  const int32_t* index_rows;     // [num_seqs] each sequence's row; null: row = sequence
};

struct VegasSparseVariant {
  using Params = VegasSparseParams;
  static constexpr bool kScoreHook = false;
  static constexpr int kMinCtasPerSm = 0;

  // count clipped to [0, limit].
  __device__ __forceinline__ static int ClampCount(int count, int64_t limit) {
    return count < 0 ? 0 : count > limit ? static_cast<int>(limit) : count;
  }

  struct Keys {
    const int32_t* indices;
    int count, recent_start;

    __device__ __forceinline__ Keys(const Params& vx, int seq)
        : Keys(vx, seq, vx.index_rows != nullptr ? __ldg(vx.index_rows + seq) : seq) {}
    __device__ __forceinline__ Keys(const Params& vx, int seq, int row)
        : indices(vx.token_indices + static_cast<int64_t>(row) * vx.index_stride),
          count(ClampCount(__ldg(vx.index_counts + row), vx.index_stride)),
          recent_start(max(0, __ldg(vx.recent_starts + seq))) {}

    // seq_len: the sequence's positions; the keys are the list and positions [recent_start,
    // seq_len).
    __device__ __forceinline__ int Count(int seq_len) {
      recent_start = min(recent_start, seq_len);
      return count + seq_len - recent_start;
    }

    template <int kHeadDim, int kThreads>
    __device__ __forceinline__ void LoadTile(const PrefillParams& p, const int32_t* table,
                                             int kv_head, int tile, int kv_lo, int kv_hi,
                                             __nv_bfloat16* k_stage, __nv_bfloat16* v_stage) const {
      const uint64_t kv_policy = L2EvictFirstPolicy();
      const uint64_t meta_policy = L2EvictLastPolicy();
      using Cfg = PrefillConfig<kHeadDim>;
      constexpr int kCopies = Cfg::kBlockN * Cfg::kChunks / kThreads;
      static_assert(kCopies >= 1 && kCopies * kThreads == Cfg::kBlockN * Cfg::kChunks);
      const int block_mask = (1 << p.log2_block_size) - 1;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int index = threadIdx.x + i * kThreads;
        const int row = index / Cfg::kChunks, chunk = index % Cfg::kChunks;
        const int key = tile * Cfg::kBlockN + row;
        const bool valid = key >= kv_lo && key < kv_hi;
        int64_t offset = 0;
        if (valid) {
          const int tok =
              key < count ? LoadHinted(indices + key, meta_policy) : recent_start + (key - count);
          const int64_t block = LoadHinted(table + (tok >> p.log2_block_size), meta_policy);
          offset =
              (((block * p.num_kv_heads + kv_head) << p.log2_block_size) | (tok & block_mask)) *
                  kHeadDim +
              chunk * 8;
        }
        const int dst = SwizzledOffset<kHeadDim>(row, chunk);
        CpAsync16Hinted(SmemAddr(k_stage + dst), p.k_cache + offset, valid, kv_policy);
        CpAsync16Hinted(SmemAddr(v_stage + dst), p.v_cache + offset, valid, kv_policy);
      }
    }
  };
};

}  // namespace specd::kernels::attention
