// Draft-vocabulary launchers (kernels/cuda/draft_vocab.h): validate, size the grid, launch,
// report. The kernels are small enough to live here rather than in a .cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/draft_vocab.h"

namespace specd::kernels {
namespace {

constexpr int kMapThreads = 256;
constexpr int kExpandThreads = 1024;
constexpr int kExpandUnroll = 8;  // column loads in flight per thread
// ExpandColumns stages a chunk of a row in shared memory: at most kMaxStageCols columns
// (192 KiB; Hopper allows 227 KiB a block), or what the device allows. A row is cut into more
// chunks, of at least kMinChunkCols, while that keeps the grid within one block per SM; chunks
// start on a multiple of kChunkAlign columns (a 128-byte line).
constexpr int64_t kMaxStageCols = 48 * 1024;
constexpr int64_t kMinChunkCols = 4096;
constexpr int64_t kChunkAlign = 32;

// ids and out may alias: thread i reads ids[i] before it writes out[i], and touches nothing else.
__global__ void MapIdsKernel(const int32_t* ids, int32_t n, const int32_t* __restrict__ map,
                             int32_t map_size, int32_t* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t id = ids[i];
  out[i] = id >= 0 && id < map_size ? map[id] : -1;
}

// Block (row, y) owns columns [y * chunk_cols, y * chunk_cols + chunk_cols) of dst's row. It fills
// its shared-memory copy of them, copies in every source value whose column it owns (all of cols
// is read; the source value only where the column is owned), then writes the chunk out once,
// coalesced (16-byte stores with Vec4). chunk_cols % kChunkAlign == 0 where a row has more than
// one chunk, so with Vec4 every chunk starts 16-byte aligned.
template <bool Vec4>
__global__ void __launch_bounds__(kExpandThreads)
    ExpandColumnsKernel(const float* __restrict__ src, int64_t src_stride, int32_t num_src_cols,
                        const int32_t* __restrict__ cols, float* __restrict__ dst,
                        int64_t dst_stride, int32_t num_dst_cols, int32_t chunk_cols, float fill) {
  extern __shared__ float4 stage4[];  // [ceil(chunk_cols / 4)]
  float* stage = reinterpret_cast<float*>(stage4);
  const int64_t begin = int64_t{blockIdx.y} * chunk_cols;
  const auto width =
      static_cast<int32_t>(num_dst_cols - begin < chunk_cols ? num_dst_cols - begin : chunk_cols);
  const float4 fill4 = make_float4(fill, fill, fill, fill);
  for (int32_t j = threadIdx.x; j < (width + 3) / 4; j += kExpandThreads) stage4[j] = fill4;
  __syncthreads();
  const float* from = src + int64_t{blockIdx.x} * src_stride;
  for (int64_t base = threadIdx.x; base < num_src_cols; base += kExpandUnroll * kExpandThreads) {
    int64_t local[kExpandUnroll];
#pragma unroll
    for (int u = 0; u < kExpandUnroll; ++u) {
      const int64_t c = base + u * kExpandThreads;
      local[u] = c < num_src_cols ? cols[c] - begin : -1;
    }
#pragma unroll
    for (int u = 0; u < kExpandUnroll; ++u) {
      if (local[u] >= 0 && local[u] < width) stage[local[u]] = from[base + u * kExpandThreads];
    }
  }
  __syncthreads();
  float* out = dst + int64_t{blockIdx.x} * dst_stride + begin;
  int32_t scalar_begin = 0;
  if constexpr (Vec4) {
    float4* out4 = reinterpret_cast<float4*>(out);
    for (int32_t j = threadIdx.x; j < width / 4; j += kExpandThreads) out4[j] = stage4[j];
    scalar_begin = width / 4 * 4;
  }
  for (int32_t j = scalar_begin + threadIdx.x; j < width; j += kExpandThreads) out[j] = stage[j];
}

// The current device's multiprocessors and opt-in shared memory per block, read once per device
// (the first 64 devices cached; any host thread may call it). Zeros when they cannot be read.
struct DeviceLimits {
  int num_sms = 0;
  int max_smem_bytes = 0;
};

DeviceLimits CurrentDeviceLimits() {
  static std::atomic<int> cached[64][2] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return {};
  if (device < 64 && cached[device][0].load(std::memory_order_acquire) > 0) {
    return {cached[device][0].load(std::memory_order_relaxed),
            cached[device][1].load(std::memory_order_relaxed)};
  }
  DeviceLimits limits;
  if (cudaDeviceGetAttribute(&limits.num_sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&limits.max_smem_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess) {
    return {};
  }
  if (device < 64) {
    cached[device][1].store(limits.max_smem_bytes, std::memory_order_relaxed);
    cached[device][0].store(limits.num_sms, std::memory_order_release);
  }
  return limits;
}

// Columns per chunk of a row (ExpandColumnsKernel): as few chunks as the stage allows, more while
// num_rows * chunks stays within one block per SM and chunks keep kMinChunkCols columns. Without
// the device's limits, the 48 KiB every device allows and one chunk per row where that fits.
int64_t ExpandChunkCols(int32_t num_rows, int32_t num_dst_cols, const DeviceLimits& limits) {
  const int64_t smem_bytes = limits.max_smem_bytes > 0 ? limits.max_smem_bytes : 48 * 1024;
  const int64_t max_stage =
      std::min<int64_t>(kMaxStageCols, smem_bytes / 4) / kChunkAlign * kChunkAlign;
  const int64_t spread = std::clamp<int64_t>(limits.num_sms / num_rows, 1,
                                             std::max<int64_t>(1, num_dst_cols / kMinChunkCols));
  const int64_t chunks = std::max(CeilDiv(num_dst_cols, max_stage), spread);
  const int64_t chunk_cols = CeilDiv(CeilDiv(num_dst_cols, chunks), kChunkAlign) * kChunkAlign;
  return std::min<int64_t>(chunk_cols, num_dst_cols);
}

template <bool Vec4>
cudaError_t LaunchExpandColumns(dim3 grid, int64_t chunk_cols, const float* src, int64_t src_stride,
                                int32_t num_src_cols, const int32_t* cols, float* dst,
                                int64_t dst_stride, int32_t num_dst_cols, float fill,
                                cudaStream_t stream) {
  const auto kernel = ExpandColumnsKernel<Vec4>;
  const auto smem = static_cast<int>(CeilDiv(chunk_cols, 4) * sizeof(float4));
  // Over the 48 KiB default. Set on every launch (cheap, host only): the attribute belongs to the
  // current device.
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<grid, kExpandThreads, smem, stream>>>(src, src_stride, num_src_cols, cols, dst,
                                                 dst_stride, num_dst_cols,
                                                 static_cast<int32_t>(chunk_cols), fill);
  return cudaGetLastError();
}

}  // namespace

cudaError_t MapIds(const int32_t* ids, int32_t n, const int32_t* map, int32_t map_size,
                   int32_t* out, cudaStream_t stream) {
  if (n < 0 || map_size < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  MapIdsKernel<<<static_cast<unsigned>(CeilDiv(n, kMapThreads)), kMapThreads, 0, stream>>>(
      ids, n, map, map_size, out);
  return cudaGetLastError();
}

cudaError_t ExpandColumns(const float* src, int64_t src_stride, int32_t num_rows,
                          int32_t num_src_cols, const int32_t* cols, float* dst, int64_t dst_stride,
                          int32_t num_dst_cols, float fill, cudaStream_t stream) {
  if (num_rows < 0 || num_src_cols < 1 || num_src_cols > num_dst_cols ||
      src_stride < num_src_cols || dst_stride < num_dst_cols) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  const int64_t chunk_cols = ExpandChunkCols(num_rows, num_dst_cols, CurrentDeviceLimits());
  const dim3 grid(static_cast<unsigned>(num_rows),
                  static_cast<unsigned>(CeilDiv(num_dst_cols, chunk_cols)));
  if (IsAligned(dst, 16) && dst_stride % 4 == 0) {
    return LaunchExpandColumns<true>(grid, chunk_cols, src, src_stride, num_src_cols, cols, dst,
                                     dst_stride, num_dst_cols, fill, stream);
  }
  return LaunchExpandColumns<false>(grid, chunk_cols, src, src_stride, num_src_cols, cols, dst,
                                    dst_stride, num_dst_cols, fill, stream);
}

}  // namespace specd::kernels
