#include "kernels/ref/rope.h"

#include <cmath>
#include <numbers>

namespace specd::kernels::ref {
namespace {

// Llama 3.1 smoothing of one inverse frequency: keep high frequencies, divide low ones by
// factor, interpolate in between. Float32 throughout, in transformers' order (a scalar divided
// by a tensor is reciprocal(tensor) * scalar there), as engine/model's RopeInvFreq.
float Llama3Scale(float f, const RopeFrequencyParams& p) {
  const float factor = static_cast<float>(p.factor);
  const float low = static_cast<float>(p.low_freq_factor);
  const float high = static_cast<float>(p.high_freq_factor);
  const float old_len = static_cast<float>(p.original_max_position_embeddings);
  const float low_freq_wavelen = static_cast<float>(
      static_cast<double>(p.original_max_position_embeddings) / p.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(
      static_cast<double>(p.original_max_position_embeddings) / p.high_freq_factor);
  const float wavelen = (1.0f / f) * static_cast<float>(2.0 * std::numbers::pi);
  const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
  const float smooth = ((1.0f / wavelen) * old_len - low) / (high - low);
  const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
  const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return medium ? smoothed : scaled;
}

}  // namespace

std::vector<float> RopeInvFreq(const RopeFrequencyParams& params, int32_t rot_dim) {
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all float32.
  const int32_t half = rot_dim / 2;
  std::vector<float> inv_freq(half);
  for (int32_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    const float power = static_cast<float>(std::pow(params.theta, static_cast<double>(exponent)));
    inv_freq[i] = 1.0f / power;
  }
  if (params.scaling == RopeScaling::kLinear) {
    for (float& f : inv_freq) f /= static_cast<float>(params.factor);
  } else if (params.scaling == RopeScaling::kLlama3) {
    for (float& f : inv_freq) f = Llama3Scale(f, params);
  }
  return inv_freq;
}

template <typename T>
void BuildRopeCache(const float* inv_freq, int32_t rot_dim, int64_t max_positions, T* cos_sin) {
  const int32_t half = rot_dim / 2;
  for (int64_t p = 0; p < max_positions; ++p) {
    T* row = cos_sin + p * rot_dim;
    for (int32_t i = 0; i < half; ++i) {
      const float angle = inv_freq[i] * static_cast<float>(p);  // float32, as transformers
      row[i] = static_cast<T>(std::cos(static_cast<double>(angle)));
      row[half + i] = static_cast<T>(std::sin(static_cast<double>(angle)));
    }
  }
}

namespace {

template <typename T>
void RotateHead(T* x, const T* cos, const T* sin, int32_t half) {
  for (int32_t i = 0; i < half; ++i) {
    const T x1 = x[i];
    const T x2 = x[half + i];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[half + i] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

template <typename T>
void ApplyRope(const int32_t* positions, int64_t num_tokens, T* q, int64_t q_stride,
               int32_t num_q_heads, T* k, int64_t k_stride, int32_t num_kv_heads, int32_t head_dim,
               int32_t rot_dim, const T* cos_sin) {
  const int32_t half = rot_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const T* cos = cos_sin + static_cast<int64_t>(positions[t]) * rot_dim;
    const T* sin = cos + half;
    for (int32_t h = 0; h < num_q_heads; ++h) {
      RotateHead(q + t * q_stride + int64_t{h} * head_dim, cos, sin, half);
    }
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      RotateHead(k + t * k_stride + int64_t{h} * head_dim, cos, sin, half);
    }
  }
}

template <typename T>
void HeadRmsNorm(T* x, int64_t x_stride, int64_t num_tokens, int32_t num_heads, int32_t head_dim,
                 const T* weight, double eps) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int32_t h = 0; h < num_heads; ++h) {
      T* v = x + t * x_stride + int64_t{h} * head_dim;
      T sum_sq = 0;
      for (int32_t i = 0; i < head_dim; ++i) sum_sq += v[i] * v[i];
      const T inv_rms = T{1} / std::sqrt(sum_sq / static_cast<T>(head_dim) + static_cast<T>(eps));
      for (int32_t i = 0; i < head_dim; ++i) v[i] = v[i] * inv_rms * weight[i];
    }
  }
}

template void BuildRopeCache<float>(const float*, int32_t, int64_t, float*);
template void BuildRopeCache<double>(const float*, int32_t, int64_t, double*);
template void ApplyRope<float>(const int32_t*, int64_t, float*, int64_t, int32_t, float*, int64_t,
                               int32_t, int32_t, int32_t, const float*);
template void ApplyRope<double>(const int32_t*, int64_t, double*, int64_t, int32_t, double*,
                                int64_t, int32_t, int32_t, int32_t, const double*);
template void HeadRmsNorm<float>(float*, int64_t, int64_t, int32_t, int32_t, const float*, double);
template void HeadRmsNorm<double>(double*, int64_t, int64_t, int32_t, int32_t, const double*,
                                  double);

}  // namespace specd::kernels::ref
