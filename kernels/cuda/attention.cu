// Paged attention launchers (layer 2): validate what the kernels cannot run, pick the template
// instance, size the grid, launch, report the error. Kernel templates in attention.cuh.
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention.h"

namespace specd::kernels {
namespace {

using attention::DecodeConfig;
using attention::DecodeParams;
using attention::PrefillConfig;
using attention::PrefillParams;
using attention::PrefillTreeParams;
using attention::TreeMaskParams;
using attention::TreeVerifyParams;
using attention::VerifyParams;

using attention::kMaxDecodeSplits;
// PagedDecodePipeKernel's ring depth and the CTAs per SM its registers and shared memory allow
// (3 x 64 KiB of ring, which is also the warps' merge scratch, of the 227 KiB).
constexpr int kDecodePipeStages = 2;
constexpr int kDecodePipeCtasPerSm = 3;
// A split covers at least this many tokens: one 16-token tile per warp of the CTA.
constexpr int64_t kMinSplitTokens = 64;
// PagedVerifyKernel's ring depth (2 x 16 KiB of K and V tiles at head_dim 128), the CTAs per SM
// its grid is sized for (4 x 32 KiB of the 227 KiB; 4 x 48 KiB at 3 stages), the most splits (the
// quarter-row combine's limit; past it the combine is slower), and the fewest tokens per split: a
// split writes an fp32 row per (query, q head) -- 16 KiB for 32 rows at head_dim 128 -- so splits
// stay long enough that those stay small next to the 128 KiB of K and V a split of 256 tokens
// reads. H100, Llama-3.1-8B shapes, 8 queries over 32K, batch 1, with the combine (scratch probes,
// 2026-11-24): 2 stages at 64 / 56 / 49 splits 58.2-58.3 / 58.5-59.1 / 59.3-59.8 us; 3 stages
// 59.2-59.4 / 60.5-60.8 / 59.7-59.9 us; 4 stages (the depth before this session) at 49 / 33
// splits 61.1-61.2 / 62.5-63.6 us.
// (3 stages below head_dim 128: with 2, ptxas spills in the head_dim 64 variants.)
template <int kHeadDim>
constexpr int kVerifyStages = kHeadDim == 128 ? 2 : 3;
constexpr int kVerifyCtasPerSm = 4;
constexpr int32_t kMaxVerifySplits = attention::kCombineFewMaxSplits;
constexpr int64_t kMinVerifySplitTokens = 256;
// Row alignment of the workspace's log-sum-exp array.
constexpr size_t kWorkspaceAlign = 256;

int Log2(int32_t x) {
  int n = 0;
  while ((1 << n) < x) ++n;
  return n;
}

bool ValidShape(const AttentionShape& s) {
  return s.num_q_heads > 0 && s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0 &&
         (s.head_dim == 16 || s.head_dim == 32 || s.head_dim == 64 || s.head_dim == 128 ||
          s.head_dim == 256) &&
         (s.block_size == 16 || s.block_size == 32 || s.block_size == 64) &&
         s.sliding_window >= 0 && std::isfinite(s.scale);
}

// q heads per decode CTA (8 or 16) and the number of CTAs one kv head's group needs.
int DecodeRows(const AttentionShape& s) { return s.num_q_heads / s.num_kv_heads <= 8 ? 8 : 16; }
int DecodeParts(const AttentionShape& s) {
  const int group = s.num_q_heads / s.num_kv_heads;
  return static_cast<int>(CeilDiv(group, DecodeRows(s)));
}

template <int kHeadDim>
int DecodeMinCtasPerSm(int rows) {
  return rows == 8 ? DecodeConfig<kHeadDim, 8>::kMinCtasPerSm
                   : DecodeConfig<kHeadDim, 16>::kMinCtasPerSm;
}

// Whether PagedDecodePipeKernel runs the shape (see its comment in attention.cuh): head_dim 128,
// up to 8 q heads per kv head -- the shapes it was measured on; elsewhere PagedDecodeKernel.
bool DecodePipelined(int head_dim, int rows) { return head_dim == 128 && rows == 8; }

int DecodeMinCtasPerSm(const AttentionShape& s) {
  const int rows = DecodeRows(s);
  if (DecodePipelined(s.head_dim, rows)) return kDecodePipeCtasPerSm;
  return s.head_dim == 16    ? DecodeMinCtasPerSm<16>(rows)
         : s.head_dim == 32  ? DecodeMinCtasPerSm<32>(rows)
         : s.head_dim == 64  ? DecodeMinCtasPerSm<64>(rows)
         : s.head_dim == 128 ? DecodeMinCtasPerSm<128>(rows)
                             : DecodeMinCtasPerSm<256>(rows);
}

// 16-byte vector access: aligned pointer, row stride a whole number of vectors, rows at least
// as wide as the heads they hold.
bool ValidRows(const void* p, int64_t stride, int64_t row_elems) {
  return p != nullptr && IsAligned(p, 16) && stride % kBf16PerVec16 == 0 && stride >= row_elems;
}

size_t PartialOutBytes(int64_t num_seqs, int32_t num_splits, const AttentionShape& s) {
  const size_t bytes =
      static_cast<size_t>(num_seqs) * s.num_q_heads * num_splits * s.head_dim * sizeof(float);
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

template <int kHeadDim, int kRows>
cudaError_t LaunchDecode(const DecodeParams& params, int64_t num_ctas, cudaStream_t stream) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  return LaunchDependent(attention::PagedDecodeKernel<kHeadDim, kRows>,
                         static_cast<unsigned>(num_ctas), Cfg::kThreads, 0, stream, params);
}

template <int kHeadDim, int kRows>
cudaError_t LaunchDecodePipe(const DecodeParams& params, int64_t num_ctas, cudaStream_t stream) {
  using Cfg = DecodeConfig<kHeadDim, kRows>;
  constexpr int kSmem = attention::DecodePipeSmemBytes<kHeadDim, kRows, kDecodePipeStages>();
  const auto kernel =
      attention::PagedDecodePipeKernel<kHeadDim, kRows, kDecodePipeStages, kDecodePipeCtasPerSm>;
  // The ring is over the 48 KiB default. Set on every launch (cheap, host only): the attribute
  // belongs to the current device, and decode steps replay from graphs anyway.
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  return LaunchDependent(kernel, static_cast<unsigned>(num_ctas), Cfg::kThreads, kSmem, stream,
                         params);
}

template <int kHeadDim>
cudaError_t LaunchDecodeAndCombine(const DecodeParams& params, int64_t num_seqs, int kRows,
                                   cudaStream_t stream) {
  const int64_t num_ctas =
      num_seqs * params.num_kv_heads * params.num_parts * static_cast<int64_t>(params.num_splits);
  // The kernel DecodePipelined names for the shape (kRows: 8 or 16, from DecodeRows).
  cudaError_t err;
  if (kRows == 16) {
    err = LaunchDecode<kHeadDim, 16>(params, num_ctas, stream);
  } else if constexpr (kHeadDim == 128) {
    err = LaunchDecodePipe<kHeadDim, 8>(params, num_ctas, stream);
  } else {
    err = LaunchDecode<kHeadDim, 8>(params, num_ctas, stream);
  }
  if (err != cudaSuccess || params.num_splits == 1) return err;
  return attention::LaunchCombine<kHeadDim>(
      params.partial_out, params.partial_lse, params.num_splits, params.num_q_heads,
      num_seqs * params.num_q_heads, params.out, params.out_stride, stream);
}

// Warps per verification CTA (16 rows each) for runs of max_q_len queries, and the row tiles.
// At most two: the four-warp variants spill registers (ptxas), so more rows take more row tiles.
int VerifyWarps(int32_t max_q_len, const AttentionShape& s) {
  const int64_t rows = static_cast<int64_t>(max_q_len) * (s.num_q_heads / s.num_kv_heads);
  return rows <= 16 ? 1 : 2;
}

// Whether the verification kernel runs the shape: head_dim up to 128 (its head_dim 256 variants
// spill registers; the prefill kernel serves those).
bool VerifyShape(const AttentionShape& s) { return ValidShape(s) && s.head_dim <= 128; }
int64_t VerifyRowTiles(int32_t max_q_len, const AttentionShape& s) {
  const int64_t rows = static_cast<int64_t>(max_q_len) * (s.num_q_heads / s.num_kv_heads);
  return CeilDiv(rows, 16 * VerifyWarps(max_q_len, s));
}

// The current device's multiprocessor count; 0 if it cannot be read.
int CurrentDeviceSms() {
  int device = 0, num_sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return num_sms;
}

template <int kHeadDim, int kWarps, typename Variant>
cudaError_t LaunchVerifyAndCombine(const typename Variant::Params& params, int64_t num_ctas,
                                   int64_t num_tokens, cudaStream_t stream) {
  constexpr int kSmem = attention::VerifySmemBytes<kHeadDim, kVerifyStages<kHeadDim>>();
  const auto kernel =
      attention::PagedVerifyKernel<kHeadDim, kWarps, kVerifyStages<kHeadDim>, Variant>;
  if constexpr (kSmem > 48 * 1024) {
    // Over the 48 KiB default; set on every launch (cheap, host only: the attribute belongs to
    // the current device).
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<static_cast<unsigned>(num_ctas), kWarps * kWarpSize, kSmem, stream>>>(params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || params.num_splits == 1) return err;
  return attention::LaunchCombine<kHeadDim>(
      params.partial_out, params.partial_lse, params.num_splits, params.num_q_heads,
      num_tokens * params.num_q_heads, params.pre.out, params.pre.out_stride, stream);
}

template <typename Variant, int kHeadDim>
cudaError_t LaunchVerify(const typename Variant::Params& params, int warps, int64_t num_ctas,
                         int64_t num_tokens, cudaStream_t stream) {
  if (warps == 1) {
    return LaunchVerifyAndCombine<kHeadDim, 1, Variant>(params, num_ctas, num_tokens, stream);
  }
  return LaunchVerifyAndCombine<kHeadDim, 2, Variant>(params, num_ctas, num_tokens, stream);
}

// The verification kernel of `Variant` (dense or tree) for the shape's head_dim (VerifyShape).
template <typename Variant>
cudaError_t DispatchVerify(const typename Variant::Params& params, int head_dim, int warps,
                           int64_t num_ctas, int64_t num_tokens, cudaStream_t stream) {
  switch (head_dim) {
    case 16:
      return LaunchVerify<Variant, 16>(params, warps, num_ctas, num_tokens, stream);
    case 32:
      return LaunchVerify<Variant, 32>(params, warps, num_ctas, num_tokens, stream);
    case 64:
      return LaunchVerify<Variant, 64>(params, warps, num_ctas, num_tokens, stream);
    default:  // 128 (VerifyShape)
      return LaunchVerify<Variant, 128>(params, warps, num_ctas, num_tokens, stream);
  }
}

// Checks a tree mask argument (null: none) and fills its kernel fields; false for an invalid
// one.
bool TreeArgs(const AttentionTreeMask* tree, const AttentionShape& shape, TreeMaskParams* params) {
  if (tree == nullptr) return true;
  if (tree->tree_starts == nullptr || tree->masks == nullptr || !IsAligned(tree->masks, 8) ||
      tree->mask_words < 1 || tree->mask_words > kMaxTreeMaskWords || shape.sliding_window > 0) {
    return false;
  }
  params->tree_starts = tree->tree_starts;
  params->masks = tree->masks;
  params->mask_words = tree->mask_words;
  return true;
}

// Checks PagedPrefillAttention's arguments (shared by PagedVerifyAttention) and fills the
// prefill parameters; false for an invalid argument.
bool PrefillArgs(const __nv_bfloat16* q, int64_t q_stride, const __nv_bfloat16* k_cache,
                 const __nv_bfloat16* v_cache, const int32_t* block_tables,
                 int32_t max_blocks_per_seq, const int32_t* cu_q_lens, const int32_t* seq_lens,
                 const AttentionShape& shape, __nv_bfloat16* out, int64_t out_stride,
                 PrefillParams* params) {
  const int64_t row = static_cast<int64_t>(shape.num_q_heads) * shape.head_dim;
  if (!ValidRows(q, q_stride, row) || !ValidRows(out, out_stride, row) || !IsAligned(k_cache, 16) ||
      !IsAligned(v_cache, 16) || k_cache == nullptr || v_cache == nullptr ||
      block_tables == nullptr || cu_q_lens == nullptr || seq_lens == nullptr ||
      max_blocks_per_seq < 1 || max_blocks_per_seq > (INT_MAX >> 6)) {
    return false;
  }
  *params = {};
  params->q = q;
  params->q_stride = q_stride;
  params->k_cache = k_cache;
  params->v_cache = v_cache;
  params->block_tables = block_tables;
  params->max_blocks_per_seq = max_blocks_per_seq;
  params->cu_q_lens = cu_q_lens;
  params->seq_lens = seq_lens;
  params->num_kv_heads = shape.num_kv_heads;
  params->group = shape.num_q_heads / shape.num_kv_heads;
  params->log2_block_size = Log2(shape.block_size);
  params->sliding_window = shape.sliding_window;
  params->scale_log2 = shape.scale * attention::kLog2e;
  params->out = out;
  params->out_stride = out_stride;
  return true;
}

template <int kHeadDim, bool kTreeMask>
cudaError_t LaunchPrefill(const attention::PrefillKernelParams<kTreeMask>& params,
                          int32_t max_q_len, int32_t num_q_heads, int32_t num_seqs,
                          cudaStream_t stream) {
  using Cfg = PrefillConfig<kHeadDim>;
  const dim3 grid(static_cast<unsigned>(CeilDiv(max_q_len, Cfg::kBlockM)),
                  static_cast<unsigned>(num_q_heads), static_cast<unsigned>(num_seqs));
  attention::PagedPrefillKernel<kHeadDim, kTreeMask><<<grid, Cfg::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

// The prefill kernel (dense or tree) for the shape's head_dim (ValidShape).
template <bool kTreeMask>
cudaError_t DispatchPrefill(const attention::PrefillKernelParams<kTreeMask>& params,
                            int32_t max_q_len, const AttentionShape& shape, int32_t num_seqs,
                            cudaStream_t stream) {
  const int32_t heads = shape.num_q_heads;
  switch (shape.head_dim) {
    case 16:
      return LaunchPrefill<16, kTreeMask>(params, max_q_len, heads, num_seqs, stream);
    case 32:
      return LaunchPrefill<32, kTreeMask>(params, max_q_len, heads, num_seqs, stream);
    case 64:
      return LaunchPrefill<64, kTreeMask>(params, max_q_len, heads, num_seqs, stream);
    case 128:
      return LaunchPrefill<128, kTreeMask>(params, max_q_len, heads, num_seqs, stream);
    default:
      return LaunchPrefill<256, kTreeMask>(params, max_q_len, heads, num_seqs, stream);
  }
}

}  // namespace

cudaError_t WriteKvCache(const __nv_bfloat16* key, int64_t key_stride, const __nv_bfloat16* value,
                         int64_t value_stride, const int64_t* slot_mapping, int64_t num_tokens,
                         const AttentionShape& shape, __nv_bfloat16* k_cache,
                         __nv_bfloat16* v_cache, cudaStream_t stream) {
  if (!ValidShape(shape) || num_tokens < 0 || num_tokens > INT_MAX) return cudaErrorInvalidValue;
  const int64_t row = static_cast<int64_t>(shape.num_kv_heads) * shape.head_dim;
  if (key_stride < row || value_stride < row) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const bool vectorize = ValidRows(key, key_stride, row) && ValidRows(value, value_stride, row) &&
                         IsAligned(k_cache, 16) && IsAligned(v_cache, 16);
  const int vec = vectorize ? kBf16PerVec16 : 1;
  const int threads =
      static_cast<int>(std::min<int64_t>(128, CeilDiv(CeilDiv(row, vec), kWarpSize) * kWarpSize));
  const auto grid = static_cast<unsigned>(num_tokens);
  return LaunchDependent(
      vectorize ? attention::WriteKvCacheKernel<kBf16PerVec16> : attention::WriteKvCacheKernel<1>,
      grid, threads, 0, stream, key, key_stride, value, value_stride, slot_mapping,
      shape.num_kv_heads, shape.head_dim, shape.block_size, k_cache, v_cache);
}

size_t PagedDecodeWorkspaceBytes(int32_t max_num_seqs, int32_t num_splits,
                                 const AttentionShape& shape) {
  if (!ValidShape(shape) || max_num_seqs <= 0 || num_splits <= 1) return 0;
  return PartialOutBytes(max_num_seqs, num_splits, shape) +
         static_cast<size_t>(max_num_seqs) * shape.num_q_heads * num_splits * sizeof(float);
}

// Split count of a split-KV launch whose splits have ctas_per_split CTAs each, on num_sms SMs
// holding ctas_per_sm CTAs each: fill one wave (every CTA streams from start to end, none waits
// for a slot), but, if prefer_even, prefer the most CTAs that are a whole number per SM (every
// SM streams the same share) while that keeps at least half the wave's splits; at most
// max_splits and kMaxDecodeSplits, at least 1.
namespace {
int32_t WaveSplits(int64_t ctas_per_split, int64_t ctas_per_sm, int64_t num_sms, int64_t max_splits,
                   bool prefer_even) {
  int64_t fill = num_sms * ctas_per_sm / ctas_per_split;
  for (int64_t per_sm = prefer_even ? ctas_per_sm : 0; per_sm >= 1; --per_sm) {
    const int64_t ctas = per_sm * num_sms;
    if (ctas % ctas_per_split == 0) {
      if (2 * (ctas / ctas_per_split) >= fill) fill = ctas / ctas_per_split;
      break;
    }
  }
  const int64_t splits = std::min({fill, max_splits, static_cast<int64_t>(kMaxDecodeSplits)});
  return static_cast<int32_t>(std::max<int64_t>(1, splits));
}
}  // namespace

int32_t ChooseDecodeSplits(int32_t num_seqs, int32_t max_seq_len, int32_t num_sms,
                           const AttentionShape& shape) {
  if (!ValidShape(shape) || num_seqs <= 0 || max_seq_len <= 0 || num_sms <= 0) return 1;
  const int64_t ctas_per_split =
      static_cast<int64_t>(num_seqs) * shape.num_kv_heads * DecodeParts(shape);
  int64_t context = max_seq_len;
  if (shape.sliding_window > 0) context = std::min<int64_t>(context, shape.sliding_window + 16);
  const int64_t max_splits = CeilDiv(context, std::max<int64_t>(shape.block_size, kMinSplitTokens));
  // Llama-3.1-8B shapes at batch 1 on an H100: 33 splits (2 CTAs per SM) read ~1 point of the
  // copy bandwidth faster than the 49 that fill 3 per SM.
  int32_t splits = WaveSplits(ctas_per_split, DecodeMinCtasPerSm(shape), num_sms, max_splits, true);
  // Then the fewest splits that keep the longest warp's tile count: each of a CTA's warps takes
  // every kWarps-th tile of its split, so the call lasts as long as the warp with the most
  // tiles; splits that do not lower it only add CTAs and partial rows to merge (the same shapes:
  // 32 splits of 64 tiles, 16 per warp, 54.9 us against 55.6 us for 33 splits of 63, also 16
  // per warp, and a short last split; docs/benchmarks.md, "third pass").
  const int64_t step =
      shape.head_dim <= 128 ? DecodeConfig<128, 8>::kStep : DecodeConfig<256, 8>::kStep;
  const int64_t warps = DecodeConfig<128, 8>::kWarps;
  const int64_t tiles = CeilDiv(context, step);
  auto warp_tiles = [&](int64_t n) { return CeilDiv(CeilDiv(tiles, n), warps); };
  while (splits > 1 && warp_tiles(splits - 1) == warp_tiles(splits)) --splits;
  return splits;
}

cudaError_t PagedDecodeAttention(const __nv_bfloat16* q, int64_t q_stride,
                                 const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                 const int32_t* block_tables, int32_t max_blocks_per_seq,
                                 const int32_t* seq_lens, int32_t num_seqs, int32_t num_splits,
                                 const AttentionShape& shape, __nv_bfloat16* out,
                                 int64_t out_stride, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream) {
  if (!ValidShape(shape) || num_seqs < 0 || num_splits < 1 || num_splits > kMaxDecodeSplits) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0) return cudaSuccess;
  const int64_t row = static_cast<int64_t>(shape.num_q_heads) * shape.head_dim;
  if (!ValidRows(q, q_stride, row) || !ValidRows(out, out_stride, row) || !IsAligned(k_cache, 16) ||
      !IsAligned(v_cache, 16) || k_cache == nullptr || v_cache == nullptr ||
      block_tables == nullptr || seq_lens == nullptr || max_blocks_per_seq < 1 ||
      max_blocks_per_seq > (INT_MAX >> 6)) {
    return cudaErrorInvalidValue;
  }
  const int parts = DecodeParts(shape);
  if (static_cast<int64_t>(num_seqs) * shape.num_kv_heads * parts * num_splits > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  DecodeParams params = {};
  params.q = q;
  params.q_stride = q_stride;
  params.k_cache = k_cache;
  params.v_cache = v_cache;
  params.block_tables = block_tables;
  params.max_blocks_per_seq = max_blocks_per_seq;
  params.seq_lens = seq_lens;
  params.num_q_heads = shape.num_q_heads;
  params.num_kv_heads = shape.num_kv_heads;
  params.group = shape.num_q_heads / shape.num_kv_heads;
  params.num_parts = parts;
  params.log2_block_size = Log2(shape.block_size);
  params.sliding_window = shape.sliding_window;
  params.num_splits = num_splits;
  params.scale_log2 = shape.scale * attention::kLog2e;
  params.out = out;
  params.out_stride = out_stride;
  if (num_splits > 1) {
    if (workspace == nullptr || !IsAligned(workspace, 16) ||
        workspace_bytes < PagedDecodeWorkspaceBytes(num_seqs, num_splits, shape)) {
      return cudaErrorInvalidValue;
    }
    params.partial_out = static_cast<float*>(workspace);
    params.partial_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                                  PartialOutBytes(num_seqs, num_splits, shape));
  }
  const int rows = DecodeRows(shape);
  switch (shape.head_dim) {
    case 16:
      return LaunchDecodeAndCombine<16>(params, num_seqs, rows, stream);
    case 32:
      return LaunchDecodeAndCombine<32>(params, num_seqs, rows, stream);
    case 64:
      return LaunchDecodeAndCombine<64>(params, num_seqs, rows, stream);
    case 128:
      return LaunchDecodeAndCombine<128>(params, num_seqs, rows, stream);
    default:
      return LaunchDecodeAndCombine<256>(params, num_seqs, rows, stream);
  }
}

size_t PagedVerifyWorkspaceBytes(int64_t num_tokens, int32_t num_splits,
                                 const AttentionShape& shape) {
  if (!ValidShape(shape) || num_tokens <= 0 || num_splits <= 1) return 0;
  return PartialOutBytes(num_tokens, num_splits, shape) +
         static_cast<size_t>(num_tokens) * shape.num_q_heads * num_splits * sizeof(float);
}

int32_t ChooseVerifySplits(int32_t num_seqs, int32_t max_q_len, int32_t max_seq_len,
                           int32_t num_sms, const AttentionShape& shape) {
  if (!VerifyShape(shape) || num_seqs <= 0 || max_q_len <= 0 || max_q_len > kMaxVerifyQueryLen ||
      max_seq_len <= 0 || num_sms <= 0) {
    return 1;
  }
  const int64_t ctas_per_split =
      static_cast<int64_t>(num_seqs) * shape.num_kv_heads * VerifyRowTiles(max_q_len, shape);
  int64_t context = max_seq_len;
  if (shape.sliding_window > 0) {
    context = std::min<int64_t>(context, int64_t{shape.sliding_window} + max_q_len + 64);
  }
  const int64_t max_splits = CeilDiv(context, kMinVerifySplitTokens);
  // The whole wave, even if SMs then hold different numbers of CTAs (with 3 stages at 3 CTAs per
  // SM, 49 splits took 59.7-60.0 us against 61.6-62.7 us for the 33 that put 2 on every SM);
  // kVerifyStages has the measurements behind the wave and the cap.
  return WaveSplits(ctas_per_split, kVerifyCtasPerSm, num_sms,
                    std::min<int64_t>(max_splits, kMaxVerifySplits), false);
}

cudaError_t PagedVerifyAttention(const __nv_bfloat16* q, int64_t q_stride,
                                 const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                 const int32_t* block_tables, int32_t max_blocks_per_seq,
                                 const int32_t* cu_q_lens, const int32_t* seq_lens,
                                 int32_t num_seqs, int64_t num_tokens, int32_t max_q_len,
                                 int32_t num_splits, const AttentionShape& shape,
                                 __nv_bfloat16* out, int64_t out_stride, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream,
                                 const AttentionTreeMask* tree) {
  TreeVerifyParams params = {};  // the dense kernel takes its VerifyParams part
  if (!VerifyShape(shape) || num_seqs < 0 || num_seqs > 65535 || num_tokens < 0 ||
      num_tokens > INT_MAX || max_q_len < 0 || max_q_len > kMaxVerifyQueryLen ||
      shape.num_q_heads > 65535 || num_splits < 1 || num_splits > kMaxDecodeSplits ||
      !TreeArgs(tree, shape, &params.tree)) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0 || num_tokens == 0 || max_q_len == 0) return cudaSuccess;
  if (!PrefillArgs(q, q_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_q_lens,
                   seq_lens, shape, out, out_stride, &params.pre)) {
    return cudaErrorInvalidValue;
  }
  const int warps = VerifyWarps(max_q_len, shape);
  const int64_t row_tiles = VerifyRowTiles(max_q_len, shape);
  const int64_t num_ctas = static_cast<int64_t>(num_seqs) * shape.num_kv_heads * row_tiles *
                           static_cast<int64_t>(num_splits);
  if (num_ctas > INT_MAX || num_tokens * shape.num_q_heads > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  params.num_q_heads = shape.num_q_heads;
  params.max_q_len = max_q_len;
  params.num_row_tiles = static_cast<int32_t>(row_tiles);
  params.num_splits = num_splits;
  if (num_splits > 1) {
    if (workspace == nullptr || !IsAligned(workspace, 16) ||
        workspace_bytes < PagedVerifyWorkspaceBytes(num_tokens, num_splits, shape)) {
      return cudaErrorInvalidValue;
    }
    params.partial_out = static_cast<float*>(workspace);
    params.partial_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                                  PartialOutBytes(num_tokens, num_splits, shape));
  }
  if (tree != nullptr) {
    return DispatchVerify<attention::TreeVerifyVariant>(params, shape.head_dim, warps, num_ctas,
                                                        num_tokens, stream);
  }
  return DispatchVerify<attention::DenseVerifyVariant>(params, shape.head_dim, warps, num_ctas,
                                                       num_tokens, stream);
}

size_t PagedPrefillWorkspaceBytes(int64_t max_num_tokens, int32_t max_num_seqs,
                                  const AttentionShape& shape) {
  if (!VerifyShape(shape) || max_num_tokens <= 0 || max_num_seqs <= 0) return 0;
  const int num_sms = CurrentDeviceSms();
  if (num_sms <= 0) return 0;
  // The verification launches PagedPrefillAttention makes: n sequences of up to q queries each
  // (at most max_num_tokens in all), at the split count of an unbounded context (the most).
  size_t bytes = 0;
  for (int32_t n = 1; n <= max_num_seqs; ++n) {
    bool split = false;
    for (int32_t q = 1; q <= kMaxVerifyQueryLen; ++q) {
      const int32_t splits = ChooseVerifySplits(n, q, INT_MAX, num_sms, shape);
      if (splits <= 1) continue;
      split = true;
      const int64_t tokens = std::min<int64_t>(max_num_tokens, int64_t{n} * q);
      bytes = std::max(bytes, PagedVerifyWorkspaceBytes(tokens, splits, shape));
    }
    if (!split) break;  // more sequences only mean fewer splits
  }
  return bytes;
}

cudaError_t PagedPrefillAttention(const __nv_bfloat16* q, int64_t q_stride,
                                  const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                  const int32_t* block_tables, int32_t max_blocks_per_seq,
                                  const int32_t* cu_q_lens, const int32_t* seq_lens,
                                  int32_t num_seqs, int64_t num_tokens, int32_t max_q_len,
                                  const AttentionShape& shape, __nv_bfloat16* out,
                                  int64_t out_stride, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream, const AttentionTreeMask* tree) {
  PrefillTreeParams params = {};  // the dense kernel takes its PrefillParams part
  if (!ValidShape(shape) || num_seqs < 0 || num_seqs > 65535 || num_tokens < 0 ||
      num_tokens > INT_MAX || max_q_len < 0 || shape.num_q_heads > 65535 ||
      !TreeArgs(tree, shape, &params.tree)) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0 || num_tokens == 0 || max_q_len == 0) return cudaSuccess;
  if (max_q_len <= kMaxVerifyQueryLen && VerifyShape(shape)) {
    const int64_t max_seq_len =
        std::min<int64_t>(INT_MAX, int64_t{max_blocks_per_seq} * shape.block_size);
    int32_t splits = ChooseVerifySplits(num_seqs, max_q_len, static_cast<int32_t>(max_seq_len),
                                        CurrentDeviceSms(), shape);
    while (splits > 1 && (workspace == nullptr || !IsAligned(workspace, 16) ||
                          PagedVerifyWorkspaceBytes(num_tokens, splits, shape) > workspace_bytes)) {
      --splits;
    }
    return PagedVerifyAttention(q, q_stride, k_cache, v_cache, block_tables, max_blocks_per_seq,
                                cu_q_lens, seq_lens, num_seqs, num_tokens, max_q_len, splits, shape,
                                out, out_stride, workspace, workspace_bytes, stream, tree);
  }
  if (!PrefillArgs(q, q_stride, k_cache, v_cache, block_tables, max_blocks_per_seq, cu_q_lens,
                   seq_lens, shape, out, out_stride, &params)) {
    return cudaErrorInvalidValue;
  }
  if (tree != nullptr) return DispatchPrefill<true>(params, max_q_len, shape, num_seqs, stream);
  return DispatchPrefill<false>(params, max_q_len, shape, num_seqs, stream);
}

}  // namespace specd::kernels
