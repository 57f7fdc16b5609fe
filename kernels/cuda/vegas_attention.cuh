// Vegas variants of the split-KV verification kernel (attention_verify.cuh; launchers in
// vegas.cu, contracts in vegas.h): the verification pass that also writes the fp16 logits and
// per-split softmax statistics of a run's first and last query over the scored prefix, and sparse
// drafting attention whose keys are a per-sequence token-index list plus the recent tokens. Both
// are variant policies of PagedVerifyKernel, so they share its mainloop. Include from .cu files
// only.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_verify.cuh"
#include "kernels/cuda/vegas.h"

namespace specd::kernels::attention {

// ---------------------------------------------------------------------------------------------
// Score collection ("Collect-2-Query", Vegas paper section 3.3; contract in vegas.h). Each tile's
// scaled log2-domain scores of the rows of query 0 and of query q_len - 1 are rounded to fp16 and
// stored per q head for keys of the prefix [0, seq_len - q_len): one packed conversion and one
// 4-byte store per key pair, so the pass stays as close to the KV stream as the dense one. The
// split's softmax statistics over the prefix cost nothing per tile: they are the kernel's own
// running (m, l) of those rows, taken just before the first tile that reaches past the prefix,
// plus that tile's prefix keys (the one tile of the split that needs them apart), or at the end
// of the split when it never reaches the prefix's end. They are of the fp32 scores, so a head's
// weights 2^(x - lse) from the rounded logits sum to 1 within fp16's rounding. Every
// (row, head, key) is written by one lane: no atomics.
//   logits  [num_seqs, 2, num_q_heads, score_stride] fp16: row 0 query 0, row 1 the last query
//   stats   [num_seqs, 2, num_q_heads, kVegasScoreSplits, 2] fp32: (max, sum) per split

struct VegasScoreParams : VerifyParams {
  __half* logits;
  float* stats;
  int64_t score_stride;  // keys per row (>= the longest prefix; later keys are not stored)
};

struct VegasScoreVariant {
  using Params = VegasScoreParams;
  using Keys = DenseVerifyVariant::Keys;
  static constexpr bool kScoreHook = true;
  // The hook on top of the mainloop's fragments spilled at head_dim 32 and 64 under ptxas'
  // default register choice; one CTA per SM as the floor lets it take up to 255 registers.
  static constexpr int kMinCtasPerSm = 1;
  static constexpr int kStatSplits = kVegasScoreSplits;  // statistics per collected row

  // The lane's statistics of its rows g and g + 8 over the split's prefix keys (log2 domain,
  // l = sum of 2^(x - m) over the lane's keys), once the split has reached the prefix's end.
  // Also what the lane stores, fixed per CTA (Init): which collected rows its rows are and where
  // their logits go.
  struct ScoreState {
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    bool taken = false;  // warp-uniform: the split reached past the prefix and m, l are final
    int targets = 0;     // Targets() of row g in bits 0-1, of row g + 8 in bits 2-3
    int64_t offset[2] = {0, 0};  // rows g, g + 8: their query-0 logits row in vx.logits
    int64_t next = 0;            // from a query-0 logits row to the last query's: heads * stride

    __device__ __forceinline__ void Init(const Params& vx, int seq, int kv_head, int warp_row0,
                                         int num_rows, int q_len, int lane) {
      const int group = vx.pre.group, num_q_heads = vx.pre.num_kv_heads * group;
      next = static_cast<int64_t>(num_q_heads) * vx.score_stride;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_row0 + lane / 4 + 8 * h;
        targets |= (r < num_rows ? Targets(r / group, q_len) : 0) << (2 * h);
        offset[h] = (static_cast<int64_t>(seq) * 2 * num_q_heads + kv_head * group + r % group) *
                    vx.score_stride;
      }
    }
  };

  // Which collected rows query qi is: bit 0 query 0, bit 1 the last query (both when q_len 1).
  __device__ __forceinline__ static int Targets(int qi, int q_len) {
    return (qi == 0 ? 1 : 0) | (qi == q_len - 1 ? 2 : 0);
  }

  __device__ __forceinline__ static float* StatsAt(const Params& vx, int seq, int target, int head,
                                                   int split) {
    const int num_q_heads = vx.pre.num_kv_heads * vx.pre.group;
    return vx.stats +
           ((((static_cast<int64_t>(seq) * 2 + target) * num_q_heads + head) * kVegasScoreSplits +
             split) *
            2);
  }

  // (-inf, 0) for splits [s0, s1) of the collected rows among the CTA's rows [r0, r1); all
  // threads.
  __device__ static void EmptyStats(const Params& vx, int seq, int kv_head, int r0, int r1,
                                    int q_len, int s0, int s1) {
    if (s1 <= s0 || r1 <= r0) return;
    const int group = vx.pre.group, n = s1 - s0;
    for (int i = threadIdx.x; i < (r1 - r0) * n; i += blockDim.x) {
      const int r = r0 + i / n, split = s0 + i % n;
      const int targets = Targets(r / group, q_len);
      for (int target = 0; target < 2; ++target) {
        if ((targets >> target & 1) == 0) continue;
        float* dst = StatsAt(vx, seq, target, kv_head * group + r % group, split);
        *reinterpret_cast<float2*>(dst) = make_float2(-INFINITY, 0.0f);
      }
    }
  }

  //   s         [kSTiles][4] scaled log2-domain scores of the warp's rows g, g + 8 (C fragments,
  //             masked), keys key0 + ...; m, l: the rows' running statistics before the tile
  //   prefix    keys before the run (seq_len - q_len): the keys stored
  template <int kHeadDim>
  __device__ __forceinline__ static void TileScores(
      const Params& vx, const float (&s)[PrefillConfig<kHeadDim>::kSTiles][4], const float (&m)[2],
      const float (&l)[2], int key0, int prefix, int lane, ScoreState& st) {
    using Cfg = PrefillConfig<kHeadDim>;
    if (st.taken) return;  // warp-uniform: past the prefix
    const int limit = prefix < vx.score_stride ? prefix : static_cast<int>(vx.score_stride);
    const int t = lane % 4;
    const bool last = key0 + Cfg::kBlockN > limit;  // warp-uniform: the tile reaches the end
    if (last) {  // the statistics so far, then this tile's prefix keys merged in
      st.taken = true;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
          const int key = key0 + 8 * nt + 2 * t;
          if (key < limit) tile_max = fmaxf(tile_max, s[nt][2 * h]);
          if (key + 1 < limit) tile_max = fmaxf(tile_max, s[nt][2 * h + 1]);
        }
        const float mm = fmaxf(m[h], tile_max);
        float sum = l[h] == 0.0f ? 0.0f : l[h] * exp2f(m[h] - mm);
#pragma unroll
        for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
          const int key = key0 + 8 * nt + 2 * t;
          if (key < limit) sum += exp2f(s[nt][2 * h] - mm);
          if (key + 1 < limit) sum += exp2f(s[nt][2 * h + 1] - mm);
        }
        st.m[h] = mm;
        st.l[h] = sum;
      }
      if (key0 >= limit) return;  // nothing of the tile is stored
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the lane's rows g and g + 8: fragments 2h and 2h + 1
      const int targets = (st.targets >> (2 * h)) & 3;
      if (targets == 0) continue;
      __half* row0 = vx.logits + st.offset[h];
      __half* row1 = row0 + st.next;
#pragma unroll
      for (int nt = 0; nt < Cfg::kSTiles; ++nt) {
        const int key = key0 + 8 * nt + 2 * t;
        // A logit beyond fp16's range rounds to +-inf: all or nothing of its head's weight.
        const __half2 x = __floats2half2_rn(s[nt][2 * h], s[nt][2 * h + 1]);
        if (!last || key + 1 < limit) {  // both keys scored (every key of a tile before the end)
          if (targets & 1) *reinterpret_cast<__half2*>(row0 + key) = x;
          if (targets & 2) *reinterpret_cast<__half2*>(row1 + key) = x;
        } else if (key < limit) {
          if (targets & 1) row0[key] = __low2half(x);
          if (targets & 2) row1[key] = __low2half(x);
        }
      }
    }
  }

  // The split's statistics of the warp's collected rows: the quad's lanes merged, written by
  // lane t == 0. All lanes of an active warp (the merge shuffles); m, l the kernel's final ones,
  // the prefix's when the split never reached past it.
  __device__ __forceinline__ static void FinishScores(const Params& vx, const ScoreState& st,
                                                      const float (&m_end)[2],
                                                      const float (&l_end)[2], int seq, int kv_head,
                                                      int split, int warp_row0, int lane) {
    const int group = vx.pre.group, g = lane / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m0 = st.taken ? st.m[h] : m_end[h], l0 = st.taken ? st.l[h] : l_end[h];
      float m = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      float l = l0 == 0.0f ? 0.0f : l0 * exp2f(m0 - m);
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = warp_row0 + g + 8 * h;
      const int targets = (st.targets >> (2 * h)) & 3;
      if (lane % 4 != 0 || targets == 0) continue;
      const int head = kv_head * group + r % group;
      for (int target = 0; target < 2; ++target) {
        if ((targets >> target & 1) == 0) continue;
        *reinterpret_cast<float2*>(StatsAt(vx, seq, target, head, split)) =
            l > 0.0f ? make_float2(m, l) : make_float2(-INFINITY, 0.0f);
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
