// NSA variants of the split-KV verification kernel (attention_verify.cuh; launchers in nsa.cu,
// contracts in nsa.h): the compressed branch over the compressed cache with its raw logits kept
// for the block selection, and the selected + window branches of an SSV group over the union of
// its tokens' blocks. Both are custom-rows variants of PagedVerifyKernel (rows are a group's
// tokens x q heads, x branches for the sparse one), so they share its cp.async ring, mma math and
// online softmax; they differ in where key k lives, each row's mask and the score hook.
// Include from .cu files only.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/cuda/attention_verify.cuh"

namespace specd::kernels::attention {

// What both NSA variants add to VerifyParams: the pass's tokens and the groups (nsa.h).
struct NsaRunParams : VerifyParams {
  const int32_t* positions;   // [num_tokens]
  const int32_t* token_seqs;  // [num_tokens]; < 0 padding
  const int32_t* groups;      // [num_groups, 2]: first token, count
  int32_t log2_nsa_block;     // log2(B)
};

// A CTA's group: its tokens, their sequence's table row, and each query's position.
struct NsaGroupRun {
  const int32_t* positions;
  int first_token, num_queries, table_row;

  __device__ __forceinline__ NsaGroupRun(const NsaRunParams& vx, int unit)
      : positions(vx.positions),
        first_token(__ldg(vx.groups + 2 * unit)),
        num_queries(__ldg(vx.groups + 2 * unit + 1)),
        table_row(0) {
    if (num_queries > 0) table_row = __ldg(vx.token_seqs + first_token);
    if (table_row < 0) num_queries = 0, table_row = 0;  // padding: no rows
  }
  __device__ __forceinline__ int Position(int qi) const {
    return __ldg(positions + first_token + qi);
  }
};

// Copies one 16-byte chunk of key/value row `offset` (elements) into a stage, or zeros.
template <int kHeadDim>
__device__ __forceinline__ void CopyKvChunk(const PrefillParams& p, int row, int chunk,
                                            int64_t offset, bool valid, uint64_t policy,
                                            __nv_bfloat16* k_stage, __nv_bfloat16* v_stage) {
  const int dst = SwizzledOffset<kHeadDim>(row, chunk);
  CpAsync16Hinted(SmemAddr(k_stage + dst), p.k_cache + offset, valid, policy);
  CpAsync16Hinted(SmemAddr(v_stage + dst), p.v_cache + offset, valid, policy);
}

// ---------------------------------------------------------------------------------------------
// Compressed branch (NsaSelect). Key c is NSA block c's entry of the compressed cache (pre.k_cache
// / v_cache are cmp_k / cmp_v, pre.log2_block_size is log2(page_size)): page
// table[e / page_size], row (e % page_size) / B, e = (c + 1) B - 1. A row at position p sees
// c < (p + 1) / B. The score hook stores every visible raw logit, scaled to the log2 domain, so
// the selection kernel can normalise each head over all of its entries (the splits only see
// theirs):
//   logits  [num_tokens, num_q_heads, logit_stride] fp32: (token, q head, c), c < (p + 1) / B

struct NsaCompressedParams : NsaRunParams {
  int32_t entries_per_page;
  float* logits;
  int64_t logit_stride;
};

struct NsaCompressedVariant {
  using Params = NsaCompressedParams;
  static constexpr bool kScoreHook = true;
  static constexpr bool kCustomRows = true;
  static constexpr int kBranches = 1;
  static constexpr int kMinCtasPerSm = 1;

  struct Keys : NsaGroupRun {
    int log2_b, epp;

    __device__ __forceinline__ Keys(const Params& vx, int unit, int)
        : NsaGroupRun(vx, unit), log2_b(vx.log2_nsa_block), epp(vx.entries_per_page) {}

    __device__ __forceinline__ void KeyRange(int, int q_last, int& kv_lo, int& kv_hi) const {
      kv_lo = 0;
      kv_hi = (Position(q_last) + 1) >> log2_b;
    }

    template <int kHeadDim, int kThreads>
    __device__ __forceinline__ void LoadTile(const PrefillParams& p, const int32_t* table,
                                             int kv_head, int tile, int kv_lo, int kv_hi,
                                             __nv_bfloat16* k_stage, __nv_bfloat16* v_stage) const {
      using Cfg = PrefillConfig<kHeadDim>;
      constexpr int kCopies = Cfg::kBlockN * Cfg::kChunks / kThreads;
      static_assert(kCopies >= 1 && kCopies * kThreads == Cfg::kBlockN * Cfg::kChunks);
      const uint64_t kv_policy = L2EvictFirstPolicy();
      const int page_mask = (1 << p.log2_block_size) - 1;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int index = threadIdx.x + i * kThreads;
        const int row = index / Cfg::kChunks, chunk = index % Cfg::kChunks;
        const int c = tile * Cfg::kBlockN + row;
        const bool valid = c >= kv_lo && c < kv_hi;
        int64_t offset = 0;
        if (valid) {
          const int e = ((c + 1) << log2_b) - 1;
          const int64_t page = __ldg(table + (e >> p.log2_block_size));
          const int slot = (e & page_mask) >> log2_b;
          offset = ((page * p.num_kv_heads + kv_head) * epp + slot) * kHeadDim + chunk * 8;
        }
        CopyKvChunk<kHeadDim>(p, row, chunk, offset, valid, kv_policy, k_stage, v_stage);
      }
    }

    template <int kHeadDim>
    __device__ __forceinline__ bool WarpNeedsTile(int, const int (&)[2], const int (&)[2],
                                                  const int (&)[2], const bool (&)[2]) const {
      return true;  // every row sees the CTA's entries up to its own limit
    }

    template <int kHeadDim>
    __device__ __forceinline__ void MaskTile(const Params& vx,
                                             float (&s)[PrefillConfig<kHeadDim>::kSTiles][4],
                                             int key0, const int (&pos)[2], const int (&)[2],
                                             const int (&)[2], int t) const {
      const int limit[2] = {(pos[0] + 1) >> log2_b, (pos[1] + 1) >> log2_b};
#pragma unroll
      for (int nt = 0; nt < PrefillConfig<kHeadDim>::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = key0 + 8 * nt + 2 * t + (e & 1);
          s[nt][e] = c < limit[e >> 1] ? s[nt][e] * vx.pre.scale_log2 : kNegInf;
        }
      }
    }

    template <int kHeadDim>
    __device__ __forceinline__ void TileScores(
        const Params& vx, const float (&s)[PrefillConfig<kHeadDim>::kSTiles][4], int key0,
        const int (&token)[2], const int (&head)[2], const bool (&valid)[2], const int (&pos)[2],
        int t) const {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!valid[h]) continue;
        const int64_t limit = min(static_cast<int64_t>((pos[h] + 1) >> log2_b), vx.logit_stride);
        float* dst = vx.logits +
                     (static_cast<int64_t>(token[h]) * vx.num_q_heads + head[h]) * vx.logit_stride;
#pragma unroll
        for (int nt = 0; nt < PrefillConfig<kHeadDim>::kSTiles; ++nt) {
          const int c = key0 + 8 * nt + 2 * t;
          if (c < limit) dst[c] = s[nt][2 * h] * vx.pre.scale_log2;
          if (c + 1 < limit) dst[c + 1] = s[nt][2 * h + 1] * vx.pre.scale_log2;
        }
      }
    }
  };
};

// ---------------------------------------------------------------------------------------------
// Selected and window branches of an SSV group (NsaAttend). The group's keys are its union list
// (NsaUnionKernel): key k is position blocks[k / B] * B + k % B, and masks[k / B] has bit qi set
// where the group's query qi attends that block; pages[k / B] holds the physical pages of the
// block's positions (B / page_size of them, or the one page holding the block). Rows are (query,
// branch, q head), branch 0 the selected softmax (keys of its blocks up to its position), branch 1
// the window (positions p - W + 1 .. p); positions past the group's last query are never read.
// A CTA stages the list entries of its split (block, mask, pages) in shared memory before its
// first tile (VerifyStagedKeys), so a tile's copies, skip test and mask read shared memory only.
//   union_blocks [num_groups, num_kv_heads, max_union] int32, ascending
//   union_masks  [num_groups, num_kv_heads, max_union] uint32
//   union_pages  [num_groups, num_kv_heads, max_union, 2^log2_pages_per_block] int32
//   union_counts [num_groups, num_kv_heads] int32

struct NsaSparseParams : NsaRunParams {
  const int32_t* union_blocks;
  const uint32_t* union_masks;
  const int32_t* union_pages;
  const int32_t* union_counts;
  int32_t max_union;
  int32_t window_size;
  int32_t log2_pages_per_block;  // max(0, log2(B / page_size))
  int32_t staged_units;          // list entries a CTA's shared memory holds (StagedUnits, nsa.cu)
};

// Shared memory a CTA stages `units` list entries in: block, mask and pages per entry.
__host__ __device__ constexpr int64_t NsaStagedBytes(int64_t units, int log2_pages_per_block) {
  return units * (2 + (int64_t{1} << log2_pages_per_block)) * 4;
}

struct NsaSparseVariant {
  using Params = NsaSparseParams;
  static constexpr bool kScoreHook = false;
  static constexpr bool kCustomRows = true;
  static constexpr bool kStagedKeys = true;
  static constexpr int kBranches = 2;  // 0 selected, 1 window
  static constexpr int kMinCtasPerSm = 1;

  struct Keys : NsaGroupRun {
    const int32_t* blocks;  // global list, then (Stage) the CTA's staged entries
    const uint32_t* masks;
    const int32_t* pages;
    int count, last_pos, log2_b, window, log2_ppb;
    int unit_base, unit_end;  // the list entries `blocks` / `masks` / `pages` hold

    __device__ __forceinline__ Keys(const Params& vx, int unit, int kv_head)
        : NsaGroupRun(vx, unit),
          log2_b(vx.log2_nsa_block),
          window(vx.window_size),
          log2_ppb(vx.log2_pages_per_block),
          unit_base(0),
          unit_end(0) {
      const int64_t list = static_cast<int64_t>(unit) * vx.pre.num_kv_heads + kv_head;
      blocks = vx.union_blocks + list * vx.max_union;
      masks = vx.union_masks + list * vx.max_union;
      pages = vx.union_pages + (list * vx.max_union << log2_ppb);
      count = num_queries > 0 ? min(__ldg(vx.union_counts + list), vx.max_union) : 0;
      last_pos = num_queries > 0 ? Position(num_queries - 1) : -1;
      unit_end = count;
    }

    __device__ __forceinline__ void KeyRange(int, int, int& kv_lo, int& kv_hi) const {
      kv_lo = 0;
      kv_hi = count << log2_b;
    }

    // Copies the entries of keys [key_begin, key_end) into `smem` (blocks, masks, pages; the
    // launcher sized it for staged_units entries) and points this map at them.
    template <int kThreads>
    __device__ __forceinline__ void Stage(const Params& vx, void* smem, int key_begin,
                                          int key_end) {
      const int u0 = key_begin >> log2_b;
      const int u1 = min(count, (key_end + (1 << log2_b) - 1) >> log2_b);
      const int n = max(0, min(u1 - u0, vx.staged_units));
      int32_t* s_blocks = static_cast<int32_t*>(smem);
      uint32_t* s_masks = reinterpret_cast<uint32_t*>(s_blocks + vx.staged_units);
      int32_t* s_pages = reinterpret_cast<int32_t*>(s_masks + vx.staged_units);
      for (int i = threadIdx.x; i < n; i += kThreads) {
        s_blocks[i] = __ldg(blocks + u0 + i);
        s_masks[i] = __ldg(masks + u0 + i);
      }
      for (int i = threadIdx.x; i < (n << log2_ppb); i += kThreads) {
        s_pages[i] = __ldg(pages + (u0 << log2_ppb) + i);
      }
      blocks = s_blocks, masks = s_masks, pages = s_pages, unit_base = u0, unit_end = u0 + n;
    }

    template <int kHeadDim, int kThreads>
    __device__ __forceinline__ void LoadTile(const PrefillParams& p, const int32_t*, int kv_head,
                                             int tile, int kv_lo, int kv_hi, __nv_bfloat16* k_stage,
                                             __nv_bfloat16* v_stage) const {
      using Cfg = PrefillConfig<kHeadDim>;
      constexpr int kCopies = Cfg::kBlockN * Cfg::kChunks / kThreads;
      static_assert(kCopies >= 1 && kCopies * kThreads == Cfg::kBlockN * Cfg::kChunks);
      const uint64_t kv_policy = L2EvictFirstPolicy();
      const int block_mask = (1 << log2_b) - 1, page_mask = (1 << p.log2_block_size) - 1;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int index = threadIdx.x + i * kThreads;
        const int row = index / Cfg::kChunks, chunk = index % Cfg::kChunks;
        const int k = tile * Cfg::kBlockN + row;
        bool valid = k >= kv_lo && k < kv_hi;
        int64_t offset = 0;
        if (valid) {
          const int u = (k >> log2_b) - unit_base;
          const int in_block = k & block_mask;
          const int pos = (blocks[u] << log2_b) | in_block;
          valid = pos <= last_pos;
          const int64_t page = pages[(u << log2_ppb) + (in_block >> p.log2_block_size)];
          offset = (((page * p.num_kv_heads + kv_head) << p.log2_block_size) | (pos & page_mask)) *
                       kHeadDim +
                   chunk * 8;
        }
        CopyKvChunk<kHeadDim>(p, row, chunk, offset, valid, kv_policy, k_stage, v_stage);
      }
    }

    // Whether any of the warp's rows sees a key of the tile: a selected row, a block of the tile
    // its query attends (not past its position); a window row, a block meeting its window. A
    // selected warp skips the group's blocks its queries do not attend, a window warp all but
    // its window's, so the math stays what each query alone would do while the loads are shared.
    template <int kHeadDim>
    __device__ __forceinline__ bool WarpNeedsTile(int key0, const int (&pos)[2], const int (&qi)[2],
                                                  const int (&branch)[2],
                                                  const bool (&valid)[2]) const {
      constexpr int kBlockN = PrefillConfig<kHeadDim>::kBlockN;
      const int u0 = key0 >> log2_b;
      const int u1 = min(unit_end, ((key0 + kBlockN - 1) >> log2_b) + 1);
      bool need = false;
      for (int u = u0; u < u1; ++u) {
        const int first = blocks[u - unit_base] << log2_b, last = first + (1 << log2_b) - 1;
        const uint32_t attended = masks[u - unit_base];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool sees = branch[h] == 0 ? ((attended >> qi[h]) & 1u) != 0 && first <= pos[h]
                                           : first <= pos[h] && last > pos[h] - window;
          need = need || (valid[h] && sees);
        }
      }
      return __any_sync(0xffffffffu, need);
    }

    // B >= 16, so each n8 tile of keys lies in one union block, and a tile spans at most
    // kBlockN / 16 of them: lane l reads the tile's l-th staged entry, the n8 tiles take theirs by
    // shuffles (per-tile reads held in registers spilled at head_dim 32).
    template <int kHeadDim>
    __device__ __forceinline__ void MaskTile(const Params& vx,
                                             float (&s)[PrefillConfig<kHeadDim>::kSTiles][4],
                                             int key0, const int (&pos)[2], const int (&qi)[2],
                                             const int (&branch)[2], int t) const {
      const int kv_hi = count << log2_b, block_mask = (1 << log2_b) - 1;
      const int u0 = key0 >> log2_b, lane = threadIdx.x % kWarpSize;
      const bool lane_in = lane <= (PrefillConfig<kHeadDim>::kBlockN >> 4) && u0 + lane < unit_end;
      const int lane_block = lane_in ? blocks[u0 + lane - unit_base] : 0;
      const uint32_t lane_mask = lane_in ? masks[u0 + lane - unit_base] : 0u;
#pragma unroll
      for (int nt = 0; nt < PrefillConfig<kHeadDim>::kSTiles; ++nt) {
        const int k8 = key0 + 8 * nt;
        const bool in_list = k8 < kv_hi;
        const int src = (k8 >> log2_b) - u0;
        const int block = __shfl_sync(0xffffffffu, lane_block, src);
        const uint32_t attended = __shfl_sync(0xffffffffu, lane_mask, src);
        // Row h sees positions [lo[h], pos[h]] of this block: its selection's whole block, or
        // its window; none where its query does not attend the block or the key is past the list.
        const int key_pos0 = (block << log2_b) | ((k8 + 2 * t) & block_mask);  // e & 1 adds 1
        int lo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          lo[h] = branch[h] == 0 ? (((attended >> qi[h]) & 1u) != 0 ? 0 : INT_MAX)
                                 : pos[h] - window + 1;
          if (!in_list) lo[h] = INT_MAX;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1, key_pos = key_pos0 + (e & 1);
          const bool valid = key_pos >= lo[h] && key_pos <= pos[h];
          s[nt][e] = valid ? s[nt][e] * vx.pre.scale_log2 : kNegInf;
        }
      }
    }
  };
};

}  // namespace specd::kernels::attention
