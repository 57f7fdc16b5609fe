// Rotary position embedding and per-head RMSNorm launchers for the CUDA backend (bf16 storage,
// fp32 math). References: kernels/ref/rope.h. Any host thread; queued on `stream`, no allocation,
// graph-capturable (positions come from the device).
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

#include "kernels/cuda/attention.h"  // AttentionShape

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

// Fills the RoPE table from the model's inverse frequencies (already scaled: llama3 or linear
// scaling is applied to inv_freq by the caller, as HF's rope init functions do):
//   cos_sin[p, i] = cos(p * inv_freq[i]), cos_sin[p, rot_dim/2 + i] = sin(p * inv_freq[i])
// for p < max_positions, i < rot_dim / 2, computed in fp32 as HF does (position * inv_freq in
// fp32, then cos/sin).
//   inv_freq  [rot_dim / 2] f32, device, in (kernels/ref/rope.h RopeInvFreq computes it)
//   cos_sin   [max_positions, rot_dim] f32, device, out
// Angles within 2 fp32 ulp (sincosf). cudaErrorInvalidValue unless rot_dim is even, in [2, 512].
cudaError_t BuildRopeCache(const float* inv_freq, int32_t rot_dim, int64_t max_positions,
                           float* cos_sin, cudaStream_t stream);

// HF "rotate_half" RoPE in place on the first rot_dim dims of every head of q and k
// (x1 = x[:rot_dim/2], x2 = x[rot_dim/2:rot_dim]: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin),
// in fp32, rounded once to bf16.
//   positions  [num_tokens] int32, device, in (each < the table's max_positions)
//   q          [num_tokens, num_q_heads, head_dim] bf16, device, in/out; token stride q_stride
//   k          [num_tokens, num_kv_heads, head_dim] bf16, device, in/out; token stride k_stride
//   cos_sin    from BuildRopeCache
// q and k may point into one fused qkv buffer. 16-byte accesses when rot_dim / 2, head_dim and
// both strides are multiples of 8 and q, k are 16-byte aligned; scalar otherwise.
// cudaErrorInvalidValue unless rot_dim is even, 2 <= rot_dim <= head_dim <= 512, and each stride
// covers its heads. Either head count may be 0 (its pointer is then unused).
cudaError_t ApplyRope(const int32_t* positions, int64_t num_tokens, __nv_bfloat16* q,
                      int64_t q_stride, int32_t num_q_heads, __nv_bfloat16* k, int64_t k_stride,
                      int32_t num_kv_heads, int32_t head_dim, int32_t rot_dim, const float* cos_sin,
                      cudaStream_t stream);

// Where q_norm and k_norm are given (Qwen3), HeadRmsNorm of q's heads by q_norm and of key's by
// k_norm; then ApplyRope on q and key with shape.num_q_heads / num_kv_heads heads of
// shape.head_dim, then WriteKvCache (attention.h) of the rotated key and of value, in one launch
// (a block per token): q, key and the caches end exactly as after those calls. (One exception:
// the norms take RoPE's vector width, so where HeadRmsNorm alone would pick another one for q or
// for key (rot_dim / 2 % 8 != 0, or q and key aligned or strided differently), their sums of
// squares may round differently. The forward pass has none of these: one qkv buffer, and every
// Qwen3 shape has rot_dim = head_dim = 128.) rot_dim and cos_sin as ApplyRope's; q_norm, k_norm
// [head_dim] bf16, device, both or neither.
// cudaErrorInvalidValue under any of those calls' conditions, or with one norm but not the other.
cudaError_t RopeAndWriteKvCache(const int32_t* positions, int64_t num_tokens, __nv_bfloat16* q,
                                int64_t q_stride, __nv_bfloat16* key, int64_t key_stride,
                                const __nv_bfloat16* value, int64_t value_stride, int32_t rot_dim,
                                const float* cos_sin, const __nv_bfloat16* q_norm,
                                const __nv_bfloat16* k_norm, float eps, const int64_t* slot_mapping,
                                const AttentionShape& shape, __nv_bfloat16* k_cache,
                                __nv_bfloat16* v_cache, cudaStream_t stream);

// Per-head RMSNorm in place (Qwen3's q_norm / k_norm): every head_dim vector of x is normalized
// and multiplied by weight, fp32 math, rounded once to bf16.
//   x       [num_tokens, num_heads, head_dim] bf16, device, in/out; token stride x_stride
//   weight  [head_dim] bf16, device, in
// One warp per head. cudaErrorInvalidValue unless 1 <= head_dim <= 512 and x_stride covers the
// heads.
cudaError_t HeadRmsNorm(__nv_bfloat16* x, int64_t x_stride, int64_t num_tokens, int32_t num_heads,
                        int32_t head_dim, const __nv_bfloat16* weight, float eps,
                        cudaStream_t stream);

}  // namespace specd::kernels
