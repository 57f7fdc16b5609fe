// Activation launchers for the CUDA backend: bf16 storage, fp32 math. References:
// kernels/ref/activation.h. Any host thread; queued on `stream`, no allocation, graph-capturable.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

// SwiGLU gate of a fused gate/up projection (vLLM silu_and_mul layout):
//   out[t, j] = bf16(silu(gate_up[t, j]) * gate_up[t, d + j]),  silu(x) = x / (1 + exp(-x)),
// computed in fp32 and rounded once (vLLM and HF round silu(x) to bf16 before the product).
// Elementwise over a 2-D grid (token, chunk of d); 16-byte accesses when d % 8 == 0 and both
// pointers are 16-byte aligned, else scalar.
//   gate_up  [num_tokens, 2 * d] bf16, device, in: gate in the first half, up in the second
//   out      [num_tokens, d] bf16, device, out; must not overlap gate_up
// cudaErrorInvalidValue unless 1 <= d <= 2^23 and 0 <= num_tokens < 2^31; num_tokens == 0
// launches nothing.
cudaError_t SiluAndMul(const __nv_bfloat16* gate_up, int64_t num_tokens, int64_t d,
                       __nv_bfloat16* out, cudaStream_t stream);

}  // namespace specd::kernels
