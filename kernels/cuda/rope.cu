// RoPE and per-head RMSNorm launchers (layer 2): validate, pick the vector width, launch, report.
#include <algorithm>
#include <climits>
#include <initializer_list>

#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rope.h"

namespace specd::kernels {
namespace {

constexpr int64_t kMaxCacheBlocks = 8192;  // grid-stride loop beyond this

bool AllAligned16(std::initializer_list<const void*> ptrs) {
  return std::all_of(ptrs.begin(), ptrs.end(), [](const void* p) { return IsAligned(p, 16); });
}

template <int kVec>
cudaError_t LaunchApplyRope(const int32_t* positions, int64_t num_tokens, __nv_bfloat16* q,
                            int64_t q_stride, int32_t num_q_heads, __nv_bfloat16* k,
                            int64_t k_stride, int32_t num_kv_heads, int32_t head_dim,
                            int32_t rot_dim, const float* cos_sin, cudaStream_t stream) {
  const int64_t items = int64_t{num_q_heads + num_kv_heads} * (rot_dim / 2 / kVec);
  const int threads = static_cast<int>(
      std::min<int64_t>(kRopeThreads, CeilDiv(std::max<int64_t>(items, 1), kWarpSize) * kWarpSize));
  return LaunchDependent(ApplyRopeKernel<kVec>, static_cast<unsigned>(num_tokens), threads, 0,
                         stream, positions, q, q_stride, num_q_heads, k, k_stride, num_kv_heads,
                         head_dim, rot_dim, cos_sin);
}

template <int kVec>
cudaError_t LaunchHeadRmsNorm(__nv_bfloat16* x, int64_t x_stride, int64_t num_tokens,
                              int32_t num_heads, int32_t head_dim, const __nv_bfloat16* weight,
                              float eps, cudaStream_t stream) {
  const int64_t num_vectors = num_tokens * num_heads;
  const int64_t heads_per_block = kHeadNormThreads / kWarpSize;
  HeadRmsNormKernel<kVec>
      <<<static_cast<unsigned>(CeilDiv(num_vectors, heads_per_block)), kHeadNormThreads, 0,
         stream>>>(x, x_stride, num_vectors, num_heads, head_dim, weight, eps);
  return cudaGetLastError();
}

// Arguments of RopeAndWriteKvCache after validation.
struct RopeKvArgs {
  const int32_t* positions;
  int64_t num_tokens;
  __nv_bfloat16* q;
  int64_t q_stride;
  __nv_bfloat16* key;
  int64_t key_stride;
  const __nv_bfloat16* value;
  int64_t value_stride;
  int32_t rot_dim;
  const float* cos_sin;
  const __nv_bfloat16* q_norm;
  const __nv_bfloat16* k_norm;
  float eps;
  const int64_t* slot_mapping;
  const AttentionShape* shape;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
};

template <int kRopeVec, int kKvVec, bool kNorm>
cudaError_t LaunchRopeAndWriteKv(const RopeKvArgs& a, cudaStream_t stream) {
  const AttentionShape& s = *a.shape;
  // As many threads as the widest of the loops has items (ApplyRope's and WriteKvCache's), and a
  // warp per head for the norms where there are.
  const int64_t rope_items = int64_t{s.num_q_heads + s.num_kv_heads} * (a.rot_dim / 2 / kRopeVec);
  const int64_t kv_items = int64_t{s.num_kv_heads} * s.head_dim / kKvVec;
  const int64_t norm_items = kNorm ? int64_t{s.num_q_heads + s.num_kv_heads} * kWarpSize : 0;
  const int threads = static_cast<int>(std::min<int64_t>(
      kRopeThreads, CeilDiv(std::max({rope_items, kv_items, norm_items}), kWarpSize) * kWarpSize));
  return LaunchDependent(RopeAndWriteKvCacheKernel<kRopeVec, kKvVec, kNorm>,
                         static_cast<unsigned>(a.num_tokens), threads, 0, stream, a.positions, a.q,
                         a.q_stride, s.num_q_heads, a.key, a.key_stride, a.value, a.value_stride,
                         s.num_kv_heads, s.head_dim, a.rot_dim, a.cos_sin, a.q_norm, a.k_norm,
                         a.eps, a.slot_mapping, s.block_size, a.k_cache, a.v_cache);
}

template <int kRopeVec, int kKvVec>
cudaError_t LaunchRopeAndWriteKvNorm(const RopeKvArgs& a, cudaStream_t stream) {
  return a.q_norm != nullptr ? LaunchRopeAndWriteKv<kRopeVec, kKvVec, true>(a, stream)
                             : LaunchRopeAndWriteKv<kRopeVec, kKvVec, false>(a, stream);
}

}  // namespace

cudaError_t BuildRopeCache(const float* inv_freq, int32_t rot_dim, int64_t max_positions,
                           float* cos_sin, cudaStream_t stream) {
  if (rot_dim < 2 || rot_dim % 2 != 0 || rot_dim > kMaxRopeHeadDim || max_positions < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = max_positions * (rot_dim / 2);
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min(kMaxCacheBlocks, CeilDiv(total, kRopeThreads));
  BuildRopeCacheKernel<<<static_cast<unsigned>(blocks), kRopeThreads, 0, stream>>>(
      inv_freq, rot_dim / 2, total, cos_sin);
  return cudaGetLastError();
}

cudaError_t ApplyRope(const int32_t* positions, int64_t num_tokens, __nv_bfloat16* q,
                      int64_t q_stride, int32_t num_q_heads, __nv_bfloat16* k, int64_t k_stride,
                      int32_t num_kv_heads, int32_t head_dim, int32_t rot_dim, const float* cos_sin,
                      cudaStream_t stream) {
  if (rot_dim < 2 || rot_dim % 2 != 0 || rot_dim > head_dim || head_dim > kMaxRopeHeadDim ||
      num_tokens < 0 || num_tokens > INT_MAX || num_q_heads < 0 || num_kv_heads < 0 ||
      q_stride < int64_t{num_q_heads} * head_dim || k_stride < int64_t{num_kv_heads} * head_dim) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0 || num_q_heads + num_kv_heads == 0) return cudaSuccess;
  const int half = rot_dim / 2;
  if (half % kBf16PerVec16 == 0 && head_dim % kBf16PerVec16 == 0 && q_stride % kBf16PerVec16 == 0 &&
      k_stride % kBf16PerVec16 == 0 && AllAligned16({q, k})) {
    return LaunchApplyRope<kBf16PerVec16>(positions, num_tokens, q, q_stride, num_q_heads, k,
                                          k_stride, num_kv_heads, head_dim, rot_dim, cos_sin,
                                          stream);
  }
  return LaunchApplyRope<1>(positions, num_tokens, q, q_stride, num_q_heads, k, k_stride,
                            num_kv_heads, head_dim, rot_dim, cos_sin, stream);
}

cudaError_t HeadRmsNorm(__nv_bfloat16* x, int64_t x_stride, int64_t num_tokens, int32_t num_heads,
                        int32_t head_dim, const __nv_bfloat16* weight, float eps,
                        cudaStream_t stream) {
  if (head_dim < 1 || head_dim > kMaxRopeHeadDim || num_heads < 0 || num_tokens < 0 ||
      x_stride < int64_t{num_heads} * head_dim ||
      num_tokens * num_heads > int64_t{INT_MAX} * (kHeadNormThreads / kWarpSize)) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0 || num_heads == 0) return cudaSuccess;
  if (head_dim % kBf16PerVec16 == 0 && x_stride % kBf16PerVec16 == 0 && AllAligned16({x, weight})) {
    return LaunchHeadRmsNorm<kBf16PerVec16>(x, x_stride, num_tokens, num_heads, head_dim, weight,
                                            eps, stream);
  }
  return LaunchHeadRmsNorm<1>(x, x_stride, num_tokens, num_heads, head_dim, weight, eps, stream);
}

cudaError_t RopeAndWriteKvCache(const int32_t* positions, int64_t num_tokens, __nv_bfloat16* q,
                                int64_t q_stride, __nv_bfloat16* key, int64_t key_stride,
                                const __nv_bfloat16* value, int64_t value_stride, int32_t rot_dim,
                                const float* cos_sin, const __nv_bfloat16* q_norm,
                                const __nv_bfloat16* k_norm, float eps, const int64_t* slot_mapping,
                                const AttentionShape& shape, __nv_bfloat16* k_cache,
                                __nv_bfloat16* v_cache, cudaStream_t stream) {
  const int64_t q_row = int64_t{shape.num_q_heads} * shape.head_dim;
  const int64_t kv_row = int64_t{shape.num_kv_heads} * shape.head_dim;
  if (shape.num_q_heads < 0 || shape.num_kv_heads < 1 || shape.head_dim < 1 ||
      shape.block_size < 1 || rot_dim < 2 || rot_dim % 2 != 0 || rot_dim > shape.head_dim ||
      shape.head_dim > kMaxRopeHeadDim || num_tokens < 0 || num_tokens > INT_MAX ||
      q_stride < q_row || key_stride < kv_row || value_stride < kv_row ||
      (q_norm == nullptr) != (k_norm == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const bool norm = q_norm != nullptr;
  // The vector widths ApplyRope (and HeadRmsNorm) and WriteKvCache would pick.
  const bool rope_vec = rot_dim / 2 % kBf16PerVec16 == 0 && shape.head_dim % kBf16PerVec16 == 0 &&
                        q_stride % kBf16PerVec16 == 0 && key_stride % kBf16PerVec16 == 0 &&
                        AllAligned16({q, key}) && (!norm || AllAligned16({q_norm, k_norm}));
  const bool kv_vec = shape.head_dim % kBf16PerVec16 == 0 && key_stride % kBf16PerVec16 == 0 &&
                      value_stride % kBf16PerVec16 == 0 &&
                      AllAligned16({key, value, k_cache, v_cache});
  const RopeKvArgs args{positions, num_tokens,   q,       q_stride, key,    key_stride,
                        value,     value_stride, rot_dim, cos_sin,  q_norm, k_norm,
                        eps,       slot_mapping, &shape,  k_cache,  v_cache};
  constexpr int kV = kBf16PerVec16;
  auto* launch = rope_vec
                     ? (kv_vec ? LaunchRopeAndWriteKvNorm<kV, kV> : LaunchRopeAndWriteKvNorm<kV, 1>)
                     : (kv_vec ? LaunchRopeAndWriteKvNorm<1, kV> : LaunchRopeAndWriteKvNorm<1, 1>);
  return launch(args, stream);
}

}  // namespace specd::kernels
