// References for the activation kernels (kernels/cuda/activation.h): the definition of what
// they compute, run in fp64 (truth) and fp32 (same-precision baseline) by tests. Pure
// functions, any thread.
#pragma once

#include <cstdint>

namespace specd::kernels::ref {

// SwiGLU's gate (Shazeer 2020; vLLM silu_and_mul layout): for each token,
//   out[j] = silu(gate_up[j]) * gate_up[d + j],  silu(x) = x / (1 + exp(-x)).
//   gate_up  [num_tokens, 2 * d] T, host, in: gate in the first half, up in the second
//   out      [num_tokens, d] T, host, out
template <typename T>
void SiluAndMul(const T* gate_up, int64_t num_tokens, int64_t d, T* out);

extern template void SiluAndMul<float>(const float*, int64_t, int64_t, float*);
extern template void SiluAndMul<double>(const double*, int64_t, int64_t, double*);

}  // namespace specd::kernels::ref
