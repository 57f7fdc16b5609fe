// References for the RMSNorm kernels (kernels/cuda/rmsnorm.h). They define what the kernels
// compute; tests run them in fp64 (the truth) and in fp32 (the same-precision baseline).
// Accumulation is in T. Pure functions, any thread.
#pragma once

#include <cstdint>

namespace specd::kernels::ref {

// out = input * rsqrt(mean(input^2) + eps) * weight, per token row (Zhang & Sennrich 2019).
//   input   [num_tokens, hidden] T, host, in
//   weight  [hidden] T, host, in
//   out     [num_tokens, hidden] T, host, out; may alias input
template <typename T>
void RmsNorm(const T* input, const T* weight, int64_t num_tokens, int64_t hidden, double eps,
             T* out);

// Residual add fused with RMSNorm, as vLLM's fused_add_rms_norm:
//   residual <- input + residual;  out = RmsNorm(residual, weight).
//   input     [num_tokens, hidden] T, host, in
//   residual  [num_tokens, hidden] T, host, in/out
//   weight    [hidden] T, host, in
//   out       [num_tokens, hidden] T, host, out; may alias input
template <typename T>
void FusedAddRmsNorm(const T* input, T* residual, const T* weight, int64_t num_tokens,
                     int64_t hidden, double eps, T* out);

extern template void RmsNorm<float>(const float*, const float*, int64_t, int64_t, double, float*);
extern template void RmsNorm<double>(const double*, const double*, int64_t, int64_t, double,
                                     double*);
extern template void FusedAddRmsNorm<float>(const float*, float*, const float*, int64_t, int64_t,
                                            double, float*);
extern template void FusedAddRmsNorm<double>(const double*, double*, const double*, int64_t,
                                             int64_t, double, double*);

}  // namespace specd::kernels::ref
