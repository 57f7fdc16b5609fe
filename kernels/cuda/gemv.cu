// Small-m GEMM launcher (layer 2): validate, pick the output type, tiles and warps, launch,
// report.
#include <atomic>
#include <climits>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv.h"

namespace specd::kernels {
namespace {

bool ValidGemv(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t m, int64_t n,
               int64_t k, const void* y, int64_t ldy) {
  return m >= 1 && m <= kMaxGemvRows && n >= 1 && k >= kBf16PerVec16 && k % kBf16PerVec16 == 0 &&
         ldx >= k && ldx % kBf16PerVec16 == 0 && ldy >= n && CeilDiv(n, kGemvTileRows) <= INT_MAX &&
         x != nullptr && w != nullptr && y != nullptr && IsAligned(x, 16) && IsAligned(w, 16);
}

// Multiprocessors of the current device, read once per device (the first 64 devices cached;
// any host thread may call it).
int MultiprocessorCount() {
  static std::atomic<int> counts[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 0;
  int count = device < 64 ? counts[device].load(std::memory_order_relaxed) : 0;
  if (count == 0 &&
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      device < 64) {
    counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// 16 warps per block where W's tiles fit one wave of one block per SM (a block alone on its SM
// keeps only 32 KiB of W in flight with 8 warps) and k gives every warp a chunk. Beyond one wave
// 8-warp blocks, three per SM, balance better: 16-warp blocks fit one per SM.
bool WideBlocks(int64_t blocks, int64_t k) {
  const int sms = MultiprocessorCount();
  return sms > 0 && blocks <= int64_t{sms} &&
         k >= int64_t{kGemvWideWarps} * kGemvUnroll * kGemvChunk;
}

template <typename OutT, int kTiles>
cudaError_t Launch(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                   const __nv_bfloat16* bias, int rows, int64_t n, int64_t k, OutT* y, int64_t ldy,
                   cudaStream_t stream) {
  const int64_t blocks = CeilDiv(n, kGemvTileRows);
  const auto grid = static_cast<unsigned>(blocks);
  if (WideBlocks(blocks, k)) {
    return LaunchDependent(GemvBf16Kernel<OutT, kTiles, kGemvWideWarps>, grid,
                           kGemvWideWarps * kWarpSize, 0, stream, x, ldx, w, bias, rows, n, k, y,
                           ldy);
  }
  return LaunchDependent(GemvBf16Kernel<OutT, kTiles, kGemvWarps>, grid, kGemvWarps * kWarpSize, 0,
                         stream, x, ldx, w, bias, rows, n, k, y, ldy);
}

}  // namespace

cudaError_t GemvBf16(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                     const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, void* y,
                     int64_t ldy, GemmOut out_type, cudaStream_t stream) {
  if (!ValidGemv(x, ldx, w, m, n, k, y, ldy)) return cudaErrorInvalidValue;
  const int rows = static_cast<int>(m);
  auto* y16 = static_cast<__nv_bfloat16*>(y);
  auto* y32 = static_cast<float*>(y);
  const bool bf16 = out_type == GemmOut::kBf16;
  if (rows <= 8) {
    return bf16 ? Launch<__nv_bfloat16, 1>(x, ldx, w, bias, rows, n, k, y16, ldy, stream)
                : Launch<float, 1>(x, ldx, w, bias, rows, n, k, y32, ldy, stream);
  }
  return bf16 ? Launch<__nv_bfloat16, 2>(x, ldx, w, bias, rows, n, k, y16, ldy, stream)
              : Launch<float, 2>(x, ldx, w, bias, rows, n, k, y32, ldy, stream);
}

}  // namespace specd::kernels
