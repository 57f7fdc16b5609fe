// Small-m GEMM kernel template (layer 1; launcher and contract in gemv.h / gemv.cu): y^T tiles
// of 16 W rows x 8 x rows on mma.m16n8k16, fragments loaded straight from global memory.
// Fragment notation as attention_common.cuh: lane = 4 g + t. Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"  // Mma16816
#include "kernels/cuda/common.cuh"

namespace specd::kernels {

// Warps per block (they split k): 16 where W's tiles fit one wave of one block per SM (a block
// alone on its SM then keeps 64 KiB of W in flight, not 32), else 8, three blocks per SM (gemv.cu).
constexpr int kGemvWarps = 8;
constexpr int kGemvWideWarps = 16;
constexpr int kGemvTileRows = 16;  // W rows per block: the M of one mma
constexpr int kGemvChunk = 32;     // k columns per lane group and step: 4 lanes x 8 bf16
constexpr int kGemvUnroll = 4;     // chunks per warp per iteration: 12 loads in flight per lane
constexpr int kGemvMinBlocks = 3;  // per SM (__launch_bounds__): caps registers at 85

// 16 bytes at p when `valid`, else zeros (p is not read). kStreaming (W: read once) keeps them
// out of L1, with a 256-byte L2 prefetch matching a warp's contiguous 4 x 64 bytes per row;
// otherwise (x: every block of the SM rereads it) they go through L1.
#define SPECD_GEMV_LOAD16(QUALIFIERS)              \
  asm volatile(                                    \
      "{\n"                                        \
      "  .reg .pred p;\n"                          \
      "  setp.ne.b32 p, %5, 0;\n"                  \
      "  mov.b32 %0, 0;\n"                         \
      "  mov.b32 %1, 0;\n"                         \
      "  mov.b32 %2, 0;\n"                         \
      "  mov.b32 %3, 0;\n"                         \
      "  @p ld.global.nc" QUALIFIERS               \
      ".v4.u32 {%0, %1, %2, %3}, [%4];\n"          \
      "}\n"                                        \
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) \
      : "l"(p), "r"(static_cast<int>(valid)))

template <bool kStreaming>
__device__ __forceinline__ uint4 Load16(const __nv_bfloat16* p, bool valid) {
  uint4 v;
  if constexpr (kStreaming) {
    SPECD_GEMV_LOAD16(".L1::no_allocate.L2::256B");
  } else {
    SPECD_GEMV_LOAD16("");
  }
  return v;
}
#undef SPECD_GEMV_LOAD16

__device__ __forceinline__ void StoreOut(float v, __nv_bfloat16* p) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void StoreOut(float v, float* p) { *p = v; }

// One block per 16 rows of W (row0 = 16 blockIdx.x); warp `warp` takes the chunks
// [(it * kWarps + warp) * kGemvUnroll, +kGemvUnroll) of every iteration `it`. Lane (g, t)
// loads columns [32 c + 8 t, +8) of W rows row0 + g and row0 + g + 8 (clamped to n - 1; the
// duplicates are not stored) and of x rows g + 8 i, i < kTiles (zero for rows >= m). Those 8
// columns are the mma's k positions {2t, 2t + 1, 2t + 8, 2t + 9} of two k16 steps, for A and B
// alike: a permutation of k the sum does not see. Accumulator c[i] holds y^T rows g, g + 8, x
// rows 8 i + 2t, 8 i + 2t + 1. kTiles 2 (m 9..16: a verification step's K + 1 rows) gets more
// registers per thread (2 blocks per SM). kWarps 16 runs one block per SM.
template <typename OutT, int kTiles, int kWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize, kWarps != kGemvWarps ? 1
                                                     : kTiles == 1        ? kGemvMinBlocks
                                                                          : 2)
    GemvBf16Kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                   const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ bias,
                   int m, int64_t n, int64_t k, OutT* __restrict__ y, int64_t ldy) {
  static_assert(kTiles == 1 || kTiles == 2, "at most 16 rows of x");
  __shared__ float partials[kWarps][4 * kTiles][kWarpSize];  // [warp][fragment][lane]
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGemvTileRows;
  const __nv_bfloat16* w_lo = w + min(row0 + g, n - 1) * k + 8 * t;
  const __nv_bfloat16* w_hi = w + min(row0 + g + 8, n - 1) * k + 8 * t;
  bool has_x[kTiles];
  const __nv_bfloat16* x_row[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    has_x[i] = g + 8 * i < m;
    x_row[i] = x + (has_x[i] ? g + 8 * i : 0) * ldx + 8 * t;
  }
  const int64_t limit = k - 8 * t;  // column offsets below this are in the row for this lane

  float c[kTiles][4] = {};
  constexpr int64_t kStep = int64_t{kWarps} * kGemvUnroll * kGemvChunk;
  uint4 lo[kGemvUnroll], hi[kGemvUnroll];
  // W rows of the chunks at `base`; W is constant, so the first ones load before the wait for
  // the previous kernel (launched as a programmatic dependent, common.cuh), overlapping its tail.
  const auto load_w = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t col = base + u * kGemvChunk;
      const bool valid = col < limit;
      lo[u] = Load16<true>(w_lo + col, valid);
      hi[u] = Load16<true>(w_hi + col, valid);
    }
  };
  const int64_t first = int64_t{warp} * kGemvUnroll * kGemvChunk;
  AllowDependentLaunch();  // first: dependents launch early (common.cuh)
  load_w(first);
  WaitForPrerequisiteGrid();
  for (int64_t base = first; base < k; base += kStep) {
    uint4 xv[kTiles][kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t col = base + u * kGemvChunk;
      const bool valid = col < limit;
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        xv[i][u] = Load16<false>(x_row[i] + col, valid && has_x[i]);
      }
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        attention::Mma16816(c[i][0], c[i][1], c[i][2], c[i][3], lo[u].x, hi[u].x, lo[u].y, hi[u].y,
                            xv[i][u].x, xv[i][u].y);
        attention::Mma16816(c[i][0], c[i][1], c[i][2], c[i][3], lo[u].z, hi[u].z, lo[u].w, hi[u].w,
                            xv[i][u].z, xv[i][u].w);
      }
    }
    if (base + kStep < k) load_w(base + kStep);
  }

#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int f = 0; f < 4; ++f) partials[warp][4 * i + f][lane] = c[i][f];
  }
  __syncthreads();
  if (threadIdx.x >= 4 * kTiles * kWarpSize) return;
  // Thread (i, f, l) sums fragment f of tile i of lane l over the warps: y^T row g + 8 (f / 2),
  // x row 8 i + 2 t + f % 2 of lane l = 4 g + t.
  const int fragment = threadIdx.x / kWarpSize, l = threadIdx.x % kWarpSize;
  const int tile = fragment / 4, f = fragment % 4;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) sum += partials[i][fragment][l];
  const int64_t row = row0 + l / 4 + 8 * (f / 2);
  const int x_index = 8 * tile + 2 * (l % 4) + f % 2;
  if (row >= n || x_index >= m) return;
  if (bias != nullptr) sum += __bfloat162float(bias[row]);
  StoreOut(sum, y + x_index * ldy + row);
}

}  // namespace specd::kernels
