#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/vocab_merge.h"

namespace specd::kernels {
namespace {

constexpr int kMaxMergeK = 64;
constexpr int kPackThreads = 128;
constexpr int kScatterMergeThreads = 256;

__global__ void PackShardCandidatesKernel(const float* logits, int64_t stride, int32_t num_rows,
                                          int32_t k, const int32_t* ids, int32_t kept,
                                          int32_t id_base, int32_t* pairs) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{num_rows} * k) return;
  const int64_t row = i / k;
  const int32_t j = static_cast<int32_t>(i % k);
  int32_t value = __float_as_int(-__int_as_float(0x7f800000));  // -inf
  int32_t id = -1;
  if (j < kept) {
    const int32_t local = ids[row * kept + j];
    value = __float_as_int(logits[row * stride + local]);
    id = id_base + local;
  }
  pairs[2 * i] = value;
  pairs[2 * i + 1] = id;
}

__global__ void ScatterShardCandidatesKernel(const int32_t* pairs, int32_t world, int32_t num_rows,
                                             int32_t k, int32_t vocab, float* out, int64_t stride) {
  const int64_t row = blockIdx.x;
  float* dst = out + row * stride;
  const float neg_inf = -__int_as_float(0x7f800000);
  for (int32_t c = threadIdx.x; c < vocab; c += blockDim.x) dst[c] = neg_inf;
  __syncthreads();
  for (int32_t t = threadIdx.x; t < world * k; t += blockDim.x) {
    const int32_t w = t / k, j = t % k;
    const int32_t* p = pairs + ((int64_t{w} * num_rows + row) * k + j) * 2;
    const int32_t id = p[1];
    if (id >= 0 && id < vocab) dst[id] = __int_as_float(p[0]);
  }
}

}  // namespace

cudaError_t PackShardCandidates(const float* logits, int64_t stride, int32_t num_rows, int32_t k,
                                const int32_t* ids, int32_t kept, int32_t id_base, int32_t* pairs,
                                cudaStream_t stream) {
  if (k < 1 || k > kMaxMergeK || kept < 0 || kept > k || num_rows < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = int64_t{num_rows} * k;
  if (n == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((n + kPackThreads - 1) / kPackThreads);
  PackShardCandidatesKernel<<<blocks, kPackThreads, 0, stream>>>(logits, stride, num_rows, k, ids,
                                                                 kept, id_base, pairs);
  return cudaGetLastError();
}

cudaError_t ScatterShardCandidates(const int32_t* pairs, int32_t world, int32_t num_rows, int32_t k,
                                   int32_t vocab, float* out, int64_t stride, cudaStream_t stream) {
  if (world < 1 || k < 1 || k > kMaxMergeK || vocab < 1 || stride < vocab || num_rows < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  ScatterShardCandidatesKernel<<<static_cast<unsigned>(num_rows), kScatterMergeThreads, 0,
                                 stream>>>(pairs, world, num_rows, k, vocab, out, stride);
  return cudaGetLastError();
}

}  // namespace specd::kernels
