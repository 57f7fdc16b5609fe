// Small-m GEMM launcher (layer 2): validate, pick the output type, launch, report.
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

}  // namespace

cudaError_t GemvBf16(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                     const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, void* y,
                     int64_t ldy, GemmOut out_type, cudaStream_t stream) {
  if (!ValidGemv(x, ldx, w, m, n, k, y, ldy)) return cudaErrorInvalidValue;
  const auto grid = static_cast<unsigned>(CeilDiv(n, kGemvTileRows));
  const int rows = static_cast<int>(m);
  auto* y16 = static_cast<__nv_bfloat16*>(y);
  auto* y32 = static_cast<float*>(y);
  const bool bf16 = out_type == GemmOut::kBf16;
  if (rows <= 8 && bf16) {
    return LaunchDependent(GemvBf16Kernel<__nv_bfloat16, 1>, grid, kGemvThreads, 0, stream, x, ldx,
                           w, bias, rows, n, k, y16, ldy);
  }
  if (rows <= 8) {
    return LaunchDependent(GemvBf16Kernel<float, 1>, grid, kGemvThreads, 0, stream, x, ldx, w, bias,
                           rows, n, k, y32, ldy);
  }
  if (bf16) {
    return LaunchDependent(GemvBf16Kernel<__nv_bfloat16, 2>, grid, kGemvThreads, 0, stream, x, ldx,
                           w, bias, rows, n, k, y16, ldy);
  }
  return LaunchDependent(GemvBf16Kernel<float, 2>, grid, kGemvThreads, 0, stream, x, ldx, w, bias,
                         rows, n, k, y32, ldy);
}

}  // namespace specd::kernels
