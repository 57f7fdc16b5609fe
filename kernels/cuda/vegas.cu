// Vegas launchers (layer 2): validate, fill the variant parameters, pick the template instance,
// launch, report the error. Kernels: vegas_attention.cuh (variants of the verification kernel),
// vegas_select.cuh, vegas_weights.cuh. The verification tiling (stages, warps, row tiles) and the
// combine launch follow attention.cu's choices for PagedVerifyAttention, so a variant runs the grid
// the dense kernel runs.
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/vegas.h"
#include "kernels/cuda/vegas_attention.cuh"
#include "kernels/cuda/vegas_decode.cuh"
#include "kernels/cuda/vegas_select.cuh"
#include "kernels/cuda/vegas_weights.cuh"

namespace specd::kernels {
namespace {

using attention::VerifyParams;

// As attention.cu: PagedVerifyKernel's ring depth per head_dim, and the partial rows' alignment.
template <int kHeadDim>
constexpr int kVerifyStages = kHeadDim == 128 ? 2 : 3;
constexpr size_t kWorkspaceAlign = 256;

int Log2(int32_t x) {
  int n = 0;
  while ((1 << n) < x) ++n;
  return n;
}

// attention.cu's VerifyShape: the verification kernel's shapes (head_dim 16 to 128).
bool VerifyShape(const AttentionShape& s) {
  return s.num_q_heads > 0 && s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0 &&
         (s.head_dim == 16 || s.head_dim == 32 || s.head_dim == 64 || s.head_dim == 128) &&
         (s.block_size == 16 || s.block_size == 32 || s.block_size == 64) &&
         s.sliding_window >= 0 && std::isfinite(s.scale) && s.num_q_heads <= 65535;
}

bool ValidRows(const void* p, int64_t stride, int64_t row_elems) {
  return p != nullptr && IsAligned(p, 16) && stride % kBf16PerVec16 == 0 && stride >= row_elems;
}

int VerifyWarps(int32_t max_q_len, const AttentionShape& s) {
  return static_cast<int64_t>(max_q_len) * (s.num_q_heads / s.num_kv_heads) <= 16 ? 1 : 2;
}

// Checks PagedVerifyAttention's arguments and fills its parameters (grid size in *num_ctas);
// false for an invalid argument.
bool VerifyArgs(const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
                const __nv_bfloat16* v_cache, const int32_t* block_tables,
                int32_t max_blocks_per_seq, const int32_t* cu_q_lens, const int32_t* seq_lens,
                int32_t num_seqs, int64_t num_tokens, int32_t max_q_len, int32_t num_splits,
                const AttentionShape& shape, __nv_bfloat16* out, int64_t out_stride,
                void* workspace, size_t workspace_bytes, VerifyParams* vp, int64_t* num_ctas) {
  const int64_t row = static_cast<int64_t>(shape.num_q_heads) * shape.head_dim;
  if (!VerifyShape(shape) || num_seqs < 0 || num_seqs > 65535 || num_tokens < 0 ||
      num_tokens > INT_MAX || max_q_len < 0 || max_q_len > kMaxVerifyQueryLen || num_splits < 1 ||
      num_splits > attention::kMaxDecodeSplits || !ValidRows(q, q_stride, row) ||
      !ValidRows(out, out_stride, row) || k_cache == nullptr || v_cache == nullptr ||
      !IsAligned(k_cache, 16) || !IsAligned(v_cache, 16) || block_tables == nullptr ||
      cu_q_lens == nullptr || seq_lens == nullptr || max_blocks_per_seq < 1 ||
      max_blocks_per_seq > (INT_MAX >> 6)) {
    return false;
  }
  const int64_t rows = static_cast<int64_t>(max_q_len) * (shape.num_q_heads / shape.num_kv_heads);
  const int64_t row_tiles = CeilDiv(rows, 16 * VerifyWarps(max_q_len, shape));
  *num_ctas = static_cast<int64_t>(num_seqs) * shape.num_kv_heads * row_tiles * num_splits;
  if (*num_ctas > INT_MAX || num_tokens * shape.num_q_heads > INT_MAX) return false;
  *vp = {};
  attention::PrefillParams& p = vp->pre;
  p.q = q;
  p.q_stride = q_stride;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = block_tables;
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.cu_q_lens = cu_q_lens;
  p.seq_lens = seq_lens;
  p.num_kv_heads = shape.num_kv_heads;
  p.group = shape.num_q_heads / shape.num_kv_heads;
  p.log2_block_size = Log2(shape.block_size);
  p.sliding_window = shape.sliding_window;
  p.scale_log2 = shape.scale * attention::kLog2e;
  p.out = out;
  p.out_stride = out_stride;
  vp->num_q_heads = shape.num_q_heads;
  vp->max_q_len = max_q_len;
  vp->num_row_tiles = static_cast<int32_t>(row_tiles);
  vp->num_splits = num_splits;
  if (num_splits > 1) {
    if (workspace == nullptr || !IsAligned(workspace, 16) ||
        workspace_bytes < PagedVerifyWorkspaceBytes(num_tokens, num_splits, shape)) {
      return false;
    }
    size_t partial_bytes =
        static_cast<size_t>(num_tokens) * shape.num_q_heads * num_splits * shape.head_dim * 4;
    partial_bytes = (partial_bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    vp->partial_out = static_cast<float*>(workspace);
    vp->partial_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) + partial_bytes);
  }
  return true;
}

// The merge of the splits (attention_combine.cuh).
template <int kHeadDim>
cudaError_t LaunchCombine(const VerifyParams& vp, int64_t num_tokens, cudaStream_t stream) {
  return attention::LaunchCombine<kHeadDim>(vp.partial_out, vp.partial_lse, vp.num_splits,
                                            vp.num_q_heads, num_tokens * vp.num_q_heads, vp.pre.out,
                                            vp.pre.out_stride, stream);
}

template <typename Variant, int kHeadDim, int kWarps>
cudaError_t LaunchVariant(const typename Variant::Params& params, int64_t num_ctas,
                          int64_t num_tokens, cudaStream_t stream) {
  constexpr int kSmem = attention::VerifySmemBytes<kHeadDim, kVerifyStages<kHeadDim>>();
  const auto kernel =
      attention::PagedVerifyKernel<kHeadDim, kWarps, kVerifyStages<kHeadDim>, Variant>;
  if constexpr (kSmem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<static_cast<unsigned>(num_ctas), kWarps * kWarpSize, kSmem, stream>>>(params);
  const cudaError_t err = cudaGetLastError();
  const VerifyParams& vp = params;
  if (err != cudaSuccess || vp.num_splits == 1) return err;
  return LaunchCombine<kHeadDim>(vp, num_tokens, stream);
}

template <typename Variant>
cudaError_t DispatchVariant(const typename Variant::Params& params, int head_dim, int warps,
                            int64_t num_ctas, int64_t num_tokens, cudaStream_t stream) {
  auto launch = [&](auto head_dim_tag) {
    constexpr int kHeadDim = decltype(head_dim_tag)::value;
    return warps == 1 ? LaunchVariant<Variant, kHeadDim, 1>(params, num_ctas, num_tokens, stream)
                      : LaunchVariant<Variant, kHeadDim, 2>(params, num_ctas, num_tokens, stream);
  };
  switch (head_dim) {
    case 16:
      return launch(std::integral_constant<int, 16>());
    case 32:
      return launch(std::integral_constant<int, 32>());
    case 64:
      return launch(std::integral_constant<int, 64>());
    default:  // 128 (VerifyShape)
      return launch(std::integral_constant<int, 128>());
  }
}

}  // namespace

cudaError_t PagedVerifyAttentionWithScores(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* cu_q_lens, const int32_t* seq_lens, int32_t num_seqs, int64_t num_tokens,
    int32_t max_q_len, int32_t num_splits, const AttentionShape& shape, __nv_bfloat16* out,
    int64_t out_stride, __half* logits, float* stats, int64_t score_stride, void* workspace,
    size_t workspace_bytes, cudaStream_t stream) {
  attention::VegasScoreParams params = {};
  int64_t num_ctas = 0;
  if (!VerifyArgs(q, q_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_q_lens,
                  seq_lens, num_seqs, num_tokens, max_q_len, num_splits, shape, out, out_stride,
                  workspace, workspace_bytes, static_cast<VerifyParams*>(&params), &num_ctas) ||
      shape.sliding_window != 0 || shape.num_q_heads / shape.num_kv_heads > 16 ||
      num_splits > kVegasScoreSplits || logits == nullptr || !IsAligned(logits, 4) ||
      stats == nullptr || !IsAligned(stats, 8) || score_stride < 0 || score_stride % 2 != 0) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0 || num_tokens == 0 || max_q_len == 0) return cudaSuccess;
  params.logits = logits;
  params.stats = stats;
  params.score_stride = score_stride;
  return DispatchVariant<attention::VegasScoreVariant>(
      params, shape.head_dim, VerifyWarps(max_q_len, shape), num_ctas, num_tokens, stream);
}

int32_t VegasScoreParts(const AttentionShape& shape) {
  return shape.num_kv_heads <= 0 || shape.num_q_heads <= 0 ? 0 : shape.num_q_heads;
}

size_t VegasSelectWorkspaceBytes(int32_t num_pairs, int64_t score_stride) {
  if (num_pairs <= 0 || score_stride <= 0) return 0;
  return static_cast<size_t>(num_pairs) * CeilDiv(score_stride, vegas::kSelectItems) *
         vegas::kSelectItems * sizeof(float);
}

cudaError_t VegasSelectTopK(const float* scores, int32_t num_parts, int64_t score_stride,
                            const int32_t* lengths, int32_t num_seqs, int32_t num_pairs,
                            const VegasBudget& budget, int32_t* indices, int64_t index_stride,
                            int32_t* counts, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream, const int32_t* out_rows,
                            int64_t out_rows_per_layer) {
  if (num_pairs < 0 || num_pairs > 65535 || num_parts < 1 || score_stride < 0 ||
      (out_rows != nullptr && out_rows_per_layer < 1) || score_stride > INT_MAX ||
      !(budget.ratio >= 0.0 && budget.ratio <= 1.0) || budget.min_tokens < 0 ||
      budget.max_tokens < budget.min_tokens || budget.max_tokens > index_stride || num_seqs < 1) {
    return cudaErrorInvalidValue;
  }
  if (num_pairs == 0) return cudaSuccess;
  if (scores == nullptr || lengths == nullptr || indices == nullptr || counts == nullptr ||
      (score_stride > 0 &&
       (workspace == nullptr || !IsAligned(workspace, 16) ||
        workspace_bytes < VegasSelectWorkspaceBytes(num_pairs, score_stride)))) {
    return cudaErrorInvalidValue;
  }
  const int64_t combined_stride = CeilDiv(score_stride, vegas::kSelectItems) * vegas::kSelectItems;
  float* combined = static_cast<float*>(workspace);
  if (score_stride > 0) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(score_stride, vegas::kCombineThreads)),
                    static_cast<unsigned>(num_pairs));
    vegas::VegasCombineScoresKernel<<<grid, vegas::kCombineThreads, 0, stream>>>(
        scores, num_parts, score_stride, lengths, num_seqs, combined, combined_stride);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  vegas::VegasSelectKernel<<<static_cast<unsigned>(num_pairs), vegas::kSelectThreads, 0, stream>>>(
      combined, combined_stride, lengths, num_seqs, score_stride, budget.ratio, budget.min_tokens,
      budget.max_tokens, indices, index_stride, counts, out_rows, out_rows_per_layer);
  return cudaGetLastError();
}

cudaError_t VegasPrefixWeights(const __half* logits, const float* stats, int32_t num_heads,
                               int64_t score_stride, const int32_t* lengths, int32_t num_seqs,
                               int32_t num_pairs, float* weights, cudaStream_t stream) {
  if (logits == nullptr || !IsAligned(logits, 8) || stats == nullptr || !IsAligned(stats, 8) ||
      lengths == nullptr || weights == nullptr || !IsAligned(weights, 16) || num_heads < 1 ||
      num_heads > kVegasMaxWeightHeads || num_seqs < 1 || num_pairs < 0 || num_pairs > 65535 ||
      score_stride < 0 || score_stride > INT_MAX || score_stride % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  if (num_pairs == 0 || score_stride == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(CeilDiv(score_stride, vegas::kWeightsTokens)), 2,
                  static_cast<unsigned>(num_pairs));
  vegas::VegasPrefixWeightsKernel<<<grid, vegas::kWeightsThreads, 0, stream>>>(
      logits, stats, num_heads, score_stride, lengths, num_seqs, weights);
  return cudaGetLastError();
}

cudaError_t PagedSparseAttention(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* cu_q_lens, const int32_t* seq_lens, const int32_t* token_indices,
    int64_t index_stride, const int32_t* index_counts, const int32_t* recent_starts,
    int32_t num_seqs, int64_t num_tokens, int32_t max_q_len, int32_t num_splits,
    const AttentionShape& shape, __nv_bfloat16* out, int64_t out_stride, void* workspace,
    size_t workspace_bytes, cudaStream_t stream, const int32_t* index_rows) {
  attention::VegasSparseParams params = {};
  int64_t num_ctas = 0;
  if (!VerifyArgs(q, q_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_q_lens,
                  seq_lens, num_seqs, num_tokens, max_q_len, num_splits, shape, out, out_stride,
                  workspace, workspace_bytes, static_cast<VerifyParams*>(&params), &num_ctas) ||
      shape.sliding_window != 0 || token_indices == nullptr || index_counts == nullptr ||
      recent_starts == nullptr || index_stride < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0 || num_tokens == 0 || max_q_len == 0) return cudaSuccess;
  params.token_indices = token_indices;
  params.index_stride = index_stride;
  params.index_counts = index_counts;
  params.recent_starts = recent_starts;
  params.index_rows = index_rows;
  return DispatchVariant<attention::VegasSparseVariant>(
      params, shape.head_dim, VerifyWarps(max_q_len, shape), num_ctas, num_tokens, stream);
}

namespace {

// attention.cu's decode CTA shape: q heads per CTA (8 or 16) and the parts of a kv head's group.
int SparseDecodeRows(const AttentionShape& s) {
  return s.num_q_heads / s.num_kv_heads <= 8 ? 8 : 16;
}

template <int kHeadDim, int kRows>
cudaError_t LaunchSparseDecode(const attention::DecodeParams& p,
                               const attention::SparseDecodeKeys& keys, int64_t num_ctas,
                               cudaStream_t stream) {
  using Cfg = attention::DecodeConfig<kHeadDim, kRows>;
  return LaunchDependent(attention::PagedSparseDecodeKernel<kHeadDim, kRows>,
                         static_cast<unsigned>(num_ctas), Cfg::kThreads, 0, stream, p, keys);
}

template <int kHeadDim>
cudaError_t LaunchSparseDecodeAndCombine(const attention::DecodeParams& p,
                                         const attention::SparseDecodeKeys& keys, int64_t num_seqs,
                                         int rows, cudaStream_t stream) {
  const int64_t num_ctas = num_seqs * p.num_kv_heads * p.num_parts * int64_t{p.num_splits};
  const cudaError_t err = rows == 16 ? LaunchSparseDecode<kHeadDim, 16>(p, keys, num_ctas, stream)
                                     : LaunchSparseDecode<kHeadDim, 8>(p, keys, num_ctas, stream);
  if (err != cudaSuccess || p.num_splits == 1) return err;
  return attention::LaunchCombine<kHeadDim>(p.partial_out, p.partial_lse, p.num_splits,
                                            p.num_q_heads, num_seqs * p.num_q_heads, p.out,
                                            p.out_stride, stream);
}

}  // namespace

cudaError_t PagedSparseDecodeAttention(
    const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
    const __nv_bfloat16* v_cache, const int32_t* block_tables, int32_t max_blocks_per_seq,
    const int32_t* seq_lens, const int32_t* token_indices, int64_t index_stride,
    const int32_t* index_counts, const int32_t* recent_starts, const int32_t* index_rows,
    int32_t num_seqs, int32_t num_splits, const AttentionShape& shape, __nv_bfloat16* out,
    int64_t out_stride, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int64_t row = static_cast<int64_t>(shape.num_q_heads) * shape.head_dim;
  if (!VerifyShape(shape) || shape.sliding_window != 0 || num_seqs < 0 || num_splits < 1 ||
      num_splits > attention::kMaxDecodeSplits || !ValidRows(q, q_stride, row) ||
      !ValidRows(out, out_stride, row) || k_cache == nullptr || v_cache == nullptr ||
      !IsAligned(k_cache, 16) || !IsAligned(v_cache, 16) || block_tables == nullptr ||
      seq_lens == nullptr || max_blocks_per_seq < 1 || max_blocks_per_seq > (INT_MAX >> 6) ||
      token_indices == nullptr || index_counts == nullptr || recent_starts == nullptr ||
      index_stride < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0) return cudaSuccess;
  const int rows = SparseDecodeRows(shape);
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const int parts = static_cast<int>(CeilDiv(group, rows));
  if (static_cast<int64_t>(num_seqs) * shape.num_kv_heads * parts * num_splits > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  attention::DecodeParams p = {};
  p.q = q;
  p.q_stride = q_stride;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = block_tables;
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.seq_lens = seq_lens;
  p.num_q_heads = shape.num_q_heads;
  p.num_kv_heads = shape.num_kv_heads;
  p.group = group;
  p.num_parts = parts;
  p.log2_block_size = Log2(shape.block_size);
  p.sliding_window = 0;
  p.num_splits = num_splits;
  p.scale_log2 = shape.scale * attention::kLog2e;
  p.out = out;
  p.out_stride = out_stride;
  if (num_splits > 1) {  // PagedDecodeAttention's workspace layout
    if (workspace == nullptr || !IsAligned(workspace, 16) ||
        workspace_bytes < PagedDecodeWorkspaceBytes(num_seqs, num_splits, shape)) {
      return cudaErrorInvalidValue;
    }
    size_t partial_bytes =
        static_cast<size_t>(num_seqs) * shape.num_q_heads * num_splits * shape.head_dim * 4;
    partial_bytes = (partial_bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    p.partial_out = static_cast<float*>(workspace);
    p.partial_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) + partial_bytes);
  }
  const attention::SparseDecodeKeys keys{token_indices, index_stride, index_counts, recent_starts,
                                         index_rows};
  switch (shape.head_dim) {
    case 16:
      return LaunchSparseDecodeAndCombine<16>(p, keys, num_seqs, rows, stream);
    case 32:
      return LaunchSparseDecodeAndCombine<32>(p, keys, num_seqs, rows, stream);
    case 64:
      return LaunchSparseDecodeAndCombine<64>(p, keys, num_seqs, rows, stream);
    default:
      return LaunchSparseDecodeAndCombine<128>(p, keys, num_seqs, rows, stream);
  }
}

}  // namespace specd::kernels
