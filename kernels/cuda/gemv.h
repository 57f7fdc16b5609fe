// Small-m GEMM for decode (batch 1..16, or a verification step's K + 1 rows): y = x W^T (+ bias),
// the same contract as Gemm::Run (kernels/cuda/gemm.h) for m <= kMaxGemvRows. At these sizes a
// projection is memory-bound: the kernel streams W once at close to copy bandwidth, where
// cuBLASLt's tiles leave the small projections at 73-88% of it. Reference: the fp64 dot product
// (kernels/check/op_table_gemm.cc). Any host thread; queued on `stream`, no allocation,
// graph-capturable.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

#include "kernels/cuda/gemm.h"  // GemmOut

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

// Most rows of x one launch takes: two n = 8 tiles of mma.m16n8k16 (a verification step of
// K = 8 drafts at batch 1 has 9 rows).
inline constexpr int64_t kMaxGemvRows = 16;

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), fp32 accumulation, rounded once to the output
// type. Algorithm (the swap-AB GEMV of TensorRT-LLM's and vLLM's small-batch kernels, on tensor
// cores): W rows play the mma's M and x rows its N, so the product is y^T[16 rows, 8] per tile
// (two tiles for m > 8) whatever m is, and tensor cores leave the SM's FMA units out of the loop.
// One block of 8 warps (16 where W's tiles fit one block per SM: one wave) per 16 rows of W; the
// warps split k, each lane loads 16 bytes of W rows g
// and g + 8 (lane = 4 g + t) per 32-column chunk, 4 chunks in flight, with
// ld.global.nc.L1::no_allocate (W is read once; L1 stays for x, which every block rereads through
// the cache). The 8 bf16 a lane holds of a row feed two mmas in a fixed permutation of k shared by
// W and x, so no shuffles are needed; the warps' partial tiles are summed in shared memory.
//   x     [m, k] bf16 row-major, device, in; row stride ldx elements (>= k, % 8 == 0), 16-byte
//         aligned
//   w     [n, k] bf16 row-major, device, in; 16-byte aligned. Launched as a programmatic dependent
//         (common.cuh), the kernel loads its first W rows before it waits for the kernel before
//         it in the stream, so that kernel must not be the one writing W (weights are written at
//         load time, long before; a copy or a synchronisation in between is enough)
//   bias  [n] bf16, device, in, or null
//   y     [m, n] bf16 or f32 (out_type) row-major, device, out; row stride ldy (>= n); must not
//         overlap x, w or bias
// cudaErrorInvalidValue (nothing queued) unless 1 <= m <= kMaxGemvRows, n >= 1, k >= 8,
// k % 8 == 0, ldx >= k, ldx % 8 == 0, ldy >= n, n / 16 < 2^31, x, w and y non-null and x and w
// 16-byte aligned.
cudaError_t GemvBf16(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                     const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, void* y,
                     int64_t ldy, GemmOut out_type, cudaStream_t stream);

}  // namespace specd::kernels
