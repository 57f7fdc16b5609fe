// Fill launchers: grid-stride loops, one element per thread per iteration.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/init.h"

namespace specd::kernels {
namespace {

constexpr int kFillThreads = 256;
constexpr int64_t kMaxFillBlocks = 4096;

__global__ void FillUniformBf16Kernel(__nv_bfloat16* out, int64_t n, uint64_t seed, uint64_t first,
                                      float lo, float hi) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) {
    out[i] = __float2bfloat16_rn(HashUniform(seed, first + static_cast<uint64_t>(i), lo, hi));
  }
}

__global__ void FillBf16Kernel(__nv_bfloat16* out, int64_t n, float value) {
  const __nv_bfloat16 v = __float2bfloat16_rn(value);
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) out[i] = v;
}

__global__ void ScatterF32Kernel(float* data, int64_t stride, const int32_t* rows,
                                 const int32_t* cols, int64_t n, float value) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) {
    data[int64_t{rows[i]} * stride + cols[i]] = value;
  }
}

unsigned NumBlocks(int64_t n) {
  return static_cast<unsigned>(std::min(CeilDiv(n, kFillThreads), kMaxFillBlocks));
}

}  // namespace

cudaError_t FillUniformBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float lo, float hi,
                            cudaStream_t stream) {
  return FillUniformBf16At(out, n, seed, 0, lo, hi, stream);
}

cudaError_t FillUniformBf16At(__nv_bfloat16* out, int64_t n, uint64_t seed, uint64_t first_index,
                              float lo, float hi, cudaStream_t stream) {
  if (n < 0 || !(lo <= hi)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  FillUniformBf16Kernel<<<NumBlocks(n), kFillThreads, 0, stream>>>(out, n, seed, first_index, lo,
                                                                   hi);
  return cudaGetLastError();
}

cudaError_t FillBf16(__nv_bfloat16* out, int64_t n, float value, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  FillBf16Kernel<<<NumBlocks(n), kFillThreads, 0, stream>>>(out, n, value);
  return cudaGetLastError();
}

cudaError_t ScatterF32(float* data, int64_t stride, const int32_t* rows, const int32_t* cols,
                       int64_t n, float value, cudaStream_t stream) {
  if (n < 0 || stride < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ScatterF32Kernel<<<NumBlocks(n), kFillThreads, 0, stream>>>(data, stride, rows, cols, n, value);
  return cudaGetLastError();
}

}  // namespace specd::kernels
