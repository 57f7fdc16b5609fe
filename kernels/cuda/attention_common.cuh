// Paged attention kernels, shared pieces (layer 1 of kernels/cuda; launchers and their contracts
// in attention.h / attention.cu): constants, PTX wrappers, online-softmax helpers and the KV
// write. bf16 operands on tensor cores (mma.sync), fp32 accumulation, log2-domain softmax.
//
// Fragment notation (PTX ISA, mma.m16n8k16 / m16n8k8): lane = 4 * g + t (g = lane / 4 is the
// "group", t = lane % 4). A (16 x k) holds rows g and g + 8, columns 2t, 2t + 1 (+ 8); B (k x 8)
// holds column g, rows 2t, 2t + 1 (+ 8); C (16 x 8) holds rows g, g + 8, columns 2t, 2t + 1.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace specd::kernels::attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();
// Splits of one decode launch never exceed this (the combine kernel holds their weights in
// shared memory); the combine kernel's block size.
constexpr int kMaxDecodeSplits = 256;
constexpr int kCombineThreads = 128;
// Splits whose partial rows the combine kernel loads before it has their weights.
constexpr int kCombinePreloadSplits = 64;

// ---------------------------------------------------------------------------------------------
// PTX wrappers

// C += A * B, m16n8k16, bf16 in, fp32 accumulate. a = {row g lo, row g+8 lo, row g hi, row g+8
// hi} (lo: columns 2t, 2t+1; hi: 2t+8, 2t+9), b = {rows 2t.., rows 2t+8..}.
__device__ __forceinline__ void Mma16816(float& c0, float& c1, float& c2, float& c3, uint32_t a0,
                                         uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// C += A * B, m16n8k8: a = {row g, row g+8} (columns 2t, 2t+1), b = rows 2t, 2t+1.
__device__ __forceinline__ void Mma1688(float& c0, float& c1, float& c2, float& c3, uint32_t a0,
                                        uint32_t a1, uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a0), "r"(a1), "r"(b));
}

// Two floats as a bf16 pair (lo in the low half), the A-operand form of probabilities.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; !valid writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// L2 eviction priorities (sm_80+; createpolicy makes the operand of the .L2::cache_hint forms):
// KV streamed once per call goes first, so the block tables and sequence lengths every CTA reads
// before its first KV load stay in L2 from one call (and one layer) to the next.
__device__ __forceinline__ uint64_t L2EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t L2EvictLastPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// CpAsync16 with an L2 eviction policy.
__device__ __forceinline__ void CpAsync16Hinted(uint32_t dst, const void* src, bool valid,
                                                uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
// Read-only 32-bit load with an L2 eviction policy.
__device__ __forceinline__ int32_t LoadHinted(const int32_t* p, uint64_t policy) {
  int32_t value;
  asm volatile("ld.global.nc.L2::cache_hint.b32 %0, [%1], %2;\n"
               : "=r"(value)
               : "l"(p), "l"(policy));
  return value;
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void LdMatrixX2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Streaming 16-byte load of KV data read once per launch (evict-first in L1 and L2).
__device__ __forceinline__ uint4 LoadStreaming(const __nv_bfloat16* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

// One softmax row's running state update for a new tile of scores (log2 domain): returns the
// factor the row's accumulator must be scaled by. m_use keeps exp2 finite while the row has seen
// no valid key (m = -inf): every exp2 then yields 0.
__device__ __forceinline__ float OnlineSoftmaxRescale(float& m, float tile_max, float& m_use) {
  const float m_new = fmaxf(m, tile_max);
  m_use = m_new == kNegInf ? 0.0f : m_new;
  const float alpha = exp2f(m - m_use);
  m = m_new;
  return alpha;
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---------------------------------------------------------------------------------------------
// KV-cache write: one thread block per token, kVec-element vectors over its heads.

// Token `token`'s key and value rows into their cache slot (none where the slot is < 0), by the
// threads of one block. No __restrict__: the fused RoPE kernel (rope.cuh) rereads key rows its
// own block has just written.
template <int kVec>
__device__ __forceinline__ void WriteKvToken(int64_t token, const __nv_bfloat16* key,
                                             int64_t key_stride, const __nv_bfloat16* value,
                                             int64_t value_stride, const int64_t* slot_mapping,
                                             int num_kv_heads, int head_dim, int block_size,
                                             __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;
  const int64_t block = slot / block_size, row = slot % block_size;
  const int vecs_per_head = head_dim / kVec;
  for (int i = threadIdx.x; i < num_kv_heads * vecs_per_head; i += blockDim.x) {
    const int head = i / vecs_per_head, col = (i % vecs_per_head) * kVec;
    const int64_t dst = ((block * num_kv_heads + head) * block_size + row) * head_dim + col;
    Bf16Vec<kVec>::Load(key + token * key_stride + head * head_dim + col).Store(k_cache + dst);
    Bf16Vec<kVec>::Load(value + token * value_stride + head * head_dim + col).Store(v_cache + dst);
  }
}

template <int kVec>
__global__ void WriteKvCacheKernel(const __nv_bfloat16* __restrict__ key, int64_t key_stride,
                                   const __nv_bfloat16* __restrict__ value, int64_t value_stride,
                                   const int64_t* __restrict__ slot_mapping, int num_kv_heads,
                                   int head_dim, int block_size,
                                   __nv_bfloat16* __restrict__ k_cache,
                                   __nv_bfloat16* __restrict__ v_cache) {
  WaitForPrerequisiteGrid();  // launched as a programmatic dependent (common.cuh)
  AllowDependentLaunch();     // after the wait: the attention follows (common.cuh)
  WriteKvToken<kVec>(blockIdx.x, key, key_stride, value, value_stride, slot_mapping, num_kv_heads,
                     head_dim, block_size, k_cache, v_cache);
}

}  // namespace specd::kernels::attention
