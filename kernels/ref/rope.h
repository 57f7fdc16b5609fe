// References for the rotary-embedding and per-head norm kernels (kernels/cuda/rope.h), plus the
// RoPE inverse frequencies as Hugging Face transformers computes them, so the CUDA runner builds
// its table from the same numbers as the CPU model (engine/model/cpu_ops.cc RopeInvFreq).
// Tests run the templates in fp64 (the truth) and fp32 (the same-precision baseline).
// Pure functions, any thread.
#pragma once

#include <cstdint>
#include <vector>

namespace specd::kernels::ref {

// transformers' rope_type: "default", "linear" (inv_freq / factor) or "llama3" (Llama 3.1
// frequency smoothing between low_freq_factor and high_freq_factor).
enum class RopeScaling { kDefault, kLinear, kLlama3 };

struct RopeFrequencyParams {
  RopeScaling scaling = RopeScaling::kDefault;
  double theta = 10000.0;
  double factor = 1.0;  // linear and llama3
  // llama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq[i] = 1 / theta^(2i / rot_dim) for i < rot_dim / 2, then the scaling, all in float32
// with the operation order of transformers' _compute_default_rope_parameters /
// _compute_llama3_parameters (and of engine/model's RopeInvFreq, which it must equal bit for
// bit). rot_dim is head_dim, or head_dim * partial_rotary_factor. Returns [rot_dim / 2] f32.
std::vector<float> RopeInvFreq(const RopeFrequencyParams& params, int32_t rot_dim);

// cos_sin[p, i] = cos(p * inv_freq[i]), cos_sin[p, rot_dim/2 + i] = sin(p * inv_freq[i]). The
// angle is the float32 product (as transformers forms it); cos and sin are evaluated in T.
//   inv_freq  [rot_dim / 2] f32, host, in
//   cos_sin   [max_positions, rot_dim] T, host, out
template <typename T>
void BuildRopeCache(const float* inv_freq, int32_t rot_dim, int64_t max_positions, T* cos_sin);

// HF rotate_half RoPE in place on the first rot_dim dims of every head of q and k:
// x1 = x[:rot_dim/2], x2 = x[rot_dim/2:rot_dim]; x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
//   positions  [num_tokens] int32, host, in (each < the table's max_positions)
//   q          [num_tokens, num_q_heads, head_dim] T, host, in/out; token stride q_stride
//   k          [num_tokens, num_kv_heads, head_dim] T, host, in/out; token stride k_stride
//   cos_sin    [max_positions, rot_dim] T, host, in (BuildRopeCache)
template <typename T>
void ApplyRope(const int32_t* positions, int64_t num_tokens, T* q, int64_t q_stride,
               int32_t num_q_heads, T* k, int64_t k_stride, int32_t num_kv_heads, int32_t head_dim,
               int32_t rot_dim, const T* cos_sin);

// Per-head RMSNorm in place (Qwen3 q_norm / k_norm): each head_dim vector of x becomes
// x * rsqrt(mean(x^2) + eps) * weight.
//   x       [num_tokens, num_heads, head_dim] T, host, in/out; token stride x_stride
//   weight  [head_dim] T, host, in
template <typename T>
void HeadRmsNorm(T* x, int64_t x_stride, int64_t num_tokens, int32_t num_heads, int32_t head_dim,
                 const T* weight, double eps);

extern template void BuildRopeCache<float>(const float*, int32_t, int64_t, float*);
extern template void BuildRopeCache<double>(const float*, int32_t, int64_t, double*);
extern template void ApplyRope<float>(const int32_t*, int64_t, float*, int64_t, int32_t, float*,
                                      int64_t, int32_t, int32_t, int32_t, const float*);
extern template void ApplyRope<double>(const int32_t*, int64_t, double*, int64_t, int32_t, double*,
                                       int64_t, int32_t, int32_t, int32_t, const double*);
extern template void HeadRmsNorm<float>(float*, int64_t, int64_t, int32_t, int32_t, const float*,
                                        double);
extern template void HeadRmsNorm<double>(double*, int64_t, int64_t, int32_t, int32_t, const double*,
                                         double);

}  // namespace specd::kernels::ref
