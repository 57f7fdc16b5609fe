// Fill launchers for the CUDA backend: initialisation of device tensors (the random bf16 weights
// of --load-format dummy, constant norm weights) and a scatter of one value into chosen elements
// of a matrix (banned logits set to -inf before sampling). Any host thread; queued on `stream`,
// no allocation, graph-capturable.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cmath>
#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

#if defined(__CUDACC__)
#define SPECD_FILL_HOST_DEVICE __host__ __device__
#else
#define SPECD_FILL_HOST_DEVICE
#endif

namespace specd::kernels {

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
SPECD_FILL_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The value FillUniformBf16 puts at `index` before rounding to bf16: counter-based, so it does
// not depend on the launch configuration, and this host copy is the kernel's reference.
// u = top 24 bits of SplitMix64(seed ^ SplitMix64(index)) / 2^24 in [0, 1); lo + (hi - lo) * u
// with one fused multiply-add (identical on host and device).
SPECD_FILL_HOST_DEVICE inline float HashUniform(uint64_t seed, uint64_t index, float lo, float hi) {
  const float u = static_cast<float>(SplitMix64(seed ^ SplitMix64(index)) >> 40) * 0x1.0p-24f;
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(hi - lo, u, lo);
#else
  return std::fma(hi - lo, u, lo);
#endif
}

// out[i] = bf16(HashUniform(seed, i, lo, hi)) for i < n (round to nearest even).
//   out  [n] bf16, device, out
// cudaErrorInvalidValue unless n >= 0 and lo <= hi; n == 0 launches nothing.
cudaError_t FillUniformBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float lo, float hi,
                            cudaStream_t stream);

// out[i] = bf16(HashUniform(seed, first_index + i, lo, hi)) for i < n: elements
// [first_index, first_index + n) of what FillUniformBf16 writes, so a tensor-parallel shard of a
// random tensor equals the same slice of the whole one. Arguments and errors as FillUniformBf16.
cudaError_t FillUniformBf16At(__nv_bfloat16* out, int64_t n, uint64_t seed, uint64_t first_index,
                              float lo, float hi, cudaStream_t stream);

// out[i] = bf16(value) for i < n.
//   out  [n] bf16, device, out
cudaError_t FillBf16(__nv_bfloat16* out, int64_t n, float value, cudaStream_t stream);

// data[rows[i] * stride + cols[i]] = value for i < n (duplicates allowed). The caller keeps
// every (row, col) inside the matrix.
//   data        [num_rows, stride] f32, device, in/out
//   rows, cols  [n] int32, device, in
cudaError_t ScatterF32(float* data, int64_t stride, const int32_t* rows, const int32_t* cols,
                       int64_t n, float value, cudaStream_t stream);

}  // namespace specd::kernels
