// NSA launchers (layer 2): validate, lay out the workspace, fill the variant parameters, pick the
// template instance, launch, report the error. Kernels: nsa_attention.cuh (variants of the
// verification kernel), nsa_kernels.cuh. The verification tiling (stages, warps) follows
// attention.cu's choices for PagedVerifyAttention.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_combine.cuh"
#include "kernels/cuda/nsa.h"
#include "kernels/cuda/nsa_attention.cuh"
#include "kernels/cuda/nsa_kernels.cuh"

namespace specd::kernels {
namespace {

using attention::NsaCompressedParams;
using attention::NsaRunParams;
using attention::NsaSparseParams;

template <int kHeadDim>
constexpr int kVerifyStages = kHeadDim == 128 ? 2 : 3;
constexpr size_t kWorkspaceAlign = 256;
constexpr int kWarpsPerSm = 8;
constexpr int32_t kMaxSplits = attention::kCombineFewMaxSplits;
constexpr int64_t kMinSelectSplitEntries = 64;
constexpr int64_t kMinAttendSplitKeys = 128;
constexpr int kMaxContextBlocks = nsa::kSelectThreads * nsa::kSelectMaxItems;  // 4096

int Log2(int64_t x) {
  int n = 0;
  while ((int64_t{1} << n) < x) ++n;
  return n;
}

size_t Aligned(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

bool ValidShape(const NsaShape& s) {
  return s.num_q_heads > 0 && s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0 &&
         s.num_q_heads / s.num_kv_heads <= 256 &&
         (s.head_dim == 32 || s.head_dim == 64 || s.head_dim == 128) &&
         (s.page_size == 16 || s.page_size == 32 || s.page_size == 64) &&
         (s.block_size == 16 || s.block_size == 32 || s.block_size == 64 || s.block_size == 128) &&
         s.block_counts >= 1 && s.block_counts <= kNsaMaxBlockCounts && s.window_size >= 1 &&
         std::isfinite(s.scale) && s.num_q_heads <= 65535;
}

// Context blocks of max_context (the logits' row, the union's flag array).
int64_t ContextBlocks(int32_t max_context, const NsaShape& s) {
  return CeilDiv(std::max<int32_t>(max_context, 1), s.block_size);
}
int64_t LogitStride(int32_t max_context, const NsaShape& s) {
  return CeilDiv(ContextBlocks(max_context, s), 4) * 4;
}

// Warps per mainloop CTA (16 rows each): enough for a group's rows, 2 to 8 -- a CTA streams its
// keys once for all its rows, so the group's queries share each tile in shared memory (at nsa-8b,
// C = 4: 128 rows, one CTA per group and kv head). The one-warp sparse instance spilled registers
// at head_dim 32; the compressed branch takes one warp where a group's rows fit 16.
int Warps(int32_t max_group_size, int branches, const NsaShape& s) {
  const int64_t rows = int64_t{max_group_size} * branches * (s.num_q_heads / s.num_kv_heads);
  if (rows <= 16) return branches == 1 ? 1 : 2;
  return rows <= 32 ? 2 : rows <= 64 ? 4 : 8;
}

// fn(std::integral_constant<int, warps>) for 1, 2, 4 or 8 warps (1: the compressed branch only).
template <bool kOneWarp, typename Fn>
cudaError_t ByWarps(int warps, Fn&& fn) {
  switch (warps) {
    case 1:
      if constexpr (kOneWarp) return fn(std::integral_constant<int, 1>());
      return cudaErrorInvalidValue;
    case 2:
      return fn(std::integral_constant<int, 2>());
    case 4:
      return fn(std::integral_constant<int, 4>());
    default:
      return fn(std::integral_constant<int, 8>());
  }
}
int64_t RowTiles(int32_t max_group_size, int branches, const NsaShape& s) {
  const int64_t rows = int64_t{max_group_size} * branches * (s.num_q_heads / s.num_kv_heads);
  return CeilDiv(rows, 16 * Warps(max_group_size, branches, s));
}

// Splits so one wave holds about kWarpsPerSm warps per SM (attention.cu's 4 CTAs of 2 warps),
// each split at least min_keys of `keys`, at most kMaxSplits.
int32_t PlanSplits(int64_t ctas_per_split, int warps, int64_t keys, int64_t min_keys,
                   int32_t num_sms) {
  const int64_t target = std::max<int64_t>(1, int64_t{kWarpsPerSm} * num_sms / warps);
  int64_t splits = std::max<int64_t>(1, target / std::max<int64_t>(1, ctas_per_split));
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, keys / min_keys));
  return static_cast<int32_t>(std::min<int64_t>(splits, kMaxSplits));
}

bool ValidRows(const void* p, int64_t stride, int64_t row_elems) {
  return p != nullptr && IsAligned(p, 16) && stride % kBf16PerVec16 == 0 && stride >= row_elems;
}

bool ValidRun(const __nv_bfloat16* q, int64_t q_stride, const NsaCache& cache,
              const NsaTokens& tokens, const NsaGroups& groups, const NsaShape& shape,
              int32_t max_context, int32_t num_splits) {
  const int64_t row = int64_t{shape.num_q_heads} * shape.head_dim;
  return ValidShape(shape) && ValidRows(q, q_stride, row) && cache.k_cache != nullptr &&
         cache.v_cache != nullptr && IsAligned(cache.k_cache, 16) && IsAligned(cache.v_cache, 16) &&
         cache.block_tables != nullptr && cache.max_blocks_per_seq >= 1 &&
         cache.max_blocks_per_seq <= (INT_MAX >> 7) && tokens.positions != nullptr &&
         tokens.token_seqs != nullptr && tokens.num_tokens >= 0 && tokens.num_tokens <= INT_MAX &&
         tokens.layer >= 0 && tokens.num_tokens * shape.num_q_heads * 2 <= INT_MAX &&
         groups.num_groups >= 0 && (groups.num_groups == 0 || groups.groups != nullptr) &&
         groups.max_group_size >= 1 && groups.max_group_size <= kNsaMaxGroupSize &&
         max_context >= 1 && ContextBlocks(max_context, shape) <= kMaxContextBlocks &&
         num_splits >= 1 && num_splits <= kMaxSplits;
}

// The mainloop's parameters shared by both variants; `branches` rows per (query, q head).
void FillRun(const __nv_bfloat16* q, int64_t q_stride, const NsaCache& cache,
             const NsaTokens& tokens, const NsaGroups& groups, const NsaShape& shape,
             int32_t num_splits, int branches, NsaRunParams* rp) {
  attention::PrefillParams& p = rp->pre;
  p.q = q;
  p.q_stride = q_stride;
  p.k_cache = cache.k_cache;
  p.v_cache = cache.v_cache;
  p.block_tables = cache.block_tables;
  p.max_blocks_per_seq = cache.max_blocks_per_seq;
  p.num_kv_heads = shape.num_kv_heads;
  p.group = shape.num_q_heads / shape.num_kv_heads;
  p.log2_block_size = Log2(shape.page_size);
  p.scale_log2 = shape.scale * attention::kLog2e;
  rp->num_q_heads = shape.num_q_heads;
  rp->max_q_len = groups.max_group_size;
  rp->num_row_tiles = static_cast<int32_t>(RowTiles(groups.max_group_size, branches, shape));
  rp->num_splits = num_splits;
  rp->positions = tokens.positions;
  rp->token_seqs = tokens.token_seqs;
  rp->groups = groups.groups;
  rp->log2_nsa_block = Log2(shape.block_size);
}

// Shared memory past the K/V stages: the sparse variant's staged list entries.
int StagedBytes(const NsaCompressedParams&) { return 0; }
int StagedBytes(const NsaSparseParams& p) {
  return static_cast<int>(attention::NsaStagedBytes(p.staged_units, p.log2_pages_per_block));
}

// A mainloop launch: the variant's dynamic shared memory is the K/V stages plus its staged keys,
// known at launch, so each instance raises its limit the first time a launch needs more.
template <typename Variant, int kHeadDim, int kWarps>
cudaError_t LaunchMainloop(const typename Variant::Params& params, int64_t num_ctas,
                           cudaStream_t stream) {
  constexpr int kStages = kVerifyStages<kHeadDim>;
  const int smem = attention::VerifySmemBytes<kHeadDim, kStages>() + StagedBytes(params);
  const auto kernel = attention::PagedVerifyKernel<kHeadDim, kWarps, kStages, Variant>;
  static std::atomic<int> allowed{48 * 1024};  // the instance's dynamic shared memory limit so far
  if (smem > allowed.load(std::memory_order_relaxed)) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    int seen = allowed.load(std::memory_order_relaxed);
    while (seen < smem && !allowed.compare_exchange_weak(seen, smem)) {
    }
  }
  return LaunchDependent(kernel, static_cast<unsigned>(num_ctas), kWarps * kWarpSize,
                         static_cast<size_t>(smem), stream, params);
}

// fn(std::integral_constant<int, head_dim>) for head_dim 32, 64 or 128 (ValidShape).
template <typename Fn>
cudaError_t ByHeadDim(int head_dim, Fn&& fn) {
  switch (head_dim) {
    case 32:
      return fn(std::integral_constant<int, 32>());
    case 64:
      return fn(std::integral_constant<int, 64>());
    default:
      return fn(std::integral_constant<int, 128>());
  }
}

// Workspace pieces, in order, each 256-byte aligned.
struct SelectLayout {
  size_t partial_out = 0, partial_lse = 0, logits = 0, total = 0;
};
SelectLayout SelectWorkspace(int64_t num_tokens, int32_t num_splits, int32_t max_context,
                             const NsaShape& s) {
  SelectLayout l;
  const size_t rows = static_cast<size_t>(num_tokens) * s.num_q_heads;
  l.partial_lse = Aligned(rows * num_splits * s.head_dim * sizeof(float));
  l.logits = l.partial_lse + Aligned(rows * num_splits * sizeof(float));
  l.total = l.logits + Aligned(rows * LogitStride(max_context, s) * sizeof(float));
  return l;
}

// log2 of the physical pages a union entry names: B / page_size, or 1 (a block within a page).
int Log2PagesPerBlock(const NsaShape& s) {
  return std::max(0, Log2(s.block_size) - Log2(s.page_size));
}

struct AttendLayout {
  size_t partial_out = 0, partial_lse = 0, blocks = 0, masks = 0, pages = 0, counts = 0, total = 0;
};
AttendLayout AttendWorkspace(int64_t num_tokens, int32_t num_groups, int32_t max_union,
                             int32_t num_splits, const NsaShape& s) {
  AttendLayout l;
  const size_t rows = static_cast<size_t>(num_tokens) * s.num_q_heads * 2;
  const size_t lists = static_cast<size_t>(num_groups) * s.num_kv_heads;
  const size_t entries = lists * max_union;
  l.partial_lse = Aligned(rows * num_splits * s.head_dim * sizeof(float));
  l.blocks = l.partial_lse + Aligned(rows * num_splits * sizeof(float));
  l.masks = l.blocks + Aligned(entries * sizeof(int32_t));
  l.pages = l.masks + Aligned(entries * sizeof(uint32_t));
  l.counts = l.pages + Aligned((entries << Log2PagesPerBlock(s)) * sizeof(int32_t));
  l.total = l.counts + Aligned(lists * sizeof(int32_t));
  return l;
}

// List entries one split of the sparse mainloop reads: its share of the tiles of the largest
// union, plus one entry a tile may straddle into (the kernel's own split of its list is never
// longer: attention_verify.cuh splits a list's tiles evenly).
int32_t StagedUnits(int32_t max_union, int32_t num_splits, int block_n, const NsaShape& s) {
  const int64_t tiles = CeilDiv(int64_t{max_union} * s.block_size, block_n);
  const int64_t per_split = CeilDiv(tiles, num_splits);
  return static_cast<int32_t>(CeilDiv(per_split * block_n, s.block_size) + 1);
}

template <typename T>
T* At(void* workspace, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace) + offset);
}

}  // namespace

int32_t NsaEntriesPerPage(const NsaShape& shape) {
  return shape.block_size <= 0 ? 0 : std::max(1, shape.page_size / shape.block_size);
}

cudaError_t NsaCompress(const NsaCache& cache, const NsaTokens& tokens, const NsaShape& shape,
                        cudaStream_t stream) {
  if (!ValidShape(shape) || cache.k_cache == nullptr || cache.v_cache == nullptr ||
      cache.cmp_k == nullptr || cache.cmp_v == nullptr || cache.block_tables == nullptr ||
      cache.max_blocks_per_seq < 1 || tokens.num_tokens < 0 || tokens.num_tokens > INT_MAX ||
      (tokens.num_tokens > 0 && (tokens.positions == nullptr || tokens.token_seqs == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (tokens.num_tokens == 0) return cudaSuccess;
  return LaunchDependent(nsa::NsaCompressKernel, static_cast<unsigned>(tokens.num_tokens),
                         nsa::kCompressThreads, 0, stream, cache.k_cache, cache.v_cache,
                         cache.block_tables, cache.max_blocks_per_seq, tokens.positions,
                         tokens.token_seqs, shape.num_kv_heads, shape.head_dim, shape.page_size,
                         shape.block_size, NsaEntriesPerPage(shape), cache.cmp_k, cache.cmp_v);
}

size_t NsaSelectWorkspaceBytes(int64_t num_tokens, int32_t num_splits, int32_t max_context,
                               const NsaShape& shape) {
  if (!ValidShape(shape) || num_tokens <= 0 || num_splits < 1) return 0;
  return SelectWorkspace(num_tokens, num_splits, max_context, shape).total;
}

int32_t NsaSelectSplits(int32_t num_groups, int32_t max_group_size, int32_t max_context,
                        int32_t num_sms, const NsaShape& shape) {
  if (!ValidShape(shape) || num_groups < 1 || max_group_size < 1) return 1;
  const int64_t ctas =
      int64_t{num_groups} * shape.num_kv_heads * RowTiles(max_group_size, 1, shape);
  return PlanSplits(ctas, Warps(max_group_size, 1, shape), ContextBlocks(max_context, shape),
                    kMinSelectSplitEntries, num_sms);
}

cudaError_t NsaSelect(const __nv_bfloat16* q, int64_t q_stride, const NsaCache& cache,
                      const NsaTokens& tokens, const NsaGroups& groups, const NsaShape& shape,
                      int32_t max_context, int32_t num_splits, __nv_bfloat16* o_cmp,
                      int64_t o_cmp_stride, int32_t* selections, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream, const NsaLoadCount* count) {
  if (!ValidRun(q, q_stride, cache, tokens, groups, shape, max_context, num_splits) ||
      cache.cmp_k == nullptr || cache.cmp_v == nullptr || !IsAligned(cache.cmp_k, 16) ||
      !IsAligned(cache.cmp_v, 16) ||
      !ValidRows(o_cmp, o_cmp_stride, int64_t{shape.num_q_heads} * shape.head_dim) ||
      selections == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens.num_tokens == 0 || groups.num_groups == 0) return cudaSuccess;
  const SelectLayout layout = SelectWorkspace(tokens.num_tokens, num_splits, max_context, shape);
  if (workspace == nullptr || !IsAligned(workspace, 16) || workspace_bytes < layout.total) {
    return cudaErrorInvalidValue;
  }
  NsaCompressedParams params = {};
  FillRun(q, q_stride, cache, tokens, groups, shape, num_splits, 1, &params);
  params.pre.k_cache = cache.cmp_k;
  params.pre.v_cache = cache.cmp_v;
  params.partial_out = At<float>(workspace, layout.partial_out);
  params.partial_lse = At<float>(workspace, layout.partial_lse);
  params.entries_per_page = NsaEntriesPerPage(shape);
  params.logits = At<float>(workspace, layout.logits);
  params.logit_stride = LogitStride(max_context, shape);
  const int64_t num_ctas =
      int64_t{groups.num_groups} * shape.num_kv_heads * params.num_row_tiles * num_splits;
  if (num_ctas > INT_MAX) return cudaErrorInvalidValue;
  const int warps = Warps(groups.max_group_size, 1, shape);
  const int64_t rows = tokens.num_tokens * shape.num_q_heads;
  cudaError_t err = ByHeadDim(shape.head_dim, [&](auto head_dim_tag) {
    constexpr int kHeadDim = decltype(head_dim_tag)::value;
    using Variant = attention::NsaCompressedVariant;
    cudaError_t e = cudaSuccess;
    if (num_ctas > 0) {
      e = ByWarps<true>(warps, [&](auto warps_tag) {
        return LaunchMainloop<Variant, kHeadDim, decltype(warps_tag)::value>(params, num_ctas,
                                                                             stream);
      });
    }
    if (e != cudaSuccess) return e;
    return attention::LaunchCombine<kHeadDim>(params.partial_out, params.partial_lse, num_splits,
                                              shape.num_q_heads, rows, o_cmp, o_cmp_stride, stream);
  });
  if (err != cudaSuccess) return err;
  const int64_t select_ctas = tokens.num_tokens * shape.num_kv_heads;
  if (select_ctas > INT_MAX) return cudaErrorInvalidValue;
  return LaunchDependent(
      nsa::NsaSelectKernel, static_cast<unsigned>(select_ctas), nsa::kSelectThreads, 0, stream,
      params.logits, params.logit_stride, tokens.positions, tokens.token_seqs, tokens.refresh_every,
      static_cast<int>(tokens.layer), shape.num_q_heads, shape.num_kv_heads, params.log2_nsa_block,
      shape.block_counts, selections, count != nullptr ? count->own_selections : nullptr);
}

int32_t NsaMaxUnionBlocks(int32_t max_group_size, int32_t max_context, const NsaShape& shape) {
  if (!ValidShape(shape) || max_group_size < 1) return 0;
  const int64_t bound = int64_t{max_group_size} * shape.block_counts +
                        (int64_t{shape.window_size} + max_group_size) / shape.block_size + 2;
  return static_cast<int32_t>(std::min(ContextBlocks(max_context, shape), bound));
}

size_t NsaAttendWorkspaceBytes(int64_t num_tokens, int32_t num_groups, int32_t max_group_size,
                               int32_t num_splits, int32_t max_context, const NsaShape& shape) {
  if (!ValidShape(shape) || num_tokens <= 0 || num_groups <= 0 || num_splits < 1) return 0;
  return AttendWorkspace(num_tokens, num_groups,
                         NsaMaxUnionBlocks(max_group_size, max_context, shape), num_splits, shape)
      .total;
}

int32_t NsaAttendSplits(int32_t num_groups, int32_t max_group_size, int32_t max_context,
                        int32_t num_sms, const NsaShape& shape) {
  if (!ValidShape(shape) || num_groups < 1 || max_group_size < 1) return 1;
  const int64_t ctas =
      int64_t{num_groups} * shape.num_kv_heads * RowTiles(max_group_size, 2, shape);
  const int64_t keys =
      int64_t{NsaMaxUnionBlocks(max_group_size, max_context, shape)} * shape.block_size;
  return PlanSplits(ctas, Warps(max_group_size, 2, shape), keys, kMinAttendSplitKeys, num_sms);
}

cudaError_t NsaAttend(const __nv_bfloat16* q, int64_t q_stride, const NsaCache& cache,
                      const NsaTokens& tokens, const NsaGroups& groups, const int32_t* selections,
                      bool shared_selection, const __nv_bfloat16* o_cmp, int64_t o_cmp_stride,
                      const __nv_bfloat16* gate_logits, int64_t gate_stride, const NsaShape& shape,
                      int32_t max_context, int32_t num_splits, __nv_bfloat16* out,
                      int64_t out_stride, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream, const NsaLoadCount* count) {
  const int64_t row = int64_t{shape.num_q_heads} * shape.head_dim;
  if (!ValidRun(q, q_stride, cache, tokens, groups, shape, max_context, num_splits) ||
      selections == nullptr || !ValidRows(o_cmp, o_cmp_stride, row) ||
      !ValidRows(out, out_stride, row) || gate_logits == nullptr ||
      gate_stride < 3 * int64_t{shape.num_q_heads} ||
      (count != nullptr && (count->own_selections == nullptr) != (count->counters == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (tokens.num_tokens == 0 || groups.num_groups == 0) return cudaSuccess;
  const int32_t max_union = NsaMaxUnionBlocks(groups.max_group_size, max_context, shape);
  const AttendLayout layout =
      AttendWorkspace(tokens.num_tokens, groups.num_groups, max_union, num_splits, shape);
  if (workspace == nullptr || !IsAligned(workspace, 16) || workspace_bytes < layout.total) {
    return cudaErrorInvalidValue;
  }
  NsaSparseParams params = {};
  FillRun(q, q_stride, cache, tokens, groups, shape, num_splits, 2, &params);
  params.partial_out = At<float>(workspace, layout.partial_out);
  params.partial_lse = At<float>(workspace, layout.partial_lse);
  int32_t* union_blocks = At<int32_t>(workspace, layout.blocks);
  uint32_t* union_masks = At<uint32_t>(workspace, layout.masks);
  int32_t* union_pages = At<int32_t>(workspace, layout.pages);
  int32_t* union_counts = At<int32_t>(workspace, layout.counts);
  params.union_blocks = union_blocks;
  params.union_masks = union_masks;
  params.union_pages = union_pages;
  params.union_counts = union_counts;
  params.max_union = max_union;
  params.window_size = shape.window_size;
  params.log2_pages_per_block = Log2PagesPerBlock(shape);
  const int64_t lists = int64_t{groups.num_groups} * shape.num_kv_heads;
  const int64_t num_ctas = lists * params.num_row_tiles * num_splits;
  if (num_ctas > INT_MAX) return cudaErrorInvalidValue;
  if (lists > 0) {
    const int64_t max_blocks = ContextBlocks(max_context, shape);
    const cudaError_t err = LaunchDependent(
        nsa::NsaUnionKernel, static_cast<unsigned>(lists), nsa::kUnionThreads,
        max_blocks * sizeof(uint32_t), stream, groups.groups, groups.max_group_size,
        tokens.positions, tokens.token_seqs, selections, shared_selection, groups.flags,
        cache.block_tables, cache.max_blocks_per_seq, params.pre.log2_block_size,
        params.log2_pages_per_block, shape.num_kv_heads, params.log2_nsa_block, shape.block_counts,
        shape.window_size, static_cast<int>(max_blocks), max_union, union_blocks, union_masks,
        union_pages, union_counts, count != nullptr ? count->own_selections : nullptr,
        count != nullptr ? count->counters : nullptr);
    if (err != cudaSuccess) return err;
  }
  const int warps = Warps(groups.max_group_size, 2, shape);
  const int64_t rows = tokens.num_tokens * shape.num_q_heads;
  const unsigned combine_ctas = static_cast<unsigned>(CeilDiv(rows, nsa::kCombineWarps));
  return ByHeadDim(shape.head_dim, [&](auto head_dim_tag) {
    constexpr int kHeadDim = decltype(head_dim_tag)::value;
    using Variant = attention::NsaSparseVariant;
    NsaSparseParams staged = params;
    staged.staged_units =
        StagedUnits(max_union, num_splits, attention::PrefillConfig<kHeadDim>::kBlockN, shape);
    cudaError_t e = cudaSuccess;
    if (num_ctas > 0) {
      e = ByWarps<false>(warps, [&](auto warps_tag) {
        return LaunchMainloop<Variant, kHeadDim, decltype(warps_tag)::value>(staged, num_ctas,
                                                                             stream);
      });
    }
    if (e != cudaSuccess) return e;
    return LaunchDependent(nsa::NsaCombineGateKernel<kHeadDim>, combine_ctas,
                           nsa::kCombineWarps * kWarpSize, 0, stream, params.partial_out,
                           params.partial_lse, num_splits, shape.num_q_heads, tokens.num_tokens,
                           tokens.token_seqs, o_cmp, o_cmp_stride, gate_logits, gate_stride, out,
                           out_stride);
  });
}

}  // namespace specd::kernels
