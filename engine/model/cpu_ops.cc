#include "engine/model/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "kernels/ref/rope.h"

namespace specd {

void ConfigureBlas(int num_threads) { openblas_set_num_threads(std::max(1, num_threads)); }

void Linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out,
            const float* bias, float* y) {
  if (rows == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
                static_cast<int>(in), x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(in), w,
                static_cast<int>(in), 0.0f, y, static_cast<int>(out));
  }
  if (bias == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * out;
    for (int64_t o = 0; o < out; ++o) row[o] += bias[o];
  }
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int32_t dim, int64_t stride,
             double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    float* yr = out + r * stride;
    double sum_sq = 0.0;
    for (int32_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float variance = static_cast<float>(sum_sq / dim);
    const float inv_rms = 1.0f / std::sqrt(variance + static_cast<float>(eps));
    for (int32_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv_rms);
  }
}

void SiluMul(const float* gate_up, int64_t rows, int32_t ffn, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * ffn;
    const float* up = gate + ffn;
    float* o = out + r * ffn;
    for (int32_t i = 0; i < ffn; ++i) {
      const float g = gate[i];
      o[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

std::vector<float> RopeInvFreq(const RopeConfig& rope, int32_t head_dim) {
  // One definition for both backends: kernels/ref/rope.h (transformers' float32 order).
  kernels::ref::RopeFrequencyParams p;
  switch (rope.type) {
    case RopeType::kDefault:
      p.scaling = kernels::ref::RopeScaling::kDefault;
      break;
    case RopeType::kLinear:
      p.scaling = kernels::ref::RopeScaling::kLinear;
      break;
    case RopeType::kLlama3:
      p.scaling = kernels::ref::RopeScaling::kLlama3;
      break;
  }
  p.theta = rope.theta;
  p.factor = rope.factor;
  p.low_freq_factor = rope.low_freq_factor;
  p.high_freq_factor = rope.high_freq_factor;
  p.original_max_position_embeddings = rope.original_max_position_embeddings;
  return kernels::ref::RopeInvFreq(p, head_dim);
}

void RopeCosSin(std::span<const float> inv_freq, int32_t position, float* cos, float* sin) {
  // transformers forms freqs = inv_freq * position in float32, then cos/sin in float32.
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float freq = inv_freq[i] * static_cast<float>(position);
    cos[i] = static_cast<float>(std::cos(static_cast<double>(freq)));
    sin[i] = static_cast<float>(std::sin(static_cast<double>(freq)));
  }
}

void ApplyRope(float* x, const float* cos, const float* sin, int32_t head_dim) {
  const int32_t half = head_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace specd
