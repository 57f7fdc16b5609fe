// NSA kernels besides the attention mainloop's variants (launchers in nsa.cu, contracts in
// nsa.h): block compression, the top-S block selection from the compressed logits, the SSV group
// union plan, and the merge of the sparse branches' splits with the gates. Include from .cu files
// only.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_combine.cuh"  // kCombineFewMaxSplits
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/nsa.h"  // NsaLoadCounters, kNsaGroup*

namespace specd::kernels::nsa {

using attention::kNegInf;

constexpr int kCompressThreads = 256;
constexpr int kSelectThreads = 256;
constexpr int kSelectMaxItems = 16;  // candidates per thread: up to 4096 blocks
constexpr int kUnionThreads = 256;
constexpr int kUnionMaxItems = 16;  // context blocks per thread: up to 4096
constexpr int kCombineWarps = 4;

// ---------------------------------------------------------------------------------------------
// NsaCompressKernel: one CTA per token; where the token's position p ends block c = p / B, each
// thread owns columns (kv head, d) of K then V and sums the block's B rows in position order.
//   cmp_k, cmp_v  [num_pages, num_kv_heads, epp, head_dim] bf16
__global__ void __launch_bounds__(kCompressThreads)
    NsaCompressKernel(const __nv_bfloat16* __restrict__ k_cache,
                      const __nv_bfloat16* __restrict__ v_cache, const int32_t* block_tables,
                      int max_blocks_per_seq, const int32_t* positions, const int32_t* token_seqs,
                      int num_kv_heads, int head_dim, int page_size, int block_size, int epp,
                      __nv_bfloat16* cmp_k, __nv_bfloat16* cmp_v) {
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  const int token = blockIdx.x;
  const int seq = token_seqs[token], pos = positions[token];
  if (seq < 0 || pos < 0 || (pos + 1) % block_size != 0) return;
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const int first = pos + 1 - block_size;
  const int64_t entry_page = table[pos / page_size];
  const int entry_row = (pos % page_size) / block_size;
  for (int i = threadIdx.x; i < 2 * num_kv_heads * head_dim; i += kCompressThreads) {
    const bool value = i >= num_kv_heads * head_dim;
    const int col = value ? i - num_kv_heads * head_dim : i;
    const int kv_head = col / head_dim, d = col % head_dim;
    const __nv_bfloat16* cache = value ? v_cache : k_cache;
    float sum = 0.0f;
    for (int j = first; j <= pos; ++j) {
      const int64_t page = __ldg(table + j / page_size);
      sum += __bfloat162float(
          cache[((page * num_kv_heads + kv_head) * page_size + j % page_size) * head_dim + d]);
    }
    const float mean = sum / static_cast<float>(block_size);
    __nv_bfloat16* dst = value ? cmp_v : cmp_k;
    dst[((entry_page * num_kv_heads + kv_head) * epp + entry_row) * head_dim + d] =
        __float2bfloat16_rn(mean);
  }
}

// ---------------------------------------------------------------------------------------------
// NsaSelectKernel: one CTA per (token, kv head). Each q head's log2-sum-exp over its visible
// logits, the block scores (the heads' probabilities summed in head order, forced blocks
// {0, i - 1, i} set to `group`), then the top S by a 4-pass radix select over the scores' bits
// (scores are >= 0, so their bits order them), ties to the lower index, written ascending.
//   logits      [num_tokens, num_q_heads, logit_stride] fp32, log2 domain (NsaCompressedVariant)
//   selections  [num_tokens, num_kv_heads, S] int32; untouched for a token whose refresh_every
//               (when given) says `layer` reuses its last refresh layer's selection
//   own_selections  null, or [num_tokens, num_kv_heads, S] int32: a refresh token's own selection
//               (SSV load counting, NsaLoadCount); a reuse token's row all -1 (no top-S on a
//               reuse layer: skipping it is what the schedule buys; overlap is counted on
//               refresh layers only, on the CPU too)
__global__ void __launch_bounds__(kSelectThreads)
    NsaSelectKernel(const float* __restrict__ logits, int64_t logit_stride,
                    const int32_t* positions, const int32_t* token_seqs,
                    const int32_t* refresh_every, int layer, int num_q_heads, int num_kv_heads,
                    int log2_b, int block_counts, int32_t* selections, int32_t* own_selections) {
  constexpr int kWarps = kSelectThreads / kWarpSize;
  __shared__ float head_lse[kMaxBlockThreads / kWarpSize * 8];  // up to 256 heads per kv head
  __shared__ uint32_t keys[kSelectThreads * kSelectMaxItems];
  __shared__ uint32_t hist[256];
  __shared__ uint32_t scratch[kWarps + 1];
  __shared__ uint32_t found[2];  // digit, remaining rank
  WaitForPrerequisiteGrid();     // launched as a programmatic dependent (common.cuh)
  const int token = blockIdx.x / num_kv_heads, kv_head = blockIdx.x % num_kv_heads;
  // A reuse layer keeps the token's selection from its last refresh layer (CTA-uniform), and
  // counts no overlap. A refresh token's row is written once (the select's registers stay those
  // of one destination), then copied to own_selections.
  const int64_t row = static_cast<int64_t>(blockIdx.x) * block_counts;
  if (refresh_every != nullptr && layer % max(1, refresh_every[token]) != 0) {
    if (own_selections != nullptr) {
      for (int k = threadIdx.x; k < block_counts; k += kSelectThreads) own_selections[row + k] = -1;
    }
    return;
  }
  const int group = num_q_heads / num_kv_heads;
  int32_t* out = selections + row;
  int32_t* copy = own_selections == nullptr ? nullptr : own_selections + row;
  const int seq = token_seqs[token], pos = positions[token];
  const int own = pos >> log2_b, n = own + 1, visible = (pos + 1) >> log2_b;
  if (seq < 0 || pos < 0 || n <= block_counts) {
    for (int k = threadIdx.x; k < block_counts; k += kSelectThreads) {
      const int32_t block = seq >= 0 && pos >= 0 && k < n ? k : -1;
      out[k] = block;
      if (copy != nullptr) copy[k] = block;
    }
    return;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const float* head_logits =
      logits + (static_cast<int64_t>(token) * num_q_heads + kv_head * group) * logit_stride;
  for (int h = warp; h < group; h += kWarps) {
    const float* row = head_logits + h * logit_stride;
    float m = kNegInf;
    for (int c = lane; c < visible; c += kWarpSize) m = fmaxf(m, row[c]);
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
    for (int c = lane; c < visible; c += kWarpSize) sum += exp2f(row[c] - m);
    sum = WarpReduceSum(sum);
    if (lane == 0) head_lse[h] = m + __log2f(sum);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < n; c += kSelectThreads) {
    float score = 0.0f;
    if (c < visible) {
      for (int h = 0; h < group; ++h)
        score += exp2f(head_logits[h * logit_stride + c] - head_lse[h]);
    }
    if (c == 0 || c == own - 1 || c == own) score = static_cast<float>(group);
    keys[c] = __float_as_uint(score);
  }
  // Radix select of the S-th largest key: `prefix` its bits so far, `remaining` its rank among
  // the keys sharing them.
  uint32_t prefix = 0, prefix_mask = 0;
  uint32_t remaining = block_counts;
#pragma unroll 1
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[threadIdx.x] = 0;  // kSelectThreads == 256 bins
    __syncthreads();
    for (int c = threadIdx.x; c < n; c += kSelectThreads) {
      if ((keys[c] & prefix_mask) == prefix) atomicAdd(&hist[(keys[c] >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (warp ==
        0) {  // lane l: bins 8 l .. 8 l + 7; the digit holding rank `remaining` from the top
      uint32_t local = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) local += hist[8 * lane + b];
      uint32_t above = local;  // inclusive suffix sum over lanes >= lane
#pragma unroll
      for (int o = 1; o < kWarpSize; o *= 2) {
        const uint32_t y = __shfl_down_sync(0xffffffffu, above, o);
        if (lane + o < kWarpSize) above += y;
      }
      const uint32_t excl = above - local;
      if (excl < remaining && remaining <= above) {
        uint32_t cum = excl;
        for (int b = 7; b >= 0; --b) {
          const uint32_t count = hist[8 * lane + b];
          if (cum + count >= remaining) {
            found[0] = 8 * lane + b;
            found[1] = remaining - cum;
            break;
          }
          cum += count;
        }
      }
    }
    __syncthreads();
    prefix |= found[0] << shift;
    prefix_mask |= 255u << shift;
    remaining = found[1];
    __syncthreads();
  }
  // Keys above the threshold, then the `remaining` lowest-index keys equal to it; thread j owns
  // the contiguous candidates [j * per, (j + 1) * per) so the scans run in index order.
  const int per = (n + kSelectThreads - 1) / kSelectThreads;
  const int c0 = threadIdx.x * per, c1 = min(n, c0 + per);
  uint32_t equal = 0;
  for (int c = c0; c < c1; ++c) equal += keys[c] == prefix;
  uint32_t total = 0;
  const uint32_t equal_start = BlockExclusiveSum<kSelectThreads>(equal, scratch, total);
  uint32_t chosen = 0, equal_before = equal_start;
  for (int c = c0; c < c1; ++c) {
    chosen += keys[c] > prefix || (keys[c] == prefix && equal_before++ < remaining);
  }
  uint32_t slot = BlockExclusiveSum<kSelectThreads>(chosen, scratch, total);
  equal_before = equal_start;
  for (int c = c0; c < c1; ++c) {
    if (keys[c] > prefix || (keys[c] == prefix && equal_before++ < remaining)) out[slot++] = c;
  }
  for (int k = static_cast<int>(total) + threadIdx.x; k < block_counts; k += kSelectThreads) {
    out[k] = -1;  // never: S of n > S candidates are always chosen
  }
  if (copy != nullptr) {  // CTA-uniform; the barrier makes the row's global writes visible
    __syncthreads();
    for (int k = threadIdx.x; k < block_counts; k += kSelectThreads) copy[k] = out[k];
  }
}

// ---------------------------------------------------------------------------------------------
// SSV load counting of one (group, kv head), for NsaUnionKernel once its flags are final (every
// thread of the CTA calls it): what engine/model/nsa_attention.cc's CountLoads counts for the
// group (nsa.h's NsaLoadCounters), added to `counters`.
//   per token: its attended blocks, and its keys: each attended block's positions up to its own
//     (its own block cut at p) less those in its window, plus the window's min(p + 1, W);
//   per group: the union's selected blocks (a token bit in the flag), and its keys: in each
//     flagged block, the selected ones up to the last position of a token selecting it (positions
//     ascend in a group) merged with the windows' union [p_first - W + 1, p_last] (positions are
//     consecutive: one range);
//   per token whose sequence's previous token is in the pass: |own(t) n own(t - 1)| / |own(t)|,
//     the rows of own_selections (ascending, -1 padded) staged in shared memory, each entry found
//     by a binary search in the previous row.
//   flags  [num_blocks] shared: a token bit per query selecting the block, kWindowFlag
constexpr uint32_t kWindowFlag = 1u << 31;
__device__ __forceinline__ uint32_t WarpSumU32(uint32_t x) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
// Whether `row` ([n] ascending block indices, then -1s) holds block b.
__device__ __forceinline__ bool RowHolds(const int32_t* row, int n, int b) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const int v = row[mid];
    if (v >= 0 && v < b) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && row[lo] == b;
}
__device__ void CountGroupLoads(const uint32_t* flags, int num_blocks, int first, int count,
                                bool has_prev, const int32_t* positions, const int32_t* selections,
                                bool group_shared, const int32_t* own_selections, int num_kv_heads,
                                int kv_head, int log2_b, int block_counts, int window,
                                NsaLoadCounters* counters) {
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  // Rows first - 1 .. first + count - 1 of own_selections (row 0 all -1 without a previous token).
  __shared__ int32_t own_rows[(kNsaMaxGroupSize + 1) * kNsaMaxBlockCounts];
  __shared__ uint32_t met[kNsaMaxGroupSize], held[kNsaMaxGroupSize];  // |own n prev|, |own|
  const int64_t row_stride = int64_t{num_kv_heads} * block_counts;
  const int64_t head = int64_t{kv_head} * block_counts;
  for (int i = threadIdx.x; i < (count + 1) * block_counts; i += kUnionThreads) {
    const int r = i / block_counts;
    own_rows[i] = r > 0 || has_prev
                      ? own_selections[(first - 1 + r) * row_stride + head + i % block_counts]
                      : -1;
  }
  if (threadIdx.x < count) met[threadIdx.x] = held[threadIdx.x] = 0;
  __syncthreads();
  uint32_t keys = 0, blocks = 0, group_keys = 0, group_blocks = 0;
  for (int i = threadIdx.x; i < count * block_counts; i += kUnionThreads) {
    const int qi = i / block_counts, k = i % block_counts;
    const int p = positions[first + qi];
    const int source = group_shared ? first : first + qi;
    const int b = selections[source * row_stride + head + k];
    if (b >= 0 && b <= p >> log2_b && b < num_blocks) {  // the union's filter
      const int lo = b << log2_b, hi = min(lo + (1 << log2_b) - 1, p);
      const int in_window = max(0, hi - max(lo, p - window + 1) + 1);
      ++blocks;
      keys += static_cast<uint32_t>(hi - lo + 1 - in_window);
    }
    const int o = own_rows[(qi + 1) * block_counts + k];
    if (o >= 0) {
      atomicAdd(&held[qi], 1u);
      if (RowHolds(own_rows + qi * block_counts, block_counts, o)) atomicAdd(&met[qi], 1u);
    }
  }
  const int p_first = positions[first], p_last = positions[first + count - 1];
  const int window_first = max(0, p_first - window + 1);
  for (int b = threadIdx.x; b < num_blocks; b += kUnionThreads) {
    if (flags[b] == 0) continue;
    const uint32_t mask = flags[b] & ~kWindowFlag;
    const int lo = b << log2_b, end = lo + (1 << log2_b) - 1;
    int selected_end = lo - 1;  // none
    if (mask != 0) {
      ++group_blocks;
      selected_end = min(end, positions[first + 31 - __clz(mask)]);
    }
    const int w_lo = max(lo, window_first), w_hi = min(end, p_last);
    const int both = max(0, min(selected_end, w_hi) - w_lo + 1);
    group_keys += static_cast<uint32_t>(selected_end - lo + 1 + max(0, w_hi - w_lo + 1) - both);
  }
  __syncthreads();
  uint32_t pairs = 0;
  double overlap = 0;
  if (threadIdx.x < count) {
    keys += static_cast<uint32_t>(min(positions[first + threadIdx.x] + 1, window));
    if ((threadIdx.x > 0 || has_prev) && held[threadIdx.x] > 0) {
      pairs = 1;
      overlap = static_cast<double>(met[threadIdx.x]) / held[threadIdx.x];
    }
  }
  const int lane = threadIdx.x % kWarpSize;
  auto add = [&](uint64_t* total, uint32_t value) {
    value = WarpSumU32(value);
    if (lane == 0 && value != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(total),
                static_cast<unsigned long long>(value));
    }
  };
  add(&counters->per_query_keys, keys);
  add(&counters->per_query_blocks, blocks);
  add(&counters->grouped_keys, group_keys);
  add(&counters->grouped_blocks, group_blocks);
  if (threadIdx.x < kWarpSize) {  // the group's tokens are lanes of warp 0 (count <= 16)
    add(&counters->overlap_pairs, pairs);
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) overlap += __shfl_xor_sync(0xffffffffu, overlap, o);
    if (lane == 0 && overlap != 0) atomicAdd(&counters->overlap_sum, overlap);
  }
  if (threadIdx.x == 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&counters->queries),
              static_cast<unsigned long long>(count));
  }
}

// ---------------------------------------------------------------------------------------------
// NsaUnionKernel: one CTA per (group, kv head). The blocks any of the group's queries reads --
// each query's attended selection (its own, or the group's first query's with `shared` or the
// group's kNsaGroupShared flag; entries < 0 or past the query's own block dropped) and every block
// of the window range [(p_first - W + 1) / B, p_last / B] -- as an ascending list with, per block,
// the bit of each query whose selection holds it and the physical pages of its positions
// (2^log2_ppb of them: B / page_size, or the one page holding a block smaller than a page). A flag
// per context block in shared memory, then a compaction; then, for a group flagged
// kNsaGroupCounted with `counters` given, its SSV loads (CountGroupLoads).
//   group_flags                [num_groups] uint8 (kNsaGroup*) or null
//   own_selections             [num_tokens, num_kv_heads, S] int32 (with counters)
//   union_blocks, union_masks  [num_groups, num_kv_heads, max_union]; union_counts [.., ..]
//   union_pages                [num_groups, num_kv_heads, max_union, 2^log2_ppb]
__global__ void __launch_bounds__(kUnionThreads, 1)
    NsaUnionKernel(const int32_t* groups, int max_group_size, const int32_t* positions,
                   const int32_t* token_seqs, const int32_t* selections, bool shared,
                   const uint8_t* group_flags, const int32_t* block_tables, int max_blocks_per_seq,
                   int log2_page, int log2_ppb, int num_kv_heads, int log2_b, int block_counts,
                   int window, int max_blocks, int max_union, int32_t* union_blocks,
                   uint32_t* union_masks, int32_t* union_pages, int32_t* union_counts,
                   const int32_t* own_selections, NsaLoadCounters* counters) {
  extern __shared__ uint32_t flags[];  // [max_blocks]
  __shared__ uint32_t scratch[kUnionThreads / kWarpSize + 1];
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  const int unit = blockIdx.x / num_kv_heads, kv_head = blockIdx.x % num_kv_heads;
  const int first = groups[2 * unit];
  const int count = min(groups[2 * unit + 1], max_group_size);
  const int64_t list = blockIdx.x;
  const int seq = count > 0 ? token_seqs[first] : -1;
  if (seq < 0) {
    if (threadIdx.x == 0) union_counts[list] = 0;
    return;
  }
  const int p_first = positions[first], p_last = positions[first + count - 1];
  const int num_blocks = min((p_last >> log2_b) + 1, max_blocks);
  for (int b = threadIdx.x; b < num_blocks; b += kUnionThreads) flags[b] = 0;
  __syncthreads();
  const int w_lo = max(0, p_first - window + 1) >> log2_b;
  for (int b = w_lo + threadIdx.x; b < num_blocks; b += kUnionThreads) {
    atomicOr(&flags[b], kWindowFlag);
  }
  const uint32_t group_bits = group_flags != nullptr ? group_flags[unit] : 0u;
  const bool group_shared = shared || (group_bits & kNsaGroupShared) != 0;
  for (int i = threadIdx.x; i < count * block_counts; i += kUnionThreads) {
    const int qi = i / block_counts;
    const int source = group_shared ? first : first + qi;
    const int b =
        selections[(static_cast<int64_t>(source) * num_kv_heads + kv_head) * block_counts +
                   i % block_counts];
    const int own = positions[first + qi] >> log2_b;
    if (b >= 0 && b <= own && b < num_blocks) atomicOr(&flags[b], 1u << qi);
  }
  __syncthreads();
  const int per = (num_blocks + kUnionThreads - 1) / kUnionThreads;
  const int b0 = threadIdx.x * per, b1 = min(num_blocks, b0 + per);
  uint32_t used = 0;
  for (int b = b0; b < b1; ++b) used += flags[b] != 0;
  uint32_t total = 0;
  uint32_t slot = BlockExclusiveSum<kUnionThreads>(used, scratch, total);
  int32_t* blocks = union_blocks + list * max_union;
  uint32_t* masks = union_masks + list * max_union;
  int32_t* pages = union_pages + (list * max_union << log2_ppb);
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  for (int b = b0; b < b1; ++b) {
    if (flags[b] == 0) continue;
    if (slot < static_cast<uint32_t>(max_union)) {
      blocks[slot] = b;
      masks[slot] = flags[b] & ~kWindowFlag;
      // Pages past the table row (positions no query reaches) are never read: clamped.
      const int page0 = (b << log2_b) >> log2_page;
      int32_t* dst = pages + (static_cast<int64_t>(slot) << log2_ppb);
#pragma unroll 1
      for (int j = 0; j < (1 << log2_ppb); ++j) {
        dst[j] = __ldg(table + min(page0 + j, max_blocks_per_seq - 1));
      }
    }
    ++slot;
  }
  if (threadIdx.x == 0) union_counts[list] = min(static_cast<int>(total), max_union);
  if (counters != nullptr && (group_bits & kNsaGroupCounted) != 0) {  // CTA-uniform
    const bool has_prev = first > 0 && token_seqs[first - 1] == seq;
    CountGroupLoads(flags, num_blocks, first, count, has_prev, positions, selections, group_shared,
                    own_selections, num_kv_heads, kv_head, log2_b, block_counts, window, counters);
  }
}

// ---------------------------------------------------------------------------------------------
// NsaCombineGateKernel: one warp per (token, q head), lane l owning columns 4 l .. 4 l + 3 (lanes
// past head_dim / 4 idle). Each branch's splits merge by their log2-sum-exps (splits with lse
// -inf weigh 0, their rows unread); then the gated sum with o_cmp. Padding tokens are skipped.
// Lane l reads the lse of splits l and l + 32 of both branches at once, and the partial rows are
// read kCombineBatch splits at a time with no load waiting on another (the splits' latency, not
// their bytes, is what this kernel's time was).
//   partial_out  [num_tokens, num_q_heads, 2, num_splits, head_dim] fp32 (branch 0 selected)
//   partial_lse  [num_tokens, num_q_heads, 2, num_splits] fp32
constexpr int kCombineBatch = 8;
template <int kHeadDim>
__global__ void __launch_bounds__(kCombineWarps* kWarpSize)
    NsaCombineGateKernel(const float* __restrict__ partial_out,
                         const float* __restrict__ partial_lse, int num_splits, int num_q_heads,
                         int64_t num_tokens, const int32_t* token_seqs,
                         const __nv_bfloat16* __restrict__ o_cmp, int64_t o_cmp_stride,
                         const __nv_bfloat16* __restrict__ gate_logits, int64_t gate_stride,
                         __nv_bfloat16* out, int64_t out_stride) {
  static_assert(attention::kCombineFewMaxSplits <= 2 * kWarpSize);
  AllowDependentLaunch();
  WaitForPrerequisiteGrid();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / kWarpSize;
  if (row >= num_tokens * num_q_heads) return;  // warp-uniform
  const int64_t token = row / num_q_heads;
  const int head = static_cast<int>(row % num_q_heads);
  if (token_seqs[token] < 0) return;
  const bool cols = lane < kHeadDim / 4;
  float4 branch[2];
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const int64_t vrow = row * 2 + b;
    const float* lse = partial_lse + vrow * num_splits;
    // Lane l's weights: splits l and l + 32, relative to the branch's largest lse.
    float own[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int s = lane + kWarpSize * j;
      own[j] = s < num_splits ? lse[s] : kNegInf;
    }
    float max_lse = fmaxf(own[0], own[1]);
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) {
      max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, o));
    }
    float weight_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      own[j] = own[j] == kNegInf ? 0.0f : exp2f(own[j] - max_lse);
      weight_sum += own[j];
    }
    weight_sum = WarpReduceSum(weight_sum);
    const float* src = partial_out + vrow * num_splits * kHeadDim + 4 * lane;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < num_splits; s0 += kCombineBatch) {
      float w[kCombineBatch];
      float4 o[kCombineBatch];
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        const int s = s0 + i;
        w[i] = __shfl_sync(0xffffffffu, s < kWarpSize ? own[0] : own[1], s % kWarpSize);
        w[i] = s < num_splits ? w[i] : 0.0f;
        o[i] = cols && w[i] > 0.0f
                   ? *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kHeadDim)
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        acc.x += w[i] * o[i].x, acc.y += w[i] * o[i].y, acc.z += w[i] * o[i].z,
            acc.w += w[i] * o[i].w;
      }
    }
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
    branch[b] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
  if (!cols) return;
  const __nv_bfloat16* gate = gate_logits + token * gate_stride + 3 * head;
  const float g_cmp = 1.0f / (1.0f + __expf(-__bfloat162float(gate[0])));
  const float g_slc = 1.0f / (1.0f + __expf(-__bfloat162float(gate[1])));
  const float g_swa = 1.0f / (1.0f + __expf(-__bfloat162float(gate[2])));
  const Bf16Vec<4> cmp =
      Bf16Vec<4>::Load(o_cmp + token * o_cmp_stride + head * kHeadDim + 4 * lane);
  const float slc[4] = {branch[0].x, branch[0].y, branch[0].z, branch[0].w};
  const float swa[4] = {branch[1].x, branch[1].y, branch[1].z, branch[1].w};
  Bf16Vec<4> result;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    result.v[i] =
        __float2bfloat16_rn(g_slc * slc[i] + g_cmp * __bfloat162float(cmp.v[i]) + g_swa * swa[i]);
  }
  result.Store(out + token * out_stride + head * kHeadDim + 4 * lane);
}

}  // namespace specd::kernels::nsa
