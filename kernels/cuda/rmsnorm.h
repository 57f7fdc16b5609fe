// RMSNorm launchers for the CUDA backend: bf16 storage, fp32 accumulation, one thread block per
// token row. References: kernels/ref/rmsnorm.h. Validation of shapes against the model belongs
// to the caller; launchers reject only what the kernel cannot run. Any host thread; work is
// queued on `stream` and never allocates, so a launch can be captured in a CUDA graph.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

// Largest hidden size a row fits: 1024 threads x 32 fp32 values held in registers each.
constexpr int64_t kMaxRmsNormHidden = 32768;

// out = input * rsqrt(mean(input^2) + eps) * weight per row, rounded once to bf16.
// Algorithm: FlashInfer include/flashinfer/norm.cuh RMSNormKernel (one block per row, warp
// shuffle + shared-memory reduction), holding the row in registers instead of reading it twice.
// 16-byte accesses when hidden % 8 == 0 and every pointer is 16-byte aligned, else scalar.
//   input   [num_tokens, hidden] bf16, device, in
//   weight  [hidden] bf16, device, in
//   out     [num_tokens, hidden] bf16, device, out; may alias input
// cudaErrorInvalidValue unless 1 <= hidden <= kMaxRmsNormHidden and 0 <= num_tokens < 2^31;
// num_tokens == 0 launches nothing.
cudaError_t RmsNorm(const __nv_bfloat16* input, const __nv_bfloat16* weight, int64_t num_tokens,
                    int64_t hidden, float eps, __nv_bfloat16* out, cudaStream_t stream);

// Residual add fused with RMSNorm (vLLM fused_add_rms_norm, FlashInfer FusedAddRMSNorm):
//   sum = input + residual (fp32);  residual <- bf16(sum);  out = bf16(RmsNorm(sum)).
// The norm uses the fp32 sum, not its bf16 rounding (as FlashInfer; vLLM re-reads the rounded
// residual), so out is one rounding away from the exact result.
//   input     [num_tokens, hidden] bf16, device, in
//   residual  [num_tokens, hidden] bf16, device, in/out
//   weight    [hidden] bf16, device, in
//   out       [num_tokens, hidden] bf16, device, out; may alias input (vLLM's in-place form)
// Same limits as RmsNorm.
cudaError_t FusedAddRmsNorm(const __nv_bfloat16* input, __nv_bfloat16* residual,
                            const __nv_bfloat16* weight, int64_t num_tokens, int64_t hidden,
                            float eps, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace specd::kernels
